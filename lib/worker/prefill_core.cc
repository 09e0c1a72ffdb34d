#include "lib/worker/prefill_core.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/clock.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/kv/load_back_copier.h"
#include "lib/metrics/buckets.h"

namespace swaserve::worker {

namespace {

struct Req {
  PrefillJob job;
  std::vector<uint64_t> hashes;
  std::unique_ptr<kv::Sequence> seq;
  std::unique_ptr<model::Sampler> sampler;
  PrefillResult result;
  int64_t arrival_ns = 0;
  int64_t start_ns = 0;
  int64_t prefetch_deadline_ns = 0;  // parked for an L3 prefetch until then
  // Hits per tier: where the prompt's match stood when it was matched, in
  // tokens: full KV in L1 up to l1_end, then L2 up to l2_end (pages that
  // were there before this request's L3 prefetch), then pages attached from
  // L3 (l3_attached_tokens of them).
  int l3_attached_tokens = 0;
  int l1_end = INT32_MAX;
  int l2_end = INT32_MAX;
  int64_t ship_start_ns = 0;
  // Full pages this request still has to allocate (counted against memory
  // from its start until its last chunk).
  int64_t pending_full_pages = 0;
  bool started = false;
  // Every prompt token's KV is computed (the last chunk ran): the pages go
  // into the prefix cache even when shipping then fails or is cancelled,
  // so the router's retry is a prefix hit.
  bool computed = false;
  bool shipping = false;
  bool cancelled = false;  // while shipping
  // MTP over the prompt: per MTP layer k, the rows (layer k-1's output, or
  // the main model's hidden state for k = 0) of consecutive positions from
  // mtp_next[k] on whose MTP-k step waits for the token at p + 1 + k.
  std::vector<std::vector<float>> mtp_rows;
  std::vector<int> mtp_next;
};

struct Metrics {
  metrics::Counter* prompt_tokens = nullptr;
  metrics::Counter* cached_tokens = nullptr;
  metrics::Counter* computed_tokens = nullptr;
  metrics::Counter* ok = nullptr;
  metrics::Counter* failed = nullptr;
  metrics::Counter* cancelled = nullptr;
  metrics::Counter* restores = nullptr;
  metrics::Counter* restored_tokens = nullptr;
  metrics::Counter* restore_saved_tokens = nullptr;
  metrics::Histogram* step_seconds = nullptr;
  metrics::Histogram* step_tokens = nullptr;
  metrics::Histogram* ttft_seconds = nullptr;
  metrics::Gauge* running = nullptr;
  metrics::Counter* prefetch_hit = nullptr;
  metrics::Counter* prefetch_miss = nullptr;
  metrics::Counter* prefetch_unused = nullptr;
  metrics::Counter* prefetch_timeout = nullptr;
  metrics::Counter* prefetch_late = nullptr;
  metrics::Counter* prefetch_bytes = nullptr;
  metrics::Histogram* prefetch_seconds = nullptr;
  metrics::Counter* load_back_async = nullptr;
  metrics::Counter* load_back_sync = nullptr;
  metrics::Counter* tier_tokens[3] = {nullptr, nullptr, nullptr};

  absl::Status InitPrefetch(metrics::Registry* r) {
    ASSIGN_OR_RETURN(auto* lb, r->AddCounter("swaserve_prefill_load_backs_total",
                                             "L2 -> L1 load-backs of prompts' matches, by how "
                                             "their copies ran: async (on the copier thread, "
                                             "overlapped with compute) or sync (inline: small).",
                                             {"mode"}));
    load_back_async = &lb->WithLabels({"async"});
    load_back_sync = &lb->WithLabels({"sync"});
    ASSIGN_OR_RETURN(auto* tt, r->AddCounter("swaserve_prefill_cached_tokens_by_tier_total",
                                             "Prompt tokens of completed prefills served from "
                                             "the prefix cache, by the tier they were in when "
                                             "the request arrived: l1; l2 (loaded back from "
                                             "host memory); l3 (read from the L3 store, then "
                                             "loaded back).",
                                             {"tier"}));
    for (int t = 0; t < 3; ++t) tier_tokens[t] = &tt->WithLabels({absl::StrCat("l", t + 1)});
    ASSIGN_OR_RETURN(auto* pf, r->AddCounter("swaserve_prefill_l3_prefetch_total",
                                             "L3 prefetches of parked requests by outcome: hit "
                                             "(pages attached or a window healed), miss (L3 held "
                                             "nothing), unused (read but not attachable), "
                                             "timeout (the request stopped waiting), late (landed "
                                             "after that; attached all the same).",
                                             {"result"}));
    prefetch_hit = &pf->WithLabels({"hit"});
    prefetch_miss = &pf->WithLabels({"miss"});
    prefetch_unused = &pf->WithLabels({"unused"});
    prefetch_timeout = &pf->WithLabels({"timeout"});
    prefetch_late = &pf->WithLabels({"late"});
    ASSIGN_OR_RETURN(auto* pb, r->AddCounter("swaserve_prefill_l3_prefetch_bytes_total",
                                             "Page bytes read from L3 by prefetches."));
    prefetch_bytes = &pb->WithLabels();
    ASSIGN_OR_RETURN(auto* ps, r->AddHistogram("swaserve_prefill_l3_prefetch_seconds",
                                               "Time of one L3 prefetch (probe + read).", {},
                                               *metrics::ExponentialBuckets(1e-5, 2, 22)));
    prefetch_seconds = &ps->WithLabels();
    return absl::OkStatus();
  }

