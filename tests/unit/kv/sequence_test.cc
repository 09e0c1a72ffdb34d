#include "lib/kv/sequence.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv {
namespace {

using Hashes = std::vector<uint64_t>;

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

KvShape Shape(int window, int page_size) {
  KvShape s;
  s.full_layers = 2;
  s.full_kv_heads = 2;
  s.full_k_head_dim = 6;
  s.full_v_head_dim = 4;
  s.swa_layers = 3;
  s.swa_kv_heads = 1;
  s.swa_k_head_dim = 8;
  s.swa_v_head_dim = 2;
  s.sliding_window = window;
  s.page_size = page_size;
  s.dtype = DType::kBF16;
  return s;
}

std::vector<uint32_t> Tokens(int n, uint32_t salt) {
  std::vector<uint32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = salt * 100000 + i;
  return t;
}

// What the header promises about a sequence's page tables, tracked
// independently of the implementation.
struct Model {
  int window = 8;
  int page_size = 4;
  int slack = 0;
  int length = 0;
  int hit_pages = 0;
  int swa_first = 0;

  int KeepFrom(int len) const {
    return std::max(0, len - slack - (window - 1) - (page_size - 1));
  }
  int Pages() const { return CeilDiv(length, page_size); }
  // Append(n) first trims to the current length, then allocates SWA pages
  // for all n new tokens.
  void Append(int n) {
    if (n == 0) return;
    Trim();
    length += n;
  }
  void Trim() { swa_first = std::max(swa_first, KeepFrom(length) / page_size); }
  void Rollback(int n) { length -= n; }
  int64_t PrivateFull() const { return Pages() - hit_pages; }
  int64_t PrivateSwa() const {
    return std::max(0, Pages() - std::max(swa_first, hit_pages));
  }
};

class SequenceTest : public ::testing::Test {
 protected:
  void Init(int window, int page_size, int64_t full_pages, int64_t swa_pages,
            bool memory = false, bool with_cache = true) {
    cache_.reset();  // before the pools it frees into (tests may Init twice)
    KvPoolsOptions o;
    o.shape = Shape(window, page_size);
    o.full_pages = full_pages;
    o.swa_pages = swa_pages;
    o.allocate_memory = memory;
    absl::StatusOr<std::unique_ptr<KvPools>> pools = KvPools::Create(o);
    ASSERT_TRUE(pools.ok()) << pools.status();
    pools_ = std::move(*pools);
    if (with_cache) {
      PrefixCacheOptions co;
      co.pools = pools_.get();
      co.keep_restorable_tombstones = keep_tombstones_;
      absl::StatusOr<std::unique_ptr<PrefixCache>> cache = PrefixCache::Create(co);
      ASSERT_TRUE(cache.ok()) << cache.status();
      cache_ = std::move(*cache);
    }
    window_ = window;
    ps_ = page_size;
  }

  void TearDown() override {
    if (cache_ != nullptr) {
      absl::Status s = cache_->CheckInvariants();
      EXPECT_TRUE(s.ok()) << s << "\n" << cache_->DebugString();
      cache_.reset();
    }
    if (pools_ != nullptr) {
      EXPECT_EQ(pools_->full().num_free(), pools_->full().num_pages());
      EXPECT_EQ(pools_->swa().num_free(), pools_->swa().num_pages());
    }
  }

  SequenceOptions Opts(int slack = 0, bool evict_on_demand = true) {
    SequenceOptions o;
    o.pools = pools_.get();
    o.cache = cache_.get();
    o.swa_slack = slack;
    o.evict_on_demand = evict_on_demand;
    return o;
  }

  Model NewModel(int slack, const CacheHit& hit = CacheHit()) {
    Model m;
    m.window = window_;
    m.page_size = ps_;
    m.slack = slack;
    m.length = hit.tokens();
    m.hit_pages = hit.tokens() / ps_;
    m.swa_first = hit.tokens() > 0 ? hit.swa_first_page() : 0;
    return m;
  }

  Hashes H(const std::vector<uint32_t>& tokens) const {
    return base::ChainedPageHashes(tokens, ps_);
  }

  // Inserts `n_pages` pages of `tokens` straight into the cache, all with
  // SWA KV.
  void InsertLive(const std::vector<uint32_t>& tokens) {
    const Hashes h = H(tokens);
    const int n = static_cast<int>(h.size());
    absl::StatusOr<Reservation> r = pools_->Reserve(n, n);
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<PageId> full = r->full, swa = r->swa;
    pools_->Commit(*r);
    cache_->Insert(h, full, swa);
  }

  // Checks the sequence's tables and the pools against the model (only this
  // one sequence allocates privately).
  void Expect(const Sequence& seq, const Model& m, const char* where) {
    SCOPED_TRACE(::testing::Message() << where << " length=" << m.length);
    ASSERT_EQ(seq.length(), m.length);
    ASSERT_EQ(static_cast<int>(seq.full_pages().size()), m.Pages());
    ASSERT_EQ(static_cast<int>(seq.swa_pages().size()), m.Pages());
    ASSERT_EQ(seq.swa_first_page(), m.swa_first);
    std::set<PageId> full_seen, swa_seen;
    for (int p = 0; p < m.Pages(); ++p) {
      const PageId f = seq.full_pages()[p];
      ASSERT_TRUE(pools_->full().Valid(f)) << p;
      ASSERT_TRUE(full_seen.insert(f).second) << "full page used twice: " << f;
      ASSERT_EQ(pools_->full().state(f),
                p < m.hit_pages ? PageState::kCached : PageState::kInUse)
          << p;
      const PageId s = seq.swa_page(p);
      ASSERT_EQ(s, seq.swa_pages()[p]);
      if (p < m.swa_first) {
        ASSERT_EQ(s, kNoPage) << "SWA page " << p << " kept outside the window";
      } else {
        ASSERT_TRUE(pools_->swa().Valid(s)) << "SWA page " << p << " missing";
        ASSERT_TRUE(swa_seen.insert(s).second);
        ASSERT_EQ(pools_->swa().state(s),
                  p < m.hit_pages ? PageState::kCached : PageState::kInUse)
            << p;
      }
    }
    ASSERT_EQ(pools_->full().num_in_use(), m.PrivateFull());
    ASSERT_EQ(pools_->swa().num_in_use(), m.PrivateSwa());
    ASSERT_EQ(pools_->full().num_reserved(), 0);
    ASSERT_EQ(pools_->swa().num_reserved(), 0);
    if (cache_ != nullptr) {
      absl::Status st = cache_->CheckInvariants();
      ASSERT_TRUE(st.ok()) << st;
    }
  }

