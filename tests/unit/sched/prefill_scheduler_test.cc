#include "lib/sched/prefill_scheduler.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::sched {
namespace {

using Policy = PrefillSchedulerOptions::Policy;
using ::testing::ElementsAre;

constexpr int64_t kSec = 1'000'000'000;

std::unique_ptr<PrefillScheduler> Make(PrefillSchedulerOptions o) {
  auto s = PrefillScheduler::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

PrefillRequestInfo Req(std::string id, int prompt, int cached = 0,
                       int64_t arrival_ns = 0) {
  return {std::move(id), prompt, cached, arrival_ns};
}

// Ids of the chunks of `step`, in order.
std::vector<std::string> Ids(const PrefillStep& step) {
  std::vector<std::string> ids;
  for (const PrefillChunk& c : step.chunks) ids.push_back(c.id);
  return ids;
}

// Ids in the order requests start when one request runs per step and every
// request fits in one chunk.
std::vector<std::string> StartOrder(PrefillScheduler& s, int64_t now_ns) {
  std::vector<std::string> order;
  for (PrefillStep step = s.NextStep(now_ns); !step.empty();
       step = s.NextStep(now_ns)) {
    for (const PrefillChunk& c : step.chunks) {
      if (c.first) order.push_back(c.id);
    }
  }
  return order;
}

PrefillSchedulerOptions OnePerStep(Policy policy, double aging = 0) {
  PrefillSchedulerOptions o;
  o.policy = policy;
  o.aging_tokens_per_second = aging;
  o.chunk_tokens = 1 << 20;
  o.step_token_budget = 1 << 20;
  o.max_requests_per_step = 1;
  return o;
}

TEST(PrefillSchedulerTest, CreateRejectsBadOptions) {
  PrefillSchedulerOptions o;
  o.chunk_tokens = 0;
  EXPECT_EQ(PrefillScheduler::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = {};
  o.step_token_budget = -1;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o = {};
  o.max_requests_per_step = 0;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o = {};
  o.max_partial_requests = 0;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o = {};
  o.max_refusals_per_step = 0;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o = {};
  o.aging_tokens_per_second = -1;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o.aging_tokens_per_second = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o.aging_tokens_per_second = std::nan("");
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o = {};
  o.refusal_block_after_seconds = -1;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o.refusal_block_after_seconds = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(PrefillScheduler::Create(o).ok());
}

TEST(PrefillSchedulerTest, AddValidates) {
  auto s = Make({});
  EXPECT_EQ(s->Add(Req("", 10)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Add(Req("a", 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Add(Req("a", 10, -1)).code(),
            absl::StatusCode::kInvalidArgument);
  // The last prompt token is always computed.
  EXPECT_EQ(s->Add(Req("a", 10, 10)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->Add(Req("a", 10, 9)).ok());
  EXPECT_EQ(s->Add(Req("a", 20)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->queued_requests(), 1);
  EXPECT_EQ(s->queued_uncached_tokens(), 1);
}

TEST(PrefillSchedulerTest, ComputeAwareOrdersByUncachedTokens) {
  auto s = Make(OnePerStep(Policy::kComputeAware));
  ASSERT_TRUE(s->Add(Req("long", 3000)).ok());
  ASSERT_TRUE(s->Add(Req("mostly-cached", 5000, 4900)).ok());  // 100 uncached
  ASSERT_TRUE(s->Add(Req("mid", 800)).ok());
  ASSERT_TRUE(s->Add(Req("short", 50)).ok());
  EXPECT_THAT(StartOrder(*s, 0),
              ElementsAre("short", "mostly-cached", "mid", "long"));
}

// Equal arrival times: the earlier Add() first (not the id order), so that
// the guard's shadow, given the same calls under other ids, agrees.
TEST(PrefillSchedulerTest, FcfsOrdersByArrivalThenAddOrder) {
  auto s = Make(OnePerStep(Policy::kFcfs));
  ASSERT_TRUE(s->Add(Req("b", 50, 0, 2)).ok());
  ASSERT_TRUE(s->Add(Req("c", 9000, 0, 1)).ok());
  ASSERT_TRUE(s->Add(Req("a", 10, 0, 2)).ok());
  ASSERT_TRUE(s->Add(Req("d", 1, 0, 3)).ok());
  EXPECT_THAT(StartOrder(*s, 10), ElementsAre("c", "b", "a", "d"));
}

TEST(PrefillSchedulerTest, ComputeAwareTiesGoToEarlierArrivalThenAddOrder) {
  auto s = Make(OnePerStep(Policy::kComputeAware, /*aging=*/0));
  ASSERT_TRUE(s->Add(Req("z", 100, 0, 5)).ok());
  ASSERT_TRUE(s->Add(Req("y", 100, 0, 5)).ok());
  ASSERT_TRUE(s->Add(Req("x", 100, 0, 7)).ok());
  ASSERT_TRUE(s->Add(Req("w", 100, 0, 1)).ok());
  EXPECT_THAT(StartOrder(*s, 10), ElementsAre("w", "z", "y", "x"));
}

// priority = uncached - aging * wait: with aging 500 tokens/s a 1000-token
// request that has waited 2 s ties with a fresh 0-token one; a request
// arriving later than t + (1000 - 100) / 500 = 1.8 s cannot overtake it.
TEST(PrefillSchedulerTest, AgingLetsAWaitingLongRequestGoFirst) {
  {
    auto s = Make(OnePerStep(Policy::kComputeAware, 500));
    ASSERT_TRUE(s->Add(Req("long", 1000, 0, 0)).ok());
    ASSERT_TRUE(s->Add(Req("short", 100, 0, 1700 * kSec / 1000)).ok());
    EXPECT_THAT(StartOrder(*s, 2 * kSec), ElementsAre("short", "long"));
  }
  {
    auto s = Make(OnePerStep(Policy::kComputeAware, 500));
    ASSERT_TRUE(s->Add(Req("long", 1000, 0, 0)).ok());
    ASSERT_TRUE(s->Add(Req("short", 100, 0, 1900 * kSec / 1000)).ok());
    EXPECT_THAT(StartOrder(*s, 2 * kSec), ElementsAre("long", "short"));
  }
  {
    // Without aging the short one always wins.
    auto s = Make(OnePerStep(Policy::kComputeAware, 0));
    ASSERT_TRUE(s->Add(Req("long", 1000, 0, 0)).ok());
    ASSERT_TRUE(s->Add(Req("short", 100, 0, 1000 * kSec)).ok());
    EXPECT_THAT(StartOrder(*s, 1001 * kSec), ElementsAre("short", "long"));
  }
}

TEST(PrefillSchedulerTest, ChunksCoverThePromptOnceInOrder) {
  PrefillSchedulerOptions o;
  o.chunk_tokens = 512;
  o.step_token_budget = 2048;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("a", 1600, 100)).ok());  // 1500 uncached
  PrefillStep st = s->NextStep(0);
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].start_token, 100);
  EXPECT_EQ(st.chunks[0].num_tokens, 512);
  EXPECT_TRUE(st.chunks[0].first);
  EXPECT_FALSE(st.chunks[0].last);
  EXPECT_EQ(s->in_progress_requests(), 1);
  EXPECT_EQ(s->queued_requests(), 0);
  EXPECT_EQ(s->queued_uncached_tokens(), 988);
  st = s->NextStep(0);
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].start_token, 612);
  EXPECT_EQ(st.chunks[0].num_tokens, 512);
  EXPECT_FALSE(st.chunks[0].first);
  EXPECT_FALSE(st.chunks[0].last);
  st = s->NextStep(0);
  ASSERT_EQ(st.chunks.size(), 1u);
  EXPECT_EQ(st.chunks[0].start_token, 1124);
  EXPECT_EQ(st.chunks[0].num_tokens, 476);
  EXPECT_TRUE(st.chunks[0].last);
  EXPECT_FALSE(s->Contains("a"));
  EXPECT_EQ(s->queued_uncached_tokens(), 0);
  EXPECT_TRUE(s->NextStep(0).empty());
}

TEST(PrefillSchedulerTest, BudgetIsSharedAndInProgressContinuesFirst) {
  PrefillSchedulerOptions o;
  o.policy = Policy::kFcfs;
  o.chunk_tokens = 512;
  o.step_token_budget = 1000;
  o.max_partial_requests = 3;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("a", 600, 0, 1)).ok());
  ASSERT_TRUE(s->Add(Req("b", 600, 0, 2)).ok());
  ASSERT_TRUE(s->Add(Req("c", 600, 0, 3)).ok());
  PrefillStep st = s->NextStep(0);
  EXPECT_THAT(Ids(st), ElementsAre("a", "b"));
  EXPECT_EQ(st.chunks[0].num_tokens, 512);
  EXPECT_EQ(st.chunks[1].num_tokens, 488);  // the budget's rest
  EXPECT_EQ(st.total_tokens(), 1000);
  st = s->NextStep(0);
  EXPECT_THAT(Ids(st), ElementsAre("a", "b", "c"));
  EXPECT_EQ(st.chunks[0].num_tokens, 88);
  EXPECT_TRUE(st.chunks[0].last);
  EXPECT_EQ(st.chunks[1].num_tokens, 112);
  EXPECT_EQ(st.chunks[1].start_token, 488);
  EXPECT_TRUE(st.chunks[1].last);
  EXPECT_EQ(st.chunks[2].num_tokens, 512);
  EXPECT_TRUE(st.chunks[2].first);
  st = s->NextStep(0);
  EXPECT_THAT(Ids(st), ElementsAre("c"));
  EXPECT_EQ(st.chunks[0].num_tokens, 88);
  EXPECT_TRUE(s->NextStep(0).empty());
}