  absl::Status Init(metrics::Registry* r) {
    if (r == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(InitPrefetch(r));
    ASSIGN_OR_RETURN(auto* tok, r->AddCounter("swaserve_prefill_tokens_total",
                                              "Prompt tokens of completed prefills, by source "
                                              "(cached: prefix cache; computed: forward).",
                                              {"source"}));
    cached_tokens = &tok->WithLabels({"cached"});
    computed_tokens = &tok->WithLabels({"computed"});
    ASSIGN_OR_RETURN(auto* pr, r->AddCounter("swaserve_prefill_prompt_tokens_total",
                                             "Prompt tokens of completed prefills."));
    prompt_tokens = &pr->WithLabels();
    ASSIGN_OR_RETURN(auto* req, r->AddCounter("swaserve_prefill_requests_total",
                                              "Prefill requests that ended, by result.",
                                              {"result"}));
    ok = &req->WithLabels({"ok"});
    failed = &req->WithLabels({"error"});
    cancelled = &req->WithLabels({"cancelled"});
    ASSIGN_OR_RETURN(auto* wr, r->AddCounter("swaserve_prefill_window_restore_requests_total",
                                             "Prefills whose prefix hit restored the SWA window "
                                             "of a full-KV match (window restore), counted when "
                                             "the prompt was computed."));
    restores = &wr->WithLabels();
    ASSIGN_OR_RETURN(auto* wt, r->AddCounter("swaserve_prefill_window_restore_tokens_total",
                                             "Tokens recomputed by window restores (the "
                                             "stretch before the full-KV match end)."));
    restored_tokens = &wt->WithLabels();
    ASSIGN_OR_RETURN(auto* ws, r->AddCounter("swaserve_prefill_window_restore_saved_tokens_total",
                                             "Recompute tokens window restores saved against "
                                             "computing from the window-safe hit."));
    restore_saved_tokens = &ws->WithLabels();
    ASSIGN_OR_RETURN(auto* ss, r->AddHistogram("swaserve_prefill_step_seconds",
                                               "Wall time of one prefill step: the forward "
                                               "pass, first-token sampling and the MTP layers "
                                               "over the prompt.", {},
                                               *metrics::ExponentialBuckets(1e-4, 2, 20)));
    step_seconds = &ss->WithLabels();
    ASSIGN_OR_RETURN(auto* st, r->AddHistogram("swaserve_prefill_step_tokens",
                                               "Tokens computed in one prefill step.", {},
                                               *metrics::ExponentialBuckets(1, 2, 16)));
    step_tokens = &st->WithLabels();
    ASSIGN_OR_RETURN(auto* tt, r->AddHistogram("swaserve_prefill_ttft_seconds",
                                               "Arrival to first token at the prefill "
                                               "worker (queue + compute).",
                                               {}, metrics::DefaultLatencyBuckets()));
    ttft_seconds = &tt->WithLabels();
    ASSIGN_OR_RETURN(auto* run, r->AddGauge("swaserve_prefill_running_requests",
                                            "Requests computing or shipping their KV."));
    running = &run->WithLabels();
    return absl::OkStatus();
  }
};

}  // namespace

struct PrefillCore::Impl {
  PrefillCoreOptions options;
  Metrics m;
  std::unique_ptr<sched::PrefillScheduler> sched;

  mutable absl::Mutex mu;
  absl::CondVar cv;
  std::deque<std::unique_ptr<Req>> incoming ABSL_GUARDED_BY(mu);
  std::vector<std::string> cancels ABSL_GUARDED_BY(mu);
  std::vector<std::pair<std::string, absl::Status>> shipped ABSL_GUARDED_BY(mu);
  struct Fetched {
    std::string id;
    std::vector<uint64_t> hashes;
    kv::L3Fetch fetch;
  };
  std::vector<Fetched> fetched ABSL_GUARDED_BY(mu);
  // Asynchronous load-backs whose copies ran (the copier's thread hands
  // them here; the loop finishes them).
  std::vector<kv::PendingLoadBack> copied ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<std::string> ids ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  PrefillLoad load ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> completed{0}, computed_total{0}, cached_total{0};
  std::atomic<int64_t> restores_total{0}, restored_total{0}, restore_saved_total{0};
  std::atomic<int64_t> prefetch_hits{0}, prefetch_misses{0}, prefetch_unused{0};
  std::atomic<int64_t> prefetch_timeouts{0}, l3_attached{0};
  std::unique_ptr<kv::L3Prefetcher> prefetcher;  // null: no L3 prefetch
  std::atomic<int64_t> async_load_backs{0}, sync_load_backs{0};
  std::atomic<int64_t> tier_tokens_total[3] = {0, 0, 0};
  std::unique_ptr<kv::LoadBackCopier> copier;  // null: no L2
  std::thread thread;

  // Loop-owned.
  absl::flat_hash_map<std::string, std::unique_ptr<Req>> reqs;
  // Requests waiting for their L3 prefetch (not matched, not in reqs yet).
  absl::flat_hash_map<std::string, std::unique_ptr<Req>> parked;
  int64_t committed_full_pages = 0;  // sum of pending_full_pages of started
  int pending_copies = 0;  // load-backs submitted to the copier, not finished
  std::atomic<int64_t> released_hits{0};  // ReleaseQueuedHits requeues
  // The last NextStep was empty although requests were queued (memory): wait
  // for an event (a ship completing, a cancel, a new request) before retrying.
  bool sched_blocked = false;
  model::ForwardOutput out;
  std::vector<model::ForwardItem> items;
  std::vector<Req*> item_reqs;
  std::vector<bool> item_last;

