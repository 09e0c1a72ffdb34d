// PrefixCache eviction: LRU order in both pools, restorable tombstones, cold
// SWA KV (checkpoints, superseded windows) and demotion to an L2.
#include "lib/kv/prefix_cache.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "tests/unit/kv/prefix_cache_test_fixture.h"

namespace swaserve::kv {
namespace {

using namespace prefix_cache_testing;  // NOLINT(build/namespaces)

TEST_F(PrefixCacheTest, EvictFreesAllTheSwaItReportsEvictable) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Insert(a);
  CacheHit hit = cache_->MatchAndLock(Prefix(a, 2));  // splits [0,1] | [2,3]
  ASSERT_EQ(hit.tokens(), 8);
  cache_->ReleaseSwa(hit);
  const int64_t evictable = cache_->EvictableSwaPages();
  EXPECT_EQ(evictable, 4);
  EXPECT_EQ(cache_->EvictableFullPages(), 2);
  EvictResult r = cache_->Evict(0, evictable);
  CHECK_CACHE();
  EXPECT_EQ(r.swa_pages_freed, evictable)
      << "Evict freed fewer SWA pages than EvictableSwaPages() promised\n"
      << cache_->DebugString();
  EXPECT_EQ(r.full_pages_freed, 2);
  EXPECT_EQ(cache_->cached_full_pages(), 2);  // the hit's, still locked
  ExpectCached(pools_->full(), hit.full_pages());
  cache_->Unlock(hit);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, FullEvictionIsLru) {
  Init(8);
  const Hashes a = H({1, 2}), b = H({3, 4}), c = H({5, 6});
  Insert(a);
  Insert(b);
  Insert(c);
  CacheHit hit = cache_->MatchAndLock(a);  // a becomes the most recent
  cache_->Unlock(hit);
  ClearEvents();
  EvictResult r = cache_->Evict(2, 0);
  EXPECT_EQ(r.full_pages_freed, 2);
  CHECK_CACHE();
  EXPECT_EQ(M(b), Lens(0, 0));
  EXPECT_EQ(M(a), Lens(8, 8));
  EXPECT_EQ(M(c), Lens(8, 8));
  EXPECT_EQ(Events(CacheEvent::Type::kRemoved), Sorted(b));
  r = cache_->Evict(1, 0);
  EXPECT_GE(r.full_pages_freed, 1);
  CHECK_CACHE();
  EXPECT_LT(M(c).first, 8);
  EXPECT_EQ(M(a), Lens(8, 8));
  // Match() has no side effects: it does not refresh recency.
  const Hashes d = H({7, 8});
  Insert(d);
  EXPECT_EQ(M(a), Lens(8, 8));
  r = cache_->Evict(2, 0);
  EXPECT_EQ(M(a), Lens(0, 0));
  EXPECT_EQ(M(d), Lens(8, 8));
  CHECK_CACHE();
}

// SWA recency is refreshed only on the hit's last window, so the SWA of an
// old part of a hot prefix ages out before a colder but newer entry.
TEST_F(PrefixCacheTest, SwaEvictionIsLruAndOnlyTheWindowIsRefreshed) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  const Hashes b = H({9, 10});
  Insert(a);
  Insert(b);
  CacheHit hit = cache_->MatchAndLock(a);  // refreshes SWA of pages 4, 5 only
  cache_->Unlock(hit);
  ClearEvents();
  EvictResult r = cache_->Evict(0, 2);
  EXPECT_GE(r.swa_pages_freed, 2);
  EXPECT_EQ(r.full_pages_freed, 0);
  CHECK_CACHE();
  EXPECT_EQ(M(a), Lens(24, 24));
  EXPECT_EQ(M(Prefix(a, 4)).second, 0);
  EXPECT_EQ(M(b), Lens(8, 8));
  EXPECT_TRUE(Events(CacheEvent::Type::kRemoved).empty());
  const Hashes swa_removed = Events(CacheEvent::Type::kSwaRemoved);
  EXPECT_FALSE(swa_removed.empty());
  for (uint64_t h : swa_removed)
    EXPECT_NE(std::find(a.begin(), a.begin() + 4, h), a.begin() + 4);
}