// A short request arriving while a long one is in progress waits for the
// long one's chunk, not the other way round.
TEST(PrefillSchedulerTest, NewShortRequestJoinsAfterContinuingOnes) {
  PrefillSchedulerOptions o;
  o.chunk_tokens = 256;
  o.step_token_budget = 512;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("long", 5000)).ok());
  EXPECT_THAT(Ids(s->NextStep(0)), ElementsAre("long"));
  ASSERT_TRUE(s->Add(Req("short", 10, 0, 1)).ok());
  PrefillStep st = s->NextStep(2);
  EXPECT_THAT(Ids(st), ElementsAre("long", "short"));
  EXPECT_TRUE(st.chunks[1].first && st.chunks[1].last);
}

TEST(PrefillSchedulerTest, MaxRequestsPerStep) {
  PrefillSchedulerOptions o;
  o.max_requests_per_step = 3;
  auto s = Make(o);
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(s->Add(Req("r" + std::to_string(i), 5, 0, i)).ok());
  }
  EXPECT_EQ(s->NextStep(10).chunks.size(), 3u);
  EXPECT_EQ(s->NextStep(10).chunks.size(), 3u);
  EXPECT_EQ(s->NextStep(10).chunks.size(), 1u);
  EXPECT_TRUE(s->NextStep(10).empty());
}

