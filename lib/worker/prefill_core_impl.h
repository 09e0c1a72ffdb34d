// Internal to lib/worker: PrefillCore's request state, metrics and Impl,
// shared by prefill_core.cc (the loop: admission, steps, completion) and
// prefill_core_tiers.cc (the KV tiers: L2 load-back on the copier thread,
// L3 prefetch with parked requests). Not part of the API; threading as in
// prefill_core.h.
#pragma once

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
#include "lib/kv/cache_pins.h"
#include "lib/kv/load_back_copier.h"
#include "lib/metrics/buckets.h"
#include "lib/worker/prefill_core.h"

namespace swaserve::worker {
namespace prefill_internal {

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
  // End of the last chunk whose forward pass (MTP layers included) ran:
  // what a prefill that ends early can keep (Impl::PartialKeepTokens).
  int computed_end = 0;
  // What its L3 checkpoints wrote of its own pages: [begin, end) tokens,
  // begin = its hit's end (end 0: none yet).
  int l3_checkpoint_begin = 0;
  int l3_checkpoint_end = 0;
  // Its hit's path was handed to the cache's L3 write queue (once: a
  // checkpoint put off for want of room must not queue it again and push
  // other paths out of that bounded queue).
  bool l3_hit_queued = false;
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
  metrics::Counter* restores_from_safe = nullptr;
  metrics::Counter* partial_kept = nullptr;
  metrics::Counter* partial_kept_tokens = nullptr;
  metrics::Counter* l3_checkpoints = nullptr;
  metrics::Counter* l3_checkpoint_tokens = nullptr;
  metrics::Counter* l3_checkpoints_skipped = nullptr;
  metrics::Counter* checkpoint_pages_yielded = nullptr;
  metrics::Counter* pinned_tokens = nullptr;
  metrics::Gauge* pinned_pages = nullptr;
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
                                              "Prefill requests that ended, by result (ok: computed "
                                              "and its KV delivered, even when the caller "
                                              "cancelled during the transfer; cancelled: the "
                                              "caller went away, or a draining worker handed "
                                              "the request back).",
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
                                             "computing from the window-safe hit (with the "
                                             "pyramid: against its work in tokens)."));
    restore_saved_tokens = &ws->WithLabels();
    ASSIGN_OR_RETURN(auto* wf, r->AddCounter("swaserve_prefill_window_restore_from_window_safe_total",
                                             "Window restores that started at the window-safe "
                                             "hit itself (inside the stretch), reading its "
                                             "cached window: less to compute."));
    restores_from_safe = &wf->WithLabels();
    ASSIGN_OR_RETURN(auto* pk, r->AddCounter("swaserve_prefill_partial_kept_requests_total",
                                             "Prefills that ended before their last chunk "
                                             "(the caller cancelled or went away, a forward "
                                             "failed) and left the chunks they had computed in "
                                             "the prefix cache, so that a retry resumes there."));
    partial_kept = &pk->WithLabels();
    ASSIGN_OR_RETURN(auto* pt, r->AddCounter("swaserve_prefill_partial_kept_tokens_total",
                                             "Computed prompt tokens such prefills left in the "
                                             "prefix cache (beyond their own hit)."));
    partial_kept_tokens = &pt->WithLabels();
    ASSIGN_OR_RETURN(auto* lc, r->AddCounter("swaserve_prefill_l3_checkpoints_total",
                                             "L3 checkpoints of long prefills written whole "
                                             "(up to the computed end): computed pages written "
                                             "to L3 while the prompt was still being computed, "
                                             "so that a retry after a crash resumes there "
                                             "(--prefill.l3_checkpoint_tokens)."));
    l3_checkpoints = &lc->WithLabels();
    ASSIGN_OR_RETURN(auto* lt, r->AddCounter("swaserve_prefill_l3_checkpoint_tokens_total",
                                             "Prompt tokens L3 checkpoints wrote (beyond the "
                                             "request's hit and its previous checkpoint)."));
    l3_checkpoint_tokens = &lt->WithLabels();
    ASSIGN_OR_RETURN(auto* ls, r->AddCounter("swaserve_prefill_l3_checkpoints_skipped_total",
                                             "L3 checkpoints put off, in whole or in part, "
                                             "to a later chunk: the store's write-behind "
                                             "queue had no room for all of it."));
    l3_checkpoints_skipped = &ls->WithLabels();
    ASSIGN_OR_RETURN(auto* cy, r->AddCounter("swaserve_prefill_swa_checkpoint_pages_yielded_total",
                                             "SWA checkpoint-window pages running prompts gave "
                                             "up for room before any hot cached window was "
                                             "evicted (--prefill.swa_checkpoints_yield)."));
    checkpoint_pages_yielded = &cy->WithLabels();
    ASSIGN_OR_RETURN(auto* pn, r->AddCounter("swaserve_prefill_pinned_tokens_total",
                                             "Prompt tokens pinned in the prefix cache for a "
                                             "client's cache breakpoint (each pin or renewal)."));
    pinned_tokens = &pn->WithLabels();
    ASSIGN_OR_RETURN(auto* pp, r->AddGauge("swaserve_prefill_pinned_pages",
                                           "Full-pool pages pinned by cache breakpoints now "
                                           "(at most --prefill.cache_pin_max_fraction of the "
                                           "pool)."));
    pinned_pages = &pp->WithLabels();
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


}  // namespace prefill_internal

