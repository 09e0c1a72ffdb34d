// The harness of kv_property_test.cc: random operations over pools, sequences
// and a prefix cache, with an independent model of what the cache holds
// (kv_property_test.cc says what the model checks). The raw-hit operations
// and the whole-state checks are in kv_property_harness.cc.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/base/sanitizers.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"

namespace swaserve::kv::property_testing {


using Hashes = std::vector<uint64_t>;
using Tokens = std::vector<uint32_t>;

inline int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// A page the cache moved between tiers: its new id is not announced (the
// model learns it from the next hit that reads it).
constexpr PageId kUnknown = -2;

struct ModelPage {
  PageId full = kNoPage;
  PageId swa = kNoPage;  // kNoPage: tombstoned; kUnknown: live, id not known
  int tier = 0;          // 0: L1, 1: L2
};

struct Request {
  std::unique_ptr<Sequence> seq;
  Tokens tokens;  // the prompt, then generated tokens
  int prompt_len = 0;
  int slack = 0;
  bool evict_on_demand = true;
  // The hit it started from.
  int hit_pages = 0;
  Hashes hit_hashes;
  std::vector<PageId> hit_full;
  // Model of the sequence.
  int length = 0;
  int swa_first = 0;
  // The divergence window the sequence keeps (page indices [begin, end)).
  int keep_begin = 0;
  int keep_end = 0;
  // Window restore from a full-KV hit: whether one runs, and the end of the
  // last prepared chunk (== length otherwise).
  bool restoring = false;
  int frontier = 0;
  // SWA pages exist below this page index only (a restore allocates them
  // as Prepare reaches them).
  int swa_end_page = 0;
  // SWA pages below this page index are the hit's (cached, shared): the hit's
  // pages for an ordinary hit, none for a restore from the stretch, those
  // below L for a restore from the window-safe hit L.
  int swa_shared_end = 0;
  bool dropped = false;  // kept windows given up
  // SequenceOptions::checkpoints_yield: checkpoint pages below this page
  // index were given up (oldest first) to make room.
  int yielded_below = 0;
  // Window restore: SWA KV from this page on is exact (the restored window).
  int restore_exact = 0;
  // SWA checkpoints (SequenceOptions::swa_checkpoint_tokens, a multiple of
  // the page size here; 0: none): the windows ending at multiples of it that
  // start at or after checkpoint_floor. Dropped (with the divergence /
  // restored window) when the sequence gives its kept windows up.
  int checkpoint = 0;
  int checkpoint_floor = 0;
  int window = 0;
  int ps = 1;
  bool Keeps(int page) const {
    if (page >= keep_begin && page < keep_end) return true;
    if (checkpoint == 0 || page < yielded_below) return false;
    // Independent restatement: every checkpoint whose window covers the page.
    for (int cp = checkpoint; cp <= (page + 1) * ps + window + checkpoint; cp += checkpoint) {
      const int start = std::max(0, cp - window + 1) / ps * ps;
      if (start >= checkpoint_floor && page * ps >= start && page * ps < cp) return true;
    }
    return false;
  }
};

struct RawHit {
  CacheHit hit;
  Hashes hashes;
  bool released = false;
};

class Harness {
 public:
  explicit Harness(uint64_t seed) : rng_(seed) {
    static constexpr int kWindows[] = {4, 8, 16, 5};
    static constexpr int kPageSizes[] = {2, 4};
    window_ = kWindows[Rand(4)];
    ps_ = kPageSizes[Rand(2)];
    KvPoolsOptions o;
    o.shape.full_layers = 1;
    o.shape.full_kv_heads = 1;
    o.shape.full_k_head_dim = 1;
    o.shape.full_v_head_dim = 1;
    o.shape.swa_layers = 1;
    o.shape.swa_kv_heads = 1;
    o.shape.swa_k_head_dim = 1;
    o.shape.swa_v_head_dim = 1;
    o.shape.sliding_window = window_;
    o.shape.page_size = ps_;
    o.full_pages = 16 + Rand(241);
    o.swa_pages = 16 + Rand(static_cast<int>(o.full_pages) - 15);
    o.allocate_memory = false;
    absl::StatusOr<std::unique_ptr<KvPools>> pools = KvPools::Create(o);
    EXPECT_TRUE(pools.ok()) << pools.status();
    pools_ = std::move(*pools);
    PrefixCacheOptions co;
    co.pools = pools_.get();
    co.keep_restorable_tombstones = keep_tombstones_ = Chance(50);
    co.cold_superseded_windows = cold_superseded_ = Chance(50);
    yield_ = Chance(50);
    if (Chance(40)) {
      // L2: its own pools, from smaller than L1 to 3x.
      KvPoolsOptions l2 = o;
      l2.full_pages = 8 + Rand(static_cast<int>(3 * o.full_pages));
      l2.swa_pages = 4 + Rand(static_cast<int>(l2.full_pages));
      absl::StatusOr<std::unique_ptr<KvPools>> l2_pools = KvPools::Create(l2);
      EXPECT_TRUE(l2_pools.ok()) << l2_pools.status();
      l2_ = std::move(*l2_pools);
      co.l2 = l2_.get();
    }
    checkpoint_ = Chance(50) ? ps_ * (1 + Rand(2 * window_ / ps_ + 2)) : 0;
    co.on_event = [this](const CacheEvent& e) { events_.push_back(e); };
    anchor_page_ = Chance(50) ? 1 + Rand(8) : 0;
    co.event_anchor_page = anchor_page_;
    absl::StatusOr<std::unique_ptr<PrefixCache>> cache = PrefixCache::Create(co);
    EXPECT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
    // Shared prefixes so that hits happen.
    for (int k = 0; k < 4; ++k) {
      Tokens p(8 * ps_ + Rand(6 * window_));
      for (uint32_t& t : p) t = 1000 + Rand(50);
      prefixes_.push_back(std::move(p));
    }
  }