TEST(PrefillSchedulerTest, RefusedRequestKeepsItsPlace) {
  auto s = Make(OnePerStep(Policy::kComputeAware));
  ASSERT_TRUE(s->Add(Req("a", 10, 0, 0)).ok());
  ASSERT_TRUE(s->Add(Req("b", 20, 0, 0)).ok());
  ASSERT_TRUE(s->Add(Req("c", 30, 0, 0)).ok());
  std::vector<std::string> asked;
  PrefillStep st = s->NextStep(0, [&](const PrefillRequestInfo& r) {
    asked.push_back(r.id);
    return r.id != "a";
  });
  EXPECT_THAT(asked, ElementsAre("a", "b"));
  EXPECT_THAT(Ids(st), ElementsAre("b"));
  // "a" fits now and is still ahead of "c".
  EXPECT_THAT(Ids(s->NextStep(0)), ElementsAre("a"));
  EXPECT_THAT(Ids(s->NextStep(0)), ElementsAre("c"));
}

TEST(PrefillSchedulerTest, CanStartIsNotAskedWithoutRoomInTheStep) {
  PrefillSchedulerOptions o;
  o.chunk_tokens = 100;
  o.step_token_budget = 100;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("a", 300, 0, 0)).ok());
  ASSERT_TRUE(s->Add(Req("b", 10, 0, 1)).ok());
  int asked = 0;
  auto count = [&](const PrefillRequestInfo&) { return ++asked, true; };
  EXPECT_THAT(Ids(s->NextStep(0, count)), ElementsAre("b", "a"));
  EXPECT_EQ(asked, 2);
  // "a" continues with the whole budget: nobody new is asked.
  ASSERT_TRUE(s->Add(Req("c", 10, 0, 2)).ok());
  EXPECT_THAT(Ids(s->NextStep(0, count)), ElementsAre("a"));
  EXPECT_EQ(asked, 2);
}

