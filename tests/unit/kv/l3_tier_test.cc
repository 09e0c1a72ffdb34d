// The L3 tier: MemoryPageStore, AsyncPageStore, FetchFromL3 and
// PrefixCache's write-back / write-through / AttachFromL3, with real page
// bytes. The consistency cases of the issue each have a test here:
//   full KV in L1 but SWA only in a lower tier  -> FullInL1SwaOnlyInL3Heals
//   in L2 but evicted from L1 (+ the rest in L3) -> L2PartThenL3Part
//   L3 evicting the prefix of a hot sequence      -> L3EvictingAHotPrefix
//   a worker restart with a warm L3 file store    -> RestartWithWarmFileStore
//   corrupt / truncated L3 files                  -> CorruptFileIsAMiss
// (a Redis L3 flushed mid-replay: tests/integration/cluster; a flushed store
// under random operations: kv_content_test).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/file_page_store.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "tests/unit/kv/fake_page_stores.h"
#include "tests/unit/kv/l3_test_harness.h"

namespace swaserve::kv {
namespace {

using Hashes = std::vector<uint64_t>;
using testing::Pattern;
using testing::Shape;
using testing::GatedStore;
using testing::RecordingStore;
using testing::RoomLimitedStore;

TEST(MemoryPageStoreTest, BoundedLruAndFlush) {
  MemoryPageStore s(3 * (10 + MemoryPageStore::kEntryOverhead));
  std::vector<uint8_t> b(10, 7), out(10);
  for (uint64_t h = 1; h <= 3; ++h) ASSERT_TRUE(s.Put({h, 9}, b).ok());
  ASSERT_TRUE(s.Get({1, 9}, absl::MakeSpan(out)).ok());  // 1 is now recent
  ASSERT_TRUE(s.Put({4, 9}, b).ok());                    // evicts 2
  EXPECT_TRUE(s.Contains({1, 9}));
  EXPECT_FALSE(s.Contains({2, 9}));
  EXPECT_FALSE(s.Contains({1, 8})) << "another layout is another key";
  EXPECT_EQ(s.Get({2, 9}, absl::MakeSpan(out)).code(), absl::StatusCode::kNotFound);
  std::vector<uint8_t> wrong(11);
  EXPECT_EQ(s.Get({1, 9}, absl::MakeSpan(wrong)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.stats().evictions.load(), 1);
  s.Flush();
  EXPECT_FALSE(s.Contains({1, 9}));
  EXPECT_EQ(s.stats().entries.load(), 0);
  EXPECT_EQ(s.Put({5, 9}, std::vector<uint8_t>(1000)).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(AsyncPageStoreTest, QueuedPutsReadBackThenLandInOrder) {
  auto gated = std::make_unique<GatedStore>();
  GatedStore* g = gated.get();
  AsyncPageStore s(std::move(gated), {.max_queued_bytes = 80});
  const std::vector<uint8_t> a(16, 1), b(16, 2);
  // {9, 0} holds the writer at the gate, so nothing leaves the queue until
  // Open. Without it the writer could skip the superseded {1, 0} at once and
  // free its bytes, and whether the put of {4, 0} below was dropped depended
  // on the writer's timing (it was not, once, under ASan in CI).
  ASSERT_TRUE(s.Put({9, 0}, a).ok());
  ASSERT_TRUE(s.Put({1, 0}, a).ok());
  ASSERT_TRUE(s.Put({1, 0}, b).ok());  // supersedes a
  ASSERT_TRUE(s.Put({2, 0}, a).ok());
  std::vector<uint8_t> out(16);
  ASSERT_TRUE(s.Get({1, 0}, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, b) << "the latest queued blob answers";
  EXPECT_TRUE(s.Contains({2, 0}));
  ASSERT_TRUE(s.Put({3, 0}, a).ok());
  // 80 bytes queued: the next put is dropped, not blocked.
  EXPECT_EQ(s.Put({4, 0}, a).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.dropped(), 1);
  s.Erase({3, 0});
  EXPECT_FALSE(s.Contains({3, 0}));
  g->Open();
  s.Flush();
  EXPECT_EQ(s.queued_bytes(), 0);
  ASSERT_TRUE(g->inner_.Get({1, 0}, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, b);
  EXPECT_TRUE(g->inner_.Contains({2, 0}));
  EXPECT_TRUE(g->inner_.Contains({9, 0}));
  EXPECT_FALSE(g->inner_.Contains({3, 0})) << "erased before it landed";
  EXPECT_FALSE(g->inner_.Contains({4, 0}));
}

class L3TierTest : public ::testing::Test, public testing::L3Harness {
 protected:
  void TearDown() override { Check(); }
};

TEST_F(L3TierTest, CreateNeedsAnL2) {
  MemoryPageStore l3(1 << 20);
  KvPoolsOptions o;
  o.shape = Shape();
  o.full_pages = 4;
  o.swa_pages = 4;
  auto pools = std::move(*KvPools::Create(o));
  PrefixCacheOptions co;
  co.pools = pools.get();
  co.l3 = &l3;
  EXPECT_EQ(PrefixCache::Create(co).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(L3TierTest, EvictedPagesComeBackFromL3ByteForByte) {
  MemoryPageStore l3(1 << 20);
  Init(&l3, /*write_through_hits=*/0);
  const Hashes a = H(1, 6);
  Insert(a);
  EvictAll();
  EXPECT_EQ(cache_->Match(a).matched_tokens + cache_->Match(a).lower_tier_tokens, 0);
  EXPECT_EQ(cache_->stats().l3_written_pages.load(), 6) << "write-back of every full page";
  EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 2) << "SWA: the trailing window only";
  EXPECT_EQ(FetchAttach(l3, a), 6);
  EXPECT_EQ(VerifyHit(a), 24);
  EXPECT_EQ(cache_->stats().l3_attached_swa_pages.load(), 2);
  // A longer prompt over the same pages hits them too.
  Hashes longer = a;
  longer.push_back(12345);
  EXPECT_EQ(VerifyHit(longer), 24);
}

// A spent fetch's buffers serve the next fetch (L3Prefetcher::Recycle):
// larger or smaller than needed, stale bytes in them, the result is what a
// fresh fetch reads, and an empty fetch hands the buffers back.
TEST_F(L3TierTest, ReusedFetchBuffersReadWhatFreshOnesRead) {
  MemoryPageStore l3(1 << 20);
  Init(&l3, /*write_through_hits=*/0);
  const Hashes big = H(1, 6), small = H(2, 3), absent = H(3, 4);
  Insert(big);
  Insert(small);
  EvictAll();
  const L3FetchOptions o = cache_->l3_fetch_options();
  L3Fetch spare = FetchFromL3(l3, o, big, 0, 0);
  ASSERT_FALSE(spare.empty());
  std::fill(spare.full_bytes.begin(), spare.full_bytes.end(), 0xAB);  // stale bytes
  std::fill(spare.swa_bytes.begin(), spare.swa_bytes.end(), 0xCD);
  for (const Hashes* h : {&small, &big, &small}) {
    const L3Fetch fresh = FetchFromL3(l3, o, *h, 0, 0);
    L3Fetch reused = FetchFromL3(l3, o, *h, 0, 0, &spare);
    EXPECT_EQ(reused.end, fresh.end);
    EXPECT_EQ(reused.full_first, fresh.full_first);
    EXPECT_EQ(reused.swa_first, fresh.swa_first);
    EXPECT_EQ(reused.hashes, fresh.hashes);
    EXPECT_EQ(reused.full_bytes, fresh.full_bytes);
    EXPECT_EQ(reused.swa_bytes, fresh.swa_bytes);
    spare = std::move(reused);
  }
  const size_t capacity = spare.full_bytes.capacity();
  const L3Fetch none = FetchFromL3(l3, o, absent, 0, 0, &spare);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(spare.full_bytes.capacity(), capacity) << "an empty fetch hands the buffers back";
  EXPECT_EQ(FetchAttach(l3, big), 6);
  EXPECT_EQ(VerifyHit(big), 24);
}

TEST_F(L3TierTest, WriteThroughAfterNHits) {
  MemoryPageStore l3(1 << 20);
  Init(&l3, /*write_through_hits=*/2);
  const Hashes a = H(1, 4);
  Insert(a);
  VerifyHit(a);
  EXPECT_EQ(cache_->stats().l3_written_pages.load(), 0);
  VerifyHit(a);
  EXPECT_EQ(cache_->stats().l3_write_through_pages.load(), 4);
  EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 2);
  // Written once: eviction does not write the same pages again.
  EvictAll();
  EXPECT_EQ(cache_->stats().l3_written_pages.load(), 4);
  EXPECT_EQ(FetchAttach(l3, a), 4);
  EXPECT_EQ(VerifyHit(a), 16);
}

// PrefixCacheOptions::l3_write_through_from_tokens: a path that reaches the
// bound is written to L3 at its insert, with no hit (what the next worker up,
// sharing the L3, needs when the prompt grows past its bucket); the pages
// before it that an earlier, shorter insert left unwritten go with it, and
// each page only once.
TEST_F(L3TierTest, APathReachingTheBoundIsWrittenThroughAtInsert) {
  MemoryPageStore l3(1 << 20);
  Init(&l3, /*write_through_hits=*/0, 16, 8, false, /*write_through_from_tokens=*/18);
  const Hashes four = H(1, 4), six = H(1, 6), eight = H(1, 8);
  Insert(four);  // 16 tokens: below the bound
  EXPECT_EQ(cache_->stats().l3_written_pages.load(), 0);
  Insert(six);  // 24 tokens (18 rounds up to 5 pages)
  EXPECT_EQ(cache_->stats().l3_write_through_pages.load(), 6) << "the whole path";
  EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 2) << "its trailing window";
  Insert(eight);
  EXPECT_EQ(cache_->stats().l3_write_through_pages.load(), 8) << "only the 2 new pages";
  EXPECT_EQ(cache_->stats().l3_write_through_bound_pages.load(), 8);
  EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 4);
  // Another worker sharing the store (a fresh cache) finds the whole prompt.
  ExpectAnotherWorkerFindsAll(l3, eight);
}

// A path near the bound larger than the write-behind queue's room
// (PutRoom) is written in pieces, root first, as the queue drains
// (ContinueL3Writes), a node split where the room ends; nothing is dropped,
// and another worker then finds the whole prompt.
TEST_F(L3TierTest, APathLargerThanTheQueueIsWrittenAsItDrains) {
  const int64_t full_page = 2 * 4 * 8 * 4;  // 2 layers x 4 tokens x (4 + 4) x f32
  const int64_t swa_page = 3 * 4 * 8 * 4;   // 3 layers
  RoomLimitedStore l3(1 << 20);
  l3.room_ = 3 * full_page;
  Init(&l3, /*write_through_hits=*/0, 16, 8, false, /*write_through_from_tokens=*/18);
  const Hashes six = H(1, 6);
  Insert(six);  // [0, 4) tombstone, [4, 6) live: 6 full + 2 SWA pages
  EXPECT_EQ(cache_->stats().l3_write_through_bound_pages.load(), 3) << "3 pages fit";
  EXPECT_TRUE(cache_->l3_writes_pending());
  cache_->ContinueL3Writes();  // no room yet: nothing
  EXPECT_EQ(cache_->stats().l3_write_through_bound_pages.load(), 3);
  // The queue drains by 3 full pages' bytes at a time: page 3, then pages 4
  // and 5 with their SWA KV (a full + a SWA page each) one per round.
  std::vector<int64_t> written;
  while (cache_->l3_writes_pending() && written.size() < 10) {
    l3.room_ = 3 * full_page;
    cache_->ContinueL3Writes();
    Check();
    written.push_back(cache_->stats().l3_write_through_bound_pages.load());
  }
  EXPECT_EQ(written, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_LE(full_page + swa_page, 3 * full_page) << "the test's sizes";
  EXPECT_FALSE(cache_->l3_writes_pending());
  EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 2);
  EXPECT_EQ(cache_->stats().l3_write_errors.load(), 0);
  EXPECT_EQ(l3.dropped_, 0);
  ExpectAnotherWorkerFindsAll(l3, six);
}

// Write-through after N hits with no room in the store (a full write-behind
// queue): nothing is put (nothing dropped), and a later hit with room
// writes the path.
TEST_F(L3TierTest, AHitsWriteThroughWaitsForRoomInsteadOfDropping) {
  RoomLimitedStore l3(1 << 20);
  Init(&l3, /*write_through_hits=*/1);
  const Hashes a = H(1, 4);
  Insert(a);
  l3.room_ = 0;
  VerifyHit(a);
  EXPECT_EQ(cache_->stats().l3_written_pages.load(), 0);
  EXPECT_EQ(l3.dropped_, 0);
  l3.room_ = std::numeric_limits<int64_t>::max();
  VerifyHit(a);
  EXPECT_EQ(cache_->stats().l3_write_through_pages.load(), 4);
  EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 2);
  EXPECT_EQ(l3.dropped_, 0);
  ExpectAnotherWorkerFindsAll(l3, a);
}

// A path is written root first (a write-behind queue that overflows drops
// the tail, and a fetch still finds the head): at an insert reaching the
// bound and at a hit's write-through alike.
TEST_F(L3TierTest, AWrittenThroughPathGoesRootFirst) {
  for (const bool at_bound : {true, false}) {
    SCOPED_TRACE(at_bound ? "at the bound" : "after 1 hit");
    RecordingStore l3;
    Init(&l3, /*write_through_hits=*/at_bound ? 0 : 1, 16, 8, false, at_bound ? 20 : 0);
    const Hashes four = H(1, 4), six = H(1, 6);
    Insert(four);
    Insert(six);  // two nodes and more: [0, 4) and [4, 6)
    if (!at_bound) VerifyHit(six);
    EXPECT_EQ(l3.order_, six);
  }
}

TEST_F(L3TierTest, FullInL1SwaOnlyInL3Heals) {
  MemoryPageStore l3(1 << 20);
  // As in a worker that restores windows: SWA pressure only tombstones.
  Init(&l3, /*write_through_hits=*/1, 16, 8, /*keep_tombstones=*/true);
  const Hashes a = H(1, 6);
  Insert(a);
  EXPECT_EQ(VerifyHit(a), 24);  // written through: full + the window's SWA
  cache_->Evict(0, 1 << 20);    // SWA pressure: the window is tombstoned...
  Check();
  MatchLengths m = cache_->Match(a);
  ASSERT_EQ(m.matched_tokens, 24) << "...the full KV stays in L1";
  ASSERT_LT(m.safe_tokens, 24);
  EXPECT_EQ(FetchAttach(l3, a), 0) << "nothing new to attach, only healing";
  EXPECT_EQ(cache_->stats().l3_healed_swa_pages.load(), 2);
  EXPECT_EQ(cache_->Match(a).safe_tokens, 24);
  EXPECT_EQ(VerifyHit(a), 24);
}

TEST_F(L3TierTest, L2PartThenL3Part) {
  MemoryPageStore l3(1 << 20);
  Init(&l3, /*write_through_hits=*/1, /*l1_pages=*/16, /*l2_pages=*/8);
  const Hashes a = H(1, 8);
  const Hashes prefix(a.begin(), a.begin() + 4);
  Insert(a);
  Insert(prefix);  // its window's SWA KV heals pages 2..3
  EXPECT_EQ(VerifyHit(prefix), 16);  // both windows written through
  EXPECT_EQ(VerifyHit(a), 32);
  EvictAll();  // all of a is in L3 now
  EXPECT_EQ(FetchAttach(l3, prefix), 4);
  cache_->Evict(1 << 20, 0);  // the prefix goes down to L2 (evicted from L1)
  Check();
  MatchLengths m = cache_->Match(a);
  ASSERT_EQ(m.matched_tokens, 0);
  ASSERT_EQ(m.lower_tier_tokens, 16) << cache_->DebugString();
  // The rest comes from L3 below the L2 part; then all of it loads back.
  EXPECT_EQ(FetchAttach(l3, a), 4);
  EXPECT_EQ(VerifyHit(a), 32);
}

TEST_F(L3TierTest, L3EvictingAHotPrefix) {
  const int64_t page = static_cast<int64_t>(Shape().Full().PageBytes()) +
                       MemoryPageStore::kEntryOverhead;
  MemoryPageStore l3(12 * page);
  Init(&l3, /*write_through_hits=*/1);
  const Hashes a = H(1, 6);
  Insert(a);
  EXPECT_EQ(VerifyHit(a), 24);  // written through
  CacheHit hot = cache_->MatchAndLock(a);  // a stays hot and locked in L1
  // Other prompts' write-backs push a's oldest pages (its prefix) out of L3.
  for (uint32_t label = 2; label <= 4; ++label) {
    const Hashes b = H(label, 3);
    Insert(b);
    VerifyHit(b);
  }
  EXPECT_FALSE(l3.Contains({a[0], cache_->l3_fetch_options().layouts.full}));
  // The hot sequence is untouched in L1...
  EXPECT_EQ(cache_->Match(a).safe_tokens, 24);
  cache_->Unlock(hot);
  // ...and once evicted everywhere, L3 without its prefix is a miss (the
  // suffix it still holds is never attached without the pages before it).
  cache_->Clear();
  EXPECT_EQ(FetchAttach(l3, a), 0);
  EXPECT_EQ(VerifyHit(a), 0);
}

TEST_F(L3TierTest, RestartWithWarmFileStore) {
  const std::string dir = ::testing::TempDir() + "/l3_restart";
  std::filesystem::remove_all(dir);
  const Hashes a = H(1, 6);
  {
    auto store = std::move(*FilePageStore::Open({.dir = dir, .capacity_bytes = 1 << 20}));
    Init(store.get(), /*write_through_hits=*/1);
    Insert(a);
    EXPECT_EQ(VerifyHit(a), 24);  // hot: written through
    cache_.reset();               // the worker dies...
  }
  // ...and a new one starts with fresh pools over the same directory.
  auto store = std::move(*FilePageStore::Open({.dir = dir, .capacity_bytes = 1 << 20}));
  Init(store.get(), /*write_through_hits=*/1);
  EXPECT_EQ(VerifyHit(a), 0);
  EXPECT_EQ(FetchAttach(*store, a), 6);
  EXPECT_EQ(VerifyHit(a), 24);
  cache_.reset();
}

TEST_F(L3TierTest, CorruptFileIsAMiss) {
  const std::string dir = ::testing::TempDir() + "/l3_corrupt";
  std::filesystem::remove_all(dir);
  auto store = std::move(*FilePageStore::Open({.dir = dir, .capacity_bytes = 1 << 20}));
  Init(store.get(), /*write_through_hits=*/0);
  const Hashes a = H(1, 8);
  Insert(a);
  EvictAll();
  const uint64_t full = cache_->l3_fetch_options().layouts.full;
  const uint64_t swa = cache_->l3_fetch_options().layouts.swa;
  {
    // Flip a byte in the middle of full page 5's payload.
    std::fstream f(store->PathOf({a[5], full}), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c ^= 0x40;
    f.write(&c, 1);
  }
  // Truncate the SWA blob of the last page.
  std::filesystem::resize_file(store->PathOf({a[7], swa}), 10);
  const L3Fetch f = FetchFromL3(*store, cache_->l3_fetch_options(), a, 0, 0);
  EXPECT_EQ(f.end, 0) << "no window-safe point: the only SWA window is damaged";
  EXPECT_EQ(store->stats().corrupt.load(), 1);
  // With window restore the intact full-KV run (pages 0..4) still comes back.
  Init(store.get(), 0, 16, 8, /*keep_tombstones=*/true);
  EXPECT_EQ(FetchAttach(*store, a), 5);
  EXPECT_EQ(cache_->Match(a).matched_tokens, 20);
  EXPECT_EQ(cache_->Match(a).safe_tokens, 0);
  CacheHit hit = cache_->MatchAndLock(a, MatchOptions{.full_kv = true});
  ASSERT_EQ(hit.tokens(), 20);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(0, std::memcmp(pools_->full().PageData(hit.full_pages()[i]),
                             Pattern(a[i], PoolKind::kFull, pools_->full().page_bytes()).data(),
                             pools_->full().page_bytes()));
  }
  cache_->Unlock(hit);
  cache_.reset();
}

// PrefixCache::CheckpointToL3 (a long prefill's L3 checkpoints): a request's
// own pages, not yet in the tree, go to L3 with the window where they end,
// and another worker on the same store finds the prompt byte for byte.
// Paced by the write-behind queue's room: whole full pages root side first,
// the window only after all of them, nothing dropped; with the window no
// longer held only the full KV goes, which a restoring reader still matches. Once the request has inserted its pages, MarkFullKvInL3
// keeps write-back from writing the checkpointed full pages again.
class L3CheckpointTest : public L3TierTest {
 protected:
  // A request's pages for `h` with the writer's bytes: full KV for every
  // page, SWA KV from page swa_from on (kNoPage before it).
  void Allocate(const Hashes& h, int swa_from) {
    const int n = static_cast<int>(h.size());
    full_.clear();
    ASSERT_TRUE(pools_->full().Reserve(n, &full_));
    pools_->full().Commit(full_);
    std::vector<PageId> swa;
    ASSERT_TRUE(pools_->swa().Reserve(n - swa_from, &swa));
    pools_->swa().Commit(swa);
    swa_.assign(n, kNoPage);
    for (int i = 0; i < n; ++i) {
      Fill(pools_->full(), full_[i], h[i], PoolKind::kFull);
      if (i >= swa_from) {
        swa_[i] = swa[i - swa_from];
        Fill(pools_->swa(), swa_[i], h[i], PoolKind::kSwa);
      }
    }
  }
  std::vector<PageId> full_, swa_;
};

TEST_F(L3CheckpointTest, ARequestsOwnPagesReachAnotherWorker) {
  RoomLimitedStore l3(1 << 20);
  Init(&l3, /*write_through_hits=*/0);
  const Hashes h = H(1, 6);
  Allocate(h, /*swa_from=*/2);  // the windows at 4 (pages 2, 3) and at 6 (4, 5)
  const int64_t full_page = static_cast<int64_t>(pools_->full().page_bytes());
  const int64_t swa_page = static_cast<int64_t>(pools_->swa().page_bytes());
  const uint64_t full_layout = cache_->l3_fetch_options().layouts.full;
  // A write-behind queue with room for three and a half full pages: the
  // checkpoint at 4 writes pages 0..2, root side first, and not the window
  // (nothing put that does not fit, nothing dropped).
  l3.room_ = 3 * full_page + full_page / 2;
  PrefixCache::L3Checkpoint c = cache_->CheckpointToL3(h, full_, swa_, 0, 4);
  EXPECT_EQ(c.full_to_page, 3);
  EXPECT_FALSE(c.window);
  EXPECT_EQ(l3.dropped_, 0);
  EXPECT_EQ(cache_->stats().l3_checkpoint_pages.load(), 3);
  EXPECT_TRUE(l3.Contains(PageKey{h[2], full_layout}));
  EXPECT_FALSE(l3.Contains(PageKey{h[3], full_layout}));
  // The queue drained: the next chunk's checkpoint goes on from page 3 and
  // ends with the window at 6 (exactly the room: full 3..5, SWA 4, 5).
  l3.room_ = 3 * full_page + 2 * swa_page;
  c = cache_->CheckpointToL3(h, full_, swa_, c.full_to_page, 6);
  EXPECT_EQ(c.full_to_page, 6);
  EXPECT_TRUE(c.window);
  EXPECT_EQ(l3.room_, 0);
  EXPECT_EQ(cache_->stats().l3_checkpoint_pages.load(), 6);
  EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 2) << "the window at 6";
  EXPECT_EQ(l3.dropped_, 0);
  // No room at all: nothing.
  c = cache_->CheckpointToL3(h, full_, swa_, 0, 6);
  EXPECT_EQ(c.full_to_page, 0);
  EXPECT_EQ(l3.dropped_, 0);
  pools_->full().Free(full_);  // the request "dies" (kill -9): its pages are gone
  std::vector<PageId> held;
  for (PageId p : swa_) {
    if (p != kNoPage) held.push_back(p);
  }
  pools_->swa().Free(held);
  ExpectAnotherWorkerFindsAll(l3, h);
}

// Only the full KV goes when the window ending at to_page is no longer
// held, or when the queue has room for every full page but not for the
// window too: a restoring reader still matches all of it.
TEST_F(L3CheckpointTest, WithoutItsWindowOnlyTheFullKvGoesForARestore) {
  for (const bool held : {false, true}) {
    SCOPED_TRACE(held ? "window held, no room for it" : "window not held");
    RoomLimitedStore l3(1 << 20);
    Init(&l3, /*write_through_hits=*/0);
    const Hashes h = H(2, 6);
    Allocate(h, /*swa_from=*/held ? 4 : 5);  // the window at 6 needs pages 4 and 5
    const int64_t full_page = static_cast<int64_t>(pools_->full().page_bytes());
    const int64_t swa_page = static_cast<int64_t>(pools_->swa().page_bytes());
    if (held) l3.room_ = 6 * full_page + 2 * swa_page - 1;
    const PrefixCache::L3Checkpoint c = cache_->CheckpointToL3(h, full_, swa_, 0, 6);
    EXPECT_EQ(c.full_to_page, 6);
    EXPECT_FALSE(c.window);
    EXPECT_EQ(l3.dropped_, 0);
    EXPECT_EQ(cache_->stats().l3_checkpoint_pages.load(), 6);
    EXPECT_EQ(cache_->stats().l3_written_swa_pages.load(), 0);
    cache_->Insert(h, full_, swa_);
    Check();
    // A restoring worker on the same store matches the full KV of all 6 pages.
    Init(&l3, /*write_through_hits=*/0, 16, 8, /*keep_tombstones=*/true);
    EXPECT_EQ(FetchAttach(l3, h), 6);
    const MatchLengths m = cache_->Match(h);
    EXPECT_EQ(m.matched_tokens, 24);
    EXPECT_LT(m.safe_tokens, 24);
  }
}

TEST_F(L3CheckpointTest, MarkedPagesAreNotWrittenBackAgain) {
  struct Case {
    int from, to;
    int64_t written;  // full pages in L3 after write-back of everything
  };
  // The insert makes nodes [0, 4) (tombstone) and [4, 6) (its window); the
  // range marked splits the nodes it starts or ends in, and only pages
  // outside it are written back (6 from the checkpoint + those).
  for (const Case c : {Case{0, 6, 6}, Case{2, 6, 8}, Case{0, 5, 7}, Case{2, 5, 9}}) {
    SCOPED_TRACE(::testing::Message() << "marked [" << c.from << ", " << c.to << ")");
    MemoryPageStore l3(1 << 20);
    Init(&l3, /*write_through_hits=*/0);
    const Hashes h = H(3, 6);
    Allocate(h, /*swa_from=*/4);
    ASSERT_EQ(cache_->CheckpointToL3(h, full_, swa_, 0, 6).full_to_page, 6);
    cache_->Insert(h, full_, swa_);
    cache_->MarkFullKvInL3(h, c.from, c.to);
    Check();
    EXPECT_EQ(VerifyHit(h), 24) << "marking changed no page";
    EvictAll();
    EXPECT_EQ(cache_->stats().l3_written_pages.load(), c.written);
    ExpectAnotherWorkerFindsAll(l3, h);
  }
}

// An insert that names its checkpointed pages (Sequence::Finish passes the
// range on) marks them before the write-through of a path near the bound,
// which then writes only what the checkpoints did not.
TEST_F(L3CheckpointTest, AnInsertNearTheBoundSkipsItsCheckpointedPages) {
  for (const int checkpointed : {0, 4}) {
    SCOPED_TRACE(checkpointed);
    MemoryPageStore l3(1 << 20);
    Init(&l3, /*write_through_hits=*/0, 16, 8, false, /*write_through_from_tokens=*/18);
    const Hashes h = H(4, 6);
    Allocate(h, /*swa_from=*/4);
    if (checkpointed > 0) {
      ASSERT_EQ(cache_->CheckpointToL3(h, full_, swa_, 0, checkpointed).full_to_page, checkpointed);
    }
    cache_->Insert(h, full_, swa_, {}, 0, checkpointed);
    Check();
    EXPECT_EQ(cache_->stats().l3_written_pages.load(), 6) << "each full page once";
    EXPECT_EQ(cache_->stats().l3_write_through_bound_pages.load(), 6 - checkpointed);
    ExpectAnotherWorkerFindsAll(l3, h);
  }
}

}  // namespace
}  // namespace swaserve::kv
