#include "lib/kv/kv_shape.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace swaserve::kv {
namespace {

// The full pool of MiMo-V2.5-Pro: 10 layers x 16 tokens x 8 heads x
// (192 + 128) dims x 2 bytes.
constexpr size_t kMiMoFullTokenLayerBytes = 8 * (192 + 128) * 2;      // 5120
constexpr size_t kMiMoFullPageBytes = 10 * 16 * kMiMoFullTokenLayerBytes;  // 819200
constexpr size_t kMiMoSwaPageBytes = 60 * 16 * kMiMoFullTokenLayerBytes;   // 4915200

TEST(DType, Sizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
}

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
}

TEST(DType, ParsesBothSpellings) {
  struct Case {
    const char* name;
    DType dtype;
  };
  for (const Case& c : {Case{"f32", DType::kF32}, Case{"float32", DType::kF32},
                        Case{"bf16", DType::kBF16},
                        Case{"bfloat16", DType::kBF16},
                        Case{"f16", DType::kF16}, Case{"float16", DType::kF16}}) {
    absl::StatusOr<DType> parsed = ParseDType(c.name);
    ASSERT_TRUE(parsed.ok()) << c.name << ": " << parsed.status();
    EXPECT_EQ(*parsed, c.dtype) << c.name;
  }
}