  struct Snapshot {
    int length;
    std::vector<PageId> full, swa;
    int swa_first;
    int64_t full_free, swa_free, full_in_use, swa_in_use, full_cached, swa_cached;
    bool operator==(const Snapshot&) const = default;
  };
  Snapshot Snap(const Sequence& seq) const {
    return Snapshot{seq.length(),
                    {seq.full_pages().begin(), seq.full_pages().end()},
                    {seq.swa_pages().begin(), seq.swa_pages().end()},
                    seq.swa_first_page(),
                    pools_->full().num_free(),
                    pools_->swa().num_free(),
                    pools_->full().num_in_use(),
                    pools_->swa().num_in_use(),
                    pools_->full().num_cached(),
                    pools_->swa().num_cached()};
  }

  std::unique_ptr<KvPools> pools_;
  std::unique_ptr<PrefixCache> cache_;
  bool keep_tombstones_ = false;  // PrefixCacheOptions::keep_restorable_tombstones
  int window_ = 8;
  int ps_ = 4;
};

TEST_F(SequenceTest, EmptySequence) {
  Init(8, 4, 16, 16);
  Sequence seq(Opts());
  EXPECT_EQ(seq.length(), 0);
  EXPECT_EQ(seq.cached_tokens(), 0);
  EXPECT_EQ(seq.page_size(), 4);
  EXPECT_TRUE(seq.full_pages().empty());
  EXPECT_TRUE(seq.swa_pages().empty());
  EXPECT_EQ(seq.swa_first_page(), 0);
  EXPECT_FALSE(seq.finished());
  Sequence::PageNeeds needs = seq.NeedsFor(1);
  EXPECT_EQ(needs.full, 1);
  EXPECT_EQ(needs.swa, 1);
  EXPECT_EQ(seq.NeedsFor(0).full, 0);
  EXPECT_EQ(seq.NeedsFor(0).swa, 0);
}

TEST_F(SequenceTest, SingleTokenAppendsSlideTheWindow) {
  for (int slack : {0, 1, 3, 6}) {
    SCOPED_TRACE(::testing::Message() << "slack=" << slack);
    Init(8, 4, 64, 64);
    {
      Sequence seq(Opts(slack));
      Model m = NewModel(slack);
      for (int i = 0; i < 150; ++i) {
        Sequence::PageNeeds needs = seq.NeedsFor(1);
        const bool new_page = m.length % 4 == 0;
        ASSERT_EQ(needs.full, new_page ? 1 : 0);
        ASSERT_EQ(needs.swa, new_page ? 1 : 0);
        ASSERT_TRUE(seq.Append(1).ok());
        m.Append(1);
        ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "decode"));
        // O(W) SWA memory: the window, the slack, partial pages and the page
        // of the step not trimmed yet.
        ASSERT_LE(pools_->swa().num_in_use(),
                  CeilDiv(8 - 1 + 4 - 1 + slack, 4) + 2);
        if (i % 3 == 0) {
          seq.TrimWindow();
          m.Trim();
          ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "trimmed"));
          ASSERT_LE(pools_->swa().num_in_use(),
                    CeilDiv(8 - 1 + 4 - 1 + slack, 4) + 1);
          seq.TrimWindow();  // idempotent
          ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "trimmed twice"));
        }
      }
    }
    TearDown();
    pools_.reset();
    cache_.reset();
  }
}

TEST_F(SequenceTest, ChunkedAppends) {
  Init(8, 4, 256, 256);
  Sequence seq(Opts(/*slack=*/2));
  Model m = NewModel(2);
  for (int chunk : {1, 3, 4, 5, 16, 2, 33, 7, 64, 1, 1, 1, 100, 4, 8}) {
    Sequence::PageNeeds needs = seq.NeedsFor(chunk);
    const int new_pages = CeilDiv(m.length + chunk, 4) - m.Pages();
    ASSERT_EQ(needs.full, new_pages) << chunk;
    // A chunk's forward pass writes every new token's SWA KV.
    ASSERT_EQ(needs.swa, new_pages) << chunk;
    ASSERT_TRUE(seq.Append(chunk).ok());
    m.Append(chunk);
    ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "chunk"));
    if (chunk % 2 == 0) {
      seq.TrimWindow();
      m.Trim();
      ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "trimmed"));
    }
  }
}

TEST_F(SequenceTest, NeedsForIsWhatAppendTakes) {
  Init(8, 4, 64, 64);
  Sequence seq(Opts(1, /*evict_on_demand=*/false));
  Model m = NewModel(1);
  for (int chunk : {5, 1, 3, 12, 2, 30, 1, 4}) {
    // After a trim, Append's own trim frees nothing: NeedsFor is exact.
    seq.TrimWindow();
    m.Trim();
    const Sequence::PageNeeds needs = seq.NeedsFor(chunk);
    // One page fewer than needed in a pool that needs some: must fail.
    for (PoolKind short_pool : {PoolKind::kFull, PoolKind::kSwa}) {
      const int64_t need =
          short_pool == PoolKind::kFull ? needs.full : needs.swa;
      if (need == 0) continue;
      const int64_t hold_full =
          pools_->full().num_free() - needs.full + (short_pool == PoolKind::kFull);
      const int64_t hold_swa =
          pools_->swa().num_free() - needs.swa + (short_pool == PoolKind::kSwa);
      absl::StatusOr<Reservation> hold = pools_->Reserve(hold_full, hold_swa);
      ASSERT_TRUE(hold.ok());
      const Snapshot before = Snap(seq);
      absl::Status s = seq.Append(chunk);
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted)
          << "chunk " << chunk << " with one " << PoolKindName(short_pool)
          << " page short";
      EXPECT_TRUE(Snap(seq) == before) << "a failed Append changed something";
      pools_->Cancel(*hold);
    }
    // Exactly what NeedsFor says: must succeed.
    absl::StatusOr<Reservation> hold =
        pools_->Reserve(pools_->full().num_free() - needs.full,
                        pools_->swa().num_free() - needs.swa);
    ASSERT_TRUE(hold.ok());
    absl::Status s = seq.Append(chunk);
    ASSERT_TRUE(s.ok()) << "chunk " << chunk << ": " << s;
    m.Append(chunk);
    pools_->Cancel(*hold);
    ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "exact"));
  }
}

