// PlanKvPools: every bucket's prefill worker holds one prompt at its upper
// bound, the decode worker one of the largest bucket plus the headroom,
// none gets less than kv_mib; FlagValueOr reads the workers' extra flags.
#include "lib/launch/kv_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/kv/kv_shape.h"

namespace swaserve::launch {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t Holds(const kv::KvShape& shape, int64_t mib, double ratio) {
  absl::StatusOr<kv::PoolSizes> s = kv::SizePools(shape, mib * kMiB, ratio);
  return s.ok() ? s->full_pages * shape.page_size : -1;
}

// The demo model's KV shape (models/demo: 2 full + 10 SWA layers, bf16).
kv::KvShape DemoLike() {
  kv::KvShape s;
  s.full_layers = 2;
  s.swa_layers = 10 + 3;  // SWA layers + MTP layers share the SWA pool
  s.full_kv_heads = s.swa_kv_heads = 2;
  s.full_k_head_dim = s.swa_k_head_dim = 64;
  s.full_v_head_dim = s.swa_v_head_dim = 64;
  s.page_size = 16;
  s.dtype = kv::DType::kBF16;
  return s;
}

TEST(PlanKvPools, EveryBucketHoldsItsLargestPromptAndNoWorkerGetsLessThanKvMib) {
  for (const kv::KvShape& shape : {DemoLike(), kv::KvShape::MiMoV25Pro()}) {
    for (double ratio : {0.25, 0.02}) {
      KvPlanOptions o{.shape = shape,
                      .swa_full_ratio = ratio,
                      .bucket_bounds = {65536, 262144, 1048576},
                      .min_mib = 256};
      absl::StatusOr<KvPlan> plan = PlanKvPools(o);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->prefill_mib.size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        const int64_t hi = o.bucket_bounds[i];
        EXPECT_GE(plan->prefill_mib[i], 256);
        EXPECT_GE(plan->prefill_tokens[i], hi) << i;
        EXPECT_EQ(plan->prefill_tokens[i], Holds(shape, plan->prefill_mib[i], ratio));
        // The least that holds it, unless kv_mib is more.
        if (plan->prefill_mib[i] > 256) {
          EXPECT_LT(Holds(shape, plan->prefill_mib[i] - 1, ratio), hi) << i;
        }
      }
      EXPECT_GE(plan->decode_tokens, 1048576 + kDecodeHeadroomTokens);
      EXPECT_EQ(plan->decode_tokens, Holds(shape, plan->decode_mib, ratio));
      EXPECT_EQ(plan->TotalMib(2), plan->prefill_mib[0] + plan->prefill_mib[1] +
                                       plan->prefill_mib[2] + 2 * plan->decode_mib);
    }
  }
  // MiMo-V2.5-Pro at ratio 0.25: 128,000 bytes per token, so bucket 0 needs
  // 65,536 x 128,000 B = 8,000 MiB, far above the 256 MiB floor.
  absl::StatusOr<KvPlan> pro = PlanKvPools({.shape = kv::KvShape::MiMoV25Pro(),
                                            .bucket_bounds = {65536},
                                            .min_mib = 256});
  ASSERT_TRUE(pro.ok());
  EXPECT_EQ(pro->prefill_mib[0], 8000);
}

TEST(PlanKvPools, KvMibWinsWhereItIsMoreAndAloneWithoutFitting) {
  const kv::KvShape shape = DemoLike();
  absl::StatusOr<KvPlan> fit = PlanKvPools({.shape = shape,
                                            .bucket_bounds = {1024, 1048576},
                                            .min_mib = 64});
  ASSERT_TRUE(fit.ok());
  EXPECT_EQ(fit->prefill_mib[0], 64);  // 1,024 tokens need far less
  EXPECT_GT(fit->prefill_mib[1], 64);
  absl::StatusOr<KvPlan> fixed = PlanKvPools({.shape = shape,
                                              .bucket_bounds = {1024, 1048576},
                                              .min_mib = 64,
                                              .fit_buckets = false});
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->prefill_mib, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(fixed->decode_mib, 64);
  EXPECT_LT(fixed->prefill_tokens[1], 1048576);  // what the worker check refuses
  EXPECT_NE(fit->Describe(1).find("prefill-1 "), std::string::npos) << fit->Describe(1);
}

TEST(PlanKvPools, AnExplicitWorkerPoolIsReportedAsIs) {
  const kv::KvShape shape = DemoLike();
  absl::StatusOr<KvPlan> plan = PlanKvPools({.shape = shape,
                                             .bucket_bounds = {1024, 1048576},
                                             .min_mib = 64,
                                             .prefill_mib_set = 100,
                                             .decode_mib_set = 300});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->prefill_mib, (std::vector<int64_t>{100, 100}));
  EXPECT_EQ(plan->prefill_tokens[1], Holds(shape, 100, 0.25));
  EXPECT_EQ(plan->decode_mib, 300);
  EXPECT_EQ(plan->decode_tokens, Holds(shape, 300, 0.25));
  EXPECT_NE(plan->Describe(1).find("prefill-1 100 MiB"), std::string::npos) << plan->Describe(1);
  EXPECT_EQ(plan->TotalMib(2), 100 + 100 + 2 * 300);  // no L2
}