TEST(DType, RejectsUnknown) {
  for (const char* bad : {"", "int8", "fp8", "f64", "bf 16"}) {
    absl::StatusOr<DType> parsed = ParseDType(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(PoolKind, Names) {
  EXPECT_EQ(PoolKindName(PoolKind::kFull), "full");
  EXPECT_EQ(PoolKindName(PoolKind::kSwa), "swa");
}

TEST(KvShape, MiMoV25ProShape) {
  KvShape s = KvShape::MiMoV25Pro();
  EXPECT_TRUE(s.Validate().ok()) << s.Validate();
  EXPECT_EQ(s.full_layers, 10);
  EXPECT_EQ(s.swa_layers, 60);
  EXPECT_EQ(s.full_kv_heads, 8);
  EXPECT_EQ(s.swa_kv_heads, 8);
  EXPECT_EQ(s.full_k_head_dim, 192);
  EXPECT_EQ(s.full_v_head_dim, 128);
  EXPECT_EQ(s.swa_k_head_dim, 192);
  EXPECT_EQ(s.swa_v_head_dim, 128);
  EXPECT_EQ(s.sliding_window, 128);
  EXPECT_EQ(s.page_size, 16);
  EXPECT_EQ(s.dtype, DType::kBF16);
}

TEST(PoolGeometry, MiMoFullPool) {
  PoolGeometry g = KvShape::MiMoV25Pro().Full();
  EXPECT_EQ(g.kind, PoolKind::kFull);
  EXPECT_EQ(g.num_layers, 10);
  EXPECT_EQ(g.num_kv_heads, 8);
  EXPECT_EQ(g.k_head_dim, 192);
  EXPECT_EQ(g.v_head_dim, 128);
  EXPECT_EQ(g.dtype, DType::kBF16);
  EXPECT_EQ(g.page_size, 16);
  EXPECT_TRUE(g.Validate().ok());

  EXPECT_EQ(g.TokenLayerBytes(), kMiMoFullTokenLayerBytes);
  EXPECT_EQ(g.TokenBytes(), 10 * kMiMoFullTokenLayerBytes);
  EXPECT_EQ(g.PageBytes(), kMiMoFullPageBytes);
  EXPECT_EQ(g.PageBytes(), 819200u);
  // [layer][K|V][token][kv_head][dim]
  EXPECT_EQ(g.KTokenStride(), 8u * 192 * 2);
  EXPECT_EQ(g.VTokenStride(), 8u * 128 * 2);
  const size_t k_block = 16u * 8 * 192 * 2;
  const size_t v_block = 16u * 8 * 128 * 2;
  for (int l = 0; l < 10; ++l) {
    EXPECT_EQ(g.KOffset(l), l * (k_block + v_block)) << l;
    EXPECT_EQ(g.VOffset(l), l * (k_block + v_block) + k_block) << l;
  }
  // The last layer's V block ends exactly at the end of the page.
  EXPECT_EQ(g.VOffset(9) + v_block, g.PageBytes());
}

TEST(PoolGeometry, MiMoSwaPool) {
  PoolGeometry g = KvShape::MiMoV25Pro().Swa();
  EXPECT_EQ(g.kind, PoolKind::kSwa);
  EXPECT_EQ(g.num_layers, 60);
  EXPECT_EQ(g.PageBytes(), kMiMoSwaPageBytes);
  EXPECT_EQ(g.KOffset(59), 59 * 16 * kMiMoFullTokenLayerBytes);
  EXPECT_EQ(g.VOffset(59) + 16u * 8 * 128 * 2, g.PageBytes());
}

TEST(PoolGeometry, OffsetsForAsymmetricF32Shape) {
  PoolGeometry g;
  g.kind = PoolKind::kSwa;
  g.num_layers = 3;
  g.num_kv_heads = 2;
  g.k_head_dim = 5;
  g.v_head_dim = 3;
  g.dtype = DType::kF32;
  g.page_size = 4;
  ASSERT_TRUE(g.Validate().ok());
  EXPECT_EQ(g.TokenLayerBytes(), 2u * (5 + 3) * 4);
  EXPECT_EQ(g.KTokenStride(), 2u * 5 * 4);
  EXPECT_EQ(g.VTokenStride(), 2u * 3 * 4);
  size_t expect = 0;
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(g.KOffset(l), expect);
    expect += 4 * g.KTokenStride();
    EXPECT_EQ(g.VOffset(l), expect);
    expect += 4 * g.VTokenStride();
  }
  EXPECT_EQ(expect, g.PageBytes());
  EXPECT_EQ(g.PageBytes(), 3u * 4 * 2 * 8 * 4);
}

TEST(PoolGeometry, ValidateNamesTheField) {
  PoolGeometry good;
  good.num_layers = 2;
  good.num_kv_heads = 2;
  good.k_head_dim = 4;
  good.v_head_dim = 4;
  good.page_size = 4;
  ASSERT_TRUE(good.Validate().ok());
  PoolGeometry empty = good;
  empty.num_layers = 0;
  EXPECT_TRUE(empty.Validate().ok());
  EXPECT_EQ(empty.PageBytes(), 0u);
  struct Case {
    const char* field;
    int PoolGeometry::*member;
  };
  for (const Case& c :
       {Case{"num_layers", &PoolGeometry::num_layers},
        Case{"num_kv_heads", &PoolGeometry::num_kv_heads},
        Case{"k_head_dim", &PoolGeometry::k_head_dim},
        Case{"v_head_dim", &PoolGeometry::v_head_dim},
        Case{"page_size", &PoolGeometry::page_size}}) {
    for (int bad : {0, -1}) {
      // An empty pool (no layers: a model without SWA layers) is valid.
      if (bad == 0 && c.member == &PoolGeometry::num_layers) continue;
      PoolGeometry g = good;
      g.*c.member = bad;
      absl::Status s = g.Validate();
      ASSERT_FALSE(s.ok()) << c.field << "=" << bad;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(std::string(s.message()).find(c.field), std::string::npos)
          << "message does not name " << c.field << ": " << s;
    }
  }
}

KvShape SmallShape() {
  KvShape s;
  s.full_layers = 2;
  s.full_kv_heads = 2;
  s.full_k_head_dim = 6;
  s.full_v_head_dim = 4;
  s.swa_layers = 3;
  s.swa_kv_heads = 1;
  s.swa_k_head_dim = 8;
  s.swa_v_head_dim = 2;
  s.sliding_window = 8;
  s.page_size = 4;
  s.dtype = DType::kF16;
  return s;
}

TEST(KvShape, FullAndSwaGeometries) {
  KvShape s = SmallShape();
  ASSERT_TRUE(s.Validate().ok()) << s.Validate();
  PoolGeometry f = s.Full();
  EXPECT_EQ(f.kind, PoolKind::kFull);
  EXPECT_EQ(f.num_layers, 2);
  EXPECT_EQ(f.num_kv_heads, 2);
  EXPECT_EQ(f.k_head_dim, 6);
  EXPECT_EQ(f.v_head_dim, 4);
  EXPECT_EQ(f.dtype, DType::kF16);
  EXPECT_EQ(f.page_size, 4);
  EXPECT_EQ(f.PageBytes(), 2u * 4 * 2 * (6 + 4) * 2);
  PoolGeometry w = s.Swa();
  EXPECT_EQ(w.kind, PoolKind::kSwa);
  EXPECT_EQ(w.num_layers, 3);
  EXPECT_EQ(w.num_kv_heads, 1);
  EXPECT_EQ(w.k_head_dim, 8);
  EXPECT_EQ(w.v_head_dim, 2);
  EXPECT_EQ(w.dtype, DType::kF16);
  EXPECT_EQ(w.page_size, 4);
  EXPECT_EQ(w.PageBytes(), 3u * 4 * 1 * (8 + 2) * 2);
}

TEST(KvShape, ValidateRejectsNonPositiveCounts) {
  {
    KvShape s = SmallShape();
    s.page_size = 0;
    EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    KvShape s = SmallShape();
    s.sliding_window = 0;
    EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    KvShape s = SmallShape();
    s.full_kv_heads = 0;
    EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    KvShape s = SmallShape();
    s.swa_v_head_dim = -3;
    EXPECT_EQ(s.Validate().code(), absl::StatusCode::kInvalidArgument);
  }
}

// SizePools: swa_tokens = ratio * full_tokens and
// full_tokens * F + swa_tokens * S = budget, each rounded down to pages.
TEST(SizePools, ExactBudgetRatioOne) {
  KvShape s = KvShape::MiMoV25Pro();
  const int64_t budget =
      1000 * static_cast<int64_t>(kMiMoFullPageBytes + kMiMoSwaPageBytes);
  absl::StatusOr<PoolSizes> sizes = SizePools(s, budget, 1.0);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->full_pages, 1000);
  EXPECT_EQ(sizes->swa_pages, 1000);
  EXPECT_EQ(sizes->bytes, budget);
}

TEST(SizePools, ExactBudgetRatioHalf) {
  KvShape s = KvShape::MiMoV25Pro();
  // Per full token: F + 0.5 S = 51200 + 153600 = 204800 bytes.
  const int64_t budget = int64_t{204800} * 16 * 1000;
  absl::StatusOr<PoolSizes> sizes = SizePools(s, budget, 0.5);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->full_pages, 1000);
  EXPECT_EQ(sizes->swa_pages, 500);
  EXPECT_EQ(sizes->bytes, 1000 * int64_t{819200} + 500 * int64_t{4915200});
  EXPECT_EQ(sizes->bytes, budget);
}

