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

TEST(PrefixCacheCreate, RejectsMissingPools) {
  PrefixCacheOptions o;
  EXPECT_FALSE(PrefixCache::Create(o).ok());
}

TEST_F(PrefixCacheTest, EmptyCacheMatchesNothing) {
  Init(8);
  const Hashes h = H({1, 2, 3});
  EXPECT_EQ(M(h), Lens(0, 0));
  EXPECT_EQ(M({}), Lens(0, 0));
  CacheHit hit = cache_->MatchAndLock(h);
  EXPECT_EQ(hit.tokens(), 0);
  EXPECT_EQ(hit.matched_tokens(), 0);
  EXPECT_TRUE(hit.full_pages().empty());
  EXPECT_TRUE(hit.swa_pages().empty());
  EXPECT_FALSE(hit.locked());
  EXPECT_FALSE(hit.swa_locked());
  cache_->ReleaseSwa(hit);
  cache_->Unlock(hit);
  cache_->Unlock(hit);
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(cache_->EvictableFullPages(), 0);
  EXPECT_EQ(cache_->EvictableSwaPages(), 0);
  EvictResult r = cache_->Evict(10, 10);
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(r.swa_pages_freed, 0);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, InsertThenMatch) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted in = Insert(a);
  EXPECT_EQ(cache_->cached_full_pages(), 4);
  EXPECT_EQ(cache_->cached_swa_pages(), 4);
  ExpectCached(pools_->full(), in.full);
  ExpectCached(pools_->swa(), in.swa);
  EXPECT_EQ(cache_->EvictableFullPages(), 4);
  EXPECT_EQ(cache_->EvictableSwaPages(), 4);

  EXPECT_EQ(M(a), Lens(16, 16));
  EXPECT_EQ(M(Prefix(a, 2)), Lens(8, 8));
  EXPECT_EQ(M(H({1, 2, 3, 4, 5, 6})), Lens(16, 16));
  EXPECT_EQ(M(H({1, 2, 9, 9})), Lens(8, 8));
  EXPECT_EQ(M(H({9, 2, 3, 4})), Lens(0, 0));
  // Same page contents at a different position is a different prefix.
  EXPECT_EQ(M(H({2, 3, 4})), Lens(0, 0));

  CacheHit hit = cache_->MatchAndLock(a);
  EXPECT_EQ(hit.tokens(), 16);
  EXPECT_EQ(hit.matched_tokens(), 16);
  EXPECT_TRUE(hit.locked());
  EXPECT_TRUE(hit.swa_locked());
  EXPECT_EQ(std::vector<PageId>(hit.full_pages().begin(), hit.full_pages().end()),
            in.full);
  // The hit's last window: tokens [16 - 8 + 1, 16) = [9, 16): pages 2 and 3.
  EXPECT_EQ(hit.swa_first_page(), 2);
  ASSERT_EQ(hit.swa_pages().size(), 2u);
  EXPECT_EQ(hit.swa_pages()[0], in.swa[2]);
  EXPECT_EQ(hit.swa_pages()[1], in.swa[3]);
  CHECK_CACHE();
  cache_->Unlock(hit);
  EXPECT_FALSE(hit.locked());
  CHECK_CACHE();

  // A hit shorter than the window needs SWA KV from the start.
  CacheHit short_hit = cache_->MatchAndLock(Prefix(a, 1));
  EXPECT_EQ(short_hit.tokens(), 4);
  EXPECT_EQ(short_hit.swa_first_page(), 0);
  ASSERT_EQ(short_hit.swa_pages().size(), 1u);
  EXPECT_EQ(short_hit.swa_pages()[0], in.swa[0]);
  cache_->Unlock(short_hit);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, WindowSafeTombstonedHead) {
  Init(8);  // a hit of L needs SWA KV for tokens [L - 7, L)
  const Hashes a = H({1, 2, 3, 4});
  Insert(a, /*live_from=*/2);  // [tombstone 0,1 | live 2,3]
  EXPECT_EQ(cache_->cached_full_pages(), 4);
  EXPECT_EQ(cache_->cached_swa_pages(), 2);
  // L = 16 needs tokens [9, 16): pages 2, 3: live.
  EXPECT_EQ(M(a), Lens(16, 16));
  // L = 12 needs [5, 12): pages 1, 2; page 1 is a tombstone. L = 8, 4 too.
  EXPECT_EQ(M(Prefix(a, 3)), Lens(12, 0));
  EXPECT_EQ(M(Prefix(a, 2)), Lens(8, 0));
  EXPECT_EQ(M(Prefix(a, 1)), Lens(4, 0));
  // Longer prompts hit the whole cached path.
  EXPECT_EQ(M(H({1, 2, 3, 4, 5})), Lens(16, 16));

  const Hashes b = H({7, 8, 9, 10});
  Insert(b, /*live_from=*/3);  // only 4 live tokens at the end: never safe
  EXPECT_EQ(M(b), Lens(16, 0));
  CacheHit hit = cache_->MatchAndLock(b);
  EXPECT_EQ(hit.tokens(), 0);
  EXPECT_EQ(hit.matched_tokens(), 16);
  EXPECT_TRUE(hit.full_pages().empty());
  cache_->Unlock(hit);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, WindowSafeTombstonedMiddle) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  Insert(Prefix(a, 2));             // [live 0,1]
  ClearEvents();
  Inserted in = Insert(a, /*live_from=*/4);  // + [tombstone 2,3 | live 4,5]
  // Pages 0, 1 were already cached: the incoming copies are freed.
  ExpectFree(pools_->full(), {in.full[0], in.full[1]});
  ExpectCached(pools_->full(), {in.full[2], in.full[3], in.full[4], in.full[5]});
  EXPECT_EQ(Events(CacheEvent::Type::kStored), Sorted(Hashes(a.begin() + 2, a.end())));
  EXPECT_EQ(cache_->cached_full_pages(), 6);
  EXPECT_EQ(cache_->cached_swa_pages(), 4);

  EXPECT_EQ(M(a), Lens(24, 24));                // 8 live tokens after the tombstone
  EXPECT_EQ(M(Prefix(a, 5)), Lens(20, 8));      // needs pages 3, 4
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 8));      // needs pages 2, 3
  EXPECT_EQ(M(Prefix(a, 3)), Lens(12, 8));      // needs pages 1, 2
  EXPECT_EQ(M(Prefix(a, 2)), Lens(8, 8));       // root path, no tombstone
  EXPECT_EQ(M(H({1, 2, 3, 4, 5, 9})), Lens(20, 8));

  CacheHit hit = cache_->MatchAndLock(Prefix(a, 5));
  EXPECT_EQ(hit.tokens(), 8);
  EXPECT_EQ(hit.matched_tokens(), 20);
  ASSERT_EQ(hit.full_pages().size(), 2u);
  EXPECT_EQ(hit.swa_first_page(), 0);
  ASSERT_EQ(hit.swa_pages().size(), 2u);
  ExpectCached(pools_->swa(), hit.swa_pages());
  CHECK_CACHE();
  cache_->Unlock(hit);
  CHECK_CACHE();
}