TEST(PrefillSchedulerTest, LongRefusedRequestBlocksTheOnesBehindIt) {
  PrefillSchedulerOptions o = OnePerStep(Policy::kFcfs);
  o.max_requests_per_step = 4;
  o.chunk_tokens = 100;
  o.refusal_block_after_seconds = 1.0;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("running", 1000, 0, 0)).ok());
  ASSERT_TRUE(s->NextStep(0).chunks.size() == 1);
  ASSERT_TRUE(s->Add(Req("big", 100, 0, 1)).ok());
  ASSERT_TRUE(s->Add(Req("small", 10, 0, 2)).ok());
  auto no_big = [](const PrefillRequestInfo& r) { return r.id != "big"; };
  // Waited < 1 s: skipped, "small" starts.
  EXPECT_THAT(Ids(s->NextStep(kSec / 2, no_big)),
              ElementsAre("running", "small"));
  ASSERT_TRUE(s->Add(Req("small2", 10, 0, 3)).ok());
  // Waited >= 1 s: nothing behind it starts; the one in progress continues.
  EXPECT_THAT(Ids(s->NextStep(kSec + 1, no_big)), ElementsAre("running"));
  EXPECT_THAT(Ids(s->NextStep(kSec + 2)),
              ElementsAre("running", "big", "small2"));
}

TEST(PrefillSchedulerTest, RefusalsPerStepAreBounded) {
  PrefillSchedulerOptions o;
  o.max_refusals_per_step = 5;
  o.refusal_block_after_seconds = std::numeric_limits<double>::infinity();
  auto s = Make(o);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(s->Add(Req("r" + std::to_string(i), 10 + i)).ok());
  }
  int asked = 0;
  EXPECT_TRUE(s->NextStep(100 * kSec, [&](const PrefillRequestInfo&) {
                 return ++asked, false;
               }).empty());
  EXPECT_EQ(asked, 5);
  EXPECT_EQ(s->queued_requests(), 20);
}

TEST(PrefillSchedulerTest, CancelQueuedAndMidPrefill) {
  PrefillSchedulerOptions o;
  o.chunk_tokens = 100;
  o.step_token_budget = 1000;
  o.max_partial_requests = 2;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("a", 350, 0, 0)).ok());
  ASSERT_TRUE(s->Add(Req("b", 400, 0, 1)).ok());
  ASSERT_TRUE(s->Add(Req("c", 50, 0, 2)).ok());
  ASSERT_TRUE(s->Add(Req("q", 500, 0, 3)).ok());
  EXPECT_TRUE(s->Cancel("q"));  // queued
  EXPECT_FALSE(s->Contains("q"));
  EXPECT_EQ(s->queued_requests(), 3);
  EXPECT_EQ(s->queued_uncached_tokens(), 800);
  EXPECT_THAT(Ids(s->NextStep(0)), ElementsAre("c", "a", "b"));
  EXPECT_FALSE(s->Cancel("c"));  // its last chunk was handed out
  EXPECT_TRUE(s->Cancel("a"));   // mid-prefill
  EXPECT_FALSE(s->Cancel("a"));
  EXPECT_EQ(s->in_progress_requests(), 1);
  EXPECT_EQ(s->queued_uncached_tokens(), 300);
  EXPECT_THAT(Ids(s->NextStep(0)), ElementsAre("b"));
  EXPECT_THAT(Ids(s->NextStep(0)), ElementsAre("b"));
  PrefillStep last = s->NextStep(0);
  EXPECT_THAT(Ids(last), ElementsAre("b"));
  EXPECT_TRUE(last.chunks[0].last);
  EXPECT_TRUE(s->NextStep(0).empty());
  // The id may be reused once the request left.
  EXPECT_TRUE(s->Add(Req("a", 10)).ok());
}

