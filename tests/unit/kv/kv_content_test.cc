// Content test: the pages a prefix-cache hit returns hold exactly the bytes
// written by the request that computed them.
//
// Every request writes a deterministic pattern, a function of (token id,
// position, pool, layer, K|V, head, dim, byte), into every layer's K and V
// through its Sequence's FullLayer/SwaLayer views as its tokens are
// appended. Whenever a request starts from a hit, it reads the hit's full
// pages (tokens [0, L)) and SWA window pages back through its own views and
// compares every byte. Between operations every free page of both pools is
// overwritten with garbage, so a page the cache or a sequence still uses
// after it was freed (or hands out twice) shows up as a mismatch. Random
// interleavings of many requests with evictions, tombstones, healing and
// rollbacks; real memory; K and V head dims differ; f32, bf16 and f16.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"
#include "tests/unit/kv/fake_page_stores.h"

namespace swaserve::kv {
namespace {

using Tokens = std::vector<uint32_t>;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

struct RowKey {
  uint32_t token;
  int position;
  PoolKind pool;
  int layer;
  bool is_v;
};

// The bytes of one token's K (or V) row of one layer: [kv_head][dim] elements
// of `elem` bytes each.
void PatternRow(const RowKey& k, size_t row_bytes, std::vector<uint8_t>* out) {
  out->resize(row_bytes);
  const uint64_t base =
      Mix((uint64_t{k.token} << 32) ^ static_cast<uint64_t>(k.position) ^
          (static_cast<uint64_t>(k.pool) << 62) ^
          (static_cast<uint64_t>(k.layer) << 52) ^ (uint64_t{k.is_v} << 51));
  for (size_t i = 0; i < row_bytes; i += 8) {
    const uint64_t v = Mix(base + i);
    std::memcpy(out->data() + i, &v, std::min<size_t>(8, row_bytes - i));
  }
}

struct Request {
  std::unique_ptr<Sequence> seq;
  Tokens tokens;
  int prompt_len = 0;
  int hit_tokens = 0;
};

class ContentHarness {
 public:
  ContentHarness(uint64_t seed, DType dtype) : rng_(seed) {
    window_ = std::vector<int>{4, 8, 6}[Rand(3)];
    ps_ = std::vector<int>{2, 4}[Rand(2)];
    KvPoolsOptions o;
    o.shape.full_layers = 2;
    o.shape.full_kv_heads = 2;
    o.shape.full_k_head_dim = 3;
    o.shape.full_v_head_dim = 2;
    o.shape.swa_layers = 3;
    o.shape.swa_kv_heads = 1;
    o.shape.swa_k_head_dim = 4;
    o.shape.swa_v_head_dim = 5;
    o.shape.sliding_window = window_;
    o.shape.page_size = ps_;
    o.shape.dtype = dtype;
    o.full_pages = 24 + Rand(48);
    o.swa_pages = 12 + Rand(static_cast<int>(o.full_pages) - 11);
    o.allocate_memory = true;
    absl::StatusOr<std::unique_ptr<KvPools>> pools = KvPools::Create(o);
    EXPECT_TRUE(pools.ok()) << pools.status();
    pools_ = std::move(*pools);
    PrefixCacheOptions co;
    co.pools = pools_.get();
    if (Rand(2) == 0) {
      // An L2 tier: demoted pages must come back byte for byte.
      KvPoolsOptions l2 = o;
      l2.full_pages = 8 + Rand(static_cast<int>(2 * o.full_pages));
      l2.swa_pages = 4 + Rand(static_cast<int>(l2.full_pages));
      absl::StatusOr<std::unique_ptr<KvPools>> l2_pools = KvPools::Create(l2);
      EXPECT_TRUE(l2_pools.ok()) << l2_pools.status();
      l2_ = std::move(*l2_pools);
      co.l2 = l2_.get();
      if (Rand(2) == 0) {
        // And an L3 below it, small enough to evict (LRU) and sometimes
        // flushed whole: whatever comes back must be the writer's bytes.
        const int64_t page = static_cast<int64_t>(pools_->full().page_bytes()) +
                             MemoryPageStore::kEntryOverhead;
        l3_ = std::make_unique<testing::RoomLimitedStore>(
            page * (8 + Rand(static_cast<int>(3 * o.full_pages))));
        co.l3 = l3_.get();
        co.l3_write_through_hits = Rand(3);
        // Paths reaching a bound written through at insert, in half.
        co.l3_write_through_from_tokens = Rand(2) == 0 ? 0 : 1 + Rand(6 * window_);
      }
    }
    absl::StatusOr<std::unique_ptr<PrefixCache>> cache = PrefixCache::Create(co);
    EXPECT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
    for (int k = 0; k < 3; ++k) {
      Tokens p(4 * ps_ + Rand(4 * window_));
      for (uint32_t& t : p) t = 500 + Rand(20);
      prefixes_.push_back(std::move(p));
    }
  }