// The rule is exactly "tokens [L - W + 1, L) have SWA KV": W - 1 live tokens
// after a tombstone suffice (not W).
TEST_F(PrefixCacheTest, WindowSafeNeedsExactlyTheLastWMinusOneTokens) {
  Init(/*window=*/9);  // L = 16 needs tokens [8, 16): pages 2, 3 only
  const Hashes a = H({1, 2, 3, 4});
  Insert(a, /*live_from=*/2);
  EXPECT_EQ(M(a), Lens(16, 16));
  const Hashes b = H({5, 6, 7, 8});
  Insert(b, /*live_from=*/3);
  EXPECT_EQ(M(b), Lens(16, 0));
}

TEST_F(PrefixCacheTest, WindowSafeSmallWindow) {
  Init(/*window=*/5);  // L needs tokens [L - 4, L): the last page only
  const Hashes a = H({1, 2, 3, 4});
  Insert(a, /*live_from=*/3);
  EXPECT_EQ(M(a), Lens(16, 16));
  EXPECT_EQ(M(Prefix(a, 3)), Lens(12, 0));
  CacheHit hit = cache_->MatchAndLock(a);
  EXPECT_EQ(hit.tokens(), 16);
  EXPECT_EQ(hit.swa_first_page(), 3);
  ASSERT_EQ(hit.swa_pages().size(), 1u);
  cache_->Unlock(hit);
}

