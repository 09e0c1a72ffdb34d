// PackedWeight in its stored formats (lib/model/packed_weight.cc): the
// E4M3 conversions, MatMul over BF16 / F16 / FP8-block-scaled weights equal
// bit for bit to MatMul over their f32 values (edge blocks included), batch
// invariance per format, and malformed parts.
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/cpu_kernels_avx2.h"

namespace swaserve::model {
namespace {

using ::testing::HasSubstr;

// E4M3 by its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits;
// exponent 0 is subnormal; S.1111.111 is NaN.
double E4M3ByDefinition(uint8_t x) {
  const int s = x >> 7, e = (x >> 3) & 15, m = x & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? m / 8.0 * std::ldexp(1.0, -6)
                            : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8E4M3, DecodesEveryCodeByTheDefinition) {
  for (int c = 0; c < 256; ++c) {
    const double want = E4M3ByDefinition(static_cast<uint8_t>(c));
    const float got = Fp8E4M3ToF32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << c;
    }
  }
  EXPECT_EQ(Fp8E4M3ToF32(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E4M3, EncodesToNearestEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    const float v = Fp8E4M3ToF32(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    const uint8_t back = F32ToFp8E4M3(v);
    // +0 and -0 keep their sign; every other value its code.
    EXPECT_EQ(back, c) << c;
  }
  // 1.0625 lies halfway between 1.0 (code 0x38, even) and 1.125 (0x39).
  EXPECT_EQ(F32ToFp8E4M3(1.0625f), 0x38);
  // 1.1875 lies between 1.125 (0x39) and 1.25 (0x3A, even).
  EXPECT_EQ(F32ToFp8E4M3(1.1875f), 0x3A);
  EXPECT_EQ(F32ToFp8E4M3(1.05f), 0x38);
  EXPECT_EQ(F32ToFp8E4M3(1.07f), 0x39);
  EXPECT_EQ(F32ToFp8E4M3(1e6f), 0x7E);
  EXPECT_EQ(F32ToFp8E4M3(-1e6f), 0xFE);
  EXPECT_EQ(F32ToFp8E4M3(NAN), 0x7F);
}

std::vector<float> Random(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// An [N, K] f32 matrix quantized to E4M3 with block scales (amax / 448 per
// block, as DeepSeek-style FP8 checkpoints are made), and its dequantized
// f32 values (fp8 * scale, rounded once).
struct Fp8Matrix {
  std::vector<uint8_t> q;
  std::vector<float> scale;  // [ceil(N / bo), ceil(K / bi)]
  std::vector<float> dequant;
  int64_t scale_cols = 0;
};

Fp8Matrix Quantize(const std::vector<float>& w, int64_t N, int64_t K, int bo,
                   int bi) {
  Fp8Matrix m;
  const int64_t sr = (N + bo - 1) / bo;
  m.scale_cols = (K + bi - 1) / bi;
  m.scale.assign(sr * m.scale_cols, 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      float& s = m.scale[(n / bo) * m.scale_cols + k / bi];
      s = std::max(s, std::fabs(w[n * K + k]) / 448.0f);
    }
  }
  m.q.resize(N * K);
  m.dequant.resize(N * K);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const float s = m.scale[(n / bo) * m.scale_cols + k / bi];
      m.q[n * K + k] = F32ToFp8E4M3(w[n * K + k] / s);
      m.dequant[n * K + k] = Fp8E4M3ToF32(m.q[n * K + k]) * s;
    }
  }
  return m;
}

WeightPart Fp8Part(const Fp8Matrix& m, int64_t rows, int64_t K, int bo, int bi,
                   int64_t row0 = 0) {
  WeightPart p;
  p.format = WeightFormat::kFp8E4M3;
  p.data = m.q.data() + row0 * K;
  p.rows = rows;
  p.K = K;
  p.scale = m.scale.data();
  p.scale_cols = m.scale_cols;
  p.block_out = bo;
  p.block_in = bi;
  p.row0 = row0;
  return p;
}

// `w` ([N, K] f32) rounded to BF16 into *bits, as one part.
WeightPart Bf16Part(const std::vector<float>& w, int64_t N, int64_t K,
                    std::vector<uint16_t>* bits) {
  bits->resize(static_cast<size_t>(N) * K);
  for (size_t i = 0; i < bits->size(); ++i) (*bits)[i] = F32ToBf16(w[i]);
  WeightPart p;
  p.format = WeightFormat::kBF16;
  p.data = bits->data();
  p.rows = N;
  p.K = K;
  return p;
}

std::vector<float> Apply(const PackedWeight& w, const std::vector<float>& x,
                       int64_t M) {
  std::vector<float> y(M * w.N);
  MatMul(x.data(), M, w, y.data());
  return y;
}

TEST(PackedWeight, Fp8MatMulEqualsF32OfTheDequantizedWeights) {
  std::mt19937 rng(3);
  // Edge blocks in both dimensions (77 % 32, 300 % 128, 45 % 16 ...).
  for (auto [N, K, bo, bi] : std::vector<std::array<int, 4>>{
           {77, 300, 128, 128}, {256, 256, 128, 128}, {45, 70, 16, 8},
           {33, 513, 7, 64}}) {
    const std::vector<float> w = Random(rng, N * K, 0.05f);
    const Fp8Matrix m = Quantize(w, N, K, bo, bi);
    absl::StatusOr<PackedWeight> fp8 =
        PackedWeight::Pack({Fp8Part(m, N, K, bo, bi)});
    ASSERT_TRUE(fp8.ok()) << fp8.status();
    const PackedWeight ref = PackedWeight::FromOutIn(m.dequant.data(), N, K);
    for (int64_t n = 0; n < N; n += 5) {
      for (int64_t k = 0; k < K; k += 3) {
        ASSERT_EQ(fp8->At(k, n), m.dequant[n * K + k]) << n << "," << k;
      }
    }
    for (int M : {1, 3, 9}) {
      const std::vector<float> x = Random(rng, M * K);
      const std::vector<float> a = Apply(*fp8, x, M), b = Apply(ref, x, M);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
          << N << "x" << K << " blocks " << bo << "x" << bi << " M=" << M;
    }
    // About one byte per weight plus the expanded scales.
    EXPECT_EQ(fp8->data8.size(), static_cast<size_t>(K) * ((N + 31) / 32 * 32));
    EXPECT_LT(fp8->bytes(), ref.bytes());
  }
}

// The AVX2 kernels (cpu_kernels_avx2.cc, used where the CPU has no AVX-512)
// against the definition, bit for bit, whatever this machine's MatMul path:
// each output element's fused multiply-adds over w.At(k, n) in k order,
// in every weight format, for row counts on both sides of the micro-kernel
// and panel thresholds, and for a column range starting at 32 (a thread's
// share); Dot's 16 lanes reduced pairwise; Axpy one fused multiply-add each.
TEST(PackedWeight, Avx2KernelsComputeTheDefinitionBitForBit) {
  if (!avx2::Have()) GTEST_SKIP() << "this CPU has no AVX2 + FMA + F16C";
  std::mt19937 rng(8);
  const int K = 700, N = 77;
  const std::vector<float> w = Random(rng, N * K, 0.05f);
  const Fp8Matrix m = Quantize(w, N, K, 128, 128);
  std::vector<uint16_t> bf, f16(N * K);
  for (int i = 0; i < N * K; ++i) f16[i] = F32ToF16(w[i]);
  WeightPart hp;
  hp.format = WeightFormat::kF16;
  hp.data = f16.data();
  hp.rows = N;
  hp.K = K;
  std::vector<PackedWeight> weights = {PackedWeight::FromOutIn(w.data(), N, K)};
  for (const WeightPart& part : {Fp8Part(m, N, K, 128, 128), Bf16Part(w, N, K, &bf), hp}) {
    absl::StatusOr<PackedWeight> pw = PackedWeight::Pack({part});
    ASSERT_TRUE(pw.ok()) << pw.status();
    weights.push_back(std::move(*pw));
  }
  for (const PackedWeight& pw : weights) {
    for (int M : {1, 3, 4, 5, 15, 16, 17}) {
      const std::vector<float> x = Random(rng, M * K);
      for (const int n0 : {0, 32}) {
        std::vector<float> y(M * N, -1.0f);
        avx2::MatMulRange(x.data(), M, pw, n0, N, y.data(), N);
        for (int r = 0; r < M; ++r) {
          for (int n = n0; n < N; ++n) {
            float want = 0;
            for (int k = 0; k < K; ++k) want = std::fma(x[r * K + k], pw.At(k, n), want);
            ASSERT_EQ(std::memcmp(&y[r * N + n], &want, 4), 0)
                << "format " << static_cast<int>(pw.format) << " M=" << M << " row " << r
                << " column " << n << ": " << y[r * N + n] << " vs " << want;
          }
          for (int n = 0; n < n0; ++n) ASSERT_EQ(y[r * N + n], -1.0f) << "outside the range";
        }
      }
    }
  }
  for (const int n : {1, 7, 16, 17, 100, 333}) {
    const std::vector<float> a = Random(rng, n), b = Random(rng, n);
    float lanes[16] = {0};
    for (int k = 0; k < n; ++k) lanes[k % 16] = std::fma(a[k], b[k], lanes[k % 16]);
    float t8[8], t4[4];
    for (int i = 0; i < 8; ++i) t8[i] = lanes[i] + lanes[i + 8];
    for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
    const float want = (t4[0] + t4[2]) + (t4[1] + t4[3]);
    const float got = avx2::Dot(a.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(&got, &want, 4), 0) << "Dot n=" << n;
    EXPECT_EQ(Dot(a.data(), b.data(), n), got) << "the dispatched Dot, n=" << n;
    std::vector<float> y = Random(rng, n), want_y = y;
    for (int i = 0; i < n; ++i) want_y[i] = std::fma(0.37f, a[i], want_y[i]);
    avx2::Axpy(0.37f, a.data(), y.data(), n);
    EXPECT_EQ(std::memcmp(y.data(), want_y.data(), 4 * n), 0) << "Axpy n=" << n;
  }
}

TEST(PackedWeight, Fp8PartsSplitInsideAScaleBlock) {
  // Rows [0, 40) and [40, 100) of one tensor whose scale blocks are 32 rows:
  // the second part starts inside block 1 and must use its scales.
  std::mt19937 rng(4);
  const int N = 100, K = 96, bo = 32, bi = 32;
  std::vector<float> w = Random(rng, N * K, 0.1f);
  for (int k = 0; k < K; ++k) w[50 * K + k] *= 40;  // a large block 1
  const Fp8Matrix m = Quantize(w, N, K, bo, bi);
  absl::StatusOr<PackedWeight> split = PackedWeight::Pack(
      {Fp8Part(m, 40, K, bo, bi, 0), Fp8Part(m, 60, K, bo, bi, 40)});
  ASSERT_TRUE(split.ok()) << split.status();
  const PackedWeight ref = PackedWeight::FromOutIn(m.dequant.data(), N, K);
  const std::vector<float> x = Random(rng, 4 * K);
  const std::vector<float> a = Apply(*split, x, 4), b = Apply(ref, x, 4);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(PackedWeight, NarrowFormatsEqualF32OfTheirValues) {
  std::mt19937 rng(5);
  const int N = 70, K = 333;
  const std::vector<float> w = Random(rng, N * K);
  for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kF16}) {
    std::vector<uint16_t> bits(N * K);
    std::vector<float> widened(N * K);
    for (int i = 0; i < N * K; ++i) {
      bits[i] = f == WeightFormat::kBF16 ? F32ToBf16(w[i]) : F32ToF16(w[i]);
      widened[i] = f == WeightFormat::kBF16 ? Bf16ToF32(bits[i]) : F16ToF32(bits[i]);
    }
    WeightPart p;
    p.format = f;
    p.data = bits.data();
    p.rows = N;
    p.K = K;
    absl::StatusOr<PackedWeight> narrow = PackedWeight::Pack({p});
    ASSERT_TRUE(narrow.ok()) << narrow.status();
    EXPECT_EQ(narrow->bytes(), static_cast<size_t>(K) * 96 * 2);
    const PackedWeight ref = PackedWeight::FromOutIn(widened.data(), N, K);
    const std::vector<float> x = Random(rng, 6 * K);
    const std::vector<float> a = Apply(*narrow, x, 6), b = Apply(ref, x, 6);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  }
}