TEST_F(SequenceTest, RollbackWithinSlack) {
  Init(8, 4, 64, 64);
  Sequence seq(Opts(/*slack=*/3));
  Model m = NewModel(3);
  ASSERT_TRUE(seq.Append(30).ok());
  m.Append(30);
  for (int i = 0; i < 40; ++i) {
    const int draft = 1 + i % 3;
    ASSERT_TRUE(seq.Append(draft).ok());
    m.Append(draft);
    ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "drafted"));
    const int rejected = i % 4;  // 0..3 <= slack
    absl::Status s = seq.Rollback(rejected);
    ASSERT_TRUE(s.ok()) << s;
    m.Rollback(rejected);
    ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "rolled back"));
  }
  // A rollback right after a single-token step, up to the slack.
  ASSERT_TRUE(seq.Append(1).ok());
  m.Append(1);
  ASSERT_TRUE(seq.Rollback(3).ok());
  m.Rollback(3);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "slack"));
}

TEST_F(SequenceTest, RollbackFreesPagesInBothPools) {
  Init(8, 4, 64, 64);
  Sequence seq(Opts(/*slack=*/8));
  Model m = NewModel(8);
  ASSERT_TRUE(seq.Append(24).ok());
  m.Append(24);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "appended"));
  const std::vector<PageId> last_full = {seq.full_pages()[4], seq.full_pages()[5]};
  const std::vector<PageId> last_swa = {seq.swa_page(4), seq.swa_page(5)};
  ASSERT_TRUE(seq.Rollback(8).ok());
  m.Rollback(8);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "rolled back"));
  for (PageId p : last_full) EXPECT_EQ(pools_->full().state(p), PageState::kFree);
  for (PageId p : last_swa) EXPECT_EQ(pools_->swa().state(p), PageState::kFree);
}

TEST_F(SequenceTest, RollbackNeedingReleasedSwaIsRejected) {
  Init(8, 4, 64, 64);
  Sequence seq(Opts(/*slack=*/0));
  Model m = NewModel(0);
  ASSERT_TRUE(seq.Append(40).ok());
  m.Append(40);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "appended"));
  EXPECT_EQ(seq.swa_first_page(), 0) << "a chunk keeps its SWA pages until trimmed";
  seq.TrimWindow();
  m.Trim();
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "trimmed"));
  ASSERT_EQ(seq.swa_first_page(), 7);  // keep_from = 40 - 7 - 3 = 30
  const Snapshot before = Snap(seq);
  // Back to 28 tokens: the next query would need tokens [21, 28) (page 5).
  absl::Status s = seq.Rollback(12);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Snap(seq) == before) << "a rejected Rollback changed something";
  s = seq.Rollback(33);  // back to 7 tokens: needs tokens [0, 7)
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Snap(seq) == before);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "unchanged"));
  // The sequence still works.
  ASSERT_TRUE(seq.Append(1).ok());
  m.Append(1);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "after"));
}

TEST_F(SequenceTest, RollbackIntoTheCachedPrefixIsRejected) {
  Init(8, 4, 64, 64);
  const std::vector<uint32_t> prompt = Tokens(21, 1);
  InsertLive(prompt);  // 5 pages
  CacheHit hit = cache_->MatchAndLock(H(prompt), 20);
  ASSERT_EQ(hit.tokens(), 20);
  Sequence seq(Opts(/*slack=*/4), std::move(hit));
  EXPECT_EQ(seq.length(), 20);
  EXPECT_EQ(seq.cached_tokens(), 20);
  ASSERT_TRUE(seq.Append(3).ok());
  const Snapshot before = Snap(seq);
  absl::Status s = seq.Rollback(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Snap(seq) == before);
  EXPECT_TRUE(seq.Rollback(3).ok());
  EXPECT_EQ(seq.length(), 20);
  s = seq.Rollback(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(seq.length(), 20);
}

// Rolling back to exactly the hit's length after the sequence has moved on
// (and dropped the hit's SWA lock) would need the hit window's SWA KV again.
TEST_F(SequenceTest, RollbackToTheHitBoundaryAfterTheWindowMovedOnIsRejected) {
  Init(8, 4, 64, 64);
  const std::vector<uint32_t> prompt = Tokens(21, 1);
  InsertLive(prompt);  // 5 pages
  CacheHit hit = cache_->MatchAndLock(H(prompt), 20);
  ASSERT_EQ(hit.tokens(), 20);
  Sequence seq(Opts(/*slack=*/0), std::move(hit));
  ASSERT_TRUE(seq.Append(30).ok());
  seq.TrimWindow();  // keep_from(50) = 40: the hit's window (pages 3, 4) is out
  ASSERT_EQ(seq.swa_first_page(), 10);
  const Snapshot before = Snap(seq);
  absl::Status s = seq.Rollback(30);  // back to 20: needs tokens [13, 20)
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Snap(seq) == before);
}

TEST_F(SequenceTest, AppendBeyondCapacityChangesNothing) {
  Init(8, 4, 6, 6, /*memory=*/false, /*with_cache=*/false);
  Sequence seq(Opts());
  Model m = NewModel(0);
  ASSERT_TRUE(seq.Append(20).ok());
  m.Append(20);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "20"));
  seq.TrimWindow();  // so that the failed Append's own trim is a no-op
  m.Trim();
  const Snapshot before = Snap(seq);
  absl::Status s = seq.Append(8);  // 2 more full pages, 1 free
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(Snap(seq) == before);
  ASSERT_TRUE(seq.Append(4).ok());
  m.Append(4);
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "24"));
  s = seq.Append(1);
  m.Trim();  // a failed Append may still have trimmed
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "full"));
}