TEST_F(PrefixCacheTest, MaxTokensCapsTheHit) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted in = Insert(a);
  {
    CacheHit hit = cache_->MatchAndLock(a, /*max_tokens=*/15);  // -> 12
    EXPECT_EQ(hit.tokens(), 12);
    EXPECT_GE(hit.matched_tokens(), 12);
    ASSERT_EQ(hit.full_pages().size(), 3u);
    EXPECT_EQ(hit.full_pages()[2], in.full[2]);
    EXPECT_EQ(hit.swa_first_page(), 1);  // tokens [5, 12)
    ASSERT_EQ(hit.swa_pages().size(), 2u);
    EXPECT_EQ(hit.swa_pages()[0], in.swa[1]);
    EXPECT_EQ(hit.swa_pages()[1], in.swa[2]);
    CHECK_CACHE();
    // Page 3 is not part of the hit: it can be evicted.
    EXPECT_EQ(cache_->EvictableFullPages(), 1);
    cache_->Unlock(hit);
  }
  {
    CacheHit hit = cache_->MatchAndLock(a, 16);
    EXPECT_EQ(hit.tokens(), 16);
    cache_->Unlock(hit);
  }
  for (int cap : {0, 1, 3}) {
    CacheHit hit = cache_->MatchAndLock(a, cap);
    EXPECT_EQ(hit.tokens(), 0) << cap;
    EXPECT_TRUE(hit.full_pages().empty());
    EXPECT_FALSE(hit.locked());
    cache_->Unlock(hit);
  }
  // The cap applies before the window-safe rule: with a tombstone in the
  // middle, capping into it falls back to the last safe boundary.
  const Hashes b = H({5, 6, 7, 8, 9, 10});
  Insert(Prefix(b, 2));
  Insert(b, 4);  // [live 0,1][tomb 2,3][live 4,5]
  {
    CacheHit hit = cache_->MatchAndLock(b, 23);  // cap 20: needs pages 3, 4
    EXPECT_EQ(hit.tokens(), 8);
    cache_->Unlock(hit);
  }
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, LocksPreventEviction) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted in = Insert(a);
  CacheHit hit = cache_->MatchAndLock(a);             // SWA lock: pages 2, 3
  CacheHit hit2 = cache_->MatchAndLock(Prefix(a, 2));  // SWA lock: pages 0, 1
  ASSERT_EQ(hit.tokens(), 16);
  ASSERT_EQ(hit2.tokens(), 8);
  EXPECT_EQ(cache_->EvictableFullPages(), 0);
  EXPECT_EQ(cache_->EvictableSwaPages(), 0);
  EvictResult r = cache_->Evict(100, 0);
  EXPECT_EQ(r.full_pages_freed, 0);
  CHECK_CACHE();
  r = cache_->Evict(100, 100);
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(r.swa_pages_freed, 0);
  CHECK_CACHE();
  EXPECT_EQ(cache_->cached_full_pages(), 4);
  ExpectCached(pools_->full(), in.full);
  ExpectCached(pools_->swa(), in.swa);
  EXPECT_EQ(M(a), Lens(16, 16));

  cache_->Unlock(hit);
  EXPECT_FALSE(hit.locked());
  CHECK_CACHE();
  EXPECT_EQ(cache_->EvictableFullPages(), 2);
  r = cache_->Evict(100, 0);
  EXPECT_EQ(r.full_pages_freed, 2);  // pages 2, 3 only
  CHECK_CACHE();
  EXPECT_EQ(M(a), Lens(8, 8));
  ExpectCached(pools_->full(), {in.full[0], in.full[1]});
  ExpectCached(pools_->swa(), {in.swa[0], in.swa[1]});

  cache_->Unlock(hit2);
  EXPECT_EQ(cache_->EvictableFullPages(), 2);
  r = cache_->Evict(100, 100);
  EXPECT_EQ(r.full_pages_freed, 2);
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(cache_->cached_swa_pages(), 0);
  EXPECT_EQ(pools_->full().num_free(), 64);
  EXPECT_EQ(pools_->swa().num_free(), 64);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, MovedHitCarriesItsLocks) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Insert(a);
  CacheHit hit = cache_->MatchAndLock(a);
  CacheHit moved = std::move(hit);
  EXPECT_TRUE(moved.locked());
  EXPECT_EQ(moved.tokens(), 16);
  cache_->Unlock(hit);  // moved-from: nothing to unlock
  EXPECT_EQ(cache_->EvictableFullPages(), 0);
  CacheHit assigned;
  assigned = std::move(moved);
  EXPECT_TRUE(assigned.locked());
  cache_->Unlock(assigned);
  EXPECT_EQ(cache_->EvictableFullPages(), 4);
  CHECK_CACHE();
}

