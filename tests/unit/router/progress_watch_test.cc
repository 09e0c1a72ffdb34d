// PrefillProgressWatch: the probe's answers kept, a replaced probe's answers
// dropped (also under concurrent Set/Ask/answers), answers after the watch
// died harmless, and the lead before each message.
#include "lib/router/progress_watch.h"

#include <atomic>
#include <deque>
#include <functional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace swaserve::router {
namespace {

using Answer = std::function<void(const v1::PrefillProgress&)>;

v1::PrefillProgress Done(uint32_t tokens) {
  v1::PrefillProgress p;
  p.set_found(true);
  p.set_done_tokens(tokens);
  return p;
}

// A probe that keeps its answer callbacks for the test to run later.
struct HeldProbes {
  absl::Mutex mu;
  std::deque<std::pair<uint32_t, Answer>> pending ABSL_GUARDED_BY(mu);
  GenerateSink::ProgressProbe For(uint32_t tag) {
    return [this, tag](Answer a) {
      absl::MutexLock lock(&mu);
      pending.emplace_back(tag, std::move(a));
    };
  }
  // Runs every held answer with its probe's tag.
  void AnswerAll() {
    std::deque<std::pair<uint32_t, Answer>> all;
    {
      absl::MutexLock lock(&mu);
      all.swap(pending);
    }
    for (auto& [tag, answer] : all) answer(Done(tag));
  }
};

TEST(PrefillProgressWatchTest, KeepsTheCurrentProbesAnswerOnly) {
  PrefillProgressWatch w;
  w.Ask();  // no probe: nothing to ask
  EXPECT_FALSE(w.Last().has_value());

  HeldProbes held;
  w.Set(held.For(1));
  w.Ask();
  EXPECT_FALSE(w.Last().has_value());  // not answered yet
  held.AnswerAll();
  ASSERT_TRUE(w.Last().has_value());
  EXPECT_EQ(w.Last()->done_tokens(), 1u);

  // A retry's leg: the old answer is forgotten, and a late answer of the
  // old probe is dropped.
  w.Ask();  // asked of probe 1, answered after the replacement
  w.Set(held.For(2));
  EXPECT_FALSE(w.Last().has_value());
  held.AnswerAll();
  EXPECT_FALSE(w.Last().has_value());
  w.Ask();
  held.AnswerAll();
  ASSERT_TRUE(w.Last().has_value());
  EXPECT_EQ(w.Last()->done_tokens(), 2u);

  // A probe that answers at once (inside Ask) is kept too.
  w.Set([](Answer a) { a(Done(3)); });
  w.Ask();
  ASSERT_TRUE(w.Last().has_value());
  EXPECT_EQ(w.Last()->done_tokens(), 3u);

  // No probe (the leg ended): asking does nothing; the answer is forgotten.
  w.Set(nullptr);
  w.Ask();
  EXPECT_FALSE(w.Last().has_value());
}

TEST(PrefillProgressWatchTest, AnAnswerAfterTheWatchIsGoneIsDropped) {
  HeldProbes held;
  {
    PrefillProgressWatch w;
    w.Set(held.For(7));
    w.Ask();
    w.Ask();
  }
  held.AnswerAll();  // no use after free (the sanitizer build checks)
}

// Random interleavings: one thread replaces the probe (as the router does
// on a retry) and checks after each replacement that the watch never shows
// an answer of an earlier probe; others ask and answer concurrently.
TEST(PrefillProgressWatchTest, ConcurrentReplacementsNeverShowAStaleAnswer) {
  PrefillProgressWatch w;
  HeldProbes held;
  std::atomic<bool> stop{false};
  std::thread asker([&] {
    while (!stop.load()) {
      {
        absl::MutexLock lock(&held.mu);
        if (held.pending.size() >= 32) continue;  // let the answers catch up
      }
      w.Ask();
    }
  });
  std::thread answerer([&] {
    std::mt19937 rng(5);
    while (!stop.load()) {
      std::pair<uint32_t, Answer> one;
      {
        absl::MutexLock lock(&held.mu);
        if (held.pending.empty()) continue;
        // Out of order: any held answer, not only the oldest.
        const size_t i = rng() % held.pending.size();
        one = std::move(held.pending[i]);
        held.pending.erase(held.pending.begin() + static_cast<std::ptrdiff_t>(i));
      }
      one.second(Done(one.first));
    }
  });
  // Every 50th probe the checks go on until its answer shows (liveness:
  // the current probe's answers are kept, not only stale ones dropped).
  int seen_current = 0, stale = 0;
  for (uint32_t tag = 1; tag <= 2000 && stale == 0; ++tag) {
    w.Set(held.For(tag));
    const absl::Time until = absl::Now() + absl::Seconds(tag % 50 == 0 ? 20 : 0);
    for (int k = 0; k < 20 || absl::Now() < until; ++k) {
      const std::optional<v1::PrefillProgress> last = w.Last();
      if (!last.has_value()) continue;
      if (last->done_tokens() != tag) {
        ADD_FAILURE() << "probe " << last->done_tokens() << "'s answer after Set of " << tag;
        ++stale;
      } else {
        ++seen_current;
      }
      break;
    }
  }
  stop = true;
  asker.join();
  answerer.join();
  w.Ask();
  held.AnswerAll();
  // Liveness: the current probe's answers do show (not only "never stale").
  EXPECT_GE(seen_current, 40);
  ASSERT_TRUE(w.Last().has_value());
  EXPECT_EQ(w.Last()->done_tokens(), 2000u);
}

TEST(PrefillProgressWatchTest, LeadIsAQuarterOfTheIntervalAtMostTwoSeconds) {
  EXPECT_EQ(PrefillProgressWatch::Lead(absl::Milliseconds(20)), absl::Milliseconds(5));
  EXPECT_EQ(PrefillProgressWatch::Lead(absl::Seconds(4)), absl::Seconds(1));
  EXPECT_EQ(PrefillProgressWatch::Lead(absl::Seconds(15)), absl::Seconds(2));
}

}  // namespace
}  // namespace swaserve::router
