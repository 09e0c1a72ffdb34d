#include "lib/base/thread_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace swaserve::base {
namespace {

TEST(ThreadPool, RunsEveryTaskOnWorkers) {
  std::atomic<int> count{0};
  {
    ThreadPool pool(3, "test");
    EXPECT_EQ(pool.num_threads(), 3);
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(pool.Schedule([&] { count.fetch_add(1); }));
    }
    pool.WaitIdle();
    EXPECT_EQ(count.load(), 1000);
    for (int i = 0; i < 100; ++i) pool.Schedule([&] { count.fetch_add(1); });
  }  // destructor drains the queue
  EXPECT_EQ(count.load(), 1100);
}

TEST(ThreadPool, TasksRunConcurrently) {
  ThreadPool pool(2);
  absl::Notification a_started, b_started;
  // Each task waits for the other: only completes if both run at once.
  pool.Schedule([&] {
    a_started.Notify();
    b_started.WaitForNotification();
  });
  pool.Schedule([&] {
    b_started.Notify();
    a_started.WaitForNotification();
  });
  pool.WaitIdle();
  EXPECT_TRUE(a_started.HasBeenNotified() && b_started.HasBeenNotified());
}

TEST(ThreadPool, TasksMayScheduleMoreTasks) {
  std::atomic<int> count{0};
  ThreadPool pool(2);
  pool.Schedule([&] {
    for (int i = 0; i < 10; ++i) pool.Schedule([&] { count.fetch_add(1); });
  });
  // WaitIdle may return between the outer and inner tasks only if the queue
  // is empty and nothing runs, which cannot happen while the outer one runs.
  pool.WaitIdle();
  EXPECT_EQ(count.load(), 10);
}

TEST(ThreadPool, DefaultSizeUsesHardware) {
  ThreadPool pool(0);
  EXPECT_GE(pool.num_threads(), 1);
}

}  // namespace
}  // namespace swaserve::base