  void Loop();
  // Runs the MTP layers over every prompt position whose inputs are known
  // (tokens up to `known`, exclusive; `extra` is the token at index
  // prompt.size() once sampled) after `hidden` rows for positions
  // [first, first + rows) of the main model were computed.
  absl::Status RunMtp(Req& r, const float* hidden, int first, int rows, int known,
                      uint32_t extra);
  std::vector<uint32_t> mtp_tokens;
  model::ForwardOutput mtp_out;
  void Accept(std::unique_ptr<Req> r);
  // Accept's second half: match, then queue in the scheduler.
  void Admit(std::unique_ptr<Req> r);
  // L3: parks r while its pages are prefetched, when worth it.
  bool MaybePark(std::unique_ptr<Req>& r);
  void OnFetched(Fetched& f);
  // Unparks requests whose prefetch wait is over; the earliest deadline of
  // those still parked (INT64_MAX: none).
  int64_t ExpireParked(int64_t now_ns);
  void FailParked(const std::string& id, absl::Status status);
  // The prefix hit for a new request: window-safe, or a full-KV hit with a
  // planned window restore when that saves work. Sets r.seq and the result's
  // cached/restored tokens.
  void MatchPrefix(Req& r);
  // Moves the L2 part of r's match into L1 (before matching): inline, or on
  // the copier when large (PrefillCoreOptions::async_load_back_min_bytes).
  void LoadBack(const Req& r, int max_tokens);
  void FinishCopied(std::vector<kv::PendingLoadBack>& done);
  // Admission deadlock breaker (see the header): when nothing runs and no
  // queued request can start, queued requests other than the oldest give
  // up their locked hits and are requeued as cold prompts. False when
  // there was nothing to release; the oldest is then failed if it cannot
  // start even so.
  bool ReleaseQueuedHits();
  bool AnyStarted() const {
    for (const auto& [id, r] : reqs) {
      if (r->started) return true;
    }
    return false;
  }
  bool CanStart(const sched::PrefillRequestInfo& info);
  // SWA pages a computing request may hold at once: its sliding window plus
  // the chunk being computed, plus one window kept for the cache (the
  // divergence or restored window), at most what it computes plus a window.
  int64_t SwaPeakPages(const Req& r) const;
  // Whether r's SWA peak fits beside what the requests already started may
  // still take (their peaks minus what they hold) in free + evictable SWA
  // pages. Always true when nothing is started (the request then has the
  // whole pool; one that cannot fit even so fails with ResourceExhausted).
  bool SwaFits(const Req& r) const;
  void RunStep(const sched::PrefillStep& step);
  void Complete(Req* r, absl::Status status);
  void PublishLoad();
  int64_t FullPagesFor(const Req& r) const {
    const int ps = options.pools->shape().page_size;
    return (static_cast<int64_t>(r.job.prompt.size()) + ps - 1) / ps - r.seq->full_pages().size();
  }
};

void PrefillCore::Impl::MatchPrefix(Req& r) {
  const int n = static_cast<int>(r.job.prompt.size());
  const kv::SequenceOptions so{.pools = options.pools,
                               .cache = options.cache,
                               .swa_slack = 0,
                               .evict_on_demand = true,
                               .swa_checkpoint_tokens = options.swa_checkpoint_tokens};
  r.result.restored_tokens = 0;
  r.result.restore_saved_tokens = 0;
  if (options.cache == nullptr) {
    r.seq = std::make_unique<kv::Sequence>(so);
    r.result.cached_tokens = 0;
    return;
  }
  // With MTP layers the hit leaves the last K prompt positions to compute:
  // decode's first draft step reads their main hidden states
  // (PrefillResult::tail_hidden) and the SWA KV K tokens before the window,
  // which a hit's locked window does not always cover otherwise.
  const model::ModelConfig& c = options.engine->config();
  const int K = c.num_mtp_layers;
  kv::MatchOptions mo{.max_tokens = n - std::max(1, K)};
  if (options.cache->has_l2()) {
    const kv::MatchLengths before = options.cache->Match(r.hashes, mo.max_tokens);
    r.l1_end = before.matched_tokens;
    r.l2_end = std::max(r.l1_end,
                        before.matched_tokens + before.lower_tier_tokens - r.l3_attached_tokens);
    LoadBack(r, mo.max_tokens);
  }
  sched::WindowRestoreChoice choice;
  if (options.window_restore_min_saved_work >= 0 && c.sliding_window > 1) {
    const kv::MatchLengths ml = options.cache->Match(r.hashes, mo.max_tokens);
    if (ml.matched_tokens > ml.safe_tokens) {
      choice = sched::ChooseWindowRestore(
          {.window_safe_tokens = ml.safe_tokens,
           .full_tokens = ml.matched_tokens,
           .restore_from = kv::WindowRestoreStart(ml.matched_tokens, c.sliding_window,
                                                  options.pools->shape().page_size,
                                                  c.num_swa_layers() + K),
           .context_cost_per_token = options.scheduler.context_cost_per_token,
           .min_saved_work = options.window_restore_min_saved_work});
      mo.full_kv = choice.restore;
    }
  }
  kv::CacheHit hit = options.cache->MatchAndLock(r.hashes, mo);
  const int safe = hit.window_safe_tokens();
  const bool restore = hit.needs_window_restore();
  r.seq = std::make_unique<kv::Sequence>(so, std::move(hit));
  if (restore) {
    absl::Status st = r.seq->BeginWindowRestore(choice.compute_from);
    if (!st.ok()) {
      // Cannot happen (the cache answered Match and MatchAndLock alike on
      // this thread); fall back to the window-safe hit rather than fail.
      SWA_LOG(err, "prefill: window restore not possible: {}", st.ToString());
      r.seq->Abort();
      r.seq = std::make_unique<kv::Sequence>(
          so, options.cache->MatchAndLock(r.hashes, mo.max_tokens));
    } else {
      r.result.restored_tokens = r.seq->cached_tokens() - choice.compute_from;
      r.result.restore_saved_tokens = choice.compute_from - safe;
    }
  }
  r.result.cached_tokens =
      r.seq->restore_from() >= 0 ? r.seq->restore_from() : r.seq->cached_tokens();
}

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

void PrefillCore::Impl::Accept(std::unique_ptr<Req> r) {
  const int ps = options.pools->shape().page_size;
  r->hashes = base::ChainedPageHashes(r->job.prompt, ps);
  if (MaybePark(r)) return;
  Admit(std::move(r));
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
  r->prefetch_deadline_ns = base::MonotonicNanos() + options.l3_prefetch_max_wait_ms * 1000000;
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

void PrefillCore::Impl::Admit(std::unique_ptr<Req> r) {
  const int n = static_cast<int>(r->job.prompt.size());
  MatchPrefix(*r);
  // Locking a hit makes its pages unevictable. Started requests count on
  // free + evictable pages for the rest of their prompts (committed): a
  // lock that would take pages from under them is not taken — the request
  // queues as a cold prompt instead (its chunks would otherwise fail with
  // ResourceExhausted mid-prompt).
  if (options.cache != nullptr && r->seq->cached_tokens() > 0 &&
      options.pools->full().num_free() + options.cache->EvictableFullPages() <
          committed_full_pages) {
    r->seq->Abort();
    r->seq = std::make_unique<kv::Sequence>(
        kv::SequenceOptions{options.pools, options.cache, 0, true}, kv::CacheHit());
    r->result.cached_tokens = 0;
    r->result.restored_tokens = 0;
    r->result.restore_saved_tokens = 0;
    ++released_hits;
  }
  r->result.prompt_tokens = n;
  r->result.computed_tokens = n - r->result.cached_tokens;
  absl::Status st = sched->Add({r->job.id, n, r->result.cached_tokens, r->arrival_ns});
  if (!st.ok()) {
    Req* raw = r.get();
    reqs.emplace(r->job.id, std::move(r));
    Complete(raw, st);
    return;
  }
  reqs.emplace(r->job.id, std::move(r));
}

bool PrefillCore::Impl::ReleaseQueuedHits() {
  Req* oldest = nullptr;
  for (const auto& [id, r] : reqs) {
    if (r->started) continue;
    if (oldest == nullptr || r->arrival_ns < oldest->arrival_ns ||
        (r->arrival_ns == oldest->arrival_ns && r->job.id < oldest->job.id)) {
      oldest = r.get();
    }
  }
  if (oldest == nullptr) return false;
  std::vector<Req*> release;
  for (const auto& [id, r] : reqs) {
    if (!r->started && r.get() != oldest && r->seq->cached_tokens() > 0) release.push_back(r.get());
  }
  // Only the oldest still holds a hit: the scheduler's choice may be another
  // request that the oldest's locked pages keep out, so release it too.
  if (release.empty() && oldest->seq->cached_tokens() > 0) release.push_back(oldest);
  std::sort(release.begin(), release.end(),
            [](const Req* a, const Req* b) { return a->job.id < b->job.id; });
  for (Req* r : release) {
    const int n = static_cast<int>(r->job.prompt.size());
    sched->Cancel(r->job.id);
    r->seq->Abort();  // unlocks the hit: its pages become evictable
    r->seq = std::make_unique<kv::Sequence>(
        kv::SequenceOptions{options.pools, options.cache, 0, true}, kv::CacheHit());
    r->result.cached_tokens = 0;
    r->result.computed_tokens = n;
    r->result.restored_tokens = 0;
    r->result.restore_saved_tokens = 0;
    ++released_hits;
    // Same arrival: the request keeps its place by wait time.
    absl::Status st = sched->Add({r->job.id, n, 0, r->arrival_ns});
    if (!st.ok()) Complete(r, st);
  }
  if (!release.empty()) {
    SWA_LOG(info, "prefill: admission stalled on locked prefix hits; {} queued request(s) "
            "released theirs and were requeued as cold prompts", release.size());
    return true;
  }
  // No queued request holds pages, so every page is free or evictable, and
  // still nothing starts (the pool is held elsewhere): a clear error for
  // the oldest rather than a stall.
  sched->Cancel(oldest->job.id);
  Complete(oldest, absl::ResourceExhaustedError(absl::StrCat(
                       "prompt of ", oldest->job.prompt.size(),
                       " tokens cannot get its KV pages in this prefill worker's pool (",
                       options.pools->full().num_free(), " free, ",
                       options.cache != nullptr ? options.cache->EvictableFullPages() : 0,
                       " evictable)")));
  return true;
}

bool PrefillCore::Impl::CanStart(const sched::PrefillRequestInfo& info) {
  auto it = reqs.find(info.id);
  if (it == reqs.end()) return false;
  Req& r = *it->second;
  // Its hit's pages are still being copied in from L2.
  if (options.cache != nullptr && options.cache->Loading(r.seq->hit())) return false;
  const int64_t need = FullPagesFor(r);
  int64_t available = options.pools->full().num_free();
  if (options.cache != nullptr) available += options.cache->EvictableFullPages();
  if (need + committed_full_pages > available) return false;
  if (!SwaFits(r)) return false;
  r.pending_full_pages = need;
  committed_full_pages += need;
  r.started = true;
  r.start_ns = base::MonotonicNanos();
  return true;
}

int64_t PrefillCore::Impl::SwaPeakPages(const Req& r) const {
  const int ps = options.pools->shape().page_size;
  const int w = options.engine->config().sliding_window;
  if (w <= 1 || options.pools->swa().num_pages() == 0) return 0;
  const int64_t window = (w - 1 + ps - 1) / ps + 1;
  const int64_t chunk = (options.scheduler.chunk_tokens + ps - 1) / ps + 1;
  const int64_t computes =
      (static_cast<int64_t>(r.job.prompt.size()) - r.result.cached_tokens + ps - 1) / ps + 1;
  return std::min(2 * window + chunk, computes + window);
}

bool PrefillCore::Impl::SwaFits(const Req& r) const {
  if (!AnyStarted()) return true;
  int64_t committed = 0;
  for (const auto& [id, o] : reqs) {
    if (!o->started || o->computed || o->seq == nullptr) continue;
    committed += std::max<int64_t>(0, SwaPeakPages(*o) - o->seq->private_swa_pages());
  }
  int64_t available = options.pools->swa().num_free();
  if (options.cache != nullptr) available += options.cache->EvictableSwaPages();
  const int64_t need = std::max<int64_t>(0, SwaPeakPages(r) - r.seq->private_swa_pages());
  return need + committed <= available;
}

void PrefillCore::Impl::Complete(Req* r, absl::Status status) {
  if (r->started && r->pending_full_pages > 0) {
    committed_full_pages -= r->pending_full_pages;
    r->pending_full_pages = 0;
  }
  if (status.ok() || (r->computed && r->seq != nullptr)) {
    // Prompt pages into the prefix cache: with MTP layers only pages whose
    // every MTP layer's KV was written (layer j at p needs token p + j + 1,
    // known to n: positions <= n - K), so a hit never reads unwritten KV.
    const int K = options.engine->config().num_mtp_layers;
    const int n = static_cast<int>(r->job.prompt.size());
    const size_t safe =
        K > 0 ? static_cast<size_t>(std::max(0, n - K + 1) / options.pools->shape().page_size)
              : r->hashes.size();
    r->seq->Finish(absl::MakeConstSpan(r->hashes).first(std::min(safe, r->hashes.size())));
  } else if (r->seq != nullptr) {
    r->seq->Abort();
  }
  // A restore counts once its prompt was computed, whatever happened to the
  // ship (the router cancels the prefill leg when a short decode ends first).
  if (r->computed && r->result.restored_tokens > 0) {
    restores_total.fetch_add(1, std::memory_order_relaxed);
    restored_total.fetch_add(r->result.restored_tokens, std::memory_order_relaxed);
    restore_saved_total.fetch_add(r->result.restore_saved_tokens, std::memory_order_relaxed);
    if (m.restores != nullptr) {
      m.restores->Increment();
      m.restored_tokens->Increment(r->result.restored_tokens);
      m.restore_saved_tokens->Increment(r->result.restore_saved_tokens);
    }
  }
  const std::string id = r->job.id;
  auto done = std::move(r->job.done);
  PrefillResult result = std::move(r->result);
  const int l1_end = r->l1_end, l2_end = r->l2_end;
  reqs.erase(id);  // r is gone
  {
    absl::MutexLock lock(&mu);
    ids.erase(id);
  }
  if (status.ok()) {
    completed.fetch_add(1, std::memory_order_relaxed);
    computed_total.fetch_add(result.computed_tokens, std::memory_order_relaxed);
    cached_total.fetch_add(result.cached_tokens, std::memory_order_relaxed);
    // Hit tokens by the tier they were in on arrival (Req::l1_end, l2_end).
    const int hit = result.cached_tokens;
    const int a = std::min(hit, l1_end);
    const int b = std::min(hit, std::max(l2_end, l1_end));
    const int by_tier[3] = {a, b - a, hit - b};
    for (int t = 0; t < 3; ++t) {
      tier_tokens_total[t].fetch_add(by_tier[t], std::memory_order_relaxed);
      if (m.tier_tokens[t] != nullptr) m.tier_tokens[t]->Increment(by_tier[t]);
    }
    if (m.ok != nullptr) {
      m.ok->Increment();
      m.prompt_tokens->Increment(result.prompt_tokens);
      m.cached_tokens->Increment(result.cached_tokens);
      m.computed_tokens->Increment(result.computed_tokens);
    }
    done(std::move(result));
  } else {
    if (m.ok != nullptr) (absl::IsCancelled(status) ? m.cancelled : m.failed)->Increment();
    done(status);
  }
}

void PrefillCore::Impl::RunStep(const sched::PrefillStep& step) {
  const int64_t t0 = base::MonotonicNanos();
  items.clear();
  item_reqs.clear();
  item_last.clear();
  for (const sched::PrefillChunk& c : step.chunks) {
    auto it = reqs.find(c.id);
    if (it == reqs.end()) continue;  // cancelled meanwhile
    Req* r = it->second.get();
    const int64_t before = r->seq->full_pages().size();
    // Append, or the next stretch of a window restore.
    absl::Status st = r->seq->Prepare(c.start_token, c.num_tokens);
    if (!st.ok()) {
      sched->Cancel(c.id);
      Complete(r, st);
      continue;
    }
    const int64_t got = static_cast<int64_t>(r->seq->full_pages().size()) - before;
    r->pending_full_pages -= got;
    committed_full_pages -= got;
    items.push_back({r->seq.get(), absl::MakeConstSpan(r->job.prompt).subspan(c.start_token, c.num_tokens),
                     c.start_token, false});
    item_reqs.push_back(r);
    item_last.push_back(c.last);
  }
  if (items.empty()) return;
  const int K = options.engine->config().num_mtp_layers;
  absl::Status st = options.engine->Forward(items, &out, /*keep_all_hidden=*/K > 0);
  if (!st.ok()) {
    SWA_LOG(err, "prefill: forward failed: {}", st.ToString());
    for (Req* r : item_reqs) {
      sched->Cancel(r->job.id);
      Complete(r, st);
    }
    return;
  }
  const int64_t t1 = base::MonotonicNanos();
  if (m.step_tokens != nullptr) m.step_tokens->Observe(step.total_tokens());
  const int V = options.engine->config().vocab_size;
  const int H = options.engine->config().hidden_size;
  int row0 = 0;
  std::vector<Req*> failed;
  for (size_t i = 0; i < items.size(); ++i) {
    Req* r = item_reqs[i];
    const int rows = static_cast<int>(items[i].tokens.size());
    const int first_row = row0;
    row0 += rows;
    r->result.compute_seconds += static_cast<double>(t1 - t0) * 1e-9;
    uint32_t first_token = 0;
    if (item_last[i]) {
      const float* row = out.logits.data() + static_cast<size_t>(out.first_row[i]) * V;
      r->result.first_token = r->sampler->Sample(absl::MakeConstSpan(row, V));
      first_token = r->result.first_token.token;
    }
    if (K > 0) {
      // The main hidden states of the last K prompt positions (decode's MTP
      // layers start there).
      const int n = static_cast<int>(r->job.prompt.size());
      const int from = std::max(items[i].start, n - K);
      for (int p = from; p < items[i].start + rows; ++p) {
        const float* h = out.all_hidden.data() + static_cast<size_t>(first_row + p - items[i].start) * H;
        r->result.tail_hidden.insert(r->result.tail_hidden.end(), h, h + H);
      }
      const int end = items[i].start + rows;
      absl::Status ms = RunMtp(*r, out.all_hidden.data() + static_cast<size_t>(first_row) * H,
                               items[i].start, rows, item_last[i] ? end + 1 : end, first_token);
      if (!ms.ok()) {
        SWA_LOG(err, "prefill: MTP forward failed: {}", ms.ToString());
        if (!item_last[i]) sched->Cancel(r->job.id);
        failed.push_back(r);
        continue;
      }
    }
    if (!item_last[i]) {
      r->seq->TrimWindow();  // release SWA pages behind the window early
      continue;
    }
    r->result.last_hidden.assign(out.last_hidden.begin() + i * H,
                                 out.last_hidden.begin() + (i + 1) * H);
    r->result.queue_seconds = static_cast<double>(r->start_ns - r->arrival_ns) * 1e-9;
    if (m.ttft_seconds != nullptr) {
      m.ttft_seconds->Observe(static_cast<double>(t1 - r->arrival_ns) * 1e-9);
    }
    r->computed = true;
    if (!r->job.ship) {
      Complete(r, absl::OkStatus());
      continue;
    }
    r->shipping = true;
    r->ship_start_ns = t1;
    const std::string id = r->job.id;
    r->job.ship(*r->seq, r->result, [this, id](absl::Status s) {
      absl::MutexLock lock(&mu);
      shipped.emplace_back(id, std::move(s));
      cv.Signal();
    });
  }
  // The whole step, MTP over the prompt included: it ran after the forward
  // (one item at a time) and took ~47% of the prefill worker's time with the
  // tiny model, which the histogram used to leave out.
  if (m.step_seconds != nullptr) {
    m.step_seconds->Observe(static_cast<double>(base::MonotonicNanos() - t0) * 1e-9);
  }
  for (Req* r : failed) Complete(r, absl::InternalError("MTP forward over the prompt failed"));
}

absl::Status PrefillCore::Impl::RunMtp(Req& r, const float* hidden, int first, int rows,
                                       int known, uint32_t extra) {
  const int K = options.engine->config().num_mtp_layers;
  const int H = options.engine->config().hidden_size;
  const int n = static_cast<int>(r.job.prompt.size());
  if (r.mtp_rows.empty()) {
    // The first computed position. Positions before it come from a prefix
    // hit, MTP KV included (for the hit's last k + 1 positions that KV was
    // computed with the inserting request's next tokens: MTP drafts from
    // there may differ, which costs acceptance, never correctness, since
    // the main model verifies every draft).
    r.mtp_rows.resize(K);
    r.mtp_next.assign(K, first);
  }
  auto token_at = [&](int idx) { return idx < n ? r.job.prompt[idx] : extra; };
  // Layer 0's inputs: the main hidden states of this chunk.
  if (r.mtp_next[0] + static_cast<int>(r.mtp_rows[0].size() / H) != first) {
    return absl::InternalError("MTP rows out of order");
  }
  r.mtp_rows[0].insert(r.mtp_rows[0].end(), hidden, hidden + static_cast<size_t>(rows) * H);
  for (int k = 0; k < K; ++k) {
    std::vector<float>& pending = r.mtp_rows[k];
    const int have = static_cast<int>(pending.size() / H);
    const int p0 = r.mtp_next[k];
    // Positions p in [p0, p0 + have) with token p + 1 + k known.
    const int ready = std::max(0, std::min(have, known - 1 - k - p0));
    if (ready == 0) continue;
    mtp_tokens.resize(ready);
    for (int j = 0; j < ready; ++j) mtp_tokens[j] = token_at(p0 + j + 1 + k);
    model::ForwardItem item{.seq = r.seq.get(), .tokens = mtp_tokens, .start = p0, .no_logits = true};
    RETURN_IF_ERROR(options.engine->ForwardMtp(
        k, {&item, 1}, absl::MakeConstSpan(pending.data(), static_cast<size_t>(ready) * H),
        &mtp_out));
    if (k + 1 < K) {
      std::vector<float>& next = r.mtp_rows[k + 1];
      if (r.mtp_next[k + 1] + static_cast<int>(next.size() / H) != p0) {
        return absl::InternalError("MTP layer rows out of order");
      }
      next.insert(next.end(), mtp_out.all_hidden.begin(),
                  mtp_out.all_hidden.begin() + static_cast<size_t>(ready) * H);
    }
    pending.erase(pending.begin(), pending.begin() + static_cast<size_t>(ready) * H);
    r.mtp_next[k] = p0 + ready;
  }
  return absl::OkStatus();
}

void PrefillCore::Impl::PublishLoad() {
  int running = 0;
  for (const auto& [id, r] : reqs) running += r->started ? 1 : 0;
  absl::MutexLock lock(&mu);
  load.queued_requests = sched->queued_requests() + static_cast<int>(incoming.size()) +
                        static_cast<int>(parked.size());
  load.queued_uncached_tokens = sched->queued_uncached_tokens();
  load.running_requests = running;
  if (m.running != nullptr) m.running->Set(running);
}

void PrefillCore::Impl::Loop() {
  while (true) {
    std::deque<std::unique_ptr<Req>> new_reqs;
    std::vector<std::string> to_cancel;
    std::vector<std::pair<std::string, absl::Status>> done_ships;
    std::vector<Fetched> done_fetches;
    std::vector<kv::PendingLoadBack> done_copies;
    {
      const bool runnable =
          !sched_blocked && (sched->queued_requests() > 0 || sched->in_progress_requests() > 0);
      // Parked requests' waits end only here, after the fetches that landed
      // while the loop was busy are taken below (not before: a result that
      // is already here is never expired).
      int64_t next_deadline = INT64_MAX;
      for (const auto& [id, r] : parked) {
        next_deadline = std::min(next_deadline, r->prefetch_deadline_ns);
      }
      absl::MutexLock lock(&mu);
      while (!stopping && incoming.empty() && cancels.empty() && shipped.empty() &&
             fetched.empty() && copied.empty() && !runnable) {
        if (next_deadline == INT64_MAX) {
          cv.Wait(&mu);
          continue;
        }
        const int64_t now = base::MonotonicNanos();
        if (now >= next_deadline) break;  // a parked request's wait is over
        cv.WaitWithTimeout(&mu, absl::Nanoseconds(next_deadline - now));
      }
      if (stopping) break;
      new_reqs.swap(incoming);
      to_cancel.swap(cancels);
      done_ships.swap(shipped);
      done_fetches.swap(fetched);
      done_copies.swap(copied);
    }
    FinishCopied(done_copies);
    for (Fetched& f : done_fetches) OnFetched(f);
    ExpireParked(base::MonotonicNanos());
    for (auto& r : new_reqs) Accept(std::move(r));
    for (const auto& [id, status] : done_ships) {
      auto it = reqs.find(id);
      if (it == reqs.end()) continue;
      Req* r = it->second.get();
      r->shipping = false;
      r->result.transfer_seconds =
          static_cast<double>(base::MonotonicNanos() - r->ship_start_ns) * 1e-9;
      Complete(r, r->cancelled && status.ok() ? absl::CancelledError("cancelled by the caller")
                                               : status);
    }
    for (const std::string& id : to_cancel) {
      FailParked(id, absl::CancelledError("cancelled by the caller"));
      auto it = reqs.find(id);
      if (it == reqs.end()) continue;
      Req* r = it->second.get();
      if (r->shipping) {
        r->cancelled = true;  // the transfer owns the pages until it ends
        continue;
      }
      sched->Cancel(id);
      Complete(r, absl::CancelledError("cancelled by the caller"));
    }
    const sched::PrefillStep step = sched->NextStep(
        base::MonotonicNanos(), [this](const sched::PrefillRequestInfo& info) {
          return CanStart(info);
        });
    sched_blocked = step.empty();
    if (step.empty() && sched->queued_requests() + sched->in_progress_requests() > 0) {
      SWA_LOG(debug, "prefill: no step: {} queued, {} in progress, started {}, free {}, evictable {}, committed {}",
              sched->queued_requests(), sched->in_progress_requests(), AnyStarted(),
              options.pools->full().num_free(),
              options.cache != nullptr ? options.cache->EvictableFullPages() : 0, committed_full_pages);
    }
    if (!step.empty()) {
      RunStep(step);
    } else if (sched->queued_requests() > 0 && !AnyStarted() && pending_copies == 0) {
      // (With copies pending, their completion is the event to wait for.)
      // No event will come (nothing computes or ships): unblock now.
      if (ReleaseQueuedHits()) sched_blocked = false;
    }
    PublishLoad();
  }
  // Stopping: fail everything still here. Shipping requests are waited for
  // (their transfer owns the pages).
  std::deque<std::unique_ptr<Req>> rest;
  {
    absl::MutexLock lock(&mu);
    rest.swap(incoming);
  }
  for (auto& r : rest) Accept(std::move(r));
  while (!parked.empty()) {
    FailParked(parked.begin()->first, absl::CancelledError("prefill worker stopping"));
  }
  while (true) {
    std::vector<Req*> now;
    bool any_shipping = false;
    for (auto& [id, r] : reqs) {
      if (r->shipping) {
        any_shipping = true;
      } else {
        now.push_back(r.get());
      }
    }
    for (Req* r : now) {
      sched->Cancel(r->job.id);
      Complete(r, absl::CancelledError("prefill worker stopping"));
    }
    if (!any_shipping) break;
    std::vector<std::pair<std::string, absl::Status>> done_ships;
    {
      absl::MutexLock lock(&mu);
      auto have = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !shipped.empty(); };
      mu.Await(absl::Condition(&have));
      done_ships.swap(shipped);
    }
    for (const auto& [id, status] : done_ships) {
      auto it = reqs.find(id);
      if (it == reqs.end()) continue;
      it->second->shipping = false;
      Complete(it->second.get(), absl::CancelledError("prefill worker stopping"));
    }
  }
  // Load-backs still copying: their path stays locked until finished.
  while (pending_copies > 0) {
    std::vector<kv::PendingLoadBack> done;
    {
      absl::MutexLock lock(&mu);
      auto have = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !copied.empty(); };
      mu.Await(absl::Condition(&have));
      done.swap(copied);
    }
    FinishCopied(done);
  }
  PublishLoad();
}

absl::StatusOr<std::unique_ptr<PrefillCore>> PrefillCore::Create(const PrefillCoreOptions& options) {
  RETURN_IF_ERROR(CheckEngineAndPools("PrefillCore", options.engine, options.pools));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  sched::PrefillSchedulerOptions so = options.scheduler;
  so.registry = options.registry;
  ASSIGN_OR_RETURN(impl->sched, sched::PrefillScheduler::Create(so));
  RETURN_IF_ERROR(impl->m.Init(options.registry));
  Impl* p = impl.get();
  if (options.l3 != nullptr && options.cache != nullptr && options.cache->has_l3()) {
    impl->prefetcher = std::make_unique<kv::L3Prefetcher>(
        options.l3, options.cache->l3_fetch_options(),
        [p](std::string id, std::vector<uint64_t> hashes, kv::L3Fetch fetch) {
          absl::MutexLock lock(&p->mu);
          p->fetched.push_back(Impl::Fetched{std::move(id), std::move(hashes), std::move(fetch)});
          p->cv.Signal();
        });
  }
  if (options.cache != nullptr && options.cache->has_l2()) {
    impl->copier = std::make_unique<kv::LoadBackCopier>([p](kv::PendingLoadBack done) {
      absl::MutexLock lock(&p->mu);
      p->copied.push_back(std::move(done));
      p->cv.Signal();
    });
  }
  impl->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<PrefillCore>(new PrefillCore(std::move(impl)));
}

PrefillCore::PrefillCore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PrefillCore::~PrefillCore() { Stop(); }

void PrefillCore::Stop() { StopLoop(&impl_->mu, &impl_->cv, &impl_->stopping, &impl_->thread); }

absl::Status PrefillCore::Submit(PrefillJob job) {
  const Impl& s = *impl_;
  if (!job.done) return absl::InvalidArgumentError("prefill job without a completion callback");
  if (job.id.empty()) return absl::InvalidArgumentError("prefill job without an id");
  if (job.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  const int n = static_cast<int>(job.prompt.size());
  if (s.options.max_prompt_tokens > 0 && n > s.options.max_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat("prompt of ", n, " tokens exceeds this worker's ",
                                              s.options.max_prompt_tokens, "-token bucket"));
  }
  const int V = s.options.engine->config().vocab_size;
  for (uint32_t t : job.prompt) {
    if (t >= static_cast<uint32_t>(V)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " >= vocab size ", V));
    }
  }
  RETURN_IF_ERROR(model::Sampler::Validate(job.sampling));
  const int ps = s.options.pools->shape().page_size;
  const int64_t pages = (n + ps - 1) / ps;
  if (pages > s.options.pools->full().num_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt of ", n, " tokens needs ", pages, " full KV pages; this worker has ",
        s.options.pools->full().num_pages()));
  }
  auto r = std::make_unique<Req>();
  r->arrival_ns = base::MonotonicNanos();
  r->sampler = std::make_unique<model::Sampler>(job.sampling);
  r->job = std::move(job);
  absl::MutexLock lock(&impl_->mu);
  if (impl_->stopping) return absl::FailedPreconditionError("prefill core is stopping");
  if (!impl_->ids.insert(r->job.id).second) {
    return absl::AlreadyExistsError(absl::StrCat("request ", r->job.id, " is already here"));
  }
  impl_->incoming.push_back(std::move(r));
  impl_->cv.Signal();
  return absl::OkStatus();
}