// With max_partial_requests = 1 a second long prompt waits for the first to
// finish, while prompts that complete within the step keep starting.
TEST(PrefillSchedulerTest, PartialRequestCap) {
  PrefillSchedulerOptions o;
  o.policy = Policy::kFcfs;
  o.chunk_tokens = 100;
  o.step_token_budget = 400;
  o.max_partial_requests = 1;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("long1", 250, 0, 0)).ok());
  ASSERT_TRUE(s->Add(Req("long2", 300, 0, 1)).ok());
  ASSERT_TRUE(s->Add(Req("short", 100, 0, 2)).ok());
  std::vector<std::string> asked;
  auto log = [&](const PrefillRequestInfo& r) {
    asked.push_back(r.id);
    return true;
  };
  // long2 is skipped without asking can_start; short fits in one chunk.
  EXPECT_THAT(Ids(s->NextStep(0, log)), ElementsAre("long1", "short"));
  EXPECT_THAT(asked, ElementsAre("long1", "short"));
  EXPECT_EQ(s->in_progress_requests(), 1);
  EXPECT_THAT(Ids(s->NextStep(0, log)), ElementsAre("long1"));
  // long1's last chunk frees the slot within the step: long2 starts.
  PrefillStep st = s->NextStep(0, log);
  EXPECT_THAT(Ids(st), ElementsAre("long1", "long2"));
  EXPECT_TRUE(st.chunks[0].last);
  EXPECT_EQ(st.chunks[0].num_tokens, 50);
  EXPECT_TRUE(st.chunks[1].first);
  // A prompt longer than one chunk waits while the slot is taken.
  ASSERT_TRUE(s->Add(Req("mid", 150, 0, 3)).ok());
  st = s->NextStep(0, log);  // long2: 100; mid would get 100 of 150
  EXPECT_THAT(Ids(st), ElementsAre("long2"));
}

TEST(PrefillSchedulerTest, OldestWait) {
  auto s = Make({});
  EXPECT_FALSE(s->oldest_arrival_ns().has_value());
  EXPECT_EQ(s->OldestWaitNs(5), 0);
  ASSERT_TRUE(s->Add(Req("late", 10, 0, 7 * kSec)).ok());
  ASSERT_TRUE(s->Add(Req("early", 5000, 0, 2 * kSec)).ok());
  EXPECT_EQ(*s->oldest_arrival_ns(), 2 * kSec);
  EXPECT_EQ(s->OldestWaitNs(10 * kSec), 8 * kSec);
  EXPECT_EQ(s->OldestWaitNs(0), 0);
  s->NextStep(10 * kSec);  // starts both (default budget)
  EXPECT_FALSE(s->oldest_arrival_ns().has_value());
}