// The SWA lock covers only the hit's last window: older SWA pages on the
// locked path can still be tombstoned while the full KV stays.
TEST_F(PrefixCacheTest, SwaLockCoversOnlyTheLastWindow) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  Inserted in = Insert(a);
  CacheHit hit = cache_->MatchAndLock(a);  // window: tokens [17, 24), pages 4, 5
  ASSERT_EQ(hit.tokens(), 24);
  EXPECT_EQ(hit.swa_first_page(), 4);
  EXPECT_EQ(cache_->EvictableFullPages(), 0);
  EXPECT_EQ(cache_->EvictableSwaPages(), 4);
  ClearEvents();
  EvictResult r = cache_->Evict(0, 100);
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(r.swa_pages_freed, 4);
  CHECK_CACHE();
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted(Prefix(a, 4)));
  EXPECT_TRUE(Events(CacheEvent::Type::kRemoved).empty());
  EXPECT_GE(cache_->stats().tombstoned_nodes.load(), 1);
  EXPECT_GE(cache_->stats().tombstone_nodes.load(), 1);
  EXPECT_EQ(cache_->stats().evicted_swa_pages.load(), 4);
  EXPECT_EQ(cache_->stats().evicted_full_pages.load(), 0);
  ExpectFree(pools_->swa(), {in.swa[0], in.swa[1], in.swa[2], in.swa[3]});
  ExpectCached(pools_->swa(), {in.swa[4], in.swa[5]});
  ExpectCached(pools_->full(), in.full);
  EXPECT_EQ(M(a), Lens(24, 24));
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 0));
  cache_->Unlock(hit);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, ReleaseSwaLetsSwaBeTombstonedWhileFullStays) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  Inserted in = Insert(a);
  CacheHit long_hit = cache_->MatchAndLock(a);             // SWA lock: pages 4, 5
  CacheHit hit = cache_->MatchAndLock(Prefix(a, 4));       // SWA lock: pages 2, 3
  ASSERT_EQ(hit.tokens(), 16);
  EXPECT_TRUE(hit.swa_locked());
  EvictResult r = cache_->Evict(0, 100);
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(r.swa_pages_freed, 2);  // pages 0, 1
  CHECK_CACHE();
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 16));

  cache_->ReleaseSwa(hit);
  EXPECT_FALSE(hit.swa_locked());
  EXPECT_TRUE(hit.locked());
  cache_->ReleaseSwa(hit);  // idempotent
  CHECK_CACHE();
  EXPECT_EQ(cache_->EvictableSwaPages(), 2);
  EXPECT_EQ(cache_->EvictableFullPages(), 0);
  ClearEvents();
  r = cache_->Evict(0, 100);
  EXPECT_EQ(r.full_pages_freed, 0);
  EXPECT_EQ(r.swa_pages_freed, 2);  // pages 2, 3
  CHECK_CACHE();
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted({a[2], a[3]}));
  EXPECT_EQ(cache_->cached_full_pages(), 6);
  ExpectCached(pools_->full(), in.full);
  ExpectFree(pools_->swa(), {in.swa[2], in.swa[3]});
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 0));
  EXPECT_EQ(M(a), Lens(24, 24));

  // The long hit goes away: its leaf may be deleted, but the released hit's
  // full pages stay cached and the tree stays valid (no tombstone leaf).
  cache_->Unlock(long_hit);
  CHECK_CACHE();
  r = cache_->Evict(100, 100);
  CHECK_CACHE();
  ExpectCached(pools_->full(), hit.full_pages());
  ClearEvents();
  cache_->Unlock(hit);
  CHECK_CACHE();
  // The tombstones kept only for the hit's full lock go with the lock.
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(Events(CacheEvent::Type::kRemoved), Sorted(Prefix(a, 4)));
  r = cache_->Evict(100, 100);
  CHECK_CACHE();
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(cache_->cached_swa_pages(), 0);
}