using prefill_internal::Metrics;
using prefill_internal::Req;

struct PrefillCore::Impl {
  PrefillCoreOptions options;
  Metrics m;
  std::unique_ptr<sched::PrefillScheduler> sched;
  // Pinned prompt prefixes (PrefillJob::cache_pins); null without a prefix
  // cache or with pins off. Loop thread.
  std::unique_ptr<kv::CachePins> pins;

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
  // Every request here (incoming, parked, queued, started) and where it
  // stands (PrefillCore::Progress).
  absl::flat_hash_map<std::string, PrefillProgress> ids ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // EndAllForDrain: asked, taken by the loop, its callbacks run.
  struct DrainEnd {
    bool requested = false;
    bool taken = false;
    bool done = false;
    absl::Status status;
    absl::Duration l3_flush_timeout;
  };
  DrainEnd drain_end ABSL_GUARDED_BY(mu);
  PrefillLoad load ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> completed{0}, computed_total{0}, cached_total{0};
  std::atomic<int64_t> restores_total{0}, restored_total{0}, restore_saved_total{0},
      restores_from_safe_total{0};
  std::atomic<int64_t> partial_kept_total{0}, partial_kept_tokens_total{0};
  std::atomic<int64_t> l3_checkpoints_total{0}, l3_checkpoint_tokens_total{0},
      l3_checkpoints_skipped_total{0}, checkpoint_pages_yielded_total{0};
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
  // EndAllForDrain (loop-owned): while hold_dones, Complete queues a failed
  // request's callback in held_dones instead of running it; RunHeldDones
  // runs them once the L3 writes are stored or at held_deadline_ns.
  bool hold_dones = false;
  bool end_pending = false;  // an EndAllForDrain not yet done
  std::vector<std::pair<std::function<void(absl::StatusOr<PrefillResult>)>, absl::Status>>
      held_dones;
  int64_t held_deadline_ns = 0;
  void EndAllHeld(const absl::Status& status, absl::Duration l3_flush_timeout);
  // Runs the held callbacks when due (or now, with force); marks the
  // EndAllForDrain done once none is left.
  void RunHeldDones(bool force);
  // Throughput (PrefillLoad::prefill_tokens_per_second): tokens and seconds
  // of the forward steps, each sum decayed by kRateDecay per step.
  static constexpr double kRateDecay = 0.9;
  // How often an idle loop goes on with paced L3 writes
  // (kv::PrefixCache::ContinueL3Writes).
  static constexpr int64_t kL3WriteRetryNanos = 20'000'000;
  double rate_tokens = 0, rate_seconds = 0;
  // rate_tokens / rate_seconds, 0 before the first step (loop thread; the
  // same value PrefillLoad gets under `mu`).
  double MeasuredRate() const { return rate_seconds > 0 ? rate_tokens / rate_seconds : 0; }
  model::ForwardOutput out;
  std::vector<model::ForwardItem> items;
  // Embedding overrides of each item of `items` (multimodal placeholders),
  // sized before the items are built so the spans into them stay valid.
  std::vector<std::vector<model::EmbeddingOverride>> item_overrides;
  std::vector<model::EmbeddingOverride> mtp_overrides;
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
  // model::ForwardItem::window_restore_end for r's tokens from `start`: its
  // restore's M while computing below it with the pyramid on, else 0.
  int RestoreEnd(const Req& r, int start) const {
    const int m = r.seq->cached_tokens();
    return options.window_restore_pyramid && r.seq->restore_from() >= 0 && start < m ? m : 0;
  }
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
  // The loop's events: ships that ended (each request then completes) and
  // cancels (a request shipping completes when its ship ends).
  void EndShipsAndCancels(const std::vector<std::pair<std::string, absl::Status>>& done_ships,
                          const std::vector<std::string>& to_cancel);
  void Complete(Req* r, absl::Status status);
  // Pins the job's cache_pins within `cached` (the prompt's pages just
  // handed to the cache).
  void PinPrefixes(const Req& r, absl::Span<const uint64_t> cached);
  // For a request ending before its last chunk: prompt tokens from 0 whose
  // KV it computed completely (page-aligned; with MTP layers, only positions
  // every MTP layer reached), when that goes past its own prefix hit (and
  // past a window restore's stretch); else 0.
  int PartialKeepTokens(const Req& r) const;
  // Whole computed pages past the hit whose KV is final (MTP layers
  // included), in tokens; 0 when none (see PartialKeepTokens).
  int ComputedPrefixTokens(const Req& r) const;
  // Writes an L3 checkpoint of r when l3_checkpoint_tokens more are computed.
  void MaybeCheckpointToL3(Req& r);
  void PublishLoad();
  int64_t FullPagesFor(const Req& r) const {
    const int ps = options.pools->shape().page_size;
    return (static_cast<int64_t>(r.job.prompt.size()) + ps - 1) / ps - r.seq->full_pages().size();
  }
};

}  // namespace swaserve::worker
