#include "lib/sched/decode_scheduler.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::sched {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::unique_ptr<DecodeScheduler> Make(int max_batch = 64) {
  DecodeSchedulerOptions o;
  o.max_batch_size = max_batch;
  auto s = DecodeScheduler::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

// A pool of `pages` pages of 16 tokens; admission reserves ceil(ctx / 16).
struct FakePool {
  int free;
  absl::flat_hash_map<std::string, int> held;

  bool Admit(const DecodeRequestInfo& r) {
    const int need = (r.context_tokens + 15) / 16;
    if (need > free) return false;
    free -= need;
    held[r.id] = need;
    return true;
  }
  void Release(const std::string& id) {
    free += held[id];
    held.erase(id);
  }
};

DecodeIteration Next(DecodeScheduler& s, FakePool& pool, int64_t now = 0) {
  return s.NextIteration(
      now, [&](const DecodeRequestInfo& r) { return pool.Admit(r); });
}

DecodeIteration NextAll(DecodeScheduler& s, int64_t now = 0) {
  return s.NextIteration(now, [](const DecodeRequestInfo&) { return true; });
}

TEST(DecodeSchedulerTest, CreateAndStageValidate) {
  DecodeSchedulerOptions o;
  o.max_batch_size = 0;
  EXPECT_EQ(DecodeScheduler::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto s = Make();
  EXPECT_EQ(s->Stage({"", 10, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Stage({"a", 0, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->Stage({"a", 10, 0}).ok());
  EXPECT_EQ(s->Stage({"a", 10, 0}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->waiting_requests(), 1);
}

TEST(DecodeSchedulerTest, AdmitsInStagingOrderWhilePagesFit) {
  auto s = Make();
  FakePool pool{10, {}};
  ASSERT_TRUE(s->Stage({"a", 64, 0}).ok());  // 4 pages
  ASSERT_TRUE(s->Stage({"b", 80, 1}).ok());  // 5 pages
  ASSERT_TRUE(s->Stage({"c", 48, 2}).ok());  // 3 pages: does not fit
  ASSERT_TRUE(s->Stage({"d", 16, 3}).ok());  // 1 page: would fit, but FIFO
  DecodeIteration it = Next(*s, pool);
  EXPECT_THAT(it.admitted, ElementsAre("a", "b"));
  EXPECT_THAT(it.batch, ElementsAre("a", "b"));
  EXPECT_EQ(pool.free, 1);
  EXPECT_EQ(s->waiting_requests(), 2);
  // Nothing frees: nothing new, the batch runs on.
  it = Next(*s, pool);
  EXPECT_THAT(it.admitted, IsEmpty());
  EXPECT_THAT(it.batch, ElementsAre("a", "b"));
  // "a" finishes: its pages let "c" and then "d" in.
  ASSERT_TRUE(s->Finish("a").ok());
  pool.Release("a");
  it = Next(*s, pool);
  EXPECT_THAT(it.admitted, ElementsAre("c", "d"));
  EXPECT_THAT(it.batch, ElementsAre("b", "c", "d"));
  EXPECT_EQ(s->admitted_total(), 4u);
}

TEST(DecodeSchedulerTest, MaxBatchSize) {
  auto s = Make(/*max_batch=*/3);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s->Stage({"r" + std::to_string(i), 10, i}).ok());
  }
  DecodeIteration it = NextAll(*s);
  EXPECT_THAT(it.batch, ElementsAre("r0", "r1", "r2"));
  ASSERT_TRUE(s->Finish("r1").ok());
  it = NextAll(*s);
  EXPECT_THAT(it.admitted, ElementsAre("r3"));
  EXPECT_THAT(it.batch, ElementsAre("r0", "r2", "r3"));
  EXPECT_EQ(s->running_requests(), 3);
  EXPECT_EQ(s->waiting_requests(), 1);
}

TEST(DecodeSchedulerTest, PreemptsYoungestAndReadmitsInOriginalOrder) {
  auto s = Make();
  for (const char* id : {"a", "b", "c", "d"}) {
    ASSERT_TRUE(s->Stage({id, 10, 0}).ok());
  }
  EXPECT_THAT(NextAll(*s).batch, ElementsAre("a", "b", "c", "d"));
  ASSERT_TRUE(s->Stage({"fresh", 10, 5}).ok());
  // Two preemptions: youngest first.
  ASSERT_EQ(s->ChoosePreemptionVictim(), "d");
  ASSERT_TRUE(s->Preempt("d", 14, 6).ok());
  ASSERT_EQ(s->ChoosePreemptionVictim(), "c");
  ASSERT_TRUE(s->Preempt("c", 13, 6).ok());
  EXPECT_TRUE(s->IsWaiting("c"));
  EXPECT_FALSE(s->IsRunning("c"));
  EXPECT_EQ(s->preempted_total(), 2u);
  // Readmission: "c" then "d" (original order), before "fresh"; the context
  // grew by the generated tokens.
  std::vector<std::pair<std::string, int>> asked;
  DecodeIteration it = s->NextIteration(7, [&](const DecodeRequestInfo& r) {
    asked.push_back({r.id, r.context_tokens});
    return r.id != "fresh";
  });
  EXPECT_THAT(asked, ElementsAre(std::pair<std::string, int>("c", 13),
                                 std::pair<std::string, int>("d", 14),
                                 std::pair<std::string, int>("fresh", 10)));
  EXPECT_THAT(it.admitted, ElementsAre("c", "d"));
  EXPECT_THAT(it.batch, ElementsAre("a", "b", "c", "d"));
  // Readmitted requests keep their admission number: "d" is still the
  // youngest, and "fresh" (admitted now) becomes younger than all.
  EXPECT_EQ(s->ChoosePreemptionVictim(), "d");
  it = NextAll(*s);
  EXPECT_THAT(it.admitted, ElementsAre("fresh"));
  EXPECT_EQ(s->ChoosePreemptionVictim(), "fresh");
}

// Preempting an older request than the youngest (allowed, e.g. the worker
// evicts a specific one) still readmits by admission number.
TEST(DecodeSchedulerTest, PreemptedRequestsReadmitByAdmissionNumber) {
  auto s = Make();
  for (const char* id : {"a", "b", "c"})
    ASSERT_TRUE(s->Stage({id, 10, 0}).ok());
  NextAll(*s);
  ASSERT_TRUE(s->Preempt("a", 11, 1).ok());
  ASSERT_TRUE(s->Preempt("c", 11, 1).ok());
  ASSERT_TRUE(s->Preempt("b", 11, 1).ok());
  EXPECT_EQ(s->ChoosePreemptionVictim(), std::nullopt);
  EXPECT_THAT(NextAll(*s).admitted, ElementsAre("a", "b", "c"));
}

TEST(DecodeSchedulerTest, FinishPreemptCancelErrors) {
  auto s = Make();
  ASSERT_TRUE(s->Stage({"w", 10, 0}).ok());
  EXPECT_EQ(s->Finish("w").code(), absl::StatusCode::kNotFound);  // waiting
  EXPECT_EQ(s->Preempt("w", 10, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Finish("nope").code(), absl::StatusCode::kNotFound);
  NextAll(*s);
  EXPECT_EQ(s->Preempt("w", 0, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->Stage({"x", 10, 0}).ok());
  EXPECT_TRUE(s->Cancel("x"));  // waiting
  EXPECT_TRUE(s->Cancel("w"));  // running
  EXPECT_FALSE(s->Cancel("w"));
  EXPECT_EQ(s->waiting_requests(), 0);
  EXPECT_EQ(s->running_requests(), 0);
  EXPECT_THAT(NextAll(*s).batch, IsEmpty());
  // A cancelled id can be staged again.
  EXPECT_TRUE(s->Stage({"w", 10, 0}).ok());
}

TEST(DecodeSchedulerTest, CancelPreemptedRequest) {
  auto s = Make();
  ASSERT_TRUE(s->Stage({"a", 10, 0}).ok());
  ASSERT_TRUE(s->Stage({"b", 10, 0}).ok());
  NextAll(*s);
  ASSERT_TRUE(s->Preempt("b", 12, 1).ok());
  EXPECT_TRUE(s->Cancel("b"));
  EXPECT_THAT(NextAll(*s).batch, ElementsAre("a"));
}

}  // namespace
}  // namespace swaserve::sched