// Evict(0, n) with n >= EvictableSwaPages() frees every SWA page that was
// reported evictable, even when deleting a leaf first turns its SWA-released
// (but still full-locked) parent into a leaf.
TEST_F(PrefixCacheTest, HealingInsertRestoresSwaOfATombstone) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted first = Insert(a, /*live_from=*/2);
  EXPECT_EQ(M(Prefix(a, 2)), Lens(8, 0));
  const int64_t dup_before = cache_->stats().duplicate_pages.load();
  const int64_t healed_before = cache_->stats().healed_pages.load();
  ClearEvents();
  Inserted second = Insert(a, /*live_from=*/0);
  EXPECT_EQ(Events(CacheEvent::Type::kSwaStored), Sorted(Prefix(a, 2)));
  EXPECT_TRUE(Events(CacheEvent::Type::kStored).empty());
  EXPECT_TRUE(Events(CacheEvent::Type::kRemoved).empty());
  EXPECT_EQ(cache_->stats().healed_pages.load() - healed_before, 2);
  EXPECT_EQ(cache_->stats().duplicate_pages.load() - dup_before, 4);
  EXPECT_EQ(cache_->cached_full_pages(), 4);
  EXPECT_EQ(cache_->cached_swa_pages(), 4);
  ExpectCached(pools_->full(), first.full);
  ExpectFree(pools_->full(), second.full);
  ExpectCached(pools_->swa(), {second.swa[0], second.swa[1], first.swa[2], first.swa[3]});
  ExpectFree(pools_->swa(), {second.swa[2], second.swa[3]});
  EXPECT_EQ(M(Prefix(a, 2)), Lens(8, 8));
  EXPECT_EQ(M(Prefix(a, 3)), Lens(12, 12));
  CacheHit hit = cache_->MatchAndLock(Prefix(a, 2));
  ASSERT_EQ(hit.tokens(), 8);
  EXPECT_EQ(hit.full_pages()[0], first.full[0]);
  ASSERT_EQ(hit.swa_pages().size(), 2u);
  EXPECT_EQ(hit.swa_pages()[0], second.swa[0]);
  EXPECT_EQ(hit.swa_pages()[1], second.swa[1]);
  cache_->Unlock(hit);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, PartialHealingSplitsTheTombstone) {
  Init(/*window=*/5);  // L needs tokens [L - 4, L): one page
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  Insert(a, /*live_from=*/4);  // [tomb 0..3 | live 4,5]
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 0));
  ClearEvents();
  Insert(a, /*live_from=*/3);  // heals page 3 only
  EXPECT_EQ(Events(CacheEvent::Type::kSwaStored), Sorted({a[3]}));
  EXPECT_EQ(cache_->cached_swa_pages(), 3);
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 16));
  EXPECT_EQ(M(Prefix(a, 3)), Lens(12, 0));
  CHECK_CACHE();
}

