#include "lib/loadgen/miss_attribution.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"
#include "lib/loadgen/agent_trace.h"

namespace swaserve::loadgen {
namespace {

TEST(AttributeMisses, TelescopesDownTheChain) {
  const MissCauses c = AttributeMisses({.prompt = 100,
                                        .ideal = 90,
                                        .anywhere = 80,
                                        .in_bucket = 60,
                                        .chosen = 50,
                                        .hit = 45});
  EXPECT_EQ(c.cold, 10);
  EXPECT_EQ(c.evicted, 10);
  EXPECT_EQ(c.bucket, 20);
  EXPECT_EQ(c.routing, 10);
  EXPECT_EQ(c.window, 5);
  EXPECT_EQ(c.Total(), 55);
}

TEST(AttributeMisses, ClampsInconsistentLevels) {
  // The chosen worker matched more than the bucket's best seen at routing
  // (its L3 or a prefill that ended in between): nothing is charged to the
  // bucket or the routing, and a level above the ideal is the ideal.
  const MissCauses c = AttributeMisses({.prompt = 100,
                                        .ideal = 80,
                                        .anywhere = 95,
                                        .in_bucket = 10,
                                        .chosen = 70,
                                        .hit = 70});
  EXPECT_EQ(c.cold, 20);
  EXPECT_EQ(c.evicted, 0);
  EXPECT_EQ(c.bucket, 10);
  EXPECT_EQ(c.routing, 0);
  EXPECT_EQ(c.window, 0);
  EXPECT_EQ(c.Total(), 30);
}

// A random set of sessions in the trace's format: each turn extends the
// previous prompt by a few blocks, now and then a sub-agent or a prompt
// that rewrites the tail (a compaction).
std::string RandomTrace(std::mt19937_64& rng, int sessions, int block) {
  std::string text;
  for (int s = 0; s < sessions; ++s) {
    std::vector<int64_t> ids;
    int64_t next_id = 0;
    double t = 0;
    std::string reqs;
    const int turns = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < turns; ++k) {
      if (rng() % 6 == 0 && !ids.empty()) ids.resize(rng() % ids.size());
      const int grow = 1 + static_cast<int>(rng() % 6);
      for (int g = 0; g < grow; ++g) ids.push_back(next_id++);
      const int64_t in =
          static_cast<int64_t>(ids.size() - 1) * block + 1 + rng() % block;
      std::string list;
      for (int64_t id : ids)
        absl::StrAppend(&list, list.empty() ? "" : ",", id);
      absl::StrAppend(&reqs, reqs.empty() ? "" : ",", "{\"t\":", t,
                      ",\"in\":", in, ",\"out\":1,\"hash_ids\":[", list,
                      "],\"api_time\":1}");
      if (rng() % 5 == 0) {
        absl::StrAppend(
            &reqs, ",{\"t\":", t + 0.5, ",\"type\":\"subagent\",\"requests\":[",
            "{\"t\":0,\"in\":", block + 1, ",\"out\":1,\"hash_ids\":[0,",
            1000 + next_id++, "]}]}");
      }
      t += 1 + static_cast<double>(rng() % 5);
    }
    absl::StrAppend(&text, "{\"id\":\"s", s, "\",\"block_size\":", block,
                    ",\"requests\":[", reqs, "]}\n");
  }
  return text;
}

// A toy cluster: workers that keep the page hashes of the prompts they ran
// in a FIFO of bounded size, two length buckets, a router that picks a
// random worker of the bucket, and a window rule that keeps only hits at a
// multiple of four pages. The attribution must account for every missed
// token of every request, whatever the cluster did.
TEST(AttributeMisses, CausesSumToTheMissesOnRandomSessionSets) {
  constexpr int kPage = 4;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng(seed);
    auto sessions = ParseAgentSessions(RandomTrace(rng, 1 + seed % 7, 8));
    ASSERT_TRUE(sessions.ok()) << sessions.status();
    auto sched =
        ScheduleAgentSessions(*sessions, {.concurrency = 3, .seed = seed});
    ASSERT_TRUE(sched.ok());
    AgentPromptSynthesizer synth({.vocab_size = 50});
    struct Worker {
      absl::flat_hash_set<uint64_t> pages;
      std::deque<uint64_t> order;
      size_t capacity = 0;
    };
    std::vector<Worker> workers(4);
    for (Worker& w : workers) w.capacity = 8 + rng() % 40;
    std::vector<absl::flat_hash_set<uint64_t>> seen(sessions->size());
    int64_t total_missed = 0, total_attributed = 0;
    for (const AgentArrival& a : sched->arrivals) {
      const AgentSession& s = (*sessions)[a.session];
      const std::vector<uint32_t> tokens = synth.Next(s, a.request);
      const std::vector<uint64_t> h = base::ChainedPageHashes(tokens, kPage);
      const int64_t len = static_cast<int64_t>(tokens.size());
      const int64_t cap = len > 0 ? (len - 1) / kPage * kPage : 0;
      auto depth = [&](const absl::flat_hash_set<uint64_t>& set) {
        int64_t d = 0;
        while (d < static_cast<int64_t>(h.size()) && set.contains(h[d])) ++d;
        return std::min(d * kPage, cap);
      };
      MissChain c{.prompt = len, .ideal = depth(seen[s.scope])};
      const int bucket = len < 24 ? 0 : 1;
      for (size_t k = 0; k < workers.size(); ++k) {
        const int64_t d = depth(workers[k].pages);
        c.anywhere = std::max(c.anywhere, d);
        if (static_cast<int>(k / 2) == bucket)
          c.in_bucket = std::max(c.in_bucket, d);
      }
      Worker& w = workers[bucket * 2 + rng() % 2];
      c.chosen = depth(w.pages);
      c.hit = c.chosen / (4 * kPage) * (4 * kPage);
      const MissCauses m = AttributeMisses(c);
      EXPECT_GE(m.cold, 0);
      EXPECT_GE(m.evicted, 0);
      EXPECT_GE(m.bucket, 0);
      EXPECT_GE(m.routing, 0);
      EXPECT_GE(m.window, 0);
      ASSERT_EQ(m.Total(), len - c.hit) << "seed " << seed;
      // With levels that are consistent by construction, each cause is the
      // plain difference.
      EXPECT_EQ(m.cold, len - c.ideal);
      EXPECT_EQ(m.window, c.chosen - c.hit);
      total_missed += len - c.hit;
      total_attributed += m.Total();
      for (uint64_t p : h) {
        seen[s.scope].insert(p);
        if (w.pages.insert(p).second) w.order.push_back(p);
        while (w.order.size() > w.capacity) {
          w.pages.erase(w.order.front());
          w.order.pop_front();
        }
      }
    }
    EXPECT_EQ(total_missed, total_attributed);
  }
}

}  // namespace
}  // namespace swaserve::loadgen
