#include "lib/loadgen/stats.h"

#include <gtest/gtest.h>

#include <vector>

namespace swaserve::loadgen {
namespace {

TEST(Percentile, Interpolates) {
  const std::vector<double> x = {1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(Percentile(x, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(x, 50), 3);
  EXPECT_DOUBLE_EQ(Percentile(x, 100), 5);
  EXPECT_DOUBLE_EQ(Percentile(x, 90), 4.6);
  EXPECT_DOUBLE_EQ(Percentile(x, 25), 2);
  EXPECT_DOUBLE_EQ(Percentile(x, 12.5), 1.5);
  // Out-of-range q is clamped.
  EXPECT_DOUBLE_EQ(Percentile(x, -5), 1);
  EXPECT_DOUBLE_EQ(Percentile(x, 500), 5);
  EXPECT_DOUBLE_EQ(Percentile(std::vector<double>{}, 50), 0);
  EXPECT_DOUBLE_EQ(Percentile(std::vector<double>{7}, 99), 7);
}

TEST(Summarize, UnsortedInput) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // 100..1
  const Distribution d = Summarize(v);
  EXPECT_EQ(d.count, 100);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 100);
  EXPECT_DOUBLE_EQ(d.p50, 50.5);
  EXPECT_DOUBLE_EQ(d.p90, 90.1);
  EXPECT_DOUBLE_EQ(d.p99, 99.01);
}

TEST(Summarize, Empty) {
  const Distribution d = Summarize({});
  EXPECT_EQ(d.count, 0);
  EXPECT_EQ(d.mean, 0);
  EXPECT_EQ(d.p99, 0);
}

TEST(Summarize, MonotonePercentiles) {
  std::vector<double> v;
  uint64_t s = 1;
  for (int i = 0; i < 1000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v.push_back(static_cast<double>(s >> 40) / 1e3);
  }
  const Distribution d = Summarize(v);
  EXPECT_LE(d.min, d.p50);
  EXPECT_LE(d.p50, d.p90);
  EXPECT_LE(d.p90, d.p99);
  EXPECT_LE(d.p99, d.max);
}

}  // namespace
}  // namespace swaserve::loadgen
