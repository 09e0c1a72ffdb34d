#include "lib/base/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace swaserve::base {
namespace {

TEST(FakeClock, OnlyMovesWhenTold) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(101500));
  clock.SleepFor(absl::Seconds(2));  // sleeping advances instead of waiting
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(103500));
  clock.SetTime(absl::FromUnixSeconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(5));
}

TEST(FakeClock, ThreadSafeAdvance) {
  FakeClock clock(absl::UnixEpoch());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) clock.Advance(absl::Milliseconds(1));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Seconds(4));
}

TEST(RealClock, TracksWallTimeAndMonotonicIncreases) {
  absl::Time before = absl::Now();
  absl::Time now = Clock::Real()->Now();
  EXPECT_GE(now, before);
  EXPECT_LT(now - before, absl::Seconds(5));
  int64_t a = MonotonicNanos();
  Clock::Real()->SleepFor(absl::Milliseconds(2));
  int64_t b = MonotonicNanos();
  EXPECT_GE(b - a, 2'000'000);
}

}  // namespace
}  // namespace swaserve::base
