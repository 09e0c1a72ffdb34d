#include "lib/base/timer_queue.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace swaserve::base {
namespace {

TEST(TimerQueue, RunsInDeadlineOrder) {
  TimerQueue q;
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification done;
  const absl::Time now = absl::Now();
  q.Schedule(now + absl::Milliseconds(60), [&] {
    absl::MutexLock l(&mu);
    order.push_back(3);
    done.Notify();
  });
  q.Schedule(now + absl::Milliseconds(20), [&] {
    absl::MutexLock l(&mu);
    order.push_back(1);
  });
  q.Schedule(now + absl::Milliseconds(40), [&] {
    absl::MutexLock l(&mu);
    order.push_back(2);
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::MutexLock l(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(TimerQueue, CancelledTimersNeverRun) {
  TimerQueue q;
  std::atomic<int> ran{0};
  const uint64_t id =
      q.Schedule(absl::Now() + absl::Milliseconds(50), [&] { ++ran; });
  EXPECT_TRUE(q.Cancel(id));
  EXPECT_FALSE(q.Cancel(id));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(ran.load(), 0);
}

TEST(TimerQueue, CancelAfterRunReturnsFalse) {
  TimerQueue q;
  absl::Notification ran;
  const uint64_t id = q.Schedule(absl::Now(), [&] { ran.Notify(); });
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_FALSE(q.Cancel(id));
}

}  // namespace
}  // namespace swaserve::base
