// PagedAttention against a naive double-precision softmax attention, for f32,
// bf16 and f16 KV, full and windowed layers, with and without sinks; and bit
// equality of one (query, head) output whatever other queries share the call.
#include "lib/model/attention.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/kv_io.h"

namespace swaserve::model {
namespace {

struct Case {
  kv::DType dtype;
  int window;  // 0: full
  bool sinks;
  int nh, nkv, hd, vd;
};

class AttentionTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    kv::KvShape shape;
    shape.full_layers = 1;
    shape.full_kv_heads = c.nkv;
    shape.full_k_head_dim = c.hd;
    shape.full_v_head_dim = c.vd;
    shape.swa_layers = 1;
    shape.swa_kv_heads = c.nkv;
    shape.swa_k_head_dim = c.hd;
    shape.swa_v_head_dim = c.vd;
    shape.sliding_window = c.window > 0 ? c.window : 16;
    shape.page_size = 16;
    shape.dtype = c.dtype;
    auto pools = kv::KvPools::Create({shape, 64, 64, true});
    ASSERT_TRUE(pools.ok()) << pools.status();
    pools_ = std::move(*pools);
    seq_ = std::make_unique<kv::Sequence>(kv::SequenceOptions{pools_.get(), nullptr, 1 << 20, false});
    // swa_slack covers everything: no SWA page is released, so the windowed
    // case may read the full pool's layout too.
    ASSERT_TRUE(seq_->Append(kTokens).ok());
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0, 1);
    view_ = c.window > 0 ? seq_->SwaLayer(0) : seq_->FullLayer(0);
    const size_t es = kv::DTypeSize(c.dtype);
    k_.resize(static_cast<size_t>(kTokens) * c.nkv * c.hd);
    v_.resize(static_cast<size_t>(kTokens) * c.nkv * c.vd);
    for (int t = 0; t < kTokens; ++t) {
      float* kt = &k_[static_cast<size_t>(t) * c.nkv * c.hd];
      float* vt = &v_[static_cast<size_t>(t) * c.nkv * c.vd];
      for (int i = 0; i < c.nkv * c.hd; ++i) kt[i] = nd(rng);
      for (int i = 0; i < c.nkv * c.vd; ++i) vt[i] = nd(rng);
      StoreKv(c.dtype, view_.K(t), kt, c.nkv * c.hd);
      StoreKv(c.dtype, view_.V(t), vt, c.nkv * c.vd);
      // The reference sees what the pool holds (rounded to its dtype).
      LoadKv(c.dtype, view_.K(t), kt, c.nkv * c.hd);
      LoadKv(c.dtype, view_.V(t), vt, c.nkv * c.vd);
      (void)es;
    }
    q_.resize(static_cast<size_t>(kTokens) * c.nh * c.hd);
    for (float& x : q_) x = nd(rng);
    sinks_.resize(c.nh);
    for (float& x : sinks_) x = nd(rng);
    params_.num_heads = c.nh;
    params_.num_kv_heads = c.nkv;
    params_.head_dim = c.hd;
    params_.v_head_dim = c.vd;
    params_.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    params_.window = c.window;
    params_.sinks = c.sinks ? sinks_.data() : nullptr;
  }

  // Naive attention of the query at row `row` (position pos), head h.
  std::vector<double> Reference(int row, int pos, int h) const {
    const Case& c = GetParam();
    const int kvh = h / (c.nh / c.nkv);
    const int lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
    const float* q = &q_[(static_cast<size_t>(row) * c.nh + h) * c.hd];
    std::vector<double> s;
    double m = c.sinks ? sinks_[h] : -INFINITY;
    for (int t = lo; t <= pos; ++t) {
      const float* k = &k_[(static_cast<size_t>(t) * c.nkv + kvh) * c.hd];
      double d = 0;
      for (int i = 0; i < c.hd; ++i) d += static_cast<double>(q[i]) * k[i];
      s.push_back(d * params_.scale);
      m = std::max(m, s.back());
    }
    double denom = c.sinks ? std::exp(sinks_[h] - m) : 0;
    std::vector<double> o(c.vd, 0);
    for (size_t j = 0; j < s.size(); ++j) {
      const double w = std::exp(s[j] - m);
      denom += w;
      const float* v = &v_[((static_cast<size_t>(lo) + j) * c.nkv + kvh) * c.vd];
      for (int i = 0; i < c.vd; ++i) o[i] += w * v[i];
    }
    for (double& x : o) x /= denom;
    return o;
  }

  static constexpr int kTokens = 300;
  std::unique_ptr<kv::KvPools> pools_;
  std::unique_ptr<kv::Sequence> seq_;
  kv::LayerView view_;
  std::vector<float> k_, v_, q_, sinks_;
  AttentionParams params_;
};