  ~ContentHarness() {
    requests_.clear();
    cache_.reset();
  }

  std::string Describe() const {
    return "W=" + std::to_string(window_) + " page_size=" + std::to_string(ps_) +
           (l2_ == nullptr ? "" : " L2") + (l3_ == nullptr ? "" : " L3") +
           " full_pages=" + std::to_string(pools_->full().num_pages()) +
           " swa_pages=" + std::to_string(pools_->swa().num_pages());
  }

  void Run(int ops) {
    for (int step = 0; step < ops; ++step) {
      Step();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "in op '" << op_ << "' at step " << step;
        return;
      }
      ScribbleFreePages();
      if (!requests_.empty()) {
        VerifyRequest(requests_[Rand(static_cast<int>(requests_.size()))]);
      }
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "after op '" << op_ << "' at step " << step;
        return;
      }
    }
    for (const Request& r : requests_) {
      VerifyRequest(r);
      if (::testing::Test::HasFatalFailure()) return;
    }
    requests_.clear();
    absl::Status st = cache_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << st;
    const PrefixCacheStats& stats = cache_->stats();
    counters().healed += stats.healed_pages.load();
    counters().l3_healed += stats.l3_healed_swa_pages.load();
    counters().tombstoned += stats.tombstoned_nodes.load();
    counters().evicted += stats.evicted_full_pages.load();
    counters().l3_at_bound += stats.l3_write_through_bound_pages.load();
  }

  struct Counters {
    int64_t hit_tokens = 0, healed = 0, tombstoned = 0, evicted = 0, loaded_back = 0;
    int64_t l3_attached = 0, l3_healed = 0, l3_at_bound = 0, l3_paced_pending = 0;
  };
  static Counters& counters() {
    static Counters c;
    return c;
  }