TEST_F(SequenceTest, SwaPoolExhaustion) {
  Init(8, 4, 64, 2, /*memory=*/false, /*with_cache=*/false);
  Sequence seq(Opts());
  Model m = NewModel(0);
  absl::Status s;
  for (int i = 0; i < 20 && s.ok(); ++i) {
    seq.TrimWindow();
    m.Trim();
    const Snapshot before = Snap(seq);
    s = seq.Append(1);
    if (s.ok()) {
      m.Append(1);
      ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "ok"));
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      EXPECT_TRUE(Snap(seq) == before);
    }
  }
  // The window needs 3 pages at some point (e.g. 9 tokens: keep_from 0).
  EXPECT_FALSE(s.ok());
}

TEST_F(SequenceTest, EvictOnDemandMakesRoomFromTheCache) {
  Init(8, 4, 8, 8);
  {
    Sequence a(Opts());
    ASSERT_TRUE(a.Append(24).ok());  // 6 full pages, SWA for pages 3..5
    a.Finish(H(Tokens(24, 1)));
    EXPECT_TRUE(a.finished());
    EXPECT_TRUE(a.full_pages().empty());
  }
  EXPECT_EQ(cache_->cached_full_pages(), 6);
  EXPECT_EQ(pools_->full().num_free(), 2);
  {
    Sequence no_evict(Opts(0, /*evict_on_demand=*/false));
    absl::Status s = no_evict.Append(16);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(no_evict.length(), 0);
    EXPECT_EQ(cache_->cached_full_pages(), 6);
  }
  Sequence b(Opts());
  absl::Status s = b.Append(16);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(b.length(), 16);
  EXPECT_LE(cache_->cached_full_pages(), 4);
  EXPECT_EQ(pools_->full().num_in_use(), 4);
  EXPECT_TRUE(cache_->CheckInvariants().ok());
  // With the cache locked by a hit, nothing can be evicted.
  b.Abort();
  EXPECT_EQ(pools_->full().num_in_use(), 0);
}

TEST_F(SequenceTest, EvictOnDemandCannotEvictLockedPages) {
  Init(8, 4, 8, 8);
  const std::vector<uint32_t> prompt = Tokens(25, 1);
  InsertLive(prompt);  // 6 pages
  CacheHit hit = cache_->MatchAndLock(H(prompt), 24);
  ASSERT_EQ(hit.tokens(), 24);
  Sequence holder(Opts(), std::move(hit));
  Sequence b(Opts());
  absl::Status s = b.Append(16);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(b.length(), 0);
  EXPECT_TRUE(b.full_pages().empty());
  EXPECT_EQ(pools_->full().num_in_use(), 0);
  EXPECT_EQ(pools_->swa().num_in_use(), 0);
  EXPECT_EQ(cache_->cached_full_pages(), 6);
}

TEST_F(SequenceTest, FinishInsertsAndALaterPromptHitsTheWindowSafePrefix) {
  Init(8, 4, 64, 64);
  // Request 1: a 37-token prompt and 2 generated tokens.
  const std::vector<uint32_t> all = Tokens(39, 7);
  const std::vector<uint32_t> prompt(all.begin(), all.begin() + 37);
  {
    Sequence seq(Opts());
    Model m = NewModel(0);
    for (int chunk : {16, 16, 5, 1, 1}) {
      ASSERT_TRUE(seq.Append(chunk).ok());
      m.Append(chunk);
      ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "request 1"));
    }
    // keep_from(39) = 29: SWA for pages 7, 8 (and the partial page 9).
    seq.TrimWindow();
    EXPECT_EQ(seq.swa_first_page(), 7);
    const std::vector<PageId> full(seq.full_pages().begin(),
                                   seq.full_pages().begin() + 9);
    const PageId partial_full = seq.full_pages()[9];
    const PageId partial_swa = seq.swa_page(9);
    seq.Finish(H(all));  // 9 complete pages
    EXPECT_TRUE(seq.finished());
    EXPECT_EQ(pools_->full().num_in_use(), 0);
    EXPECT_EQ(pools_->swa().num_in_use(), 0);
    EXPECT_EQ(cache_->cached_full_pages(), 9);
    EXPECT_EQ(cache_->cached_swa_pages(), 2);
    for (PageId p : full) EXPECT_EQ(pools_->full().state(p), PageState::kCached);
    EXPECT_EQ(pools_->full().state(partial_full), PageState::kFree);
    EXPECT_EQ(pools_->swa().state(partial_swa), PageState::kFree);
  }
  // Request 2: the same prompt hits up to the last page boundary (36), whose
  // window [29, 36) is pages 7, 8.
  {
    CacheHit hit = cache_->MatchAndLock(H(prompt), 36);
    ASSERT_EQ(hit.tokens(), 36);
    const std::vector<PageId> hit_full(hit.full_pages().begin(), hit.full_pages().end());
    Sequence seq(Opts(), std::move(hit));
    EXPECT_EQ(seq.length(), 36);
    EXPECT_EQ(seq.cached_tokens(), 36);
    EXPECT_EQ(std::vector<PageId>(seq.full_pages().begin(), seq.full_pages().end()),
              hit_full);
    EXPECT_LE(seq.swa_first_page(), 7);
    EXPECT_NE(seq.swa_page(7), kNoPage);
    EXPECT_NE(seq.swa_page(8), kNoPage);
    EXPECT_EQ(pools_->swa().state(seq.swa_page(8)), PageState::kCached);
    ASSERT_TRUE(seq.Append(1).ok());
    EXPECT_EQ(pools_->full().num_in_use(), 1);
    seq.Finish(H(prompt));
    EXPECT_EQ(cache_->cached_full_pages(), 9);
    EXPECT_EQ(pools_->full().num_in_use(), 0);
  }
  // Request 3: a shorter prompt ending inside the tombstoned part: no hit.
  {
    const std::vector<uint32_t> shorter(all.begin(), all.begin() + 30);
    CacheHit hit = cache_->MatchAndLock(H(shorter), 29);
    EXPECT_EQ(hit.tokens(), 0);
    EXPECT_EQ(hit.matched_tokens(), 28);
    Sequence seq(Opts(), std::move(hit));
    EXPECT_EQ(seq.length(), 0);
  }
  // Request 4: a longer prompt hits the whole cached 36 tokens.
  {
    std::vector<uint32_t> longer = all;
    longer.push_back(5);
    longer.push_back(6);
    CacheHit hit = cache_->MatchAndLock(H(longer), 40);
    EXPECT_EQ(hit.tokens(), 36);
    cache_->Unlock(hit);
  }
}