// The FCFS-wait guard: a long prompt that FCFS would start at once is not
// passed over indefinitely by a stream of short ones, even without aging;
// without the guard (and aging) it waits as long as the stream lasts.
// Returns the step in which "long" started (1-based), 0 if not in 20 steps.
int LongStartStep(double ratio) {
  PrefillSchedulerOptions o;
  o.policy = Policy::kComputeAware;
  o.aging_tokens_per_second = 0;
  o.fcfs_wait_ratio = ratio;
  o.chunk_tokens = 512;
  o.step_token_budget = 1024;
  o.max_partial_requests = 1;
  auto s = Make(o);
  EXPECT_TRUE(s->Add(Req("long", 4000, 0, 0)).ok());
  for (int step = 1; step <= 20; ++step) {
    // 4 x 256 short tokens per step: exactly the step budget.
    for (int k = 0; k < 4; ++k) {
      EXPECT_TRUE(s->Add(Req(absl::StrCat("s", step, "-", k), 256, 0, step)).ok());
    }
    for (const PrefillChunk& c : s->NextStep(step).chunks) {
      if (c.id == "long" && c.first) return step;
    }
  }
  return 0;
}

TEST(PrefillSchedulerTest, FcfsWaitGuardStartsAPassedOverLongPrompt) {
  // FCFS starts it in step 1 (wait 0, floor one step = 1,024 tokens): with
  // ratio 1.6 it must start before 1,638 tokens have been handed out. Step 1
  // hands out 1,024 short tokens (still within its deadline), step 2 two
  // more short prompts and then it.
  EXPECT_EQ(LongStartStep(1.6), 2);
  EXPECT_EQ(LongStartStep(0), 0);  // guard off: starved by the stream
}

// One chunk per step, so a request in progress holds the step: a request
// whose deadline falls before the next step starts takes the step instead
// (the in-progress one pauses), and its deadline counts from its arrival,
// during the step in flight, not from that step's end.
TEST(PrefillSchedulerTest, FcfsWaitGuardDueRequestTakesTheStepFromOneInProgress) {
  PrefillSchedulerOptions o = OnePerStep(Policy::kComputeAware);
  o.fcfs_wait_ratio = 1.7;
  o.chunk_tokens = o.step_token_budget = 100;
  o.max_partial_requests = 1;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("s0", 100, 0, 0)).ok());
  EXPECT_THAT(Ids(s->NextStep(0)), ElementsAre("s0"));  // step 1: work 0-100
  // Both arrive during step 1. FCFS starts "long" in step 2 (wait: the rest
  // of step 1), so it must start before 1.7 x 100 of work from arrival,
  // i.e. by work 170 - 100 = 70 past step 1's end: in step 2. Shortest-first
  // alone would start "short" there and keep "long" waiting behind it.
  ASSERT_TRUE(s->Add(Req("long", 1000, 0, 1)).ok());
  ASSERT_TRUE(s->Add(Req("short", 300, 0, 1)).ok());
  EXPECT_THAT(Ids(s->NextStep(2)), ElementsAre("long"));
  // "short" (FCFS: after all of "long", 10 steps) starts when "long" ends.
  std::vector<std::string> order;
  for (int step = 3; step < 20; ++step) {
    for (const PrefillChunk& c : s->NextStep(step).chunks) order.push_back(c.id);
  }
  EXPECT_THAT(order, ElementsAre("long", "long", "long", "long", "long", "long",
                                 "long", "long", "long", "short", "short", "short"));
  EXPECT_EQ(s->guarded_starts(), 1);

  // A request in progress pauses for a due one. "b" arrives first (FCFS
  // starts it at once: deadline 170); "a" (150 tokens) may go first, as its
  // 150 of work would leave "b" on time, but it takes two steps, and after
  // the first the next step would start at 200 > 170: "b" takes step 2.
  auto t = Make(o);
  ASSERT_TRUE(t->Add(Req("b", 1000, 0, 0)).ok());
  ASSERT_TRUE(t->Add(Req("a", 150, 0, 0)).ok());
  EXPECT_THAT(Ids(t->NextStep(0)), ElementsAre("a"));  // work 0-100
  EXPECT_THAT(Ids(t->NextStep(1)), ElementsAre("b"));
  EXPECT_THAT(Ids(t->NextStep(2)), ElementsAre("a"));  // in progress first
  // A request that would push "b" past its deadline may not go first.
  auto u = Make(o);
  ASSERT_TRUE(u->Add(Req("b", 1000, 0, 0)).ok());
  ASSERT_TRUE(u->Add(Req("a", 300, 0, 0)).ok());
  EXPECT_THAT(Ids(u->NextStep(0)), ElementsAre("b"));
}

