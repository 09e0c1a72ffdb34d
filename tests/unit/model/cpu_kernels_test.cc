#include "lib/model/cpu_kernels.h"

#include <array>
#include <cmath>
#include <cstring>
#include <random>

#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

std::vector<float> Random(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(MatMul, MatchesDoublePrecisionReference) {
  std::mt19937 rng(1);
  for (auto [M, K, N] : std::vector<std::array<int, 3>>{{1, 7, 3}, {5, 300, 33}, {17, 256, 64}, {9, 513, 100}}) {
    auto x = Random(rng, static_cast<size_t>(M) * K);
    auto w = Random(rng, static_cast<size_t>(N) * K);
    std::vector<float> y(static_cast<size_t>(M) * N);
    MatMul(x.data(), M, PackedWeight::FromOutIn(w.data(), N, K), y.data());
    for (int m = 0; m < M; ++m) {
      for (int n = 0; n < N; ++n) {
        double ref = 0;
        for (int k = 0; k < K; ++k) ref += static_cast<double>(x[m * K + k]) * w[n * K + k];
        EXPECT_NEAR(y[m * N + n], ref, 1e-4 * std::sqrt(K)) << M << "x" << K << "x" << N;
      }
    }
  }
}

TEST(MatMul, RowResultDoesNotDependOnBatchSizeOrPosition) {
  std::mt19937 rng(2);
  const int K = 700, N = 77;  // K spans several K blocks, N has a tail
  auto w = Random(rng, static_cast<size_t>(N) * K);
  const PackedWeight pw = PackedWeight::FromOutIn(w.data(), N, K);
  auto row = Random(rng, K);
  std::vector<float> alone(N);
  MatMul(row.data(), 1, pw, alone.data());
  for (int M : {2, 3, 4, 5, 8, 9, 17, 64}) {
    for (int at : {0, M / 2, M - 1}) {
      auto x = Random(rng, static_cast<size_t>(M) * K);
      std::memcpy(x.data() + static_cast<size_t>(at) * K, row.data(), sizeof(float) * K);
      std::vector<float> y(static_cast<size_t>(M) * N);
      MatMul(x.data(), M, pw, y.data());
      ASSERT_EQ(std::memcmp(y.data() + static_cast<size_t>(at) * N, alone.data(), sizeof(float) * N), 0)
          << "M=" << M << " row " << at;
    }
  }
}

TEST(Kernels, DotRmsNormRopeAxpy) {
  std::vector<float> a = {1, 2, 3}, b = {4, 5, 6};
  EXPECT_FLOAT_EQ(Dot(a.data(), b.data(), 3), 32.0f);
  std::vector<float> w = {1, 1, 2}, y(3);
  RmsNorm(a.data(), w.data(), y.data(), 1, 3, 0.0f);
  const float inv = 1.0f / std::sqrt(14.0f / 3.0f);
  EXPECT_NEAR(y[0], 1 * inv, 1e-6);
  EXPECT_NEAR(y[2], 3 * inv * 2, 1e-6);
  // RoPE at position 0 is the identity; it rotates pairs (i, i + rot/2).
  std::vector<float> v = {1, 0, 0, 1, 7, 8};  // one head, head_dim 6, rot 4
  ApplyRope(v.data(), 1, 6, 4, 0, 10000.0);
  EXPECT_EQ(v, (std::vector<float>{1, 0, 0, 1, 7, 8}));
  ApplyRope(v.data(), 1, 6, 4, 1, 10000.0);
  EXPECT_NEAR(v[0], std::cos(1.0f), 1e-6);   // pair (0, 2), freq 1
  EXPECT_NEAR(v[2], std::sin(1.0f), 1e-6);
  EXPECT_EQ(v[4], 7);  // beyond rot_dim: untouched
  EXPECT_EQ(v[5], 8);
  std::vector<float> acc = {1, 1, 1};
  Axpy(2.0f, a.data(), acc.data(), 3);
  EXPECT_EQ(acc, (std::vector<float>{3, 5, 7}));
  EXPECT_NEAR(Silu(0.0f), 0.0f, 1e-7);
}

TEST(KernelThreads, ParallelForCoversTheRangeOnce) {
  std::vector<int> hits(1000, 0);
  KernelThreads::Get().ParallelFor(1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ++hits[i];
  });
  for (int h : hits) ASSERT_EQ(h, 1);
}

}  // namespace
}  // namespace swaserve::model