// M = 1..15 widens narrow weights inside the micro-kernel; M >= 16 converts
// each K-block panel once (cpu_kernels.cc kPanelRows): both must give the
// same bits.
TEST(PackedWeight, EveryFormatIsBatchInvariant) {
  std::mt19937 rng(6);
  const int K = 700, N = 77;  // several K blocks; a column tail
  const std::vector<float> w = Random(rng, N * K, 0.05f);
  const Fp8Matrix m = Quantize(w, N, K, 128, 128);
  std::vector<uint16_t> bf;
  const WeightPart bp = Bf16Part(w, N, K, &bf);
  for (const WeightPart& part : {Fp8Part(m, N, K, 128, 128), bp}) {
    absl::StatusOr<PackedWeight> pw = PackedWeight::Pack({part});
    ASSERT_TRUE(pw.ok()) << pw.status();
    const std::vector<float> row = Random(rng, K);
    const std::vector<float> alone = Apply(*pw, row, 1);
    for (int M : {2, 4, 5, 8, 9, 15, 16, 17, 64}) {
      for (int at : {0, M / 2, M - 1}) {
        std::vector<float> x = Random(rng, M * K);
        std::memcpy(x.data() + at * K, row.data(), K * 4);
        const std::vector<float> y = Apply(*pw, x, M);
        ASSERT_EQ(std::memcmp(y.data() + at * N, alone.data(), N * 4), 0)
            << "format " << static_cast<int>(part.format) << " M=" << M
            << " row " << at;
      }
    }
  }
}