TEST(PrefillSchedulerTest, FcfsWaitGuardOptionsAreValidated) {
  PrefillSchedulerOptions o;
  o.fcfs_wait_ratio = -1;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o.fcfs_wait_ratio = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o.fcfs_wait_ratio = 2;
  o.context_cost_per_token = -0.5;
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o.context_cost_per_token = std::nan("");
  EXPECT_FALSE(PrefillScheduler::Create(o).ok());
  o.context_cost_per_token = 1e-3;
  EXPECT_TRUE(PrefillScheduler::Create(o).ok());
}

// Work clock: a token at position s counts 1 + k * s; cancelled requests
// are forgotten by the shadow too (an id reused afterwards is accepted).
TEST(PrefillSchedulerTest, WorkClockWeighsContext) {
  PrefillSchedulerOptions o;
  o.context_cost_per_token = 0.01;
  o.chunk_tokens = 100;
  o.step_token_budget = 100;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Req("a", 200, 0, 0)).ok());
  s->NextStep(0);  // tokens [0, 100): 100 + 0.01 * 100 * 50 = 150
  EXPECT_DOUBLE_EQ(s->work_clock(), 150);
  s->NextStep(1);  // [100, 200): 100 + 0.01 * 100 * 150 = 250
  EXPECT_DOUBLE_EQ(s->work_clock(), 400);
  ASSERT_TRUE(s->Add(Req("b", 50, 0, 2)).ok());
  EXPECT_TRUE(s->Cancel("b"));
  ASSERT_TRUE(s->Add(Req("b", 50, 0, 3)).ok());
  EXPECT_EQ(Ids(s->NextStep(3)), std::vector<std::string>{"b"});
}

TEST(WindowRestoreTest, ChoosesTheCheaperStartByWork) {
  // Full KV to 10,000, window-safe to 2,000, restore from 9,000: restoring
  // computes 1,000 tokens instead of 8,000.
  WindowRestoreChoice c = ChooseWindowRestore(
      {.window_safe_tokens = 2000, .full_tokens = 10000, .restore_from = 9000});
  EXPECT_TRUE(c.restore);
  EXPECT_EQ(c.compute_from, 9000);
  EXPECT_DOUBLE_EQ(c.saved_work, 7000);
  // With attention cost the saving counts the keys too: [2000, 10000) at
  // 1 + k·pos per token minus [9000, 10000).
  c = ChooseWindowRestore({.window_safe_tokens = 2000, .full_tokens = 10000,
                           .restore_from = 9000, .context_cost_per_token = 1e-3});
  EXPECT_NEAR(c.saved_work, PrefillWork(1e-3, 2000, 8000) - PrefillWork(1e-3, 9000, 1000), 1e-6);
  EXPECT_GT(c.saved_work, 7000);
  // The margin: a restore that saves less than it is not taken.
  c = ChooseWindowRestore({.window_safe_tokens = 8990, .full_tokens = 10000,
                           .restore_from = 9000, .min_saved_work = 64});
  EXPECT_FALSE(c.restore);
  EXPECT_EQ(c.compute_from, 8990);
  // Nothing to restore: the restore start at or before the safe hit, or no
  // full-KV match beyond it.
  EXPECT_FALSE(ChooseWindowRestore({.window_safe_tokens = 500, .full_tokens = 10000,
                                    .restore_from = 400}).restore);
  EXPECT_FALSE(ChooseWindowRestore({.window_safe_tokens = 500, .full_tokens = 500,
                                    .restore_from = 0}).restore);
  // PrefillWork is chunking-invariant.
  EXPECT_NEAR(PrefillWork(2e-4, 100, 900), PrefillWork(2e-4, 100, 400) + PrefillWork(2e-4, 500, 500),
              1e-9);
}

}  // namespace
}  // namespace swaserve::sched