  ~Harness() {
    pending_.clear();  // a failed run: not finished (the cache goes too)
    requests_.clear();
    for (RawHit& h : raw_hits_) cache_->Unlock(h.hit);
    raw_hits_.clear();
    cache_.reset();
  }

  std::string Describe() const {
    return "W=" + std::to_string(window_) + " page_size=" + std::to_string(ps_) +
           " full_pages=" + std::to_string(pools_->full().num_pages()) +
           " swa_pages=" + std::to_string(pools_->swa().num_pages()) +
           " keep_tombstones=" + std::to_string(keep_tombstones_) +
           " cold_superseded=" + std::to_string(cold_superseded_) +
           " checkpoint=" + std::to_string(checkpoint_) + " yield=" + std::to_string(yield_) +
           (l2_ == nullptr ? std::string(" no L2")
                           : " L2 " + std::to_string(l2_->full().num_pages()) + "/" +
                                 std::to_string(l2_->swa().num_pages()));
  }

  void Run(int ops) {
    for (step_ = 0; step_ < ops; ++step_) {
      ++coverage().ops;
      coverage().ops_while_loading += !pending_.empty();
      Step();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "in op '" << last_op_ << "' at step " << step_;
        return;
      }
      CheckAll();
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "after op '" << last_op_ << "' at step " << step_;
        return;
      }
    }
    Drain();
  }

  // Coverage counters, summed over seeds and printed by the test.
  struct Coverage {
    int64_t ops = 0, lookups = 0, hit_tokens = 0, window_lost = 0;
    int64_t appends = 0, appends_exhausted = 0, rollbacks = 0,
            rollbacks_rejected = 0, finishes = 0, aborts = 0, evicted_full = 0,
            evicted_swa = 0, healed = 0, tombstoned = 0, locked_evict_attempts = 0;
    int64_t divergence_windows = 0, multi_run_inserts = 0;
    int64_t restores = 0, restore_prepares = 0, restores_from_safe = 0;
    int64_t demoted = 0, promoted = 0, load_backs = 0;
    // Asynchronous load-backs begun, and operations run while one was
    // pending (BeginLoadBack ... FinishLoadBack).
    int64_t async_load_backs = 0, ops_while_loading = 0;
    int64_t checkpoint_pages_inserted = 0, kept_drops = 0, checkpoint_yields = 0,
            tombstone_leaves = 0;  // SWA-only evictions with tombstones kept
    int64_t anchored = 0;  // events checked against CacheEvent::anchor
    int64_t cooled = 0;    // superseded windows' SWA pages made cold
  };
  static Coverage& coverage() {
    static Coverage c;
    return c;
  }

 private:
  int Rand(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  bool Chance(int percent) { return Rand(100) < percent; }

  Hashes H(const Tokens& t, int n_tokens) const {
    return base::ChainedPageHashes(absl::MakeConstSpan(t).subspan(0, n_tokens), ps_);
  }

  Tokens RandomPrompt() {
    Tokens p;
    if (!finished_.empty() && Chance(30)) {
      p = finished_[Rand(static_cast<int>(finished_.size()))];
      p.resize(std::max(1, static_cast<int>(p.size()) - Rand(3 * ps_)));
    } else {
      const Tokens& prefix = prefixes_[Rand(static_cast<int>(prefixes_.size()))];
      p.assign(prefix.begin(), prefix.begin() + Rand(static_cast<int>(prefix.size()) + 1));
    }
    const int suffix = Chance(20) ? 0 : 1 + Rand(2 * window_ + 3 * ps_);
    for (int i = 0; i < suffix; ++i) p.push_back(Rand(4));
    if (p.empty()) p.push_back(Rand(4));
    return p;
  }

  // --- the model of the cache ----------------------------------------------

  struct Lens {
    int matched = 0;
    int safe = 0;
    int lower = 0;  // further match in L2
  };
  Lens ModelMatch(const Hashes& h, int max_tokens) const {
    const int n = std::min<int>(static_cast<int>(h.size()), max_tokens / ps_);
    auto in_tier = [&](int p, int tier) {
      auto it = model_.find(h[p]);
      return it != model_.end() && it->second.tier == tier;
    };
    int matched = 0;
    while (matched < n && in_tier(matched, 0)) ++matched;
    int lower = matched;
    while (lower < n && in_tier(lower, 1)) ++lower;
    for (int k = matched; k >= 0; --k) {
      const int l = k * ps_;
      bool ok = true;
      for (int p = std::max(0, l - window_ + 1) / ps_; p < k && ok; ++p) {
        ok = model_.at(h[p]).swa != kNoPage;
      }
      if (ok) return {matched * ps_, l, (lower - matched) * ps_};
    }
    return {matched * ps_, 0, (lower - matched) * ps_};
  }
  // A page id the model may not know (moved between tiers): learn it.
  static void Learn(PageId* model_id, PageId actual) {
    if (*model_id == kUnknown) *model_id = actual;
  }

  // Every event's depth, parent and anchor (CacheEvent) agree with the
  // paths its stored events built; stored events record the path, removed
  // ones forget it.
  void CheckEventPath(const CacheEvent& e) {
    const int n = static_cast<int>(e.hashes.size());
    for (int i = 0; i < n; ++i) {
      const uint64_t h = e.hashes[i];
      const uint64_t parent = i == 0 ? e.parent : e.hashes[i - 1];
      if (e.type == CacheEvent::Type::kStored) {
        path_[h] = {e.depth + i, parent};
        if (e.depth + i > 0) {
          ASSERT_TRUE(path_.contains(parent)) << "stored under a page never stored";
        }
      } else {
        auto it = path_.find(h);
        ASSERT_NE(it, path_.end()) << "event on a page never stored";
        ASSERT_EQ(it->second.first, e.depth + i) << "depth";
        ASSERT_EQ(it->second.second, parent) << "parent";
      }
    }
    if (anchor_page_ > 0 && e.depth + n > anchor_page_) {
      uint64_t h = e.hashes.back();
      while (path_.at(h).first > anchor_page_) h = path_.at(h).second;
      ASSERT_EQ(e.anchor, h) << "anchor of an event at depth " << e.depth;
      ++coverage().anchored;
    } else {
      ASSERT_EQ(e.anchor, 0u);
    }
    if (e.type == CacheEvent::Type::kRemoved) {
      for (uint64_t h : e.hashes) path_.erase(h);
    }
  }

  // Applies the events of one operation to the model. `inserted` maps the
  // hashes handed to Insert (by this operation) to the pages handed over.
  void ApplyEvents(int64_t* full_removed = nullptr, int64_t* swa_removed = nullptr) {
    int64_t fr = 0, sr = 0;
    // Pages stored without SWA KV in this operation: the cache follows their
    // kStored with a kSwaRemoved.
    absl::flat_hash_set<uint64_t> stored_as_tombstone;
    for (const CacheEvent& e : events_) {
      ASSERT_FALSE(e.hashes.empty()) << "empty event";
      CheckEventPath(e);
      if (::testing::Test::HasFatalFailure()) return;
      for (uint64_t h : e.hashes) {
        auto it = model_.find(h);
        switch (e.type) {
          case CacheEvent::Type::kStored: {
            ASSERT_EQ(it, model_.end()) << "stored twice: " << h;
            auto in = inserted_.find(h);
            ASSERT_NE(in, inserted_.end()) << "stored a hash nobody inserted now";
            model_[h] = in->second;
            if (in->second.swa == kNoPage) stored_as_tombstone.insert(h);
            ++total_stored_;
            break;
          }
          case CacheEvent::Type::kRemoved:
            ASSERT_NE(it, model_.end()) << "removed a hash not cached: " << h;
            ++total_full_removed_;
            total_swa_removed_ += it->second.swa != kNoPage;
            // EvictResult counts L1 pages.
            if (it->second.tier == 0) {
              sr += it->second.swa != kNoPage;
              ++fr;
            }
            ++coverage().evicted_full;
            model_.erase(it);
            break;
          case CacheEvent::Type::kSwaRemoved:
            ASSERT_NE(it, model_.end()) << "tombstoned a hash not cached";
            if (it->second.swa == kNoPage && stored_as_tombstone.erase(h) == 1) {
              break;  // announces a page stored without SWA KV
            }
            ASSERT_NE(it->second.swa, kNoPage) << "tombstoned a tombstone";
            it->second.swa = kNoPage;
            ++total_swa_removed_;
            if (it->second.tier == 0) ++sr;
            ++coverage().tombstoned;
            break;
          case CacheEvent::Type::kSwaStored: {
            ASSERT_NE(it, model_.end()) << "healed a hash not cached";
            ASSERT_EQ(it->second.swa, kNoPage) << "healed a live page";
            auto in = inserted_.find(h);
            ASSERT_NE(in, inserted_.end()) << "healed without an insert";
            ASSERT_NE(in->second.swa, kNoPage) << "healed without a SWA page";
            ASSERT_EQ(it->second.tier, 0) << "healed outside L1";
            it->second.swa = in->second.swa;
            ++total_healed_;
            ++coverage().healed;
            break;
          }
          case CacheEvent::Type::kTierChanged: {
            ASSERT_NE(it, model_.end()) << "moved a hash not cached";
            ASSERT_NE(l2_, nullptr) << "tier change without L2";
            ASSERT_NE(it->second.tier, e.tier) << "moved to the tier it is in";
            if (it->second.tier == 0) {  // demoted: its L1 pages are free now
              ++fr;
              sr += it->second.swa != kNoPage;
              ++coverage().demoted;
            } else {
              ++coverage().promoted;
            }
            it->second.tier = e.tier;
            // An insert's pages adopted into L1 are the inserter's own;
            // otherwise the new ids are learnt from the next hit.
            auto in = inserted_.find(h);
            it->second.full = e.tier == 0 && in != inserted_.end() ? in->second.full : kUnknown;
            if (it->second.swa != kNoPage) it->second.swa = kUnknown;
            break;
          }
        }
      }
    }
    events_.clear();
    inserted_.clear();
    if (full_removed != nullptr) *full_removed = fr;
    if (swa_removed != nullptr) *swa_removed = sr;
  }

  // Checks a fresh hit against the model.
  void CheckHit(const CacheHit& hit, const Hashes& h, int max_tokens, bool full_kv = false,
                bool lock_safe_window = false) {
    const Lens want = ModelMatch(h, max_tokens);
    ++lookups_;
    hit_tokens_ += hit.window_safe_tokens();
    window_lost_ += hit.matched_tokens() - hit.window_safe_tokens();
    ++coverage().lookups;
    coverage().hit_tokens += hit.window_safe_tokens();
    coverage().window_lost += hit.matched_tokens() - hit.window_safe_tokens();
    ASSERT_EQ(hit.window_safe_tokens(), want.safe) << "not the longest window-safe prefix";
    ASSERT_EQ(hit.matched_tokens(), want.matched);
    if (full_kv && want.matched > want.safe) {
      // A full-KV hit: the full pages of the whole match, no SWA page (with
      // lock_safe_window: the SWA pages of the window at L).
      ASSERT_TRUE(hit.needs_window_restore());
      ASSERT_EQ(hit.tokens(), want.matched);
      for (int p = 0; p < hit.tokens() / ps_; ++p) {
        Learn(&model_.at(h[p]).full, hit.full_pages()[p]);
        ASSERT_EQ(hit.full_pages()[p], model_.at(h[p]).full) << "page " << p;
      }
      if (!lock_safe_window || want.safe == 0 || window_ <= 1) {
        ASSERT_TRUE(hit.swa_pages().empty());
        ASSERT_FALSE(hit.swa_locked());
        return;
      }
      ASSERT_TRUE(hit.swa_locked());
      const int safe_pages = want.safe / ps_;
      ASSERT_EQ(hit.swa_first_page(), std::max(0, want.safe - window_ + 1) / ps_);
      ASSERT_NO_FATAL_FAILURE(CheckHitSwaPages(hit, h, safe_pages));
      return;
    }
    ASSERT_FALSE(hit.needs_window_restore());
    ASSERT_EQ(hit.tokens(), want.safe) << "MatchAndLock is not the longest window-safe prefix";
    ASSERT_GE(hit.matched_tokens(), hit.tokens());
    ASSERT_EQ(hit.locked(), hit.tokens() > 0);
    const int pages = hit.tokens() / ps_;
    ASSERT_EQ(static_cast<int>(hit.full_pages().size()), pages);
    for (int p = 0; p < pages; ++p) {
      ASSERT_EQ(pools_->full().state(hit.full_pages()[p]), PageState::kCached);
      ASSERT_TRUE(model_.contains(h[p])) << "hit on a page the cache never reported";
      Learn(&model_.at(h[p]).full, hit.full_pages()[p]);
      ASSERT_EQ(hit.full_pages()[p], model_.at(h[p]).full) << "page " << p;
    }
    if (pages == 0) return;
    const int window_first = std::max(0, hit.tokens() - window_ + 1) / ps_;
    ASSERT_LE(hit.swa_first_page(), window_first);
    ASSERT_NO_FATAL_FAILURE(CheckHitSwaPages(hit, h, pages));
  }
  // The hit's SWA pages: cached, those the model knows, from its
  // swa_first_page() to page `end`.
  void CheckHitSwaPages(const CacheHit& hit, const Hashes& h, int end) {
    ASSERT_EQ(static_cast<int>(hit.swa_pages().size()), end - hit.swa_first_page());
    for (int p = hit.swa_first_page(); p < end; ++p) {
      const PageId s = hit.swa_pages()[p - hit.swa_first_page()];
      ASSERT_TRUE(pools_->swa().Valid(s)) << "hit without SWA page " << p;
      ASSERT_EQ(pools_->swa().state(s), PageState::kCached);
      Learn(&model_.at(h[p]).swa, s);
      ASSERT_EQ(s, model_.at(h[p]).swa) << "page " << p;
    }
  }

  // --- operations ----------------------------------------------------------

  void Step() {
    const int r = Rand(100);
    if (r < 12) return StartRequest();
    if (r < 45) return AppendToRequest();
    if (r < 50) return TrimRequest();
    if (r < 58) return RollbackRequest();
    if (r < 66) return FinishRequest();
    if (r < 70) return AbortRequest();
    if (r < 76) return EvictOp();
    if (r < 82) return MatchOp();
    if (r < 87) return RawLock();
    if (r < 92) return RawRelease();
    if (r < 97) return RawInsert();
    return FinishLoadBackOp();
  }

  // Finishes one pending asynchronous load-back (its copies run first).
  void FinishLoadBackOp() {
    last_op_ = "finish load-back";
    if (pending_.empty()) return;
    const size_t i = Rand(static_cast<int>(pending_.size()));
    pending_[i].result.seconds = pending_[i].RunCopies();
    cache_->FinishLoadBack(pending_[i]);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    ApplyEvents();
  }

  Request* PickRequest() {
    if (requests_.empty()) return nullptr;
    return &requests_[Rand(static_cast<int>(requests_.size()))];
  }

  void StartRequest() {
    last_op_ = "start";
    if (requests_.size() >= 6) return AbortRequest();
    Request req;
    req.tokens = RandomPrompt();
    req.prompt_len = static_cast<int>(req.tokens.size());
    req.slack = std::vector<int>{0, 0, 1, 2, 4}[Rand(5)];
    const Hashes h = H(req.tokens, req.prompt_len);
    const int max_tokens = req.prompt_len - 1;
    const bool full_kv = Chance(35);
    if (l2_ != nullptr && Chance(60)) {
      last_op_ = "load back";
      const MatchLengths before = cache_->Match(h, max_tokens);
      const int min_tokens = Chance(70) ? 0 : Rand(4 * ps_);
      LoadBackResult lb;
      if (Chance(40)) {
        // Asynchronous: the copies "run" while later operations go on; a
        // later step (or the drain) finishes it.
        PendingLoadBack p = cache_->BeginLoadBack(h, max_tokens, min_tokens);
        lb = p.result;
        if (!p.empty()) {
          pending_.push_back(std::move(p));
          ++coverage().async_load_backs;
        }
      } else {
        lb = cache_->LoadBack(h, max_tokens, min_tokens);
      }
      ApplyEvents();
      if (::testing::Test::HasFatalFailure()) return;
      const MatchLengths after = cache_->Match(h, max_tokens);
      ASSERT_LE(lb.pages * ps_, before.lower_tier_tokens);
      if (before.lower_tier_tokens < min_tokens) {
        ASSERT_EQ(lb.pages, 0);
      }
      // What came back extends the L1 match (unless L1 eviction took part
      // of the L1 match to make room: it can, it is not locked).
      ASSERT_LE(after.matched_tokens, before.matched_tokens + before.lower_tier_tokens);
      coverage().load_backs += lb.pages > 0;
      last_op_ = "start";
    }
    const bool lock_safe = full_kv && Chance(50);
    CacheHit hit = cache_->MatchAndLock(
        h, {.max_tokens = max_tokens, .full_kv = full_kv, .lock_safe_window = lock_safe});
    ApplyEvents();
    ASSERT_NO_FATAL_FAILURE(CheckHit(hit, h, max_tokens, full_kv, lock_safe));
    req.hit_pages = hit.tokens() / ps_;
    req.hit_hashes.assign(h.begin(), h.begin() + req.hit_pages);
    req.hit_full.assign(hit.full_pages().begin(), hit.full_pages().end());
    req.length = hit.tokens();
    req.frontier = req.length;
    req.swa_end_page = CeilDiv(req.length, ps_);
    req.swa_first = hit.tokens() > 0 ? hit.swa_first_page() : 0;
    req.swa_shared_end = req.hit_pages;
    // A hit that locked its window at L restores from L (only).
    const bool from_safe = hit.needs_window_restore() && hit.swa_locked();
    const int safe = hit.window_safe_tokens();
    const int restore_from = !hit.needs_window_restore() ? -1 : from_safe ? safe : Rand(hit.tokens());
    if (hit.matched_tokens() > hit.tokens()) {
      // Independent restatement of the rule in sequence.h.
      const int d = hit.matched_tokens();
      req.keep_end = d / ps_;
      req.keep_begin = std::max(req.hit_pages, std::max(0, d - window_ + 1) / ps_);
      ++coverage().divergence_windows;
    }
    SequenceOptions so;
    so.pools = pools_.get();
    so.cache = cache_.get();
    so.swa_slack = req.slack;
    so.swa_checkpoint_tokens = checkpoint_;
    so.checkpoints_yield = yield_;
    req.window = window_;
    req.ps = ps_;
    req.checkpoint = window_ > 1 ? checkpoint_ : 0;
    req.checkpoint_floor = req.length;
    so.evict_on_demand = req.evict_on_demand = !Chance(15);
    req.seq = std::make_unique<Sequence>(so, std::move(hit));
    ASSERT_EQ(req.seq->cached_tokens(), req.length);
    ASSERT_FALSE(req.seq->BeginWindowRestore(req.length).ok()) << "restore from the hit's end";
    if (from_safe) {
      ASSERT_FALSE(req.seq->BeginWindowRestore(Rand(safe)).ok()) << "restore below the window";
      ASSERT_FALSE(req.seq->BeginWindowRestore(safe + ps_).ok()) << "restore past the window";
    }
    if (restore_from >= 0) {
      absl::Status st = req.seq->BeginWindowRestore(restore_from);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_FALSE(req.seq->BeginWindowRestore(restore_from).ok()) << "restore planned twice";
      // Independent restatement of the restore rules in sequence.h.
      req.restoring = true;
      req.frontier = restore_from;
      if (!from_safe) req.swa_first = restore_from / ps_;
      req.swa_end_page = restore_from / ps_;
      req.swa_shared_end = from_safe ? restore_from / ps_ : 0;
      req.keep_begin =
          std::max(restore_from / ps_, std::max(0, req.length - window_ + 1) / ps_);
      req.keep_end = req.hit_pages;
      req.restore_exact = req.keep_begin;
      ++coverage().restores;
      coverage().restores_from_safe += from_safe;
    }
    requests_.push_back(std::move(req));
  }

  int KeepFrom(const Request& r, int len) const {
    return std::max(0, len - r.slack - (window_ - 1) - (ps_ - 1));
  }
  void ModelTrim(Request& r) {
    r.swa_first = std::max(r.swa_first, KeepFrom(r, std::min(r.length, r.frontier)) / ps_);
  }

  // The next chunk of a window restore (Prepare from the frontier); it may
  // run past the hit's end.
  void PrepareRestore(Request* r) {
    last_op_ = "prepare restore";
    const int n = 1 + Rand(std::min(3 * window_, r->length - r->frontier + window_));
    const std::vector<PageId> full_before(r->seq->full_pages().begin(), r->seq->full_pages().end());
    const std::vector<PageId> swa_before(r->seq->swa_pages().begin(), r->seq->swa_pages().end());
    ASSERT_FALSE(r->seq->Append(1).ok()) << "Append during a window restore";
    ASSERT_FALSE(r->seq->Prepare(r->frontier + 1, n).ok()) << "Prepare past the frontier";
    int64_t swa_missing = 0;
    for (int p = r->frontier / ps_; p < CeilDiv(r->frontier + n, ps_); ++p) {
      swa_missing += r->seq->swa_page(p) == kNoPage;
    }
    const bool could_drop = CouldDropKept(*r, swa_missing);
    const bool could_yield = CouldYield(*r, swa_missing);
    absl::Status s = r->seq->Prepare(r->frontier, n);
    ApplyEvents();  // evict_on_demand may have evicted
    if (::testing::Test::HasFatalFailure()) return;
    ModelTrim(*r);  // Prepare trims first, even when it then fails
    ASSERT_NO_FATAL_FAILURE(ModelDrop(*r, could_drop));
    ASSERT_NO_FATAL_FAILURE(ModelYield(*r, could_yield));
    ++coverage().restore_prepares;
    if (!s.ok()) {
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      ASSERT_EQ(std::vector<PageId>(r->seq->full_pages().begin(), r->seq->full_pages().end()),
                full_before)
          << "a failed Prepare changed the page table";
      return;
    }
    r->frontier += n;
    r->length = std::max(r->length, r->frontier);
    r->swa_end_page = CeilDiv(r->frontier, ps_);
    while (static_cast<int>(r->tokens.size()) < r->length) r->tokens.push_back(Rand(4));
  }

  // Private SWA pages an allocation's opening trim releases.
  int64_t TrimmedSwaPages(const Request& r) const {
    int64_t trimmed = 0;
    for (int p = r.swa_first; p < KeepFrom(r, std::min(r.length, r.frontier)) / ps_; ++p) {
      if (!r.Keeps(p) && r.seq->swa_page(p) != kNoPage && p >= r.swa_shared_end) ++trimmed;
    }
    return trimmed;
  }
  // Whether an allocation needing `swa` SWA pages may make the sequence
  // give up its kept windows: only when free plus evictable SWA pages fall
  // short (checked before the call; the trim it starts with frees only
  // private pages, which can only help, so this is an upper bound).
  bool CouldDropKept(const Request& r, int64_t swa) const {
    const int64_t trimmed = TrimmedSwaPages(r);
    const int64_t evictable = r.evict_on_demand ? cache_->EvictableSwaPages() : 0;
    return pools_->swa().num_free() + trimmed + evictable < swa;
  }
  // Whether an allocation needing `swa` SWA pages may make the sequence
  // give up checkpoint windows (checkpoints_yield): only when free pages,
  // what its trim releases and the cache's cold SWA KV fall short.
  bool CouldYield(const Request& r, int64_t swa) const {
    if (!yield_ || !r.evict_on_demand) return false;
    return pools_->swa().num_free() + TrimmedSwaPages(r) + cache_->EvictableColdSwaPages() < swa;
  }
  // After an allocation: checkpoint pages the sequence no longer has were
  // given up oldest first, and only when allowed; the model forgets them.
  void ModelYield(Request& r, bool could_yield) {
    if (r.dropped || r.checkpoint == 0) return;
    auto checkpoint_page = [&](int p) {
      return r.Keeps(p) && !(p >= r.keep_begin && p < r.keep_end) && p >= r.swa_shared_end;
    };
    int gone = -1;  // the newest checkpoint page given up
    for (int p = r.yielded_below; p < r.swa_first; ++p) {
      if (checkpoint_page(p) && r.seq->swa_page(p) == kNoPage) gone = p;
    }
    if (gone < 0) return;
    ASSERT_TRUE(could_yield) << "checkpoint page " << gone
                             << " given up although free and cold pages had room";
    for (int p = r.yielded_below; p < gone; ++p) {
      if (checkpoint_page(p)) ASSERT_EQ(r.seq->swa_page(p), kNoPage) << "not oldest first: " << p;
    }
    r.yielded_below = gone + 1;
    ++coverage().checkpoint_yields;
  }
  // After an allocation: if the sequence gave its kept windows up, that was
  // allowed, and the model forgets them.
  void ModelDrop(Request& r, bool could_drop) {
    if (!r.seq->kept_windows_dropped() || r.dropped) return;
    ASSERT_TRUE(could_drop) << "kept windows dropped although the pool had room";
    r.dropped = true;
    r.keep_begin = r.keep_end = 0;
    r.checkpoint = 0;
    ++coverage().kept_drops;
  }

  void AppendToRequest() {
    last_op_ = "append";
    Request* r = PickRequest();
    if (r == nullptr) return StartRequest();
    if (r->frontier < r->length) return PrepareRestore(r);
    int n;
    if (r->length < r->prompt_len) {
      n = 1 + Rand(std::min(r->prompt_len - r->length, 3 * window_));
    } else {
      n = 1 + Rand(r->slack + 1);  // a decode step or speculative drafts
    }
    const std::vector<PageId> full_before(r->seq->full_pages().begin(),
                                          r->seq->full_pages().end());
    const Sequence::PageNeeds needs = r->seq->NeedsFor(n);
    const int new_pages = CeilDiv(r->length + n, ps_) - CeilDiv(r->length, ps_);
    ASSERT_EQ(needs.full, new_pages);
    ASSERT_EQ(needs.swa, new_pages) << "Append allocates SWA for every new token";
    const bool could_drop = CouldDropKept(*r, needs.swa);
    const bool could_yield = CouldYield(*r, needs.swa);
    absl::Status s = r->seq->Append(n);
    ApplyEvents();  // evict_on_demand may have evicted
    if (::testing::Test::HasFatalFailure()) return;
    ModelTrim(*r);  // Append trims first, even when it then fails
    ASSERT_NO_FATAL_FAILURE(ModelDrop(*r, could_drop));
    ASSERT_NO_FATAL_FAILURE(ModelYield(*r, could_yield));
    ++coverage().appends;
    if (!s.ok()) {
      ++coverage().appends_exhausted;
      ASSERT_FALSE(pools_->CanReserve(needs.full, needs.swa))
          << "Append failed although the pages are free";
      if (r->evict_on_demand) {
        ASSERT_TRUE(
            pools_->full().num_free() + cache_->EvictableFullPages() < needs.full ||
            pools_->swa().num_free() + cache_->EvictableSwaPages() < needs.swa)
            << "Append failed although eviction could make room: needs "
            << needs.full << "/" << needs.swa << ", free "
            << pools_->full().num_free() << "/" << pools_->swa().num_free()
            << ", evictable " << cache_->EvictableFullPages() << "/"
            << cache_->EvictableSwaPages();
      }
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      ASSERT_EQ(std::vector<PageId>(r->seq->full_pages().begin(),
                                    r->seq->full_pages().end()),
                full_before)
          << "a failed Append changed the page table";
      if (Chance(30)) {
        last_op_ = "abort after failed append";
        r->seq->Abort();
        requests_.erase(requests_.begin() + (r - requests_.data()));
        ApplyEvents();  // unlocking may delete a tombstoned hit end
      }
      return;
    }
    r->length += n;
    r->frontier = r->length;
    r->swa_end_page = CeilDiv(r->length, ps_);
    while (static_cast<int>(r->tokens.size()) < r->length) r->tokens.push_back(Rand(4));
  }

  void TrimRequest() {
    last_op_ = "trim";
    Request* r = PickRequest();
    if (r == nullptr) return;
    r->seq->TrimWindow();
    ApplyEvents();
    ModelTrim(*r);
  }

  void RollbackRequest() {
    last_op_ = "rollback";
    Request* r = PickRequest();
    if (r == nullptr || r->length == 0) return;
    const int n = Chance(80) ? Rand(std::min(r->slack, r->length) + 1)
                             : Rand(r->length + 1);
    const int new_len = r->length - n;
    const bool want_ok =
        new_len >= r->hit_pages * ps_ &&
        std::max(0, new_len - window_ + 1) >= r->swa_first * ps_;
    absl::Status s = r->seq->Rollback(n);
    ApplyEvents();
    if (!want_ok && new_len == 0 && s.ok()) {
      // Back to nothing needs no SWA KV at all: accepting that is fine too,
      // and the window then starts from scratch.
      r->length = 0;
      r->frontier = 0;
      r->swa_end_page = 0;
      r->swa_first = 0;
      r->tokens.resize(r->prompt_len);
      return;
    }
    ++coverage().rollbacks;
    if (!want_ok) {
      ++coverage().rollbacks_rejected;
      ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
          << "Rollback(" << n << ") from " << r->length << " to " << new_len
          << " (hit " << r->hit_pages * ps_ << ", SWA from token "
          << r->swa_first * ps_ << ") should be rejected; got " << s;
      return;
    }
    ASSERT_TRUE(s.ok()) << "Rollback(" << n << ") from " << r->length << ": " << s;
    r->length = new_len;
    r->frontier = std::min(r->frontier, new_len);
    r->swa_end_page = std::min(r->swa_end_page, CeilDiv(new_len, ps_));
    r->tokens.resize(std::max(r->prompt_len, new_len));
  }

  void FinishRequest() {
    last_op_ = "finish";
    Request* r = PickRequest();
    if (r == nullptr) return;
    const int complete = r->length / ps_;
    int k = complete;
    if (Chance(25)) k = std::min(complete, r->prompt_len / ps_);
    if (Chance(5)) k = Rand(complete + 1);
    const Hashes h = H(r->tokens, k * ps_);
    ModelTrim(*r);  // Finish trims first
    const std::vector<PageId> full(r->seq->full_pages().begin(), r->seq->full_pages().end());
    const std::vector<PageId> swa(r->seq->swa_pages().begin(), r->seq->swa_pages().end());
    for (int p = std::max(0, r->hit_pages); p < k; ++p) {
      inserted_[h[p]] =
          ModelPage{full[p], p >= r->swa_first || r->Keeps(p) ? swa[p] : kNoPage};
      if (p < r->swa_first && r->checkpoint > 0 && r->Keeps(p) &&
          !(p >= r->keep_begin && p < r->keep_end)) {
        ++coverage().checkpoint_pages_inserted;
      }
    }
    if (r->restoring) {
      // The restored window heals the hit's tombstones.
      // The stretch before it is freed, never inserted.
      for (int p = 0; p < std::min(k, r->hit_pages); ++p) {
        // (Or, once the kept window was given up, its pages still in the
        // current window: exact all the same.)
        const bool exact = r->Keeps(p) || (p >= r->swa_first && p >= r->restore_exact);
        if (exact && swa[p] != kNoPage) inserted_[h[p]] = ModelPage{full[p], swa[p]};
      }
    }
    r->seq->Finish(h);
    ++coverage().finishes;
    ASSERT_TRUE(r->seq->finished());
    ApplyEvents();
    if (::testing::Test::HasFatalFailure()) return;
    // Every private page is now either the cache's (as the model says) or free.
    for (int p = 0; r->restoring && p < r->hit_pages; ++p) {
      if (swa[p] == kNoPage) continue;
      if (p < r->swa_shared_end) {
        // The hit's window at L: the cache's before and after.
        ASSERT_EQ(pools_->swa().state(swa[p]), PageState::kCached) << "shared SWA page " << p;
        continue;
      }
      const bool swa_kept = p < k && model_.contains(h[p]) && model_.at(h[p]).swa == swa[p];
      ASSERT_EQ(pools_->swa().state(swa[p]), swa_kept ? PageState::kCached : PageState::kFree)
          << "restored SWA page " << p << " of a finished request";
    }
    for (int p = r->hit_pages; p < static_cast<int>(full.size()); ++p) {
      const bool kept = p < k && model_.contains(h[p]) && model_.at(h[p]).full == full[p];
      ASSERT_EQ(pools_->full().state(full[p]), kept ? PageState::kCached : PageState::kFree)
          << "full page " << p << " of a finished request";
      if (swa[p] == kNoPage) continue;
      const bool swa_kept = p < k && model_.contains(h[p]) && model_.at(h[p]).swa == swa[p];
      ASSERT_EQ(pools_->swa().state(swa[p]), swa_kept ? PageState::kCached : PageState::kFree)
          << "SWA page " << p << " of a finished request";
    }
    finished_.push_back(Tokens(r->tokens.begin(), r->tokens.begin() + r->length));
    if (finished_.size() > 8) finished_.erase(finished_.begin());
    requests_.erase(requests_.begin() + (r - requests_.data()));
  }

  void AbortRequest() {
    last_op_ = "abort";
    Request* r = PickRequest();
    if (r == nullptr) return;
    ++coverage().aborts;
    if (Chance(50)) {
      r->seq->Abort();
    } else {
      last_op_ = "destroy";
      r->seq.reset();
    }
    requests_.erase(requests_.begin() + (r - requests_.data()));
    ApplyEvents();
  }

  void EvictOp() {
    last_op_ = "evict";
    const int64_t ef = cache_->EvictableFullPages();
    const int64_t es = cache_->EvictableSwaPages();
    const int64_t f = Chance(50) ? Rand(12) : 0;
    const int64_t s = Chance(50) ? Rand(12) : 0;
    const std::string before = cache_->DebugString();
    EvictResult res = cache_->Evict(f, s);
    int64_t fr = 0, sr = 0;
    ApplyEvents(&fr, &sr);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(res.full_pages_freed, fr) << "EvictResult disagrees with the events";
    ASSERT_EQ(res.swa_pages_freed, sr) << "EvictResult disagrees with the events";
    ASSERT_GE(res.full_pages_freed, std::min(f, ef)) << "Evict(" << f << ", " << s << ")";
    ASSERT_GE(res.swa_pages_freed, std::min(s, es))
        << "Evict(" << f << ", " << s << ") with EvictableFullPages()=" << ef
        << " EvictableSwaPages()=" << es << "; cache before:\n"
        << before << "after:\n" << cache_->DebugString();
    ASSERT_LE(res.full_pages_freed, ef);
    ASSERT_LE(res.swa_pages_freed, es);
    if (keep_tombstones_ && f == 0) {
      // Restorable tombstones: SWA eviction never takes full KV with it.
      ASSERT_EQ(fr, 0) << "SWA eviction removed full KV";
      if (sr > 0) ++coverage().tombstone_leaves;
    }
  }

  void MatchOp() {
    last_op_ = "match";
    const Tokens p = RandomPrompt();
    const Hashes h = H(p, static_cast<int>(p.size()));
    MatchLengths m = cache_->Match(h);
    ASSERT_TRUE(events_.empty());
    const Lens want = ModelMatch(h, INT32_MAX);
    ASSERT_EQ(m.matched_tokens, want.matched);
    ASSERT_EQ(m.safe_tokens, want.safe);
    ASSERT_EQ(m.lower_tier_tokens, want.lower);
  }

  // Raw hits (lock, release, insert without a sequence) and the checks of
  // the whole state against the model (kv_property_harness.cc).
  void RawLock();
  void RawRelease();
  void RawInsert();
  void CheckAll();
  void Drain();

  std::mt19937_64 rng_;
  bool keep_tombstones_ = false;
  bool cold_superseded_ = false;
  bool yield_ = false;
  int checkpoint_ = 0;
  int window_ = 8;
  int ps_ = 4;
  int step_ = 0;
  const char* last_op_ = "";
  std::unique_ptr<KvPools> pools_;
  std::unique_ptr<KvPools> l2_;  // may be null
  std::unique_ptr<PrefixCache> cache_;
  std::vector<CacheEvent> events_;
  // Page hash -> (depth, parent hash) of every cached page, from the events.
  absl::flat_hash_map<uint64_t, std::pair<int, uint64_t>> path_;
  int anchor_page_ = 0;
  absl::flat_hash_map<uint64_t, ModelPage> inserted_;
  absl::flat_hash_map<uint64_t, ModelPage> model_;
  std::vector<Tokens> prefixes_;
  std::vector<Tokens> finished_;
  std::vector<Request> requests_;
  std::vector<RawHit> raw_hits_;
  std::vector<PendingLoadBack> pending_;  // asynchronous load-backs not finished
  int64_t lookups_ = 0, hit_tokens_ = 0, window_lost_ = 0;
  int64_t total_stored_ = 0, total_healed_ = 0;
  int64_t total_full_removed_ = 0, total_swa_removed_ = 0;
};

}  // namespace swaserve::kv::property_testing