// Columns (a narrow lm_head): every kept column computes the same bits as
// in the whole weight, in every format, at every batch size; the others are
// gone.
TEST(PackedWeight, ColumnsComputeExactlyTheirColumnsOfTheWhole) {
  std::mt19937 rng(7);
  const int K = 300, N = 150;
  const std::vector<float> w = Random(rng, N * K, 0.05f);
  const Fp8Matrix m = Quantize(w, N, K, 128, 128);
  std::vector<uint16_t> bf;
  const WeightPart bp = Bf16Part(w, N, K, &bf);
  std::vector<PackedWeight> weights = {PackedWeight::FromOutIn(w.data(), N, K)};
  for (const WeightPart& part : {Fp8Part(m, N, K, 128, 128), bp}) {
    absl::StatusOr<PackedWeight> pw = PackedWeight::Pack({part});
    ASSERT_TRUE(pw.ok()) << pw.status();
    weights.push_back(*std::move(pw));
  }
  const std::vector<int32_t> cols = {149, 0, 7, 31, 32, 33, 100, 64, 5};
  for (const PackedWeight& whole : weights) {
    const PackedWeight narrow = whole.Columns(cols);
    ASSERT_EQ(narrow.N, static_cast<int64_t>(cols.size()));
    EXPECT_LT(narrow.bytes(), whole.bytes() / 4);
    for (int M : {1, 4, 17}) {
      const std::vector<float> x = Random(rng, M * K);
      const std::vector<float> all = Apply(whole, x, M), part = Apply(narrow, x, M);
      for (int r = 0; r < M; ++r) {
        for (size_t j = 0; j < cols.size(); ++j) {
          ASSERT_EQ(std::memcmp(&part[r * cols.size() + j], &all[r * N + cols[j]], 4), 0)
              << "format " << static_cast<int>(whole.format) << " M=" << M << " row " << r
              << " column " << cols[j];
        }
      }
    }
  }
}