TEST_F(PrefixCacheTest, RootSideFirstAmongEquallyRecentNodes) {
  Init(/*window=*/16);  // a 16-token hit needs SWA for tokens [1, 16): all pages
  const Hashes a = H({1, 2, 3, 4});
  Inserted in = Insert(Prefix(a, 2));
  Inserted in2 = Insert(a);
  // One lookup touches both nodes ([0,1] and [2,3]) at the same time.
  CacheHit hit = cache_->MatchAndLock(a);
  ASSERT_EQ(hit.tokens(), 16);
  EXPECT_EQ(hit.swa_first_page(), 0);
  cache_->Unlock(hit);
  ClearEvents();
  EvictResult r = cache_->Evict(0, 1);
  CHECK_CACHE();
  // The root-side node is tombstoned; the leaf stays whole.
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(r.swa_pages_freed, 2);
  ExpectFree(pools_->swa(), {in.swa[0], in.swa[1]});
  ExpectCached(pools_->swa(), {in2.swa[2], in2.swa[3]});
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(Prefix(a, 2)));
  EXPECT_EQ(M(a), Lens(16, 0));
}

TEST_F(PrefixCacheTest, FullPassDeletesLeavesAndCascadesTombstoneParents) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted in = Insert(a, /*live_from=*/2);  // [tomb 0,1 | live 2,3]
  EXPECT_EQ(cache_->EvictableFullPages(), 4);
  ClearEvents();
  EvictResult r = cache_->Evict(1, 0);
  CHECK_CACHE();
  EXPECT_EQ(r.full_pages_freed, 4);
  EXPECT_EQ(r.swa_pages_freed, 2);
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(cache_->cached_swa_pages(), 0);
  ExpectFree(pools_->full(), in.full);
  ExpectFree(pools_->swa(), in.swa);
  EXPECT_EQ(Events(CacheEvent::Type::kRemoved), Sorted(a));
  EXPECT_EQ(M(a), Lens(0, 0));
}

TEST_F(PrefixCacheTest, SwaPassDeletesUnlockedLeaves) {
  Init(8);
  const Hashes a = H({1, 2});
  Insert(a);
  EvictResult r = cache_->Evict(0, 1);
  CHECK_CACHE();
  // A leaf is never tombstoned: it is deleted, full pages included.
  EXPECT_EQ(r.full_pages_freed, 2);
  EXPECT_EQ(r.swa_pages_freed, 2);
  EXPECT_EQ(M(a), Lens(0, 0));
}

TEST_F(PrefixCacheTest, RestorableTombstonesKeepFullKvUnderSwaPressure) {
  keep_tombstones_ = true;
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted in = Insert(a);
  ClearEvents();
  // The SWA pass tombstones the leaf instead of deleting it.
  EvictResult r = cache_->Evict(0, 1);
  CHECK_CACHE();
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(r.swa_pages_freed, 4);
  EXPECT_TRUE(Events(CacheEvent::Type::kRemoved).empty());
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(a));
  ExpectCached(pools_->full(), in.full);
  ExpectFree(pools_->swa(), in.swa);
  EXPECT_EQ(cache_->EvictableSwaPages(), 0);
  EXPECT_EQ(cache_->EvictableFullPages(), 4);
  // Not window-safe anywhere, but a full-KV match a restore can use.
  const Hashes longer = H({1, 2, 3, 4, 5});
  EXPECT_EQ(M(longer), Lens(16, 0));
  CacheHit hit = cache_->MatchAndLock(longer, {.full_kv = true});
  EXPECT_TRUE(hit.needs_window_restore());
  EXPECT_EQ(hit.tokens(), 16);
  EXPECT_EQ(std::vector<PageId>(hit.full_pages().begin(), hit.full_pages().end()), in.full);
  cache_->Unlock(hit);
  CHECK_CACHE();
  // Unlocking keeps the tombstone leaf (the default deletes it).
  EXPECT_EQ(cache_->cached_full_pages(), 4);
  // The full pass takes it like any leaf.
  ClearEvents();
  r = cache_->Evict(1, 0);
  CHECK_CACHE();
  EXPECT_EQ(r.full_pages_freed, 4);
  EXPECT_EQ(Events(CacheEvent::Type::kRemoved), Sorted(a));
  EXPECT_EQ(M(longer), Lens(0, 0));
}