// A request that kept the SWA window where its prompt diverged from a cached
// path (Sequence's divergence window) inserts two live runs: the first heals
// the tombstone it covers, making the path window-safe there.
TEST_F(PrefixCacheTest, SeveralLiveRunsHealTheTombstonesTheyCover) {
  Init(/*window=*/5);  // L needs tokens [L - 4, L): one page
  const Hashes a = H({1, 2, 3, 4, 5, 6, 7, 8});
  Inserted first = Insert(a, /*live_from=*/6);  // [tomb 0..5 | live 6, 7]
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 0));
  ClearEvents();
  Inserted second = InsertPattern(a, {false, false, false, true, false, false, true, true});
  EXPECT_EQ(Events(CacheEvent::Type::kSwaStored), Sorted({a[3]}));
  EXPECT_TRUE(Events(CacheEvent::Type::kStored).empty());
  EXPECT_EQ(cache_->cached_swa_pages(), 3);
  ExpectCached(pools_->swa(), {second.swa[3], first.swa[6], first.swa[7]});
  ExpectFree(pools_->swa(), {second.swa[6], second.swa[7]});
  ExpectFree(pools_->full(), second.full);
  EXPECT_EQ(M(Prefix(a, 3)), Lens(12, 0));
  EXPECT_EQ(M(Prefix(a, 4)), Lens(16, 16));
  EXPECT_EQ(M(Prefix(a, 6)), Lens(24, 16));
  EXPECT_EQ(M(a), Lens(32, 32));
  // A hit at the healed point locks it; eviction cannot take it meanwhile.
  CacheHit hit = cache_->MatchAndLock(Prefix(a, 4));
  ASSERT_EQ(hit.tokens(), 16);
  ASSERT_EQ(hit.swa_pages().size(), 1u);
  EXPECT_EQ(hit.swa_pages()[0], second.swa[3]);
  cache_->Unlock(hit);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, NewSuffixWithSeveralLiveRunsAlternatesNodes) {
  Init(/*window=*/5);
  const Hashes b = H({9, 10, 11, 12, 13, 14, 15, 16, 17});
  // The last page has no SWA KV: it would be a tombstone leaf, so it is
  // dropped (and freed).
  Inserted in = InsertPattern(b, {false, false, true, false, false, false, true, true, false});
  EXPECT_EQ(Events(CacheEvent::Type::kStored), Sorted(Prefix(b, 8)));
  EXPECT_EQ(Events(CacheEvent::Type::kSwaRemoved), Sorted({b[0], b[1], b[3], b[4], b[5]}));
  EXPECT_EQ(cache_->cached_full_pages(), 8);
  EXPECT_EQ(cache_->cached_swa_pages(), 3);
  ExpectFree(pools_->full(), {in.full[8]});
  EXPECT_EQ(M(Prefix(b, 2)), Lens(8, 0));
  EXPECT_EQ(M(Prefix(b, 3)), Lens(12, 12));
  EXPECT_EQ(M(Prefix(b, 5)), Lens(20, 12));
  EXPECT_EQ(M(Prefix(b, 8)), Lens(32, 32));
  CHECK_CACHE();
  // Evicting everything frees every page (no tombstone is left behind).
  cache_->Evict(1000, 1000);
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  EXPECT_EQ(cache_->cached_swa_pages(), 0);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, DuplicateInsertFreesTheIncomingPages) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted first = Insert(a);
  const int64_t inserted = cache_->stats().inserted_pages.load();
  EXPECT_EQ(inserted, 4);
  ClearEvents();
  Inserted second = Insert(a);
  EXPECT_TRUE(events_.empty()) << "a duplicate insert changes nothing";
  ExpectFree(pools_->full(), second.full);
  ExpectFree(pools_->swa(), second.swa);
  ExpectCached(pools_->full(), first.full);
  ExpectCached(pools_->swa(), first.swa);
  EXPECT_EQ(cache_->stats().inserted_pages.load(), 4);
  EXPECT_EQ(cache_->stats().duplicate_pages.load(), 4);
  EXPECT_EQ(cache_->cached_full_pages(), 4);
  EXPECT_EQ(cache_->cached_swa_pages(), 4);

  // An extension: the shared part is freed, the new pages adopted.
  const Hashes b = H({1, 2, 3, 4, 5, 6});
  Inserted third = Insert(b);
  EXPECT_EQ(Events(CacheEvent::Type::kStored), Sorted({b[4], b[5]}));
  ExpectFree(pools_->full(), {third.full[0], third.full[1], third.full[2], third.full[3]});
  ExpectCached(pools_->full(), {third.full[4], third.full[5]});
  EXPECT_EQ(cache_->stats().inserted_pages.load(), 6);
  EXPECT_EQ(cache_->cached_full_pages(), 6);
}

// A request that started from a hit hands back the hit's own pages along
// with its new ones: the cache's pages are left alone.
TEST_F(PrefixCacheTest, InsertWithTheCallersOwnHitPages) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  Inserted first = Insert(Prefix(a, 4));
  CacheHit hit = cache_->MatchAndLock(Prefix(a, 4));
  ASSERT_EQ(hit.tokens(), 16);
  std::vector<PageId> full(hit.full_pages().begin(), hit.full_pages().end());
  std::vector<PageId> fresh_full = Take(pools_->full(), 2);
  full.insert(full.end(), fresh_full.begin(), fresh_full.end());
  std::vector<PageId> swa(6, kNoPage);
  swa[2] = hit.swa_pages()[0];
  swa[3] = hit.swa_pages()[1];
  std::vector<PageId> fresh_swa = Take(pools_->swa(), 2);
  swa[4] = fresh_swa[0];
  swa[5] = fresh_swa[1];
  cache_->Insert(a, full, swa);
  CHECK_CACHE();
  EXPECT_EQ(pools_->full().num_in_use(), 0);
  EXPECT_EQ(pools_->swa().num_in_use(), 0);
  ExpectCached(pools_->full(), full);
  ExpectCached(pools_->swa(), {swa[2], swa[3], swa[4], swa[5]});
  ExpectCached(pools_->swa(), {first.swa[0], first.swa[1]});
  EXPECT_EQ(cache_->cached_full_pages(), 6);
  EXPECT_EQ(cache_->cached_swa_pages(), 6);
  EXPECT_TRUE(hit.locked()) << "the caller's hit stays locked after Insert";
  EXPECT_EQ(M(a), Lens(24, 24));
  cache_->Unlock(hit);
  CHECK_CACHE();
}

