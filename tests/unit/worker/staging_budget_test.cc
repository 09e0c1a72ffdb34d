// StagingBudget: random acquire / cancel / release sequences against a
// model (FIFO queue of waiters, bytes in use), invariants after every step:
// in use never exceeds the capacity, grants come in arrival order, a
// cancelled waiter is never granted, and every byte comes back.
#include "lib/worker/staging_budget.h"

#include <deque>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace swaserve::worker {
namespace {

TEST(StagingBudget, GrantsAtOnceWhenItFitsAndReleasesOnDestruction) {
  StagingBudget b(100);
  std::unique_ptr<StagingBudget::Reservation> r;
  ASSERT_TRUE(b.Acquire("a", 60, [&](auto res) { r = std::move(res); }).ok());
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(b.in_use(), 60u);
  r.reset();
  EXPECT_EQ(b.in_use(), 0u);
}

TEST(StagingBudget, LargerThanTheBudgetIsAClearError) {
  StagingBudget b(size_t{8} << 20);
  absl::Status st = b.Acquire("big", size_t{9} << 20, [](auto) { FAIL(); });
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_NE(st.message().find("staging budget"), absl::string_view::npos) << st;
}

TEST(StagingBudget, WaitersAreGrantedInArrivalOrder) {
  StagingBudget b(100);
  std::vector<std::string> order;
  std::map<std::string, std::unique_ptr<StagingBudget::Reservation>> held;
  auto grant = [&](const std::string& k) {
    return [&, k](std::unique_ptr<StagingBudget::Reservation> r) {
      order.push_back(k);
      held[k] = std::move(r);
    };
  };
  ASSERT_TRUE(b.Acquire("a", 90, grant("a")).ok());
  ASSERT_TRUE(b.Acquire("big", 80, grant("big")).ok());  // waits
  ASSERT_TRUE(b.Acquire("small", 10, grant("small"))
                  .ok());  // fits, but waits behind big
  EXPECT_EQ(order, std::vector<std::string>{"a"});
  EXPECT_EQ(b.waiters(), 2);
  {
    std::unique_ptr<StagingBudget::Reservation> a = std::move(held["a"]);
    held.erase("a");
  }  // releasing `a` grants the waiters (they insert into `held`)
  EXPECT_EQ(order, (std::vector<std::string>{"a", "big", "small"}));
  EXPECT_EQ(b.in_use(), 90u);
}

TEST(StagingBudget, CancelledWaiterIsNeverGrantedAndUnblocksThoseBehind) {
  StagingBudget b(100);
  std::unique_ptr<StagingBudget::Reservation> a, c;
  ASSERT_TRUE(b.Acquire("a", 50, [&](auto r) { a = std::move(r); }).ok());
  ASSERT_TRUE(b.Acquire("big", 80, [&](auto) {
                 ADD_FAILURE() << "cancelled waiter granted";
               }).ok());
  ASSERT_TRUE(b.Acquire("c", 40, [&](auto r) { c = std::move(r); }).ok());
  EXPECT_EQ(c, nullptr);
  EXPECT_TRUE(b.Cancel("big"));
  ASSERT_NE(c, nullptr);  // behind the cancelled head, and it fits
  EXPECT_FALSE(b.Cancel("big"));
  EXPECT_EQ(b.waiting_bytes(), 0u);
}

TEST(StagingBudget, RandomSequencesKeepTheInvariants) {
  std::mt19937_64 rng(16);
  for (int round = 0; round < 50; ++round) {
    const size_t cap = 50 + rng() % 200;
    StagingBudget b(cap);
    std::map<int, std::unique_ptr<StagingBudget::Reservation>> held;
    std::deque<std::pair<int, size_t>> model_waiters;  // arrival order
    std::map<int, bool> cancelled;
    std::vector<int> granted_order, expected_order;
    size_t model_in_use = 0;
    int next = 0;
    auto model_grant = [&] {
      while (!model_waiters.empty() &&
             model_in_use + model_waiters.front().second <= cap) {
        expected_order.push_back(model_waiters.front().first);
        model_in_use += model_waiters.front().second;
        model_waiters.pop_front();
      }
    };
    for (int step = 0; step < 300; ++step) {
      const int op = static_cast<int>(rng() % 3);
      if (op == 0) {
        const int k = next++;
        const size_t bytes = 1 + rng() % cap;
        model_waiters.emplace_back(k, bytes);
        model_grant();
        ASSERT_TRUE(
            b.Acquire(std::to_string(k), bytes,
                      [&, k](std::unique_ptr<StagingBudget::Reservation> r) {
                        ASSERT_FALSE(cancelled[k]);
                        granted_order.push_back(k);
                        held[k] = std::move(r);
                      })
                .ok());
      } else if (op == 1 && !held.empty()) {
        auto it = held.begin();
        std::advance(it, rng() % held.size());
        model_in_use -= it->second->bytes();
        // Out of the map first: the release grants waiters, whose callbacks
        // insert into `held`.
        std::unique_ptr<StagingBudget::Reservation> r = std::move(it->second);
        held.erase(it);
        r.reset();
        model_grant();
      } else if (op == 2 && !model_waiters.empty()) {
        const size_t i = rng() % model_waiters.size();
        const int k = model_waiters[i].first;
        model_waiters.erase(model_waiters.begin() + static_cast<long>(i));
        cancelled[k] = true;
        model_grant();
        ASSERT_TRUE(b.Cancel(std::to_string(k)));
      }
      ASSERT_LE(b.in_use(), cap);
      ASSERT_EQ(b.in_use(), model_in_use);
      ASSERT_EQ(b.waiters(), static_cast<int>(model_waiters.size()));
      ASSERT_EQ(granted_order, expected_order);
    }
    // Releasing everything grants every waiter left, in arrival order.
    for (const auto& w : model_waiters) expected_order.push_back(w.first);
    while (!held.empty()) {
      std::map<int, std::unique_ptr<StagingBudget::Reservation>> batch;
      batch.swap(held);
    }  // each batch's release may grant waiters into `held`
    EXPECT_EQ(granted_order, expected_order);
    EXPECT_EQ(b.in_use(), 0u);
    EXPECT_EQ(b.waiters(), 0);
  }
}

}  // namespace
}  // namespace swaserve::worker