void PrefillCore::Cancel(const std::string& id) {
  absl::MutexLock lock(&impl_->mu);
  if (!impl_->ids.contains(id)) return;
  impl_->cancels.push_back(id);
  impl_->cv.Signal();
}

PrefillLoad PrefillCore::GetLoad() const {
  PrefillLoad l;
  {
    absl::MutexLock lock(&impl_->mu);
    l = impl_->load;
  }
  l.completed_total = impl_->completed.load();
  l.computed_tokens_total = impl_->computed_total.load();
  l.cached_tokens_total = impl_->cached_total.load();
  l.released_hits_total = impl_->released_hits.load();
  l.window_restores_total = impl_->restores_total.load();
  l.restored_tokens_total = impl_->restored_total.load();
  l.restore_saved_tokens_total = impl_->restore_saved_total.load();
  l.l3_prefetch_hits = impl_->prefetch_hits.load();
  l.l3_prefetch_misses = impl_->prefetch_misses.load();
  l.l3_prefetch_unused = impl_->prefetch_unused.load();
  l.l3_prefetch_timeouts = impl_->prefetch_timeouts.load();
  l.l3_attached_pages = impl_->l3_attached.load();
  l.async_load_backs = impl_->async_load_backs.load();
  l.sync_load_backs = impl_->sync_load_backs.load();
  l.l1_cached_tokens_total = impl_->tier_tokens_total[0].load();
  l.l2_cached_tokens_total = impl_->tier_tokens_total[1].load();
  l.l3_cached_tokens_total = impl_->tier_tokens_total[2].load();
  return l;
}

}  // namespace swaserve::worker