TEST_F(PrefixCacheTest, RestorableTombstoneParentsStayWhenTheirChildGoes) {
  keep_tombstones_ = true;
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Insert(a, /*live_from=*/2);  // [tomb 0,1 | live 2,3]
  const Hashes b = H({1, 2, 7, 8});
  Insert(b, /*live_from=*/2);  // [tomb 0,1] gets a second live child
  EvictResult r = cache_->Evict(1, 0);  // the LRU leaf: a's [2,4)
  CHECK_CACHE();
  EXPECT_EQ(r.full_pages_freed, 2);
  EXPECT_EQ(M(b), Lens(16, 16));
  r = cache_->Evict(1, 0);  // b's leaf; its tombstone parent stays
  CHECK_CACHE();
  EXPECT_EQ(r.full_pages_freed, 2);
  EXPECT_EQ(cache_->cached_full_pages(), 2);
  EXPECT_EQ(M(a), Lens(8, 0));
}

TEST_F(PrefixCacheTest, ColdSwaIsEvictedBeforeAnyHotSwa) {
  Init(8);
  const Hashes a = H({1, 2});
  Inserted in_a = Insert(a);  // hot, older
  // b: a cold checkpoint window (pages 0, 1), a tombstone, the hot
  // trailing window (pages 3, 4).
  const Hashes b = H({5, 6, 7, 8, 9});
  InsertColdHead(b);
  ClearEvents();
  EvictResult r = cache_->Evict(0, 1);
  CHECK_CACHE();
  // The newer but cold pages go first; the hot ones (a, b's tail) stay.
  EXPECT_EQ(r.swa_pages_freed, 2);
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(Prefix(b, 2)));
  ExpectCached(pools_->swa(), in_a.swa);
  EXPECT_EQ(M(a), Lens(8, 8));
  r = cache_->Evict(0, 1);
  CHECK_CACHE();
  // Then LRU among the hot: a (older) before b's tail.
  EXPECT_EQ(Events(CacheEvent::Type::kRemoved), Sorted(a));
  EXPECT_EQ(M(b), Lens(20, 20));
}

// EvictColdSwa frees cold SWA KV only, however much is asked for.
TEST_F(PrefixCacheTest, EvictColdSwaStopsAtTheFirstHotWindow) {
  Init(8);
  const Hashes a = H({1, 2});
  Inserted in_a = Insert(a);
  const Hashes b = H({5, 6, 7, 8, 9});
  InsertColdHead(b);
  EXPECT_EQ(cache_->EvictableSwaPages(), 6);
  EXPECT_EQ(cache_->EvictableColdSwaPages(), 2);
  ClearEvents();
  EvictResult r = cache_->EvictColdSwa(5);
  CHECK_CACHE();
  EXPECT_EQ(r.swa_pages_freed, 2);
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(Prefix(b, 2)));
  EXPECT_EQ(cache_->EvictableColdSwaPages(), 0);
  ExpectCached(pools_->swa(), in_a.swa);
  EXPECT_EQ(cache_->EvictColdSwa(5).swa_pages_freed, 0);
  EXPECT_EQ(M(a), Lens(8, 8));
  EXPECT_EQ(M(b), Lens(20, 20));
}

// VisitSwaEvictionOrder lists the evictable SWA KV node by node in the
// order the SWA pass takes it: cold, then least recently used hot.
TEST_F(PrefixCacheTest, SwaEvictionOrderIsTheOrderEvictTakes) {
  Init(8);
  const Hashes a = H({1, 2});
  Insert(a);
  const Hashes b = H({5, 6, 7, 8, 9});
  InsertColdHead(b);
  std::vector<Hashes> order;
  cache_->VisitSwaEvictionOrder([&](absl::Span<const uint64_t> h) {
    order.emplace_back(h.begin(), h.end());
    return true;
  });
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], Prefix(b, 2));                 // cold
  EXPECT_EQ(order[1], a);                            // hot, older
  EXPECT_EQ(order[2], Hashes(b.begin() + 3, b.end()));  // hot, newer
  int calls = 0;
  cache_->VisitSwaEvictionOrder([&](absl::Span<const uint64_t>) { return ++calls < 2; });
  EXPECT_EQ(calls, 2);
  for (const Hashes& next : order) {
    ClearEvents();
    EvictResult r = cache_->Evict(0, 1);
    CHECK_CACHE();
    EXPECT_EQ(r.swa_pages_freed, static_cast<int64_t>(next.size()));
    Hashes gone = Events(CacheEvent::Type::kSwaRemoved);
    if (gone.empty()) gone = Events(CacheEvent::Type::kRemoved);
    // A deleted leaf's tombstone parents go with it (b's last step).
    for (uint64_t h : next) EXPECT_TRUE(std::count(gone.begin(), gone.end(), h)) << h;
  }
}

