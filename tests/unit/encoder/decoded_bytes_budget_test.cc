// DecodedBytesBudget (lib/encoder/decoded_bytes_budget.h): reservations up
// to the capacity, waiting in arrival order for room, ResourceExhausted
// after max_wait or for more than the whole capacity.
#include "lib/encoder/decoded_bytes_budget.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace swaserve::encoder {
namespace {

TEST(DecodedBytesBudget, ReservesUpToTheCapacityAndRefusesAfterWaiting) {
  DecodedBytesBudget budget({.capacity = 100, .max_wait = absl::Milliseconds(50)});
  auto a = budget.Acquire(60);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(budget.in_flight(), 60);
  const absl::Time start = absl::Now();
  auto b = budget.Acquire(50);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(b.status().message(),
                                "encoder busy: 60 bytes of decoded media in flight and 50 more"))
      << b.status();
  auto huge = budget.Acquire(101);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  {
    auto c = budget.Acquire(40);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(budget.in_flight(), 100);
  }
  EXPECT_EQ(budget.in_flight(), 60);
  *a = DecodedBytesBudget::Reservation();  // released
  EXPECT_EQ(budget.in_flight(), 0);
}

TEST(DecodedBytesBudget, WaitersGetRoomInArrivalOrder) {
  DecodedBytesBudget budget({.capacity = 100, .max_wait = absl::Seconds(10)});
  auto first = budget.Acquire(100);
  ASSERT_TRUE(first.ok());
  std::vector<int> order;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      auto r = budget.Acquire(60);
      ASSERT_TRUE(r.ok()) << r.status();
      {
        absl::MutexLock lock(&mu);
        order.push_back(i);
      }
      absl::SleepFor(absl::Milliseconds(5));
    });
    // Each one queued before the next starts.
    absl::SleepFor(absl::Milliseconds(30));
  }
  *first = DecodedBytesBudget::Reservation();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(budget.in_flight(), 0);
}

}  // namespace
}  // namespace swaserve::encoder