// A prompt that shares a cached prefix but diverges where the cache has no
// SWA KV: the sequence recomputes up to the divergence point, keeps that
// window's SWA pages, and Finish() heals the cached path there, so the next
// prompt diverging at the same point gets a window-safe hit.
TEST_F(SequenceTest, KeepsTheDivergenceWindowAndFinishHealsThePath) {
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_divergence_window" : "without");
    Init(8, 4, 64, 64);
    const std::vector<uint32_t> a = Tokens(40, 1);
    {
      Sequence seq(Opts());
      ASSERT_TRUE(seq.Append(40).ok());
      seq.Finish(H(a));  // SWA kept for pages 7..9 only
    }
    auto diverging = [&](uint32_t salt) {
      std::vector<uint32_t> t(a.begin(), a.begin() + 24);
      const std::vector<uint32_t> tail = Tokens(16, salt);
      t.insert(t.end(), tail.begin(), tail.end());
      return t;
    };
    const std::vector<uint32_t> b = diverging(2);
    CacheHit hit = cache_->MatchAndLock(H(b), 39);
    EXPECT_EQ(hit.matched_tokens(), 24);
    EXPECT_EQ(hit.tokens(), 0);  // the window [17, 24) was not cached
    SequenceOptions o = Opts();
    o.keep_divergence_window = keep;
    Sequence seq(o, std::move(hit));
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(seq.Append(8).ok());
    seq.TrimWindow();
    // keep_from(40) = 30: pages 7..9; the divergence window is pages 4, 5.
    EXPECT_EQ(seq.swa_first_page(), 7);
    for (int p = 0; p < 7; ++p) {
      const bool kept = keep && (p == 4 || p == 5);
      if (kept) {
        ASSERT_TRUE(pools_->swa().Valid(seq.swa_page(p))) << p;
        EXPECT_EQ(pools_->swa().state(seq.swa_page(p)), PageState::kInUse) << p;
      } else {
        EXPECT_EQ(seq.swa_page(p), kNoPage) << p;
      }
    }
    EXPECT_EQ(pools_->swa().num_in_use(), keep ? 5 : 3);
    seq.Finish(H(b));
    EXPECT_EQ(pools_->swa().num_in_use(), 0);
    const MatchLengths m = cache_->Match(H(diverging(3)));
    EXPECT_EQ(m.matched_tokens, 24);
    EXPECT_EQ(m.safe_tokens, keep ? 24 : 0);
    ASSERT_TRUE(cache_->CheckInvariants().ok()) << cache_->DebugString();
    TearDown();
  }
}

TEST_F(SequenceTest, CheckpointWindowsGoToTheCacheColdAndMakeLaterDivergencesSafe) {
  for (int checkpoint : {16, 0}) {
    SCOPED_TRACE(::testing::Message() << "swa_checkpoint_tokens " << checkpoint);
    Init(8, 4, 64, 64);
    const std::vector<uint32_t> a = Tokens(64, 1);
    SequenceOptions o = Opts();
    o.swa_checkpoint_tokens = checkpoint;
    {
      Sequence seq(o);
      for (int i = 0; i < 8; ++i) ASSERT_TRUE(seq.Append(8).ok());
      seq.TrimWindow();
      // keep_from(64) = 54: pages 13..15; the windows of the checkpoints at
      // 16, 32 and 48 tokens: [8, 16), [24, 32), [40, 48) = pages 2-3, 6-7,
      // 10-11 (the one at 64 is the trailing window).
      EXPECT_EQ(seq.swa_first_page(), 13);
      for (int p = 0; p < 13; ++p) {
        const bool kept = checkpoint > 0 && (p == 2 || p == 3 || p == 6 || p == 7 ||
                                             p == 10 || p == 11);
        EXPECT_EQ(seq.swa_page(p) != kNoPage, kept) << p;
      }
      EXPECT_EQ(pools_->swa().num_in_use(), checkpoint > 0 ? 9 : 3);
      EXPECT_FALSE(seq.kept_windows_dropped());
      seq.Finish(H(a));
    }
    // A prompt that diverges from a at token 44: window-safe at the
    // checkpoint at 32 (without checkpoints: nowhere).
    std::vector<uint32_t> b(a.begin(), a.begin() + 44);
    const std::vector<uint32_t> tail = Tokens(20, 2);
    b.insert(b.end(), tail.begin(), tail.end());
    MatchLengths m = cache_->Match(H(b));
    EXPECT_EQ(m.matched_tokens, 44);
    EXPECT_EQ(m.safe_tokens, checkpoint > 0 ? 32 : 0);
    if (checkpoint == 0) continue;
    // Checkpoints are cold: SWA pressure takes them before the trailing window.
    EvictResult r = cache_->Evict(0, 6);
    EXPECT_EQ(r.swa_pages_freed, 6);
    EXPECT_EQ(cache_->cached_swa_pages(), 3);
    EXPECT_EQ(cache_->Match(H(a), 63).safe_tokens, 60);
    EXPECT_EQ(cache_->Match(H(b)).safe_tokens, 0);
  }
}

