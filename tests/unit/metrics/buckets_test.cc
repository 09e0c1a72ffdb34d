#include "lib/metrics/buckets.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::metrics {
namespace {

using ::testing::ElementsAre;

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(BucketsTest, DefaultLatencyBucketsAreValidAndSpanMsToMinutes) {
  const std::vector<double> buckets = DefaultLatencyBuckets();
  ASSERT_FALSE(buckets.empty());
  EXPECT_DOUBLE_EQ(buckets.front(), 0.001);
  EXPECT_GE(buckets.back(), 60.0);
  absl::StatusOr<std::vector<double>> normalized = NormalizeBuckets(buckets);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(*normalized, buckets);
}

TEST(BucketsTest, Exponential) {
  absl::StatusOr<std::vector<double>> buckets = ExponentialBuckets(1, 2, 4);
  ASSERT_TRUE(buckets.ok());
  EXPECT_THAT(*buckets, ElementsAre(1, 2, 4, 8));
}

TEST(BucketsTest, ExponentialRejectsBadArguments) {
  EXPECT_FALSE(ExponentialBuckets(0, 2, 4).ok());
  EXPECT_FALSE(ExponentialBuckets(-1, 2, 4).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 1, 4).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 2, 0).ok());
  EXPECT_FALSE(ExponentialBuckets(NAN, 2, 3).ok());
  EXPECT_FALSE(ExponentialBuckets(1e300, 1e10, 3).ok());  // overflows
}

TEST(BucketsTest, LinearHasNoAccumulatedRoundingError) {
  absl::StatusOr<std::vector<double>> buckets = LinearBuckets(0, 0.1, 10);
  ASSERT_TRUE(buckets.ok());
  ASSERT_EQ(buckets->size(), 10u);
  EXPECT_EQ(buckets->front(), 0.0);
  EXPECT_EQ(buckets->back(), 9 * 0.1);
  EXPECT_THAT(*LinearBuckets(-1, 0.5, 3), ElementsAre(-1, -0.5, 0));
}

TEST(BucketsTest, LinearRejectsBadArguments) {
  EXPECT_FALSE(LinearBuckets(0, 0, 3).ok());
  EXPECT_FALSE(LinearBuckets(0, -1, 3).ok());
  EXPECT_FALSE(LinearBuckets(0, 1, 0).ok());
  EXPECT_FALSE(LinearBuckets(kInf, 1, 2).ok());
  EXPECT_FALSE(LinearBuckets(1e20, 1, 3).ok());  // width lost in rounding
}

TEST(BucketsTest, NormalizeDropsTrailingInfAndAcceptsEmpty) {
  EXPECT_THAT(*NormalizeBuckets({0.5, 1, kInf}), ElementsAre(0.5, 1));
  EXPECT_TRUE(NormalizeBuckets({})->empty());
  EXPECT_TRUE(NormalizeBuckets({kInf})->empty());
}

TEST(BucketsTest, NormalizeRejectsInvalid) {
  EXPECT_FALSE(NormalizeBuckets({1, 1}).ok());
  EXPECT_FALSE(NormalizeBuckets({2, 1}).ok());
  EXPECT_FALSE(NormalizeBuckets({NAN}).ok());
  EXPECT_FALSE(NormalizeBuckets({-kInf, 1}).ok());
  EXPECT_FALSE(NormalizeBuckets({1, kInf, 2}).ok());
  EXPECT_FALSE(NormalizeBuckets({kInf, kInf}).ok());
}

}  // namespace
}  // namespace swaserve::metrics