// cold_superseded_windows: a conversation's next turn extends b; b's old
// end's window then ranks with the cold SWA KV and goes before an older hot
// window (a's). Without the option a, the least recently used, goes first.
TEST_F(PrefixCacheTest, AnExtendedLeafsWindowGoesBeforeOlderHotWindows) {
  for (const bool demote : {false, true}) {
    SCOPED_TRACE(demote);
    keep_tombstones_ = true;
    cold_superseded_ = demote;
    Init(8);  // a window covers 2 pages
    const Hashes a = H({1, 2});
    Insert(a);
    const Hashes b = H({5, 6, 7});
    Insert(b, /*live_from=*/1);
    EXPECT_EQ(M(b), Lens(12, 12));
    const Hashes c = H({5, 6, 7, 8, 9, 10});
    Insert(c, /*live_from=*/4);  // SWA KV for its own window only
    ClearEvents();
    const EvictResult r = cache_->Evict(0, 1);
    CHECK_CACHE();
    EXPECT_EQ(r.swa_pages_freed, 2);
    if (demote) {
      EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(Hashes(b.begin() + 1, b.end())));
      EXPECT_EQ(M(a), Lens(8, 8));
      EXPECT_EQ(M(b), Lens(12, 0));  // a full-KV match now, restorable
    } else {
      EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(a));
      EXPECT_EQ(M(b), Lens(12, 12));
    }
    EXPECT_EQ(M(c), Lens(24, 24));
    cache_.reset();
    pools_.reset();
  }
}

// A turn extending b by less than a window brings SWA KV for part of b's
// window itself: that part is the new window's and is not demoted.
TEST_F(PrefixCacheTest, AWindowTheExtensionStillReadsStaysHot) {
  keep_tombstones_ = true;
  cold_superseded_ = true;
  Init(8);
  const Hashes a = H({1, 2});
  Insert(a);
  const Hashes b = H({5, 6, 7});
  Insert(b, /*live_from=*/1);
  const Hashes c = H({5, 6, 7, 8});
  Insert(c, /*live_from=*/2);  // c's window: pages 2 and 3
  ClearEvents();
  cache_->Evict(0, 1);
  CHECK_CACHE();
  // LRU among hot windows: a, the older, goes; b's end stays window-safe.
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(a));
  EXPECT_EQ(M(b), Lens(12, 12));
  EXPECT_EQ(M(c), Lens(16, 16));
}

// A turn that restored b's evicted window and extends b: the rebuilt window
// heals b's end and is superseded at once, so it goes cold too.
TEST_F(PrefixCacheTest, ARestoredWindowAnExtensionSupersedesGoesCold) {
  keep_tombstones_ = true;
  cold_superseded_ = true;
  Init(8);
  const Hashes b = H({5, 6, 7});
  Insert(b, /*live_from=*/1);
  cache_->Evict(0, 2);  // b's window: b is a restorable tombstone leaf now
  CHECK_CACHE();
  EXPECT_EQ(M(b), Lens(12, 0));
  const Hashes a = H({1, 2});
  Insert(a);
  const Hashes c = H({5, 6, 7, 8, 9, 10});
  InsertPattern(c, {false, true, true, false, true, true});  // restored + own window
  EXPECT_EQ(M(b), Lens(12, 12));  // healed
  ClearEvents();
  cache_->Evict(0, 1);
  CHECK_CACHE();
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(Hashes(b.begin() + 1, b.end())));
  EXPECT_EQ(M(a), Lens(8, 8));
  EXPECT_EQ(M(c), Lens(24, 24));
}