 private:
  int Rand(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  bool Chance(int percent) { return Rand(100) < percent; }

  void Step() {
    const int r = Rand(100);
    if (r < 15) return Start();
    if (r < 60) return AppendOp();
    if (r < 65) return Trim();
    if (r < 72) return RollbackOp();
    if (r < 85) return FinishOp();
    if (r < 90) return AbortOp();
    return EvictOp();
  }

  Tokens RandomPrompt() {
    Tokens p;
    if (!finished_.empty() && Chance(40)) {
      p = finished_[Rand(static_cast<int>(finished_.size()))];
      p.resize(std::max(1, static_cast<int>(p.size()) - Rand(2 * ps_)));
    } else {
      const Tokens& prefix = prefixes_[Rand(static_cast<int>(prefixes_.size()))];
      p.assign(prefix.begin(), prefix.begin() + Rand(static_cast<int>(prefix.size()) + 1));
    }
    const int suffix = 1 + Rand(2 * window_);
    for (int i = 0; i < suffix; ++i) p.push_back(Rand(3));
    return p;
  }

  void WriteRow(uint8_t* at, const RowKey& key, size_t bytes) {
    PatternRow(key, bytes, &scratch_);
    std::memcpy(at, scratch_.data(), bytes);
  }
  void CheckRow(const uint8_t* at, const RowKey& key, size_t bytes, const char* what) {
    PatternRow(key, bytes, &scratch_);
    if (std::memcmp(at, scratch_.data(), bytes) == 0) return;
    size_t i = 0;
    while (at[i] == scratch_[i]) ++i;
    FAIL() << what << ": " << (key.pool == PoolKind::kFull ? "full" : "SWA")
           << " layer " << key.layer << (key.is_v ? " V" : " K") << " of token "
           << key.position << " (id " << key.token << ") differs at byte " << i
           << ": " << int{at[i]} << " != " << int{scratch_[i]};
  }

  // Writes (or checks) every layer's K and V of tokens [from, to) of `r`.
  void Rows(const Request& r, int from, int to, bool write, const char* what) {
    const Sequence& s = *r.seq;
    for (PoolKind kind : {PoolKind::kFull, PoolKind::kSwa}) {
      const PoolGeometry& g = pools_->pool(kind).geometry();
      const size_t k_bytes = g.KTokenStride();
      const size_t v_bytes = g.VTokenStride();
      for (int layer = 0; layer < g.num_layers; ++layer) {
        const LayerView view = kind == PoolKind::kFull ? s.FullLayer(layer) : s.SwaLayer(layer);
        for (int t = from; t < to; ++t) {
          if (kind == PoolKind::kSwa && s.swa_page(t / ps_) == kNoPage) continue;
          const RowKey k{r.tokens[t], t, kind, layer, false};
          const RowKey v{r.tokens[t], t, kind, layer, true};
          if (write) {
            WriteRow(view.K(t), k, k_bytes);
            WriteRow(view.V(t), v, v_bytes);
          } else {
            ASSERT_NO_FATAL_FAILURE(CheckRow(view.K(t), k, k_bytes, what));
            ASSERT_NO_FATAL_FAILURE(CheckRow(view.V(t), v, v_bytes, what));
          }
        }
      }
    }
  }

  // Every byte a request can read: full KV of all its tokens, SWA KV of the
  // tokens its table still holds.
  void VerifyRequest(const Request& r) {
    ASSERT_NO_FATAL_FAILURE(Rows(r, 0, r.seq->length(), /*write=*/false, "live request"));
  }

  void ScribbleFreePages() {
    for (KvPools* pools : {pools_.get(), l2_.get()}) {
      if (pools == nullptr) continue;
      for (PoolKind kind : {PoolKind::kFull, PoolKind::kSwa}) {
        PagePool& pool = pools->pool(kind);
        for (PageId p = 0; p < pool.num_pages(); ++p) {
          if (pool.state(p) == PageState::kFree) {
            std::memset(pool.PageData(p), 0xEE ^ (p & 0xFF), pool.page_bytes());
          }
        }
      }
    }
  }

  void Start() {
    op_ = "start";
    if (requests_.size() >= 5) return AbortOp();
    Request r;
    r.tokens = RandomPrompt();
    r.prompt_len = static_cast<int>(r.tokens.size());
    const std::vector<uint64_t> h = base::ChainedPageHashes(r.tokens, ps_);
    if (l3_ != nullptr && Rand(4) != 0) {
      const MatchLengths m = cache_->Match(h, r.prompt_len - 1);
      const int limit = (r.prompt_len - 1) / ps_;
      const L3Fetch f = FetchFromL3(
          *l3_, cache_->l3_fetch_options(),
          absl::MakeConstSpan(h).subspan(0, limit),
          (m.matched_tokens + m.lower_tier_tokens) / ps_, m.safe_tokens / ps_);
      counters().l3_attached += cache_->AttachFromL3(h, f);
      absl::Status st = cache_->CheckInvariants();
      ASSERT_TRUE(st.ok()) << st;
    }
    if (l2_ != nullptr && Rand(4) != 0) {
      counters().loaded_back += cache_->LoadBack(h, r.prompt_len - 1).pages;
    }
    CacheHit hit = cache_->MatchAndLock(h, r.prompt_len - 1);
    r.hit_tokens = hit.tokens();
    SequenceOptions so;
    so.pools = pools_.get();
    so.cache = cache_.get();
    so.swa_slack = Rand(3);
    r.seq = std::make_unique<Sequence>(so, std::move(hit));
    ASSERT_EQ(r.seq->length(), r.hit_tokens);
    // The hit's bytes are the inserter's: full KV of [0, L), SWA KV of the
    // hit's window.
    ASSERT_NO_FATAL_FAILURE(Rows(r, 0, r.hit_tokens, /*write=*/false, "prefix hit"));
    if (r.hit_tokens > 0) {
      const int window_first = std::max(0, r.hit_tokens - window_ + 1) / ps_;
      for (int p = window_first; p < r.hit_tokens / ps_; ++p) {
        ASSERT_NE(r.seq->swa_page(p), kNoPage) << "hit without SWA KV in its window";
      }
    }
    counters().hit_tokens += r.hit_tokens;
    requests_.push_back(std::move(r));
  }

  Request* Pick() {
    if (requests_.empty()) return nullptr;
    return &requests_[Rand(static_cast<int>(requests_.size()))];
  }
  void Erase(Request* r) { requests_.erase(requests_.begin() + (r - requests_.data())); }

  void AppendOp() {
    op_ = "append";
    Request* r = Pick();
    if (r == nullptr) return Start();
    const int len = r->seq->length();
    const int n = len < r->prompt_len ? 1 + Rand(std::min(r->prompt_len - len, 2 * window_))
                                      : 1 + Rand(2);
    absl::Status s = r->seq->Append(n);
    if (!s.ok()) {
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      if (Chance(40)) {
        r->seq->Abort();
        Erase(r);
      }
      return;
    }
    while (static_cast<int>(r->tokens.size()) < len + n) r->tokens.push_back(Rand(3));
    // The forward pass: write every layer's K and V of the new tokens.
    ASSERT_NO_FATAL_FAILURE(Rows(*r, len, len + n, /*write=*/true, ""));
  }

  void Trim() {
    op_ = "trim";
    Request* r = Pick();
    if (r != nullptr) r->seq->TrimWindow();
  }

  void RollbackOp() {
    op_ = "rollback";
    Request* r = Pick();
    if (r == nullptr) return;
    const int n = Rand(4);
    if (!r->seq->Rollback(n).ok()) return;
    // Rejected drafts: the tokens appended next are new random ones.
    r->tokens.resize(std::max(r->prompt_len, r->seq->length()));
  }

  void FinishOp() {
    op_ = "finish";
    Request* r = Pick();
    if (r == nullptr) return;
    const int len = r->seq->length();
    int pages = len / ps_;
    if (Chance(25)) pages = std::min(pages, r->prompt_len / ps_);
    const std::vector<uint64_t> h = base::ChainedPageHashes(
        absl::MakeConstSpan(r->tokens).subspan(0, pages * ps_), ps_);
    r->seq->Finish(h);
    finished_.push_back(Tokens(r->tokens.begin(), r->tokens.begin() + len));
    if (finished_.size() > 6) finished_.erase(finished_.begin());
    Erase(r);
    absl::Status st = cache_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << st;
  }

  void AbortOp() {
    op_ = "abort";
    Request* r = Pick();
    if (r == nullptr) return;
    r->seq->Abort();
    Erase(r);
  }

  void EvictOp() {
    op_ = "evict";
    if (l3_ != nullptr && Chance(2)) l3_->inner_.Flush();  // a flushed Redis
    if (l3_ != nullptr && Chance(30)) {
      // A write-behind queue with little room left (or plenty): paced
      // writes near the bound go on where they stopped, splitting nodes.
      l3_->room_ = Chance(50) ? Rand(6) * static_cast<int64_t>(pools_->full().page_bytes())
                              : std::numeric_limits<int64_t>::max();
      cache_->ContinueL3Writes();
      counters().l3_paced_pending += cache_->l3_writes_pending();
    }
    cache_->Evict(Rand(6), Rand(6));
    absl::Status st = cache_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << st;
  }

  std::mt19937_64 rng_;
  int window_ = 8;
  int ps_ = 4;
  const char* op_ = "";
  std::unique_ptr<KvPools> pools_;
  std::unique_ptr<KvPools> l2_;  // may be null
  std::unique_ptr<testing::RoomLimitedStore> l3_;  // may be null
  std::unique_ptr<PrefixCache> cache_;
  std::vector<Tokens> prefixes_;
  std::vector<Tokens> finished_;
  std::vector<Request> requests_;
  std::vector<uint8_t> scratch_;
};

class KvContentTest : public ::testing::TestWithParam<DType> {};

TEST_P(KvContentTest, HitsReturnTheInsertersBytes) {
  constexpr int kSeeds = 150;
  constexpr int kOps = 500;
  ContentHarness::counters() = {};
  for (int seed = 1; seed <= kSeeds; ++seed) {
    ContentHarness h(seed * 7919 + static_cast<int>(GetParam()), GetParam());
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " (" << h.Describe() << ")");
    h.Run(kOps);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const ContentHarness::Counters& c = ContentHarness::counters();
  std::printf(
      "verified %lld hit tokens byte by byte; %lld pages evicted, %lld "
      "tombstones, %lld SWA pages healed, %lld pages loaded back from L2, %lld pages "
      "attached from L3, %lld SWA pages healed from L3, %lld written to L3 at an insert "
      "reaching the bound (paths left pending %lld times)\n",
      static_cast<long long>(c.hit_tokens), static_cast<long long>(c.evicted),
      static_cast<long long>(c.tombstoned), static_cast<long long>(c.healed),
      static_cast<long long>(c.loaded_back), static_cast<long long>(c.l3_attached),
      static_cast<long long>(c.l3_healed), static_cast<long long>(c.l3_at_bound),
      static_cast<long long>(c.l3_paced_pending));
  EXPECT_GT(c.hit_tokens, 10000);
  EXPECT_GT(c.evicted, 1000);
  EXPECT_GT(c.tombstoned, 100);
  EXPECT_GT(c.healed, 100);
  EXPECT_GT(c.loaded_back, 1000);
  EXPECT_GT(c.l3_attached, 150);
  EXPECT_GT(c.l3_healed, 100);
  EXPECT_GT(c.l3_at_bound, 100);
  EXPECT_GT(c.l3_paced_pending, 5);
}

INSTANTIATE_TEST_SUITE_P(DTypes, KvContentTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace swaserve::kv