TEST_F(SequenceTest, KeptWindowsGiveWayWhenTheSwaPoolRunsShort) {
  for (const bool yield : {false, true}) {
    SCOPED_TRACE(yield ? "checkpoints_yield" : "all at once");
    // 8 SWA pages; a checkpoint every 8 tokens keeps every page, so the
    // sequence would run out at 32 tokens: it gives kept windows up, all of
    // them at once, or (checkpoints_yield) whole windows from the oldest, as
    // many as it needs.
    Init(8, 4, 64, 8);
    const std::vector<uint32_t> a = Tokens(64, 1);
    SequenceOptions o = Opts();
    o.swa_checkpoint_tokens = 8;
    o.checkpoints_yield = yield;
    Sequence seq(o);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(seq.Append(8).ok());
    EXPECT_EQ(pools_->swa().num_free(), 0);
    EXPECT_FALSE(seq.kept_windows_dropped());
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(seq.Append(8).ok()) << i;
    EXPECT_EQ(seq.kept_windows_dropped(), !yield);
    seq.TrimWindow();
    // keep_from(64) = 54: the window is pages 13..15. Yielding, the newest
    // checkpoints' windows stay: pages 8..12 hold the checkpoints at 40 and
    // 48 (pages 8-9, 10-11) and 52's first page (the window at 56 reaches
    // back to page 12); everything older went, two pages per Append.
    for (int p = 0; p < seq.swa_first_page(); ++p) {
      EXPECT_EQ(seq.swa_page(p) != kNoPage, yield && p >= 8) << p;
    }
    seq.Finish(H(a));
    EXPECT_EQ(cache_->Match(H(a), 63).safe_tokens, 60);
    EXPECT_EQ(cache_->cached_swa_pages(), yield ? 8 : 3);
  }
}

// checkpoints_yield: when the SWA pool runs short, the cache's cold windows
// go first, then the running prompt's own checkpoints, and hot windows
// stay; without it, hot cached windows go while the checkpoints stay.
TEST_F(SequenceTest, CheckpointsGiveWayBeforeHotCachedWindows) {
  for (const bool yield : {true, false}) {
    SCOPED_TRACE(yield ? "checkpoints_yield" : "checkpoints stay");
    Init(8, 4, 64, 14);
    // a: a hot window at its end (pages 1-3).
    const std::vector<uint32_t> a = Tokens(16, 1);
    {
      Sequence seq(Opts());
      ASSERT_TRUE(seq.Append(16).ok());
      seq.Finish(H(a));
    }
    // c: a cold checkpoint window at 16 (pages 2-3), a hot one at its end.
    const std::vector<uint32_t> c = Tokens(32, 3);
    {
      SequenceOptions o = Opts();
      o.swa_checkpoint_tokens = 16;
      Sequence seq(o);
      for (int i = 0; i < 4; ++i) ASSERT_TRUE(seq.Append(8).ok());
      seq.Finish(H(c));
    }
    std::vector<uint32_t> c_branch(c.begin(), c.begin() + 20);
    const std::vector<uint32_t> tail = Tokens(12, 4);
    c_branch.insert(c_branch.end(), tail.begin(), tail.end());
    ASSERT_EQ(cache_->Match(H(c_branch)).safe_tokens, 16);
    ASSERT_EQ(cache_->Match(H(a), 15).safe_tokens, 12);
    ASSERT_EQ(cache_->Match(H(c), 31).safe_tokens, 28);
    // b: a checkpoint every 8 tokens, 48 tokens, 8 at a time.
    const std::vector<uint32_t> b = Tokens(48, 2);
    SequenceOptions o = Opts();
    o.swa_checkpoint_tokens = 8;
    o.checkpoints_yield = yield;
    Sequence seq(o);
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(seq.Append(8).ok()) << i;
    // The cold checkpoint went first either way.
    EXPECT_EQ(cache_->Match(H(c_branch)).safe_tokens, 0);
    // Yielding, the hot windows stay and b's oldest checkpoints went;
    // otherwise the hot windows went and every checkpoint of b stayed.
    EXPECT_EQ(cache_->Match(H(a), 15).safe_tokens, yield ? 12 : 0);
    EXPECT_EQ(cache_->Match(H(c), 31).safe_tokens, yield ? 28 : 0);
    EXPECT_EQ(seq.swa_page(0) != kNoPage, !yield);
    EXPECT_EQ(seq.checkpoint_pages_yielded(), yield ? 4 : 0);  // the windows at 8 and 16
    EXPECT_FALSE(seq.kept_windows_dropped());
    seq.Finish(H(b));
    // b diverging at 30 is window-safe at 28 either way: its checkpoint
    // windows at 24 and 32 (pages 4-5, 6-7) cover [21, 28).
    std::vector<uint32_t> b_branch(b.begin(), b.begin() + 30);
    b_branch.insert(b_branch.end(), tail.begin(), tail.end());
    EXPECT_EQ(cache_->Match(H(b_branch)).safe_tokens, 28);
  }
}

TEST_F(SequenceTest, SwaPressureWithRestorableTombstonesKeepsFullKv) {
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_restorable_tombstones" : "default");
    keep_tombstones_ = keep;
    Init(8, 4, 64, 6);
    const std::vector<uint32_t> a = Tokens(32, 1);
    {
      Sequence seq(Opts());
      for (int i = 0; i < 4; ++i) ASSERT_TRUE(seq.Append(8).ok());
      seq.Finish(H(a));  // 8 full pages, SWA for pages 5..7
    }
    // Another prompt needs the SWA pool: a's window is evicted.
    Sequence other(Opts());
    ASSERT_TRUE(other.Append(16).ok());
    const MatchLengths m = cache_->Match(H(a), 31);
    EXPECT_EQ(m.safe_tokens, 0);
    EXPECT_EQ(m.matched_tokens, keep ? 28 : 0) << "full KV kept for a window restore";
    other.Abort();
  }
}

TEST_F(SequenceTest, SwaWindowStartIsThePageOfTheNextTokensWindow) {
  EXPECT_EQ(SwaWindowStart(0, 8, 4), 0);
  EXPECT_EQ(SwaWindowStart(7, 8, 4), 0);
  EXPECT_EQ(SwaWindowStart(11, 8, 4), 4);   // next token 11 sees [4, 11]
  EXPECT_EQ(SwaWindowStart(12, 8, 4), 4);   // sees [5, 12]
  EXPECT_EQ(SwaWindowStart(15, 8, 4), 8);   // sees [8, 15]
  EXPECT_EQ(SwaWindowStart(1000, 128, 16), 864);
}