namespace swaserve::sched {
namespace {

PrefillRequestInfo Prio(std::string id, int prompt, int priority, int64_t arrival_ns) {
  return {.id = std::move(id), .prompt_tokens = prompt, .cached_tokens = 0,
          .arrival_ns = arrival_ns, .priority = priority};
}

// Request priority: lower values are tried first; the policy orders
// requests of one value.
TEST(PrefillSchedulerPriorityTest, LowerValuesStartFirstAndThePolicyOrdersEachValue) {
  for (Policy policy : {Policy::kFcfs, Policy::kComputeAware}) {
    PrefillSchedulerOptions o = OnePerStep(policy);
    o.fcfs_wait_ratio = 0;  // the guard is tested below
    auto s = Make(o);
    ASSERT_TRUE(s->Add(Prio("a", 100, 0, 0)).ok());
    ASSERT_TRUE(s->Add(Prio("b", 50, 1, 0)).ok());
    ASSERT_TRUE(s->Add(Prio("c", 500, -1, 1)).ok());
    ASSERT_TRUE(s->Add(Prio("d", 10, 0, 2)).ok());
    if (policy == Policy::kFcfs) {
      EXPECT_THAT(StartOrder(*s, 3), ElementsAre("c", "a", "d", "b"));
    } else {
      EXPECT_THAT(StartOrder(*s, 3), ElementsAre("c", "d", "a", "b"));
    }
  }
}

// Without priorities (all 0) the order is the policy's alone: the field's
// default changes nothing.
TEST(PrefillSchedulerPriorityTest, EqualPrioritiesKeepThePolicyOrder) {
  auto s = Make(OnePerStep(Policy::kComputeAware));
  ASSERT_TRUE(s->Add(Prio("a", 100, 7, 0)).ok());
  ASSERT_TRUE(s->Add(Prio("b", 50, 7, 0)).ok());
  ASSERT_TRUE(s->Add(Prio("c", 500, 7, 1)).ok());
  EXPECT_THAT(StartOrder(*s, 2), ElementsAre("b", "a", "c"));
}

// A request of a lower value that memory refuses does not block higher
// values from using the step (it keeps its place and starts when it fits).
TEST(PrefillSchedulerPriorityTest, ARefusedUrgentRequestKeepsItsPlace) {
  PrefillSchedulerOptions o = OnePerStep(Policy::kComputeAware);
  o.fcfs_wait_ratio = 0;
  auto s = Make(o);
  ASSERT_TRUE(s->Add(Prio("urgent", 1000, -5, 0)).ok());
  ASSERT_TRUE(s->Add(Prio("normal", 10, 0, 0)).ok());
  bool fits = false;
  auto can_start = [&](const PrefillRequestInfo& info) { return info.id != "urgent" || fits; };
  EXPECT_THAT(Ids(s->NextStep(1, can_start)), ElementsAre("normal"));
  ASSERT_TRUE(s->Add(Prio("later", 5, 0, 2)).ok());
  fits = true;
  EXPECT_THAT(Ids(s->NextStep(3, can_start)), ElementsAre("urgent"));
  EXPECT_THAT(Ids(s->NextStep(4, can_start)), ElementsAre("later"));
}

// With the FCFS-wait guard (the default) the shadow is priority-then-FCFS:
// a stream of urgent arrivals still goes first, and the low-priority
// request starts once the urgent ones are done.
TEST(PrefillSchedulerPriorityTest, TheGuardKeepsPriorityOrder) {
  auto s = Make(OnePerStep(Policy::kComputeAware));
  ASSERT_TRUE(s->Add(Prio("low", 10, 5, 0)).ok());
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(s->Add(Prio(absl::StrCat("u", i), 100, -1, i)).ok());
    for (const PrefillChunk& c : s->NextStep(i).chunks) order.push_back(c.id);
  }
  for (const PrefillChunk& c : s->NextStep(7).chunks) order.push_back(c.id);
  EXPECT_THAT(order, ElementsAre("u0", "u1", "u2", "u3", "u4", "u5", "low"));
}

}  // namespace
}  // namespace swaserve::sched
