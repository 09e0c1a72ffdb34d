// Harness (kv_property_harness.h): raw-hit operations and the checks of the
// whole state against the model.
#include "tests/unit/kv/kv_property_harness.h"

namespace swaserve::kv::property_testing {

void Harness::RawLock() {
  last_op_ = "lock";
  if (raw_hits_.size() >= 4) return RawRelease();
  const Tokens p = Chance(50) && !finished_.empty()
                       ? finished_[Rand(static_cast<int>(finished_.size()))]
                       : RandomPrompt();
  const Hashes h = H(p, static_cast<int>(p.size()));
  const int cap = Chance(70) ? INT32_MAX : Rand(static_cast<int>(p.size()) + 1);
  CacheHit hit = cache_->MatchAndLock(h, cap);
  ApplyEvents();
  ASSERT_NO_FATAL_FAILURE(CheckHit(hit, h, cap));
  if (!hit.locked()) return;
  RawHit raw;
  raw.hashes = h;
  raw.hit = std::move(hit);
  raw_hits_.push_back(std::move(raw));
}

void Harness::RawRelease() {
  last_op_ = "release";
  if (raw_hits_.empty()) return;
  const int i = Rand(static_cast<int>(raw_hits_.size()));
  if (!raw_hits_[i].released && Chance(60)) {
    last_op_ = "release swa";
    cache_->ReleaseSwa(raw_hits_[i].hit);
    ASSERT_FALSE(raw_hits_[i].hit.swa_locked());
    raw_hits_[i].released = true;
  } else {
    last_op_ = "unlock";
    cache_->Unlock(raw_hits_[i].hit);
    ASSERT_FALSE(raw_hits_[i].hit.locked());
    raw_hits_.erase(raw_hits_.begin() + i);
  }
  ApplyEvents();
}

void Harness::RawInsert() {
  last_op_ = "insert";
  const Tokens p = RandomPrompt();
  const Hashes h = H(p, static_cast<int>(p.size()));
  const int n = static_cast<int>(h.size());
  if (n == 0) return;
  int live_from;
  if (Chance(70)) {
    live_from = std::max(0, n - CeilDiv(window_ - 1, ps_) - Rand(3));
  } else {
    live_from = Rand(n + 1);
  }
  if (!pools_->CanReserve(n, n - live_from)) return;
  absl::StatusOr<Reservation> res = pools_->Reserve(n, n - live_from);
  ASSERT_TRUE(res.ok());
  std::vector<PageId> full = res->full;
  std::vector<PageId> swa(live_from, kNoPage);
  swa.insert(swa.end(), res->swa.begin(), res->swa.end());
  if (Chance(30)) {
    // Several live runs (a divergence window before the trailing one):
    // punch holes into the live part and move pages before it; the
    // pages taken out go back to the pool.
    std::vector<PageId> spare;
    for (int i = live_from; i < n - 1; ++i) {
      if (Chance(30)) {
        spare.push_back(swa[i]);
        swa[i] = kNoPage;
      }
    }
    for (int i = 0; i < live_from && !spare.empty(); ++i) {
      if (Chance(30)) {
        swa[i] = spare.back();
        spare.pop_back();
      }
    }
    pools_->Commit(*res);
    if (!spare.empty()) pools_->swa().Free(spare);
    ++coverage().multi_run_inserts;
  } else {
    pools_->Commit(*res);
  }
  for (int i = 0; i < n; ++i) inserted_[h[i]] = ModelPage{full[i], swa[i]};
  cache_->Insert(h, full, swa);
  ApplyEvents();
  if (::testing::Test::HasFatalFailure()) return;
  // Each handed-over page was adopted (the model says whose) or freed.
  for (int i = 0; i < n; ++i) {
    auto it = model_.find(h[i]);
    const bool kept = it != model_.end() && it->second.full == full[i];
    ASSERT_EQ(pools_->full().state(full[i]), kept ? PageState::kCached : PageState::kFree);
    if (swa[i] == kNoPage) continue;
    const bool swa_kept = it != model_.end() && it->second.swa == swa[i];
    ASSERT_EQ(pools_->swa().state(swa[i]), swa_kept ? PageState::kCached : PageState::kFree);
  }
}

// --- checks after every step --------------------------------------------

void Harness::CheckAll() {
  absl::Status st = cache_->CheckInvariants();
  ASSERT_TRUE(st.ok()) << st << "\n" << cache_->DebugString();

  ASSERT_TRUE(events_.empty());
  // Model vs cache.
  int64_t full_in[2] = {0, 0}, swa_in[2] = {0, 0};
  for (const auto& [h, page] : model_) {
    ++full_in[page.tier];
    swa_in[page.tier] += page.swa != kNoPage;
    const KvPools& pools = page.tier == 0 ? *pools_ : *l2_;
    if (page.full != kUnknown) {
      ASSERT_EQ(pools.full().state(page.full), PageState::kCached);
    }
    if (page.swa != kNoPage && page.swa != kUnknown) {
      ASSERT_EQ(pools.swa().state(page.swa), PageState::kCached);
    }
  }
  ASSERT_EQ(full_in[0], cache_->cached_full_pages());
  ASSERT_EQ(swa_in[0], cache_->cached_swa_pages());
  ASSERT_EQ(full_in[1], cache_->l2_full_pages());
  ASSERT_EQ(swa_in[1], cache_->l2_swa_pages());
  ASSERT_EQ(pools_->full().num_cached(), cache_->cached_full_pages());
  ASSERT_EQ(pools_->swa().num_cached(), cache_->cached_swa_pages());
  // Sequences vs their models; private pages are exclusive.
  int64_t in_use_full = 0, in_use_swa = 0;
  absl::flat_hash_set<PageId> private_full, private_swa;
  for (const Request& r : requests_) {
    const Sequence& s = *r.seq;
    const int pages = CeilDiv(r.length, ps_);
    ASSERT_EQ(s.length(), r.length);
    ASSERT_EQ(static_cast<int>(s.full_pages().size()), pages);
    ASSERT_EQ(static_cast<int>(s.swa_pages().size()), pages);
    ASSERT_EQ(s.swa_first_page(), r.swa_first) << "length " << r.length;
    for (int p = 0; p < pages; ++p) {
      const PageId f = s.full_pages()[p];
      if (p < r.hit_pages) {
        ASSERT_EQ(f, r.hit_full[p]);
        ASSERT_EQ(pools_->full().state(f), PageState::kCached) << "locked page evicted";
        ASSERT_TRUE(model_.contains(r.hit_hashes[p])) << "locked page removed";
        ASSERT_EQ(model_.at(r.hit_hashes[p]).tier, 0) << "locked page left L1";
        ASSERT_EQ(model_.at(r.hit_hashes[p]).full, f);
      } else {
        ASSERT_EQ(pools_->full().state(f), PageState::kInUse);
        ASSERT_TRUE(private_full.insert(f).second) << "full page " << f << " owned twice";
        ++in_use_full;
      }
      const PageId w = s.swa_page(p);
      if (p < r.swa_first && !r.Keeps(p)) {
        ASSERT_EQ(w, kNoPage) << "SWA page " << p << " kept below the window";
        continue;
      }
      if (p >= r.swa_end_page) {
        ASSERT_EQ(w, kNoPage) << "SWA page " << p << " allocated ahead of the restore";
        continue;
      }
      ASSERT_TRUE(pools_->swa().Valid(w))
          << "SWA page " << p << " missing (length " << r.length << ", SWA from page "
          << r.swa_first << ", hit pages " << r.hit_pages << ", restoring " << r.restoring
          << ", frontier " << r.frontier << ", checkpoint " << r.checkpoint << " from token "
          << r.checkpoint_floor << ", kept [" << r.keep_begin << ", " << r.keep_end
          << "), dropped " << r.dropped << ")";
      if (p < r.swa_shared_end) {
        ASSERT_EQ(pools_->swa().state(w), PageState::kCached) << "locked SWA page evicted";
        ASSERT_EQ(model_.at(r.hit_hashes[p]).swa, w);
      } else {
        ASSERT_EQ(pools_->swa().state(w), PageState::kInUse);
        ASSERT_TRUE(private_swa.insert(w).second) << "SWA page " << w << " owned twice";
        ++in_use_swa;
      }
    }
  }
  for (const RawHit& raw : raw_hits_) {
    const CacheHit& hit = raw.hit;
    for (size_t p = 0; p < hit.full_pages().size(); ++p) {
      ASSERT_EQ(pools_->full().state(hit.full_pages()[p]), PageState::kCached);
      ASSERT_TRUE(model_.contains(raw.hashes[p])) << "locked page removed";
      ASSERT_EQ(model_.at(raw.hashes[p]).full, hit.full_pages()[p]);
    }
    if (raw.released) continue;
    for (size_t j = 0; j < hit.swa_pages().size(); ++j) {
      ASSERT_EQ(pools_->swa().state(hit.swa_pages()[j]), PageState::kCached)
          << "SWA-locked page evicted";
      ASSERT_EQ(model_.at(raw.hashes[hit.swa_first_page() + j]).swa, hit.swa_pages()[j]);
    }
  }
  for (PagePool* pool : {&pools_->full(), &pools_->swa()}) {
    ASSERT_EQ(pool->num_reserved(), 0);
    ASSERT_EQ(pool->num_free() + pool->num_reserved() + pool->num_in_use() +
                  pool->num_cached(),
              pool->num_pages());
  }
  ASSERT_EQ(pools_->full().num_in_use(), in_use_full);
  ASSERT_EQ(pools_->swa().num_in_use(), in_use_swa);
}

void Harness::Drain() {
  last_op_ = "drain";
  while (!pending_.empty()) FinishLoadBackOp();
  requests_.clear();
  for (RawHit& h : raw_hits_) cache_->Unlock(h.hit);
  raw_hits_.clear();
  ApplyEvents();  // unlocking may delete nodes kept only for their lock
  ASSERT_NO_FATAL_FAILURE(CheckAll());
  ASSERT_EQ(cache_->EvictableFullPages(), cache_->cached_full_pages());
  ASSERT_EQ(cache_->EvictableSwaPages(), cache_->cached_swa_pages());
  EvictResult r = cache_->Evict(INT64_MAX / 4, INT64_MAX / 4);
  ApplyEvents();
  ASSERT_NO_FATAL_FAILURE(CheckAll());
  ASSERT_EQ(cache_->cached_full_pages(), 0);  // all deleted or in L2
  cache_->Clear();
  ApplyEvents();
  ASSERT_NO_FATAL_FAILURE(CheckAll());
  ASSERT_TRUE(model_.empty());
  ASSERT_EQ(cache_->cached_full_pages(), 0);
  ASSERT_EQ(pools_->full().num_free(), pools_->full().num_pages());
  ASSERT_EQ(pools_->swa().num_free(), pools_->swa().num_pages());
  (void)r;
  const PrefixCacheStats& st = cache_->stats();
  ASSERT_EQ(st.lookups.load(), lookups_);
  ASSERT_EQ(st.hit_tokens.load(), hit_tokens_);
  ASSERT_EQ(st.window_lost_tokens.load(), window_lost_);
  ASSERT_EQ(st.inserted_pages.load(), total_stored_);
  ASSERT_EQ(st.healed_pages.load(), total_healed_);
  ASSERT_EQ(st.evicted_full_pages.load(), total_full_removed_);
  ASSERT_EQ(st.evicted_swa_pages.load(), total_swa_removed_);
  ASSERT_EQ(st.tombstone_nodes.load(), 0);
  if (!cold_superseded_) ASSERT_EQ(st.cooled_swa_pages.load(), 0);
  coverage().cooled += st.cooled_swa_pages.load();
}
}  // namespace swaserve::kv::property_testing
