// PrefillCore admission never deadlocks: queued requests hold
// their prefix hits locked, so with tiny pools the locked hits plus any one
// request's need can exceed the pool while nothing runs. The core must
// still make progress: every request finishes, or fails with a clear
// ResourceExhausted, and nothing is left locked or in use afterwards.
#include <algorithm>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "lib/kv/prefix_cache.h"
#include "lib/worker/prefill_core.h"
#include "tests/unit/worker/test_model.h"

namespace swaserve::worker {
namespace {

using testing::kPage;

class Admission {
 public:
  explicit Admission(int pages, int swa_pages = -1) {
    pools_ = testing::NewPools(pages, swa_pages < 0 ? pages : swa_pages);
    auto cache = kv::PrefixCache::Create({pools_.get(), nullptr});
    EXPECT_TRUE(cache.ok());
    cache_ = std::move(*cache);
    PrefillCoreOptions p;
    p.engine = &testing::TestEngine();
    p.pools = pools_.get();
    p.cache = cache_.get();
    p.scheduler.chunk_tokens = 16;
    p.scheduler.step_token_budget = 32;
    auto pc = PrefillCore::Create(p);
    EXPECT_TRUE(pc.ok()) << pc.status();
    core_ = std::move(*pc);
  }
  ~Admission() { core_->Stop(); }

