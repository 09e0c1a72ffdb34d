#include "lib/router/policy.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/kv/sequence.h"

namespace swaserve::router {
namespace {

PrefillCandidate P(std::string id, int64_t cached, int64_t queued,
                   int32_t running = 0, int32_t queued_requests = 0) {
  PrefillCandidate c;
  c.id = std::move(id);
  c.cached_tokens = cached;
  c.queued_uncached_tokens = queued;
  c.running_requests = running;
  c.queued_requests = queued_requests;
  return c;
}

DecodeCandidate D(std::string id, int64_t free_full, int64_t free_swa,
                  int32_t running, int32_t staged = 0,
                  int32_t max_running = 0) {
  DecodeCandidate c;
  c.id = std::move(id);
  c.free_full_pages = free_full;
  c.total_full_pages = 10000;
  c.free_swa_pages = free_swa;
  c.total_swa_pages = 1000;
  c.running_requests = running;
  c.staged_requests = staged;
  c.max_running_requests = max_running;
  return c;
}

TEST(BucketFor, DefaultBoundsAreExclusive) {
  PolicyOptions o;
  EXPECT_EQ(*BucketFor(0, o), 0);
  EXPECT_EQ(*BucketFor(1, o), 0);
  EXPECT_EQ(*BucketFor(65535, o), 0);
  EXPECT_EQ(*BucketFor(65536, o), 1);
  EXPECT_EQ(*BucketFor(262143, o), 1);
  EXPECT_EQ(*BucketFor(262144, o), 2);
  EXPECT_EQ(*BucketFor(1048575, o), 2);
  EXPECT_EQ(BucketFor(1048576, o).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(BucketFor(5000000, o).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(BucketFor(-1, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BucketFor, CustomAndInvalidBounds) {
  PolicyOptions o;
  o.bucket_bounds = {100};
  EXPECT_EQ(*BucketFor(99, o), 0);
  EXPECT_EQ(BucketFor(100, o).status().code(), absl::StatusCode::kOutOfRange);
  o.bucket_bounds = {};
  EXPECT_EQ(BucketFor(1, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.bucket_bounds = {100, 100};
  EXPECT_EQ(BucketFor(1, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.bucket_bounds = {0, 100};
  EXPECT_EQ(BucketFor(1, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ReasonName, SnakeCase) {
  EXPECT_EQ(ReasonName(Reason::kCacheAffinity), "cache_affinity");
  EXPECT_EQ(ReasonName(Reason::kLeastLoad), "least_load");
  EXPECT_EQ(ReasonName(Reason::kHotspotGuard), "hotspot_guard");
  EXPECT_EQ(ReasonName(Reason::kOnlyCandidate), "only_candidate");
  EXPECT_EQ(ReasonName(Reason::kNoLoadReport), "no_load_report");
  EXPECT_EQ(ReasonName(Reason::kNoFreeKv), "no_free_kv");
}

TEST(ChoosePrefill, CacheAffinityWinsWhenLoadsAreSimilar) {
  PolicyOptions o;
  std::vector<PrefillCandidate> c = {P("a", 0, 1000), P("b", 8000, 1500),
                                     P("c", 0, 900)};
  auto d = ChoosePrefill(10000, c, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->index, 1);
  EXPECT_EQ(d->reason, Reason::kCacheAffinity);
  EXPECT_EQ(d->expected_cached_tokens, 8000);
}

TEST(ChoosePrefill, LoadWinsWhenQueueOutweighsCache) {
  PolicyOptions o;
  // b saves 2000 tokens but has 5000 more queued.
  std::vector<PrefillCandidate> c = {P("a", 0, 0), P("b", 2000, 5000)};
  auto d = ChoosePrefill(10000, c, o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 0);
  EXPECT_EQ(d->reason, Reason::kLeastLoad);
  EXPECT_EQ(d->expected_cached_tokens, 0);
}

TEST(ChoosePrefill, SharedCacheIsNotAffinity) {
  PolicyOptions o;
  std::vector<PrefillCandidate> c = {P("a", 512, 300), P("b", 512, 200)};
  auto d = ChoosePrefill(2000, c, o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 1);
  EXPECT_EQ(d->reason, Reason::kLeastLoad);
  EXPECT_EQ(d->expected_cached_tokens, 512);
}

TEST(ChoosePrefill, CachedTokensClampedToPrompt) {
  PolicyOptions o;
  std::vector<PrefillCandidate> c = {P("a", 99999, 100), P("b", -5, 0)};
  auto d = ChoosePrefill(1000, c, o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 0);
  EXPECT_EQ(d->expected_cached_tokens, 1000);
  EXPECT_EQ(PrefillCost(1000, c[0], o), 100.0);
  EXPECT_EQ(PrefillCost(1000, c[1], o), 1000.0);
}

TEST(ChoosePrefill, TiesByRequestsThenIdOrRendezvous) {
  PolicyOptions o;
  std::vector<PrefillCandidate> c = {P("b", 0, 0), P("a", 0, 0),
                                     P("c", 0, 0, 1)};
  auto d = ChoosePrefill(100, c, o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 1);  // "a": lower id
  EXPECT_EQ(d->reason, Reason::kLeastLoad);
  c[1].queued_requests = 1;
  EXPECT_EQ(ChoosePrefill(100, c, o)->index, 0);  // fewer requests
  // With a key, idle workers share fresh requests: every worker wins some.
  std::vector<PrefillCandidate> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(P(absl::StrCat("w", i), 0, 0));
  std::vector<int> wins(8, 0);
  for (uint64_t key = 1; key <= 800; ++key) {
    auto r = ChoosePrefill(100, idle, o, key);
    ASSERT_TRUE(r.ok());
    ++wins[r->index];
    EXPECT_EQ(r->index, ChoosePrefill(100, idle, o, key)->index);  // stable
  }
  for (int w : wins) EXPECT_GT(w, 40);
}

TEST(ChoosePrefill, HotspotGuardTriggersExactlyBeyondBothMargins) {
  PolicyOptions o;
  o.hotspot_abs_tokens = 1000;
  o.hotspot_rel = 2.0;
  // Cost winner "hot" (big cache hit) vs least-loaded "cold".
  auto run = [&](int64_t hot_q, int64_t cold_q) {
    std::vector<PrefillCandidate> c = {P("cold", 0, cold_q),
                                       P("hot", 50000, hot_q)};
    auto d = ChoosePrefill(60000, c, o);
    EXPECT_TRUE(d.ok());
    return *d;
  };
  // Absolute margin: diff exactly 1000 -> no guard; 1001 -> guard.
  EXPECT_EQ(run(1000, 0).reason, Reason::kCacheAffinity);
  EXPECT_EQ(run(1001, 0).index, 0);
  EXPECT_EQ(run(1001, 0).reason, Reason::kHotspotGuard);
  EXPECT_EQ(run(1001, 0).expected_cached_tokens, 0);
  // Relative margin: cold 2000, hot 4000 (diff 2000 > 1000 but ratio exactly
  // 2) -> no guard; 4001 -> guard.
  EXPECT_EQ(run(4000, 2000).reason, Reason::kCacheAffinity);
  EXPECT_EQ(run(4001, 2000).reason, Reason::kHotspotGuard);
  // Ratio beyond 2 but diff within 1000 -> no guard.
  EXPECT_EQ(run(900, 100).reason, Reason::kCacheAffinity);
  // Disabled.
  o.hotspot_abs_tokens = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(run(40000, 0).reason, Reason::kCacheAffinity);
}

TEST(ChoosePrefill, UnhealthyAndNoReportSkipped) {
  PolicyOptions o;
  std::vector<PrefillCandidate> c = {P("a", 9000, 0), P("b", 9000, 0),
                                     P("c", 0, 500)};
  c[0].healthy = false;
  c[1].has_load = false;
  auto d = ChoosePrefill(10000, c, o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 2);
  EXPECT_EQ(d->reason, Reason::kOnlyCandidate);
  // Nobody reports load: cache, then id order among the healthy.
  c[2].has_load = false;
  c.push_back(P("d", 9000, 0));
  c.back().has_load = false;
  d = ChoosePrefill(10000, c, o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 1);  // "b" (9000 cached) before "d" (9000), not "c"
  EXPECT_EQ(d->reason, Reason::kNoLoadReport);
  EXPECT_EQ(d->expected_cached_tokens, 9000);
  // Nobody healthy.
  for (auto& x : c) x.healthy = false;
  EXPECT_EQ(ChoosePrefill(10000, c, o).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(ChoosePrefill(10000, {}, o).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ChoosePrefill, InvalidInput) {
  PolicyOptions o;
  std::vector<PrefillCandidate> c = {P("a", 0, 0)};
  EXPECT_EQ(ChoosePrefill(0, c, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.cache_credit = -1;
  EXPECT_EQ(ChoosePrefill(10, c, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = PolicyOptions();
  o.hotspot_rel = 0.5;
  EXPECT_EQ(ChoosePrefill(10, c, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChooseDecode, PrefersFitThenQueueThenFreeKv) {
  PolicyOptions o;  // page 16, window 128
  // prompt 1000 + 200 = 1200 tokens: 75 full pages, 9 SWA pages.
  std::vector<DecodeCandidate> c = {D("a", 74, 100, 0),    // full short
                                    D("b", 5000, 100, 3),  // fits, 3 running
                                    D("c", 4000, 100, 2),  // fits, 2 running
                                    D("d", 9000, 8, 0)};   // SWA short
  auto d = ChooseDecode(1000, 200, c, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->index, 2);
  EXPECT_EQ(d->reason, Reason::kLeastLoad);
  // Equal queues: more free full pages wins.
  c[1].running_requests = 2;
  EXPECT_EQ(ChooseDecode(1000, 200, c, o)->index, 1);
  // Staged requests count as queue.
  c[1].staged_requests = 1;
  EXPECT_EQ(ChooseDecode(1000, 200, c, o)->index, 2);
  // Exactly enough pages fits.
  std::vector<DecodeCandidate> exact = {D("x", 75, 9, 5), D("y", 74, 9, 0)};
  EXPECT_EQ(ChooseDecode(1000, 200, exact, o)->index, 0);
}

TEST(ChooseDecode, BatchFullAndNoFit) {
  PolicyOptions o;
  std::vector<DecodeCandidate> c = {D("a", 5000, 100, 4, 0, 4),
                                    D("b", 5000, 100, 6, 2, 0)};
  auto d = ChooseDecode(100, 10, c, o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 1);  // a's batch is full; b has no limit
  EXPECT_EQ(d->reason, Reason::kLeastLoad);
  c[1].max_running_requests = 8;  // 6 + 2 >= 8: full too
  d = ChooseDecode(100, 10, c, o);
  EXPECT_EQ(d->index, 0);  // both tier 1: fewer requests
  EXPECT_EQ(d->reason, Reason::kNoFreeKv);
  std::vector<DecodeCandidate> small = {D("a", 1, 1, 0), D("b", 2, 1, 0)};
  d = ChooseDecode(100000, 10, small, o);
  EXPECT_EQ(d->index, 1);
  EXPECT_EQ(d->reason, Reason::kNoFreeKv);
}

TEST(ChooseDecode, SkipsUnhealthyAndUnreported) {
  PolicyOptions o;
  std::vector<DecodeCandidate> c = {D("a", 5000, 100, 0), D("b", 5000, 100, 1)};
  c[0].healthy = false;
  auto d = ChooseDecode(100, 10, c, o);
  EXPECT_EQ(d->index, 1);
  EXPECT_EQ(d->reason, Reason::kOnlyCandidate);
  c[1].has_load = false;
  d = ChooseDecode(100, 10, c, o);
  EXPECT_EQ(d->index, 1);
  EXPECT_EQ(d->reason, Reason::kNoLoadReport);
  c[1].healthy = false;
  EXPECT_EQ(ChooseDecode(100, 10, c, o).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(ChooseDecode(0, 10, c, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseDecode(10, -1, c, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Property test: random candidate sets; the invariants of the file comment.
TEST(ChoosePrefill, RandomizedInvariants) {
  std::mt19937_64 rng(20240607);
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int guards = 0, affinity = 0, least = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    PolicyOptions o;
    o.hotspot_abs_tokens = uni(0, 40000);
    o.hotspot_rel = 1.0 + uni(0, 30) / 10.0;
    o.cache_credit = uni(0, 20) / 10.0;
    const int64_t prompt = uni(1, 100000);
    const int n = static_cast<int>(uni(1, 9));
    std::vector<PrefillCandidate> c;
    for (int i = 0; i < n; ++i) {
      PrefillCandidate p =
          P(absl::StrCat("w", uni(0, 50)), uni(0, 1) ? uni(0, prompt) : 0,
            uni(0, 3) ? uni(0, 60000) : 0, static_cast<int32_t>(uni(0, 3)),
            static_cast<int32_t>(uni(0, 3)));
      p.healthy = uni(0, 9) != 0;
      p.has_load = uni(0, 9) != 0;
      c.push_back(p);
    }
    const uint64_t key = static_cast<uint64_t>(uni(0, 3));
    auto d = ChoosePrefill(prompt, c, o, key);
    const bool any_healthy =
        std::any_of(c.begin(), c.end(), [](auto& x) { return x.healthy; });
    const bool any_eligible = std::any_of(
        c.begin(), c.end(), [](auto& x) { return x.healthy && x.has_load; });
    if (!any_healthy) {
      ASSERT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
      continue;
    }
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_GE(d->index, 0);
    ASSERT_LT(d->index, n);
    const PrefillCandidate& chosen = c[d->index];
    ASSERT_TRUE(chosen.healthy);
    ASSERT_EQ(d->expected_cached_tokens,
              std::clamp<int64_t>(chosen.cached_tokens, 0, prompt));
    if (!any_eligible) {
      ASSERT_EQ(d->reason, Reason::kNoLoadReport);
      for (const auto& x : c) {
        if (x.healthy) {
          ASSERT_GE(d->expected_cached_tokens,
                    std::clamp<int64_t>(x.cached_tokens, 0, prompt));
        }
      }
      continue;
    }
    ASSERT_TRUE(chosen.has_load);
    double min_cost = std::numeric_limits<double>::infinity();
    int64_t min_q = std::numeric_limits<int64_t>::max();
    for (const auto& x : c) {
      if (!x.healthy || !x.has_load) continue;
      const double cost = PrefillCost(prompt, x, o);
      if (cost < min_cost) min_cost = cost;
      min_q = std::min(min_q, x.queued_uncached_tokens);
    }
    if (d->reason == Reason::kHotspotGuard) {
      ++guards;
      // The guard's pick is the least loaded.
      ASSERT_EQ(chosen.queued_uncached_tokens, min_q);
    } else {
      // Otherwise the cost is minimal...
      ASSERT_EQ(PrefillCost(prompt, chosen, o), min_cost);
      // ... and the guard condition does not hold for it.
      const int64_t q = chosen.queued_uncached_tokens;
      ASSERT_FALSE(q - min_q > o.hotspot_abs_tokens &&
                   static_cast<double>(q) > o.hotspot_rel * min_q)
          << "guard should have fired";
      if (d->reason == Reason::kCacheAffinity) ++affinity;
      if (d->reason == Reason::kLeastLoad) ++least;
    }
    // Deterministic.
    auto again = ChoosePrefill(prompt, c, o, key);
    ASSERT_EQ(again->index, d->index);
    ASSERT_EQ(again->reason, d->reason);
  }
  // Every branch was exercised.
  EXPECT_GT(guards, 100);
  EXPECT_GT(affinity, 100);
  EXPECT_GT(least, 100);
}

}  // namespace
}  // namespace swaserve::router

namespace swaserve::router {
namespace {

TEST(PrefixCredit, WindowUnsafeMatchesAreCreditedTheirSafeDepthOrAWindowRestore) {
  // Window-safe (or nothing known), or no window: the whole full-KV match.
  EXPECT_EQ(PrefixCredit({.full_tokens = 10000, .sliding_window = 128, .page_size = 16,
                          .swa_chain_layers = 61, .window_restore = true}),
            10000);
  EXPECT_EQ(PrefixCredit({.full_tokens = 10000, .window_safe_tokens = 10000,
                          .sliding_window = 128, .page_size = 16, .swa_chain_layers = 61}),
            10000);
  EXPECT_EQ(PrefixCredit({.full_tokens = 10000, .window_safe_tokens = 0, .sliding_window = 0,
                          .page_size = 16, .swa_chain_layers = 61, .window_restore = true}),
            10000);
  // A worker that does not restore reuses its window-safe depth L; below the
  // index's scan (-1) it is credited 0 (a lower bound).
  EXPECT_EQ(PrefixCredit({.full_tokens = 10000, .window_safe_tokens = 4096,
                          .sliding_window = 128, .page_size = 16, .swa_chain_layers = 61,
                          .window_restore = false}),
            4096);
  EXPECT_EQ(PrefixCredit({.full_tokens = 10000, .window_safe_tokens = -1,
                          .sliding_window = 128, .page_size = 16, .swa_chain_layers = 61,
                          .window_restore = false}),
            0);
  // A restoring worker: max(L, M − R) (the MiMo-V2.5-Pro shape: 60 SWA + 1
  // MTP layer, W = 128, R ~ 7.7K), clamped at 0.
  EXPECT_EQ(PrefixCredit({.full_tokens = 10000, .window_safe_tokens = -1,
                          .sliding_window = 128, .page_size = 16, .swa_chain_layers = 61,
                          .window_restore = true}),
            kv::WindowRestoreStart(10000, 128, 16, 61));
  EXPECT_EQ(kv::WindowRestoreStart(10000, 128, 16, 61), 9872 - 60 * 127);
  EXPECT_EQ(PrefixCredit({.full_tokens = 10000, .window_safe_tokens = 9600,
                          .sliding_window = 128, .page_size = 16, .swa_chain_layers = 61,
                          .window_restore = true}),
            9600);
  EXPECT_EQ(PrefixCredit({.full_tokens = 4000, .window_safe_tokens = -1, .sliding_window = 128,
                          .page_size = 16, .swa_chain_layers = 61, .window_restore = true}),
            0);
  // A worker that restores as a pyramid publishes the restore's work (about
  // half the stretch): credited M − work, still at least L, and never more
  // work than the (clamped) stretch.
  const PrefixCreditInputs pyramid{.full_tokens = 10000, .window_safe_tokens = -1,
                                   .sliding_window = 128, .page_size = 16,
                                   .swa_chain_layers = 61, .window_restore = true,
                                   .restore_work = 3905};
  EXPECT_EQ(PrefixCredit(pyramid), 10000 - 3905);
  PrefixCreditInputs safe_wins = pyramid;
  safe_wins.window_safe_tokens = 9600;
  EXPECT_EQ(PrefixCredit(safe_wins), 9600);
  PrefixCreditInputs clamped = pyramid;
  clamped.full_tokens = 4000;  // s = 0: the stretch is the whole match
  EXPECT_EQ(PrefixCredit(clamped), 4000 - 3905);
  clamped.full_tokens = 3000;
  EXPECT_EQ(PrefixCredit(clamped), 0);
  PrefixCreditInputs not_restoring = pyramid;
  not_restoring.window_restore = false;
  EXPECT_EQ(PrefixCredit(not_restoring), 0);
  EXPECT_EQ(PrefixCredit({.full_tokens = 0}), 0);
  EXPECT_EQ(WindowPages(128, 16), 8);
  EXPECT_EQ(WindowPages(129, 16), 8);
  EXPECT_EQ(WindowPages(130, 16), 9);
  EXPECT_EQ(WindowPages(0, 16), 0);
}

// WindowScanPages is just enough: for a restoring worker, any L the index
// would not find (L < d − S pages) never beats the restore start, so the
// credit with L = -1 equals the credit with the true L; and one page less of
// scan would be wrong for some depth.
TEST(PrefixCredit, TheScanBoundForARestoringWorkerIsExactAndTight) {
  // (W, page, chain, restore_work: 0 = the whole stretch, else a pyramid's
  // published work, larger than a page).
  for (const auto& [window, page, chain, work] :
       std::vector<std::tuple<int, int, int, int>>{
           {128, 16, 61, 0}, {128, 16, 13, 0}, {4, 4, 3, 0}, {100, 16, 5, 0}, {17, 8, 2, 0},
           {128, 64, 9, 0}, {128, 16, 61, 3905}, {128, 16, 13, 800}, {100, 16, 5, 17},
           {17, 8, 2, 9}, {128, 64, 9, 640}}) {
    PrefixCreditInputs w{.sliding_window = window, .page_size = page,
                         .swa_chain_layers = chain, .window_restore = true,
                         .restore_work = work};
    const int64_t scan = WindowScanPages(w, 12345);
    bool tight = false;
    for (int64_t d = 1; d <= scan + 40; ++d) {
      w.full_tokens = d * page;
      for (int64_t l = 0; l < d; ++l) {
        w.window_safe_tokens = l * page;
        const int64_t exact = PrefixCredit(w);
        if (l < d - scan) {
          PrefixCreditInputs unknown = w;
          unknown.window_safe_tokens = -1;
          ASSERT_EQ(PrefixCredit(unknown), exact)
              << "W " << window << " page " << page << " chain " << chain << " work " << work
              << " d " << d << " L " << l;
        }
        if (l == d - scan) {
          PrefixCreditInputs unknown = w;
          unknown.window_safe_tokens = -1;
          if (PrefixCredit(unknown) != exact) tight = true;
        }
      }
    }
    EXPECT_TRUE(tight) << "W " << window << " page " << page << " chain " << chain << " work "
                       << work;
  }
  // A worker that does not restore: the configured bound.
  EXPECT_EQ(WindowScanPages({.sliding_window = 128, .page_size = 16, .swa_chain_layers = 61},
                            2048),
            2048);
}

TEST(TieredCredit, LowerTierTokensCountAtTheirWeight) {
  EXPECT_EQ(TieredCredit(1000, 1000, 0.75), 1000);  // all in L1
  EXPECT_EQ(TieredCredit(1000, 600, 0.75), 900);    // 400 in L2 -> 300
  EXPECT_EQ(TieredCredit(1000, 0, 0.75), 750);
  EXPECT_EQ(TieredCredit(1000, 5000, 0.75), 1000);  // L1 past the credit
  EXPECT_EQ(TieredCredit(1000, 600, 0.0), 600);
  EXPECT_EQ(TieredCredit(0, 0, 0.75), 0);
  PolicyOptions o;
  o.lower_tier_credit = 1.5;
  EXPECT_EQ(ValidatePolicyOptions(o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShedRetryAfter, ShedsOnlyWhenEveryEligibleWorkerIsBacklogged) {
  auto cand = [](std::string id, int64_t queued, double rate) {
    PrefillCandidate c;
    c.id = std::move(id);
    c.queued_uncached_tokens = queued;
    c.tokens_per_second = rate;
    return c;
  };
  // 1,000 tokens/s: 50 s and 80 s of backlog against a 30 s bound.
  std::vector<PrefillCandidate> c = {cand("a", 50000, 1000), cand("b", 80000, 1000)};
  std::optional<double> retry = ShedRetryAfterSeconds(c, 30);
  ASSERT_TRUE(retry.has_value());
  EXPECT_DOUBLE_EQ(*retry, 20.0);  // a drains back under 30 s in 20 s
  // One worker under the bound admits the request.
  c.push_back(cand("c", 20000, 1000));
  EXPECT_FALSE(ShedRetryAfterSeconds(c, 30).has_value());
  // ...unless it is unhealthy or has no load report (not eligible).
  c[2].healthy = false;
  EXPECT_TRUE(ShedRetryAfterSeconds(c, 30).has_value());
  c[2].healthy = true;
  c[2].has_load = false;
  EXPECT_TRUE(ShedRetryAfterSeconds(c, 30).has_value());
  // An eligible worker without a measured throughput: admitted (no basis).
  c[2] = cand("c", 10'000'000, 0);
  EXPECT_FALSE(ShedRetryAfterSeconds(c, 30).has_value());
  // Disabled, and at the bound exactly (not above it).
  c.pop_back();
  EXPECT_FALSE(ShedRetryAfterSeconds(c, 0).has_value());
  EXPECT_FALSE(ShedRetryAfterSeconds(c, 50).has_value());
  // The floor on Retry-After.
  retry = ShedRetryAfterSeconds(c, 49.9, 1.0);
  ASSERT_TRUE(retry.has_value());
  EXPECT_DOUBLE_EQ(*retry, 1.0);
  // No eligible candidates: not this check's business.
  EXPECT_FALSE(ShedRetryAfterSeconds({}, 30).has_value());
}

}  // namespace
}  // namespace swaserve::router
