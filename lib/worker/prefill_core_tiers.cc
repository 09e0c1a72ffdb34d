// PrefillCore and the KV tiers: the L2 -> L1 load-back before a
// match (inline, or on the copier thread when large) and the L3 prefetch of
// parked requests. Runs on the loop thread; see prefill_core.h.
#include <algorithm>
#include <string>
#include <vector>

#include "lib/base/clock.h"
#include "lib/worker/prefill_core_impl.h"

namespace swaserve::worker {

void PrefillCore::Impl::LoadBack(const Req& r, int max_tokens) {
  kv::PendingLoadBack p =
      options.cache->BeginLoadBack(r.hashes, max_tokens, options.load_back_min_tokens);
  if (p.empty()) return;
  if (copier == nullptr || p.result.bytes < options.async_load_back_min_bytes) {
    p.result.seconds = p.RunCopies();
    options.cache->FinishLoadBack(p);
    sync_load_backs.fetch_add(1, std::memory_order_relaxed);
    if (m.load_back_sync != nullptr) m.load_back_sync->Increment();
    return;
  }
  ++pending_copies;
  async_load_backs.fetch_add(1, std::memory_order_relaxed);
  if (m.load_back_async != nullptr) m.load_back_async->Increment();
  copier->Submit(std::move(p));
}

void PrefillCore::Impl::FinishCopied(std::vector<kv::PendingLoadBack>& done) {
  for (kv::PendingLoadBack& p : done) {
    options.cache->FinishLoadBack(p);
    --pending_copies;
  }
  if (!done.empty()) sched_blocked = false;  // waiting requests may start now
  done.clear();
}


bool PrefillCore::Impl::MaybePark(std::unique_ptr<Req>& r) {
  if (prefetcher == nullptr) return false;
  const int ps = options.pools->shape().page_size;
  const int n = static_cast<int>(r->job.prompt.size());
  const int K = options.engine->config().num_mtp_layers;
  const int limit = (n - std::max(1, K)) / ps;  // pages a hit may cover
  if (limit <= 0) return false;
  const kv::MatchLengths ml = options.cache->Match(r->hashes, limit * ps);
  const int safe = ml.safe_tokens / ps;
  const int tree = (ml.matched_tokens + ml.lower_tier_tokens) / ps;
  if ((limit - std::max(safe, tree)) * ps < options.l3_prefetch_min_tokens &&
      (tree - safe) * ps < options.l3_prefetch_min_tokens) {
    return false;  // too little to gain
  }
  prefetcher->Submit(r->job.id,
                     std::vector<uint64_t>(r->hashes.begin(), r->hashes.begin() + limit), tree,
                     safe);
  const int64_t stake = static_cast<int64_t>(limit - safe) * ps;  // what the fetch may save
  r->prefetch_deadline_ns =
      base::MonotonicNanos() +
      absl::ToInt64Nanoseconds(L3PrefetchWait(options, stake, MeasuredRate()));
  const std::string id = r->job.id;
  parked.emplace(id, std::move(r));
  return true;
}

void PrefillCore::Impl::OnFetched(Fetched& f) {
  const int attached = options.cache->AttachFromL3(f.hashes, f.fetch);
  l3_attached.fetch_add(attached, std::memory_order_relaxed);
  if (m.prefetch_bytes != nullptr) {
    m.prefetch_bytes->Increment(static_cast<double>(f.fetch.read_bytes));
    m.prefetch_seconds->Observe(f.fetch.seconds);
  }
  auto it = parked.find(f.id);
  if (it == parked.end()) {
    if (m.prefetch_late != nullptr) m.prefetch_late->Increment();
    prefetcher->Recycle(std::move(f.fetch));
    return;
  }
  // A fetch that healed the window of the tree's own match attaches no
  // pages but is a hit all the same: the match now ends window-safe.
  const bool useful = attached > 0 || (!f.fetch.empty() && f.fetch.swa_pages() > 0 &&
                                       f.fetch.full_pages() == 0);
  if (f.fetch.empty()) {
    prefetch_misses.fetch_add(1, std::memory_order_relaxed);
    if (m.prefetch_miss != nullptr) m.prefetch_miss->Increment();
  } else if (useful) {
    prefetch_hits.fetch_add(1, std::memory_order_relaxed);
    if (m.prefetch_hit != nullptr) m.prefetch_hit->Increment();
  } else {
    prefetch_unused.fetch_add(1, std::memory_order_relaxed);
    if (m.prefetch_unused != nullptr) m.prefetch_unused->Increment();
  }
  prefetcher->Recycle(std::move(f.fetch));  // its bytes are in L2 now
  std::unique_ptr<Req> r = std::move(it->second);
  parked.erase(it);
  r->l3_attached_tokens = attached * options.pools->shape().page_size;
  Admit(std::move(r));
}

int64_t PrefillCore::Impl::ExpireParked(int64_t now_ns) {
  int64_t next = INT64_MAX;
  std::vector<std::string> due;
  for (const auto& [id, r] : parked) {
    if (r->prefetch_deadline_ns <= now_ns) {
      due.push_back(id);
    } else {
      next = std::min(next, r->prefetch_deadline_ns);
    }
  }
  std::sort(due.begin(), due.end());  // deterministic order
  for (const std::string& id : due) {
    auto it = parked.find(id);
    std::unique_ptr<Req> r = std::move(it->second);
    parked.erase(it);
    prefetch_timeouts.fetch_add(1, std::memory_order_relaxed);
    if (m.prefetch_timeout != nullptr) m.prefetch_timeout->Increment();
    Admit(std::move(r));
  }
  return next;
}

void PrefillCore::Impl::FailParked(const std::string& id, absl::Status status) {
  auto it = parked.find(id);
  if (it == parked.end()) return;
  prefetcher->Cancel(id);
  std::unique_ptr<Req> r = std::move(it->second);
  parked.erase(it);
  Req* raw = r.get();
  reqs.emplace(id, std::move(r));
  Complete(raw, status);
}


void PrefillCore::Impl::EndAllHeld(const absl::Status& status, absl::Duration l3_flush_timeout) {
  held_deadline_ns = base::MonotonicNanos() + absl::ToInt64Nanoseconds(l3_flush_timeout);
  hold_dones = true;
  while (!parked.empty()) FailParked(parked.begin()->first, status);
  std::vector<Req*> ending;
  for (const auto& [id, r] : reqs) {
    if (!r->shipping) ending.push_back(r.get());
  }
  for (Req* r : ending) {
    sched->Cancel(r->job.id);
    Complete(r, status);  // keeps what it computed, written through to L3
  }
  hold_dones = false;
  end_pending = true;
  SWA_LOG(info, "prefill: ended {} request(s) for the drain; their answers wait for the L3 "
          "writes (at most {})", held_dones.size(), absl::FormatDuration(l3_flush_timeout));
  RunHeldDones(/*force=*/false);
}

void PrefillCore::Impl::RunHeldDones(bool force) {
  if (!end_pending) return;
  if (!held_dones.empty()) {
    const bool stored =
        options.cache == nullptr ||
        (!options.cache->l3_writes_pending() && (options.l3 == nullptr || options.l3->queued_bytes() == 0));
    if (!force && !stored && base::MonotonicNanos() < held_deadline_ns) return;
    if (!stored) SWA_LOG(warn, "prefill: drain: answering before every L3 write was stored");
    auto dones = std::move(held_dones);
    held_dones.clear();
    for (auto& [done, status] : dones) done(status);
  }
  end_pending = false;
  absl::MutexLock lock(&mu);
  drain_end.done = true;
  cv.SignalAll();
}

absl::Duration L3PrefetchWait(const PrefillCoreOptions& options, int64_t stake_tokens,
                              double measured_tokens_per_second) {
  const double rate = measured_tokens_per_second > 0 ? measured_tokens_per_second
                                                     : options.l3_prefetch_assumed_tokens_per_second;
  const absl::Duration floor = absl::Milliseconds(options.l3_prefetch_max_wait_ms);
  if (!(rate > 0) || !(options.l3_prefetch_wait_fraction > 0) || stake_tokens <= 0) return floor;
  return std::max(floor, absl::Seconds(options.l3_prefetch_wait_fraction *
                                       static_cast<double>(stake_tokens) / rate));
}

}  // namespace swaserve::worker