// Decode admission: a transferred prompt gets full pages for every token and
// SWA pages for the next token's window only, then decodes on normally.
TEST_F(SequenceTest, AppendPrefilledPlacesTransferredKv) {
  Init(8, 4, 64, 64);
  Sequence seq(Opts());
  // The next token (30) sees [23, 30]: SWA from page 5 (token 20) at the latest.
  EXPECT_EQ(seq.AppendPrefilled(30, 22).code(), absl::StatusCode::kInvalidArgument);  // unaligned
  EXPECT_EQ(seq.AppendPrefilled(30, 24).code(), absl::StatusCode::kInvalidArgument);  // too late
  EXPECT_EQ(seq.AppendPrefilled(0, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(seq.AppendPrefilled(30, 20).ok());
  EXPECT_EQ(seq.length(), 30);
  EXPECT_EQ(seq.full_pages().size(), 8u);
  EXPECT_EQ(seq.swa_first_page(), 5);
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(seq.swa_page(p) != kNoPage, p >= 5) << p;
  }
  EXPECT_EQ(pools_->full().num_in_use(), 8);
  EXPECT_EQ(pools_->swa().num_in_use(), 3);
  EXPECT_EQ(seq.AppendPrefilled(4, 0).code(), absl::StatusCode::kInvalidArgument)
      << "only an empty sequence";
  // Decoding on: the window slides as usual.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(seq.Append(1).ok());
  seq.TrimWindow();
  EXPECT_EQ(seq.swa_first_page(), (40 - 7 - 3) / 4);
  seq.Finish(H(Tokens(40, 9)));
  EXPECT_EQ(cache_->cached_full_pages(), 10);
  EXPECT_EQ(pools_->full().num_in_use(), 0);
  EXPECT_EQ(pools_->swa().num_in_use(), 0);
}

TEST_F(SequenceTest, AppendPrefilledBeyondCapacityChangesNothing) {
  Init(8, 4, /*full_pages=*/6, /*swa_pages=*/64);
  Sequence seq(Opts());
  EXPECT_EQ(seq.AppendPrefilled(30, 20).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(seq.length(), 0);
  EXPECT_EQ(pools_->full().num_in_use(), 0);
  EXPECT_EQ(pools_->swa().num_in_use(), 0);
  EXPECT_TRUE(seq.AppendPrefilled(20, 12).ok());
}

TEST_F(SequenceTest, FinishWithFewerHashesFreesTheRest) {
  Init(8, 4, 64, 64);
  const std::vector<uint32_t> tokens = Tokens(40, 3);
  Sequence seq(Opts(/*slack=*/8));
  ASSERT_TRUE(seq.Append(40).ok());
  // keep_from(40) = 40 - 8 - 7 - 3 = 22: SWA for pages 5..9. Hand over only
  // the first 8 pages (e.g. the prompt): its SWA tail is pages 5..7.
  const Hashes h = H(tokens);
  seq.Finish(Hashes(h.begin(), h.begin() + 8));
  EXPECT_EQ(pools_->full().num_in_use(), 0);
  EXPECT_EQ(pools_->swa().num_in_use(), 0);
  EXPECT_EQ(cache_->cached_full_pages(), 8);
  EXPECT_EQ(cache_->cached_swa_pages(), 3);
  EXPECT_EQ(cache_->Match(h).matched_tokens, 32);
  EXPECT_EQ(cache_->Match(h).safe_tokens, 32);
}

TEST_F(SequenceTest, FinishWithoutACacheFreesEverything) {
  Init(8, 4, 16, 16, false, /*with_cache=*/false);
  Sequence seq(Opts());
  ASSERT_TRUE(seq.Append(21).ok());
  seq.Finish(H(Tokens(21, 1)));
  EXPECT_TRUE(seq.finished());
  EXPECT_EQ(pools_->full().num_free(), 16);
  EXPECT_EQ(pools_->swa().num_free(), 16);
}

// A sequence started from a hit drops the hit's SWA lock once the hit's
// window has slid out of its own window; the full lock stays until the end.
TEST_F(SequenceTest, HitSwaLockIsDroppedWhenTheWindowSlidesOut) {
  Init(8, 4, 64, 64);
  const std::vector<uint32_t> tokens = Tokens(48, 9);
  InsertLive(tokens);  // 12 pages, all live
  const Hashes h = H(tokens);
  const Hashes h6(h.begin(), h.begin() + 6);
  // Keeps pages 6..11 internal and locks the SWA of pages 10, 11.
  CacheHit other = cache_->MatchAndLock(h);
  ASSERT_EQ(other.tokens(), 48);
  CacheHit hit = cache_->MatchAndLock(h6);  // 24 tokens, window pages 4, 5
  ASSERT_EQ(hit.tokens(), 24);
  ASSERT_EQ(hit.swa_first_page(), 4);
  const std::vector<PageId> hit_full(hit.full_pages().begin(), hit.full_pages().end());
  const std::vector<PageId> hit_swa(hit.swa_pages().begin(), hit.swa_pages().end());
  {
    Sequence seq(Opts(), std::move(hit));
    Model m = NewModel(0);
    m.length = 24;
    m.hit_pages = 6;
    m.swa_first = 4;
    ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "from hit"));
    // Length 30: keep_from 20, page 5 still needed -> the hit stays locked.
    ASSERT_TRUE(seq.Append(6).ok());
    m.Append(6);
    seq.TrimWindow();
    m.Trim();
    ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "30"));
    cache_->Evict(0, 1000);
    ASSERT_TRUE(cache_->CheckInvariants().ok());
    EXPECT_EQ(cache_->Match(h6).safe_tokens, 24);
    for (PageId p : hit_swa) EXPECT_EQ(pools_->swa().state(p), PageState::kCached);
    // Length 34: keep_from 24, the hit's window (pages 4, 5) is out.
    ASSERT_TRUE(seq.Append(4).ok());
    m.Append(4);
    seq.TrimWindow();
    m.Trim();
    ASSERT_NO_FATAL_FAILURE(Expect(seq, m, "34"));
    EvictResult r = cache_->Evict(0, 1000);
    EXPECT_EQ(r.full_pages_freed, 0);
    EXPECT_EQ(r.swa_pages_freed, 2);
    ASSERT_TRUE(cache_->CheckInvariants().ok());
    EXPECT_EQ(cache_->Match(h6).safe_tokens, 0);
    EXPECT_EQ(cache_->Match(h6).matched_tokens, 24);
    for (PageId p : hit_full) EXPECT_EQ(pools_->full().state(p), PageState::kCached);
    EXPECT_EQ(cache_->Match(h).safe_tokens, 48);
    seq.Abort();
  }
  cache_->Unlock(other);
}