TEST_P(AttentionTest, MatchesNaiveReference) {
  const Case& c = GetParam();
  // Spans of several sizes over one sequence: rows [0, kTokens) hold
  // positions [0, kTokens), split unevenly.
  std::vector<AttentionSpan> spans;
  for (int p = 0, n = 1; p < kTokens; p += n, n = n * 3 % 37 + 1) {
    n = std::min(n, kTokens - p);
    spans.push_back({view_, p, p, n});
  }
  std::vector<float> out(static_cast<size_t>(kTokens) * c.nh * c.vd, NAN);
  PagedAttention(params_, spans, q_.data(), out.data());
  double worst = 0;
  for (int r = 0; r < kTokens; ++r) {
    for (int h = 0; h < c.nh; ++h) {
      const std::vector<double> want = Reference(r, r, h);
      // Error relative to the output vector's scale (single elements can
      // cancel to near zero).
      double scale = 1e-3;
      for (double x : want) scale = std::max(scale, std::abs(x));
      for (int i = 0; i < c.vd; ++i) {
        const double got = out[(static_cast<size_t>(r) * c.nh + h) * c.vd + i];
        const double err = std::abs(got - want[i]) / scale;
        worst = std::max(worst, err);
        ASSERT_LT(err, 1e-5) << "row " << r << " head " << h << " dim " << i << ": got "
                             << got << ", want " << want[i];
      }
    }
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST_P(AttentionTest, OutputDoesNotDependOnTheOtherQueries) {
  const Case& c = GetParam();
  const size_t row_floats = static_cast<size_t>(c.nh) * c.vd;
  // One call with everything in a single span...
  std::vector<float> all(kTokens * row_floats);
  AttentionSpan whole{view_, 0, 0, kTokens};
  PagedAttention(params_, {&whole, 1}, q_.data(), all.data());
  // ...against each query alone (a decode step), and in random chunks.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<AttentionSpan> spans;
    for (int p = 0; p < kTokens;) {
      const int n = trial == 0 ? 1 : std::min<int>(1 + rng() % 40, kTokens - p);
      spans.push_back({view_, p, p, n});
      p += n;
    }
    std::vector<float> out(kTokens * row_floats);
    PagedAttention(params_, spans, q_.data(), out.data());
    ASSERT_EQ(std::memcmp(out.data(), all.data(), sizeof(float) * out.size()), 0)
        << "trial " << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, AttentionTest,
    ::testing::Values(Case{kv::DType::kF32, 0, false, 4, 2, 16, 8},
                      Case{kv::DType::kF32, 16, true, 4, 2, 16, 8},
                      Case{kv::DType::kBF16, 0, true, 8, 1, 24, 20},
                      Case{kv::DType::kF16, 40, false, 6, 3, 7, 5},
                      Case{kv::DType::kBF16, 128, true, 16, 2, 64, 48},
                      // The demo model's SWA and full layers (one and two
                      // heads per KV head).
                      Case{kv::DType::kBF16, 128, true, 8, 8, 36, 24},
                      Case{kv::DType::kBF16, 0, false, 8, 4, 36, 24},
                      // A long window: several 16-lane vectors per task.
                      Case{kv::DType::kBF16, 1024, true, 8, 4, 36, 24}));

}  // namespace
}  // namespace swaserve::model