  // Prefill only (no decode leg): what the admission test needs.
  absl::Status Submit(const std::string& id, std::vector<uint32_t> prompt, int priority = 0) {
    PrefillJob j;
    j.id = id;
    j.prompt = std::move(prompt);
    j.priority = priority;
    j.done = [this, id](absl::StatusOr<PrefillResult> r) {
      absl::MutexLock lock(&mu_);
      results_[id] = r.status();
      order_.push_back(id);
    };
    absl::Status st = core_->Submit(std::move(j));
    if (!st.ok()) {
      absl::MutexLock lock(&mu_);
      results_[id] = st;
    }
    return st;
  }
  // True when every submitted request ended within `timeout`.
  bool WaitAll(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [&] { return results_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  std::map<std::string, absl::Status> results() {
    absl::MutexLock lock(&mu_);
    return results_;
  }
  // Ids in the order their requests ended.
  std::vector<std::string> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }
  void CheckClean() {
    core_->Stop();
    EXPECT_EQ(pools_->full().num_in_use(), 0);
    EXPECT_EQ(pools_->full().num_reserved(), 0);
    EXPECT_EQ(pools_->swa().num_in_use(), 0);
    EXPECT_TRUE(cache_->CheckInvariants().ok());
  }
  PrefillCore& core() { return *core_; }

 private:
  std::unique_ptr<kv::KvPools> pools_;
  std::unique_ptr<kv::PrefixCache> cache_;
  std::unique_ptr<PrefillCore> core_;
  absl::Mutex mu_;
  std::map<std::string, absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
};

std::vector<uint32_t> Concat(std::vector<uint32_t> a,
                             const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The constructed case: four cached prompts of 5 pages each fill 20 of 24
// pages; four queued continuations lock all 20 and each needs 15 more.
// Without the breaker nothing could ever start.
TEST(PrefillAdmission, LockedQueuedHitsDoNotStallTheQueue) {
  // Whether the four continuations are accepted in one loop iteration (all
  // locking their hits before any starts) is up to thread timing: repeat
  // until the stall was reached, every attempt finishing everything.
  int64_t released = 0;
  for (int attempt = 0; attempt < 20 && released == 0; ++attempt) {
    Admission a(24);
    std::vector<std::vector<uint32_t>> bases;
    for (int i = 0; i < 4; ++i) {
      bases.push_back(testing::RandomPrompt(100 + i, 5 * kPage));
      ASSERT_TRUE(a.Submit("warm" + std::to_string(i), bases[i]).ok());
    }
    ASSERT_TRUE(a.WaitAll(4, absl::Seconds(60)));
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(a.Submit("q" + std::to_string(i),
                           Concat(bases[i], testing::RandomPrompt(200 + i, 60)))
                      .ok());
    }
    ASSERT_TRUE(a.WaitAll(8, absl::Seconds(120))) << "admission stalled";
    for (const auto& [id, st] : a.results())
      EXPECT_TRUE(st.ok()) << id << ": " << st;
    released += a.core().GetLoad().released_hits_total;
    a.CheckClean();
  }
  EXPECT_GT(released, 0) << "the test never reached the stalled state";
}

// Random workloads on tiny pools: shared bases (hits), random tails, bursts
// submitted together. Every request ends OK or with a clear error naming the
// pages; none is left waiting.
TEST(PrefillAdmission, RandomWorkloadsOnTinyPoolsAlwaysFinish) {
  std::mt19937 rng(20261201);
  int64_t released = 0;
  for (int round = 0; round < 12; ++round) {
    const int pages = 12 + static_cast<int>(rng() % 20);
    Admission a(pages);
    std::vector<std::vector<uint32_t>> bases;
    for (int b = 0; b < 4; ++b) {
      bases.push_back(testing::RandomPrompt(round * 10 + b,
                                            kPage * (1 + rng() % (pages / 3))));
    }
    size_t submitted = 0;
    for (int wave = 0; wave < 3; ++wave) {
      const int burst = 2 + static_cast<int>(rng() % 6);
      for (int i = 0; i < burst; ++i) {
        std::vector<uint32_t> p = bases[rng() % bases.size()];
        const int room = pages * kPage - static_cast<int>(p.size());
        if (room > 1) {
          p = Concat(p, testing::RandomPrompt(
                            rng(), 1 + static_cast<int>(rng() % room)));
        }
        (void)a.Submit(absl::StrCat("r", round, "-", wave, "-", i), p);
        ++submitted;
      }
      ASSERT_TRUE(a.WaitAll(submitted, absl::Seconds(120)))
          << "round " << round << " wave " << wave << ": admission stalled";
    }
    for (const auto& [id, st] : a.results()) {
      EXPECT_TRUE(st.ok() ||
                  (absl::IsResourceExhausted(st) && !st.message().empty()))
          << id << ": " << st;
    }
    released += a.core().GetLoad().released_hits_total;
    a.CheckClean();
  }
  RecordProperty("released_hits", static_cast<int>(released));
}

// Started requests hold SWA pages too (their window plus the chunk being
// computed): a SWA pool that holds one request's window and chunk but not
// two must not start a second request whose chunk then fails with "swa pool
// short" (a lost request). The full pool is ample, so only SWA gates here.
TEST(PrefillAdmission, RequestsStartOnlyWhenTheirSwaWindowFits) {
  // Tiny model: W = 16, 4-token pages, 16-token chunks: a request holds at
  // most 5 window pages + 5 chunk pages.
  for (int swa_pages : {10, 12, 16, 24}) {
    Admission a(400, swa_pages);
    constexpr int kRequests = 6;
    for (int i = 0; i < kRequests; ++i) {
      ASSERT_TRUE(a.Submit(absl::StrCat("s", i), testing::RandomPrompt(900 + i, 70 + 9 * i)).ok());
    }
    ASSERT_TRUE(a.WaitAll(kRequests, absl::Seconds(120))) << "admission stalled";
    for (const auto& [id, st] : a.results()) {
      EXPECT_TRUE(st.ok()) << "swa pool " << swa_pages << ", " << id << ": " << st;
    }
    a.CheckClean();
  }
}

// A job's priority reaches the scheduler. Requests of equal
// length queue FCFS; an urgent one submitted last overtakes every queued
// one (at most the one already computing finishes before it: no
// preemption). The load report then carries the measured throughput the
// router's shedding divides by.
TEST(PrefillPriority, AnUrgentRequestOvertakesTheQueueAndTheLoadReportsThroughput) {
  Admission a(400);
  EXPECT_EQ(a.core().GetLoad().prefill_tokens_per_second, 0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(a.Submit(absl::StrCat("low", i), testing::RandomPrompt(300 + i, 160), 5).ok());
  }
  ASSERT_TRUE(a.Submit("urgent", testing::RandomPrompt(399, 160), -1).ok());
  ASSERT_TRUE(a.WaitAll(5, absl::Seconds(120)));
  const std::vector<std::string> order = a.order();
  const auto at = std::find(order.begin(), order.end(), "urgent") - order.begin();
  EXPECT_LE(at, 1) << "ended " << at << "th of 5";
  EXPECT_GT(a.core().GetLoad().prefill_tokens_per_second, 0);
  a.CheckClean();
}

// Progress (what a client waiting for a long prompt's first token is shown):
// polled while six 1,440-token prompts share steps of 32 tokens, the last one
// is seen queued behind the others, then computing with its done tokens
// growing to the prompt, and gone once answered. (With 480-token prompts the
// second half of the last one took a few tens of ms: a poller descheduled
// that long on a loaded CI machine saw it end at 208 of 480.)
TEST(PrefillProgressTest, AQueuedRequestReportsItsQueueThenItsDoneTokens) {
  Admission a(800);
  EXPECT_FALSE(a.core().Progress("nobody").has_value());
  constexpr int kPrompt = 1440;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(a.Submit(absl::StrCat("p", i), testing::RandomPrompt(500 + i, kPrompt)).ok());
  }
  using State = PrefillProgress::State;
  bool saw_queued = false;
  int computing_snapshots = 0, last_done = 0;
  State last_state = State::kQueued;
  while (std::optional<PrefillProgress> p = a.core().Progress("p5")) {
    EXPECT_EQ(p->prompt_tokens, kPrompt);
    EXPECT_GE(p->done_tokens, last_done);  // never goes back
    EXPECT_LE(p->done_tokens, kPrompt);
    EXPECT_GE(static_cast<int>(p->state), static_cast<int>(last_state));  // queued, computing
    if (p->state == State::kQueued) {
      saw_queued = true;
      EXPECT_GE(p->queued_requests, 1);
      EXPECT_EQ(p->done_tokens, 0);
    } else {
      EXPECT_GT(p->done_tokens, 0);
      if (p->state == State::kComputing) ++computing_snapshots;
      EXPECT_GT(p->tokens_per_second, 0);
    }
    last_done = p->done_tokens;
    last_state = p->state;
    absl::SleepFor(absl::Microseconds(200));
  }
  EXPECT_TRUE(saw_queued);
  EXPECT_GT(computing_snapshots, 0);
  EXPECT_GT(last_done, kPrompt / 2);
  ASSERT_TRUE(a.WaitAll(6, absl::Seconds(120)));
  for (const auto& [id, st] : a.results()) EXPECT_TRUE(st.ok()) << id << ": " << st;
  EXPECT_FALSE(a.core().Progress("p5").has_value());
  a.CheckClean();
}

}  // namespace
}  // namespace swaserve::worker