TEST(SizePools, RoundsBothPoolsDownToPages) {
  KvShape s = KvShape::MiMoV25Pro();
  // Ratio 4: per full token F + 4 S = 51200 + 1228800 = 1280000 bytes.
  // budget = 175 full tokens' worth -> full_tokens = 175 (10.94 pages -> 10),
  // swa_tokens = 700 (43.75 pages -> 43).
  const int64_t budget = int64_t{1280000} * 175;
  absl::StatusOr<PoolSizes> sizes = SizePools(s, budget, 4.0);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->full_pages, 10);
  EXPECT_EQ(sizes->swa_pages, 43);
  EXPECT_EQ(sizes->bytes, 10 * int64_t{819200} + 43 * int64_t{4915200});
  EXPECT_LE(sizes->bytes, budget);
}

TEST(SizePools, JustBelowAPageBoundaryRoundsDown) {
  KvShape s = KvShape::MiMoV25Pro();
  const int64_t per_pair = kMiMoFullPageBytes + kMiMoSwaPageBytes;
  absl::StatusOr<PoolSizes> sizes = SizePools(s, 7 * per_pair - 1, 1.0);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->full_pages, 6);
  EXPECT_EQ(sizes->swa_pages, 6);
  EXPECT_EQ(sizes->bytes, 6 * per_pair);
}

TEST(SizePools, RandomBudgetsStayWithinBudgetAndLoseLessThanAPagePerPool) {
  KvShape s = SmallShape();
  ASSERT_TRUE(s.Validate().ok());
  const int64_t fpb = s.Full().PageBytes();
  const int64_t spb = s.Swa().PageBytes();
  const double f = s.Full().TokenBytes();
  const double w = s.Swa().TokenBytes();
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const int64_t budget = std::uniform_int_distribution<int64_t>(
        fpb + 8 * spb, int64_t{1} << 30)(rng);
    const double ratio = std::uniform_real_distribution<double>(0.05, 16)(rng);
    SCOPED_TRACE(::testing::Message() << "budget=" << budget << " ratio=" << ratio);
    absl::StatusOr<PoolSizes> sizes = SizePools(s, budget, ratio);
    ASSERT_TRUE(sizes.ok()) << sizes.status();
    EXPECT_GE(sizes->full_pages, 0);
    EXPECT_GE(sizes->swa_pages, 0);
    EXPECT_EQ(sizes->bytes, sizes->full_pages * fpb + sizes->swa_pages * spb);
    EXPECT_LE(sizes->bytes, budget);
    // Each pool loses less than one page to rounding.
    const double full_tokens = budget / (f + ratio * w);
    const double swa_tokens = ratio * full_tokens;
    EXPECT_NEAR(static_cast<double>(sizes->full_pages),
                std::floor(full_tokens / s.page_size), 1.0);
    EXPECT_NEAR(static_cast<double>(sizes->swa_pages),
                std::floor(swa_tokens / s.page_size), 1.0);
    EXPECT_LT(budget - sizes->bytes, fpb + spb + 1);
  }
}