// New pages without any SWA KV would make a tombstone leaf: they are not
// kept (and the caller's pages are still taken over).
TEST_F(PrefixCacheTest, InsertWithoutAnySwaKeepsNoTombstoneLeaf) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4});
  Inserted in = Insert(a, /*live_from=*/4);
  CHECK_CACHE();
  EXPECT_EQ(M(a).second, 0);
  // Under a live prefix too.
  const Hashes b = H({5, 6, 7, 8});
  Insert(Prefix(b, 2));
  Insert(b, /*live_from=*/4);
  CHECK_CACHE();
  EXPECT_EQ(M(b).second, 8);
  EXPECT_EQ(pools_->full().num_in_use(), 0);
}

TEST_F(PrefixCacheTest, MultimodalContentHashesSplitThePrefix) {
  Init(8);
  // 12 tokens; an image's placeholders are tokens [4, 8) (page 1).
  std::vector<uint32_t> tokens(12);
  for (int i = 0; i < 12; ++i) tokens[i] = 100 + i;
  const std::vector<base::HashedSpan> cat = {{4, 4, base::Hash128Of("cat.png")}};
  const std::vector<base::HashedSpan> dog = {{4, 4, base::Hash128Of("dog.png")}};
  const Hashes with_cat = base::ChainedPageHashes(tokens, 4, cat);
  const Hashes with_dog = base::ChainedPageHashes(tokens, 4, dog);
  const Hashes cat_again = base::ChainedPageHashes(tokens, 4, cat);
  Insert(with_cat);
  EXPECT_EQ(M(with_cat), Lens(12, 12));
  EXPECT_EQ(M(cat_again), Lens(12, 12));
  EXPECT_EQ(M(with_dog), Lens(4, 4));  // only the page before the image
  // An image that starts mid-page taints that page too.
  const std::vector<base::HashedSpan> cat_mid = {{2, 4, base::Hash128Of("cat.png")}};
  const std::vector<base::HashedSpan> dog_mid = {{2, 4, base::Hash128Of("dog.png")}};
  const Hashes mid_cat = base::ChainedPageHashes(tokens, 4, cat_mid);
  const Hashes mid_dog = base::ChainedPageHashes(tokens, 4, dog_mid);
  Insert(mid_cat);
  EXPECT_EQ(M(mid_dog), Lens(0, 0));
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, EventsCarryChainedHashesInPrefixOrder) {
  Init(8);
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  Insert(a);
  EXPECT_EQ(Events(CacheEvent::Type::kStored), Sorted(a));
  for (const CacheEvent& e : events_) {
    EXPECT_EQ(e.type, CacheEvent::Type::kStored) << "a fresh insert only stores";
  }
  ASSERT_FALSE(events_.empty());
  EXPECT_EQ(events_[0].hashes[0], a[0]);
  ClearEvents();
  CacheHit hit = cache_->MatchAndLock(a);
  EXPECT_TRUE(events_.empty()) << "a lookup is not a content change";
  cache_->Unlock(hit);
  EXPECT_TRUE(events_.empty());
  const Hashes b = H({1, 2, 3, 7, 8});
  Insert(b);
  EXPECT_EQ(Events(CacheEvent::Type::kStored), Sorted({b[3], b[4]}));
  cache_->Evict(100, 100);
  CHECK_CACHE();
  // Everything is gone: every stored page was reported removed exactly once.
  Hashes all = a;
  all.push_back(b[3]);
  all.push_back(b[4]);
  EXPECT_EQ(Events(CacheEvent::Type::kRemoved), Sorted(all));
  for (const CacheEvent& e : events_) {
    // Each event's hashes are a run of one chain, in prefix order.
    ASSERT_FALSE(e.hashes.empty());
    const Hashes& chain =
        std::find(a.begin(), a.end(), e.hashes[0]) != a.end() ? a : b;
    auto it = std::find(chain.begin(), chain.end(), e.hashes[0]);
    ASSERT_NE(it, chain.end());
    for (size_t i = 0; i < e.hashes.size(); ++i, ++it) {
      ASSERT_NE(it, chain.end());
      EXPECT_EQ(*it, e.hashes[i]);
    }
  }
}

