#include "lib/metrics/instruments.h"

#include <cmath>
#include <latch>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::metrics {
namespace {

using ::testing::ElementsAre;

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(CounterTest, IncrementsAndIgnoresNegativeAndNaN) {
  Counter counter;
  EXPECT_EQ(counter.Value(), 0);
  counter.Increment();
  counter.Increment(2.5);
  counter.Increment(-1);
  counter.Increment(NAN);
  counter.Increment(0);
  EXPECT_DOUBLE_EQ(counter.Value(), 3.5);
}

TEST(GaugeTest, SetIncrementDecrement) {
  Gauge gauge;
  EXPECT_EQ(gauge.Value(), 0);
  gauge.Set(10);
  gauge.Increment();
  gauge.Increment(4);
  gauge.Decrement(2.5);
  gauge.Decrement();
  EXPECT_DOUBLE_EQ(gauge.Value(), 11.5);
  gauge.Set(-3);
  EXPECT_DOUBLE_EQ(gauge.Value(), -3);
}

TEST(HistogramTest, BucketsAreInclusiveUpperBounds) {
  Histogram histogram({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 2.0, 4.0, 5.0, 7.0, -3.0}) {
    histogram.Observe(v);
  }
  const HistogramSnapshot snapshot = histogram.Collect();
  // le=1: 0.5 1.0 -3; le=2: +1.5 2.0; le=5: +4 5; +Inf: +7
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(3, 5, 7, 8));
  EXPECT_EQ(snapshot.count, 8u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 0.5 + 1 + 1.5 + 2 + 4 + 5 + 7 - 3);
}

TEST(HistogramTest, InfinitiesAndNaN) {
  Histogram histogram({1});
  histogram.Observe(-kInf);
  histogram.Observe(NAN);  // ignored
  EXPECT_THAT(histogram.Collect().cumulative_counts, ElementsAre(1, 1));
  histogram.Observe(kInf);
  const HistogramSnapshot snapshot = histogram.Collect();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(1, 2));
  EXPECT_TRUE(std::isnan(snapshot.sum));  // -Inf + Inf
}

TEST(HistogramTest, NoFiniteBucketsHasOnlyInf) {
  Histogram histogram({});
  histogram.Observe(3);
  histogram.Observe(4);
  const HistogramSnapshot snapshot = histogram.Collect();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(2));
  EXPECT_EQ(snapshot.count, 2u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 7);
}

TEST(HistogramTest, ManyBucketsSpanSeveralCacheLines) {
  std::vector<double> bounds;
  for (int i = 1; i <= 40; ++i) bounds.push_back(i);
  Histogram histogram(bounds);
  for (int i = 0; i <= 41; ++i) histogram.Observe(i);
  const HistogramSnapshot snapshot = histogram.Collect();
  ASSERT_EQ(snapshot.cumulative_counts.size(), 41u);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(snapshot.cumulative_counts[i], static_cast<uint64_t>(i + 2)) << i;
  }
  EXPECT_EQ(snapshot.cumulative_counts[40], 42u);
}

TEST(HistogramTest, SanitizesInvalidBounds) {
  Histogram histogram({5, NAN, 1, kInf, 1, -kInf});
  EXPECT_THAT(histogram.bounds(), ElementsAre(1, 5));
}

// Short-lived threads give their shard back, so threads alive at the same
// time get distinct shards however many threads came and went before.
TEST(ShardTest, LiveThreadsGetDistinctShards) {
  const uint32_t main_shard = internal::ThisThreadShard();
  for (int i = 0; i < 3 * static_cast<int>(internal::kNumShards); ++i) {
    std::thread([] { internal::ThisThreadShard(); }).join();
  }
  constexpr int kLive = 4;
  std::latch assigned(kLive);
  std::latch release(1);
  std::vector<uint32_t> shards(kLive);
  std::vector<std::thread> threads;
  for (int t = 0; t < kLive; ++t) {
    threads.emplace_back([&, t] {
      shards[t] = internal::ThisThreadShard();
      EXPECT_EQ(internal::ThisThreadShard(), shards[t]);  // sticky
      assigned.count_down();
      release.wait();
    });
  }
  assigned.wait();
  release.count_down();
  for (std::thread& thread : threads) thread.join();
  std::set<uint32_t> distinct(shards.begin(), shards.end());
  distinct.insert(main_shard);
  EXPECT_EQ(distinct.size(), kLive + 1u);
  for (uint32_t shard : distinct) EXPECT_LT(shard, internal::kNumShards);
}

// Many threads update the same child: totals must be exact (no lost
// updates across shards or within a shared shard).
TEST(InstrumentsConcurrencyTest, TotalsAreExact) {
  constexpr int kThreads = 24;  // more than kNumShards: some share a shard
  constexpr int kPerThread = 20000;
  Counter counter;
  Gauge gauge;
  Histogram histogram({1, 10, 100});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        counter.Increment();
        counter.Increment(0.5);
        gauge.Increment(2);
        gauge.Decrement();
        histogram.Observe(static_cast<double>((i + t) % 4) * 10);  // 0..30
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  constexpr double kTotal = static_cast<double>(kThreads) * kPerThread;
  EXPECT_EQ(counter.Value(), kTotal * 1.5);
  EXPECT_EQ(gauge.Value(), kTotal);
  const HistogramSnapshot snapshot = histogram.Collect();
  constexpr uint64_t kN = static_cast<uint64_t>(kThreads) * kPerThread;
  EXPECT_EQ(snapshot.count, kN);
  // Values 0, 10, 20, 30 equally often: le=1 {0}, le=10 {0,10}, le=100 all.
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(kN / 4, kN / 2, kN, kN));
  EXPECT_EQ(snapshot.sum, kTotal / 4 * (0 + 10 + 20 + 30));
}

}  // namespace
}  // namespace swaserve::metrics