TEST(PlanKvPools, ThePrefillWorkersL2TiersCountInTheTotal) {
  absl::StatusOr<KvPlan> plan = PlanKvPools({.shape = DemoLike(),
                                             .bucket_bounds = {1024, 4096},
                                             .min_mib = 64,
                                             .fit_buckets = false,
                                             .l2_ratio = 2});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->prefill_l2_mib, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(plan->TotalMib(1), 64 * 2 + 64 + 128 * 2);  // 2 prefill + decode + L2s
  EXPECT_NE(plan->Describe(1).find("prefill-0 64 MiB ("), std::string::npos) << plan->Describe(1);
  EXPECT_NE(plan->Describe(1).find(" + L2 128 MiB"), std::string::npos) << plan->Describe(1);
}

TEST(PlanKvPools, EveryPoolHoldsAPrefillStepsSwaTokens) {
  absl::StatusOr<KvPlan> plan = PlanKvPools({.shape = DemoLike(),
                                             .swa_full_ratio = 0.25,
                                             .bucket_bounds = {256, 4096},
                                             .swa_tokens = 656,
                                             .min_mib = 1});
  ASSERT_TRUE(plan.ok());
  for (int64_t mib : {plan->prefill_mib[0], plan->prefill_mib[1], plan->decode_mib}) {
    absl::StatusOr<kv::PoolSizes> s = kv::SizePools(DemoLike(), mib * kMiB, 0.25);
    ASSERT_TRUE(s.ok());
    EXPECT_GE(s->swa_pages * 16, 656) << mib;
  }
}

TEST(PlanKvPools, Errors) {
  EXPECT_FALSE(PlanKvPools({.shape = DemoLike(), .bucket_bounds = {}}).ok());
  EXPECT_FALSE(PlanKvPools({.shape = DemoLike(), .bucket_bounds = {1024}, .min_mib = 0}).ok());
  EXPECT_FALSE(
      PlanKvPools({.shape = DemoLike(), .swa_full_ratio = 0, .bucket_bounds = {1024}}).ok());
}

// `swaserve up --workers.prefill.kv.prefill_mib=N` puts the flag among the
// prefill workers' extra flags, after the plan's own: the "KV pools" line
// must show N.
TEST(PlanKvPoolsForModel, TheWorkersExplicitPoolFlagsWin) {
  const std::string demo = SWASERVE_SOURCE_DIR "/models/demo";
  const std::vector<int64_t> buckets = {65536, 1048576};
  absl::StatusOr<KvPlan> fitted = PlanKvPoolsForModel(demo, buckets, 64, true, {}, {});
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_GT(fitted->prefill_mib[1], 300);
  absl::StatusOr<KvPlan> set = PlanKvPoolsForModel(
      demo, buckets, 64, true, std::vector<std::string>{"--kv.prefill_mib=300"},
      std::vector<std::string>{"--kv.decode_mib=500", "--kv.prefill_mib=9"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->prefill_mib, (std::vector<int64_t>{300, 300}));
  EXPECT_LT(set->prefill_tokens[1], fitted->prefill_tokens[1]);
  EXPECT_EQ(set->decode_mib, 500);
  // The worker default L2 (2x the pool) unless the flags say otherwise.
  EXPECT_EQ(set->prefill_l2_mib, (std::vector<int64_t>{600, 600}));
  absl::StatusOr<KvPlan> no_l2 = PlanKvPoolsForModel(
      demo, buckets, 64, true, std::vector<std::string>{"--kv.l2_ratio=0"}, {});
  ASSERT_TRUE(no_l2.ok()) << no_l2.status();
  EXPECT_EQ(no_l2->prefill_l2_mib, (std::vector<int64_t>{0, 0}));
}

TEST(FlagValueOr, TheLastValidFlagWins) {
  const std::vector<std::string> flags = {"--kv.swa_full_ratio=0.5", "--kv.page_size=32",
                                          "--kv.swa_full_ratio=0.1", "--kv.swa_full_ratio=x",
                                          "--kv.swa_full_ratio_other=9"};
  EXPECT_DOUBLE_EQ(FlagValueOr(flags, "kv.swa_full_ratio", 0.25), 0.1);
  EXPECT_DOUBLE_EQ(FlagValueOr(flags, "kv.page_size", 16), 32);
  EXPECT_DOUBLE_EQ(FlagValueOr(flags, "kv.prefill_mib", 7), 7);
}

}  // namespace
}  // namespace swaserve::launch