TEST(PackedWeight, RejectsMalformedParts) {
  std::mt19937 rng(7);
  const int N = 40, K = 64;
  const Fp8Matrix m = Quantize(Random(rng, N * K), N, K, 32, 32);
  std::vector<float> f32(N * K, 1.0f);
  WeightPart fp = Fp8Part(m, N, K, 32, 32);
  WeightPart ff;
  ff.data = f32.data();
  ff.rows = N;
  ff.K = K;
  EXPECT_FALSE(PackedWeight::Pack({fp, ff}).ok());  // mixed formats
  WeightPart bad_cols = fp;
  bad_cols.scale_cols = 1;
  EXPECT_THAT(std::string(PackedWeight::Pack({bad_cols}).status().message()),
              HasSubstr("scale columns"));
  WeightPart no_scale = fp;
  no_scale.scale = nullptr;
  EXPECT_FALSE(PackedWeight::Pack({no_scale}).ok());
  Fp8Matrix nan = m;
  nan.q[5] = 0x7F;
  EXPECT_THAT(
      std::string(PackedWeight::Pack({Fp8Part(nan, N, K, 32, 32)}).status().message()),
      HasSubstr("NaN"));
  EXPECT_FALSE(PackedWeight::Pack({}).ok());
}

}  // namespace
}  // namespace swaserve::model