TEST(SizePools, Errors) {
  KvShape s = SmallShape();
  EXPECT_FALSE(SizePools(s, -1, 1.0).ok());
  EXPECT_FALSE(SizePools(s, 1 << 20, -1.0).ok());
  EXPECT_FALSE(
      SizePools(s, 1 << 20, std::numeric_limits<double>::quiet_NaN()).ok());
  EXPECT_FALSE(
      SizePools(s, 1 << 20, std::numeric_limits<double>::infinity()).ok());
  KvShape bad = s;
  bad.page_size = 0;
  absl::StatusOr<PoolSizes> sizes = SizePools(bad, 1 << 20, 1.0);
  ASSERT_FALSE(sizes.ok());
  EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInvalidArgument);
}

// MinBudgetForFullTokens: the least whole-MiB budget whose full pool holds
// the tokens (what `swaserve up` gives each bucket's workers, and what a
// worker's start-up check names). Checked against SizePools itself over
// shapes, ratios and token counts: the budget holds them, 1 MiB less does not.
TEST(MinBudgetForFullTokens, IsTheLeastWholeMiBThatHoldsTheTokens) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  KvShape small = KvShape::MiMoV25Pro();
  small.full_layers = 2;
  small.swa_layers = 10;
  small.full_kv_heads = small.swa_kv_heads = 2;
  small.full_k_head_dim = small.swa_k_head_dim = 32;
  small.full_v_head_dim = small.swa_v_head_dim = 32;
  for (const KvShape& s : {KvShape::MiMoV25Pro(), small}) {
    for (double ratio : {0.02, 0.25, 1.0}) {
      for (int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{17}, int64_t{65536},
                             int64_t{262144}, int64_t{1048576}}) {
        absl::StatusOr<int64_t> budget = MinBudgetForFullTokens(s, tokens, ratio);
        ASSERT_TRUE(budget.ok()) << budget.status();
        EXPECT_EQ(*budget % kMiB, 0);
        absl::StatusOr<PoolSizes> sizes = SizePools(s, *budget, ratio);
        ASSERT_TRUE(sizes.ok()) << sizes.status();
        EXPECT_GE(sizes->full_pages * s.page_size, tokens) << ratio << " " << tokens;
        if (*budget > kMiB) {
          absl::StatusOr<PoolSizes> less = SizePools(s, *budget - kMiB, ratio);
          EXPECT_TRUE(!less.ok() || less->full_pages * s.page_size < tokens)
              << "not the least: " << ratio << " " << tokens;
        }
      }
    }
  }
  // MiMo-V2.5-Pro at the default ratio 0.25: 128,000 bytes per full token,
  // so a 1M-token prompt needs 128,000 MiB.
  absl::StatusOr<int64_t> pro = MinBudgetForFullTokens(KvShape::MiMoV25Pro(), 1048576, 0.25);
  ASSERT_TRUE(pro.ok());
  EXPECT_EQ(*pro / kMiB, 128000);
}

TEST(MinBudgetForFullTokens, AlsoHoldsTheSwaTokensAsked) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  const KvShape s = KvShape::MiMoV25Pro();
  // 64 full tokens at ratio 0.02 would give no SWA page at all; asking for a
  // prefill step's 656 SWA tokens (chunk 512 + W 128 + a page) sizes by them.
  absl::StatusOr<int64_t> budget = MinBudgetForFullTokens(s, 64, 0.02, 656);
  ASSERT_TRUE(budget.ok()) << budget.status();
  absl::StatusOr<PoolSizes> sizes = SizePools(s, *budget, 0.02);
  ASSERT_TRUE(sizes.ok());
  EXPECT_GE(sizes->swa_pages * s.page_size, 656);
  absl::StatusOr<PoolSizes> less = SizePools(s, *budget - kMiB, 0.02);
  EXPECT_TRUE(!less.ok() || less->swa_pages * s.page_size < 656);
  EXPECT_FALSE(MinBudgetForFullTokens(s, 64, 0.02, -1).ok());
}

TEST(MinBudgetForFullTokens, RejectsBadInput) {
  EXPECT_EQ(MinBudgetForFullTokens(KvShape::MiMoV25Pro(), 0, 0.25).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MinBudgetForFullTokens(KvShape::MiMoV25Pro(), 16, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  KvShape bad = KvShape::MiMoV25Pro();
  bad.page_size = 0;
  EXPECT_EQ(MinBudgetForFullTokens(bad, 16, 0.25).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::kv