TEST_F(SequenceTest, AbortFreesEverythingAndUnlocks) {
  Init(8, 4, 64, 64);
  const std::vector<uint32_t> prompt = Tokens(33, 4);
  InsertLive(prompt);
  CacheHit hit = cache_->MatchAndLock(H(prompt), 32);
  ASSERT_EQ(hit.tokens(), 32);
  EXPECT_EQ(cache_->EvictableFullPages(), 0);
  Sequence seq(Opts(2), std::move(hit));
  ASSERT_TRUE(seq.Append(17).ok());
  EXPECT_GT(pools_->full().num_in_use(), 0);
  seq.Abort();
  EXPECT_EQ(pools_->full().num_in_use(), 0);
  EXPECT_EQ(pools_->swa().num_in_use(), 0);
  EXPECT_EQ(cache_->cached_full_pages(), 8) << "Abort inserts nothing";
  EXPECT_EQ(cache_->EvictableFullPages(), 8) << "Abort unlocks the hit";
  EXPECT_TRUE(seq.full_pages().empty());
  seq.Abort();  // harmless
}

TEST_F(SequenceTest, DestructorFreesAndUnlocks) {
  Init(8, 4, 64, 64);
  const std::vector<uint32_t> prompt = Tokens(33, 4);
  InsertLive(prompt);
  {
    CacheHit hit = cache_->MatchAndLock(H(prompt), 32);
    ASSERT_EQ(hit.tokens(), 32);
    Sequence seq(Opts(), std::move(hit));
    ASSERT_TRUE(seq.Append(9).ok());
    EXPECT_EQ(pools_->full().num_in_use(), 3);
  }
  EXPECT_EQ(pools_->full().num_in_use(), 0);
  EXPECT_EQ(pools_->swa().num_in_use(), 0);
  EXPECT_EQ(cache_->EvictableFullPages(), 8);
  {
    Sequence seq(Opts());
    ASSERT_TRUE(seq.Append(9).ok());
    seq.Finish({});  // nothing handed over
    EXPECT_EQ(pools_->full().num_in_use(), 0);
  }
  EXPECT_EQ(cache_->cached_full_pages(), 8);
}

TEST_F(SequenceTest, LayerViewsMatchTheGeometry) {
  Init(8, 4, 32, 32, /*memory=*/true);
  Sequence seq(Opts(/*slack=*/1));
  ASSERT_TRUE(seq.Append(23).ok());
  ASSERT_TRUE(seq.Append(2).ok());
  const PoolGeometry fg = pools_->full().geometry();
  const PoolGeometry sg = pools_->swa().geometry();
  // Every (layer, token) K and V row is a distinct, in-bounds region.
  std::vector<int> full_owner(pools_->full().total_bytes(), 0);
  std::vector<int> swa_owner(pools_->swa().total_bytes(), 0);
  auto mark = [](std::vector<int>& owner, const PagePool& pool, uint8_t* at,
                 size_t n) {
    const ptrdiff_t off = at - pool.base();
    ASSERT_GE(off, 0);
    ASSERT_LE(static_cast<size_t>(off) + n, owner.size());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(owner[off + i]++, 0) << "overlap";
    std::memset(at, 0xA5, n);
  };
  for (int l = 0; l < fg.num_layers; ++l) {
    LayerView v = seq.FullLayer(l);
    EXPECT_EQ(v.pool, &pools_->full());
    EXPECT_EQ(v.page_size, 4);
    EXPECT_EQ(v.k_offset, fg.KOffset(l));
    EXPECT_EQ(v.v_offset, fg.VOffset(l));
    EXPECT_EQ(v.k_token_stride, fg.KTokenStride());
    EXPECT_EQ(v.v_token_stride, fg.VTokenStride());
    ASSERT_EQ(v.pages.size(), seq.full_pages().size());
    for (int t = 0; t < seq.length(); ++t) {
      uint8_t* page = pools_->full().PageData(seq.full_pages()[t / 4]);
      ASSERT_EQ(v.K(t), page + fg.KOffset(l) + (t % 4) * fg.KTokenStride());
      ASSERT_EQ(v.V(t), page + fg.VOffset(l) + (t % 4) * fg.VTokenStride());
      mark(full_owner, pools_->full(), v.K(t), fg.KTokenStride());
      mark(full_owner, pools_->full(), v.V(t), fg.VTokenStride());
    }
  }
  for (int l = 0; l < sg.num_layers; ++l) {
    LayerView v = seq.SwaLayer(l);
    EXPECT_EQ(v.pool, &pools_->swa());
    EXPECT_EQ(v.k_offset, sg.KOffset(l));
    EXPECT_EQ(v.v_offset, sg.VOffset(l));
    EXPECT_EQ(v.k_token_stride, sg.KTokenStride());
    EXPECT_EQ(v.v_token_stride, sg.VTokenStride());
    ASSERT_EQ(v.pages.size(), seq.swa_pages().size());
    for (int p = 0; p < static_cast<int>(v.pages.size()); ++p) {
      EXPECT_EQ(v.pages[p], seq.swa_page(p));
    }
    for (int t = seq.swa_first_page() * 4; t < seq.length(); ++t) {
      uint8_t* page = pools_->swa().PageData(seq.swa_page(t / 4));
      ASSERT_EQ(v.K(t), page + sg.KOffset(l) + (t % 4) * sg.KTokenStride());
      ASSERT_EQ(v.V(t), page + sg.VOffset(l) + (t % 4) * sg.VTokenStride());
      mark(swa_owner, pools_->swa(), v.K(t), sg.KTokenStride());
      mark(swa_owner, pools_->swa(), v.V(t), sg.VTokenStride());
    }
  }
}

}  // namespace
}  // namespace swaserve::kv