TEST_F(PrefixCacheTest, Stats) {
  Init(8);
  const PrefixCacheStats& st = cache_->stats();
  const int64_t nodes0 = st.nodes.load();
  const Hashes a = H({1, 2, 3, 4, 5, 6});
  Insert(Prefix(a, 2));
  Insert(a, /*live_from=*/4);  // [live 0,1][tomb 2,3][live 4,5]
  EXPECT_EQ(st.inserted_pages.load(), 6);
  EXPECT_EQ(st.duplicate_pages.load(), 2);
  EXPECT_GE(st.nodes.load() - nodes0, 3);
  EXPECT_GE(st.tombstone_nodes.load(), 1);
  EXPECT_EQ(st.lookups.load(), 0);

  CacheHit h1 = cache_->MatchAndLock(a);             // 24 of 24
  CacheHit h2 = cache_->MatchAndLock(Prefix(a, 4));  // 8 of 16: 8 lost
  CacheHit h3 = cache_->MatchAndLock(H({9, 9}));     // nothing
  EXPECT_EQ(st.lookups.load(), 3);
  EXPECT_EQ(st.lookup_tokens.load(), 24 + 16 + 8);
  EXPECT_EQ(st.hit_tokens.load(), 24 + 8);
  EXPECT_EQ(st.window_lost_tokens.load(), 8);
  (void)cache_->Match(a);  // no side effects
  EXPECT_EQ(st.lookups.load(), 3);
  cache_->Unlock(h1);
  cache_->Unlock(h2);
  cache_->Unlock(h3);

  EXPECT_EQ(st.tombstoned_nodes.load(), 0);
  EvictResult r = cache_->Evict(0, 2);
  EXPECT_EQ(st.evicted_swa_pages.load(), r.swa_pages_freed);
  EXPECT_EQ(st.evicted_full_pages.load(), r.full_pages_freed);
  CHECK_CACHE();
  r = cache_->Evict(100, 100);
  EXPECT_EQ(st.evicted_full_pages.load(), 6);
  EXPECT_EQ(st.evicted_swa_pages.load(), 4);  // every SWA page ever cached
  EXPECT_EQ(st.nodes.load(), nodes0);
  EXPECT_EQ(st.tombstone_nodes.load(), 0);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, EvictFreesAtLeastWhatWasAskedWhenPossible) {
  Init(8);
  for (uint32_t i = 0; i < 8; ++i) Insert(H({10 * i + 1, 10 * i + 2, 10 * i + 3}));
  EXPECT_EQ(cache_->EvictableFullPages(), 24);
  EXPECT_EQ(cache_->EvictableSwaPages(), 24);
  EvictResult r = cache_->Evict(7, 0);
  EXPECT_GE(r.full_pages_freed, 7);
  CHECK_CACHE();
  r = cache_->Evict(0, 5);
  EXPECT_GE(r.swa_pages_freed, 5);
  CHECK_CACHE();
  const int64_t left = cache_->cached_full_pages();
  r = cache_->Evict(1000, 0);
  EXPECT_EQ(r.full_pages_freed, left);
  EXPECT_EQ(cache_->cached_full_pages(), 0);
  CHECK_CACHE();
}

TEST_F(PrefixCacheTest, DestructorFreesCachedPages) {
  Init(8);
  Insert(H({1, 2, 3}));
  Insert(H({1, 2, 4, 5}), 2);
  EXPECT_GT(pools_->full().num_cached(), 0);
  EXPECT_FALSE(cache_->DebugString().empty());
  // TearDown destroys the cache and checks that every page is free.
}

}  // namespace
}  // namespace swaserve::kv