TEST_F(PrefixCacheTest, EvictionDemotesToL2KeepingOnlyTheTrailingWindowsSwa) {
  l2_full_pages_ = 16;
  l2_swa_pages_ = 8;
  Init(8);  // W = 8, 4-token pages: a window is 2 pages
  const Hashes a = H({1, 2, 3, 4});
  Insert(a);
  ClearEvents();
  EvictResult r = cache_->Evict(4, 0);
  CHECK_CACHE();
  // All four L1 pages are free; the trailing window [2, 4) went down with
  // its SWA, the rest (one child, not a hit end) without.
  EXPECT_EQ(r.full_pages_freed, 4);
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(cache_->l2_full_pages(), 4);
  EXPECT_EQ(cache_->l2_swa_pages(), 2);
  EXPECT_TRUE(Events(CacheEvent::Type::kRemoved).empty());
  EXPECT_EQ(Events(CacheEvent::Type::kTierChanged), Sorted(a));
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(Prefix(a, 2)));
  // Not usable until loaded back; Match says how much L2 holds.
  const Hashes longer = H({1, 2, 3, 4, 5});
  MatchLengths m = cache_->Match(longer);
  EXPECT_EQ(m.matched_tokens, 0);
  EXPECT_EQ(m.lower_tier_tokens, 16);
  EXPECT_EQ(cache_->MatchAndLock(longer).tokens(), 0);
  // Below the threshold nothing moves; at it everything does.
  EXPECT_EQ(cache_->LoadBack(longer, INT32_MAX, 17).pages, 0);
  ClearEvents();
  LoadBackResult lb = cache_->LoadBack(longer, INT32_MAX, 16);
  CHECK_CACHE();
  EXPECT_EQ(lb.pages, 4);
  EXPECT_EQ(lb.swa_pages, 2);
  EXPECT_EQ(cache_->l2_full_pages(), 0);
  EXPECT_EQ(Events(CacheEvent::Type::kTierChanged), Sorted(a));
  EXPECT_EQ(M(longer), Lens(16, 16));  // the window came back: window-safe
  EXPECT_EQ(cache_->stats().demoted_pages.load(), 4);
  EXPECT_EQ(cache_->stats().loaded_back_pages.load(), 4);
}

TEST_F(PrefixCacheTest, AnInsertAdoptsTheL2NodesOnItsPath) {
  l2_full_pages_ = 16;
  l2_swa_pages_ = 8;
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Insert(a);
  cache_->Evict(4, 0);
  ClearEvents();
  const Hashes b = H({1, 2, 3, 4, 5, 6});
  Inserted in = Insert(b, /*live_from=*/4);  // the request recomputed a's pages
  CHECK_CACHE();
  EXPECT_EQ(cache_->l2_full_pages(), 0) << "the path is back in L1";
  EXPECT_EQ(cache_->cached_full_pages(), 6);
  ExpectCached(pools_->full(), in.full);  // the request's pages, adopted
  EXPECT_EQ(Events(CacheEvent::Type::kTierChanged), Sorted(a));
  EXPECT_EQ(M(H({1, 2, 3, 4, 5, 6, 7})), Lens(24, 24));
}

TEST_F(PrefixCacheTest, FullL2DeletesItsLeastRecentlyUsedLeaves) {
  l2_full_pages_ = 4;
  l2_swa_pages_ = 4;
  Init(8);
  const Hashes a = H({1, 2}), b = H({3, 4}), c = H({5, 6});
  Insert(a);
  Insert(b);
  Insert(c);
  ClearEvents();
  cache_->Evict(6, 0);  // a, b fill L2; c pushes a out
  CHECK_CACHE();
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(cache_->l2_full_pages(), 4);
  EXPECT_EQ(Events(CacheEvent::Type::kRemoved), Sorted(a));
  EXPECT_EQ(cache_->Match(c).lower_tier_tokens, 8);
  cache_->Clear();
  CHECK_CACHE();
  EXPECT_EQ(cache_->l2_full_pages(), 0);
}

TEST(PrefixCacheCreate, RejectsAnL2OfAnotherShape) {
  KvPoolsOptions o;
  o.shape.full_layers = 1;
  o.shape.full_kv_heads = 1;
  o.shape.full_k_head_dim = 4;
  o.shape.full_v_head_dim = 4;
  o.shape.swa_layers = 1;
  o.shape.swa_kv_heads = 1;
  o.shape.swa_k_head_dim = 4;
  o.shape.swa_v_head_dim = 4;
  o.shape.sliding_window = 8;
  o.shape.page_size = 4;
  o.full_pages = o.swa_pages = 4;
  o.allocate_memory = false;
  std::unique_ptr<KvPools> l1 = *KvPools::Create(o);
  o.shape.page_size = 8;
  std::unique_ptr<KvPools> l2 = *KvPools::Create(o);
  absl::StatusOr<std::unique_ptr<PrefixCache>> c =
      PrefixCache::Create({.pools = l1.get(), .l2 = l2.get()});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::kv
