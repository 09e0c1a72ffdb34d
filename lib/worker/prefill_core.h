// The prefill worker's engine loop (docs/architecture.md#request-path step 3), without gRPC:
// a request's prompt is matched against the prefix cache (its window-safe
// hit locked), queued in a sched::PrefillScheduler (compute-aware priority
// with a wait-time credit, or FCFS), computed in chunks — several requests'
// chunks in one ragged Forward — and, after its last chunk, its first token
// is sampled and its KV handed to the job's ship function (a UCX transfer to
// a decode worker, or a copy into a local DecodeCore in monolithic mode).
// The model's MTP layers run over the prompt too, chunk by chunk (layer k at
// position p once the token at p + 1 + k is known, the first generated token
// included), so their KV for the last window ships with the rest.
// When shipping is done the prompt's pages go into the prefix cache
// (Sequence::Finish) and the job's callback gets the result.
//
// Memory: a request starts only when the full pages of all its uncached
// tokens fit (free + evictable, minus what started requests still need) and
// so does its SWA peak (window + chunk + one window kept for the cache,
// beside what started requests may still take; a SWA pool too small for two
// windows otherwise failed the second request's chunk, a lost request);
// requests that could never fit in these pools are rejected at Submit.
// Queued requests hold their prefix hits locked (not evictable), so queued
// hits plus a request's need can exceed the pool with nothing running: then
// no event would ever unblock the queue. When that happens, queued requests
// other than the oldest release their hits and are requeued as cold prompts
// with their original arrival (the oldest's too if it alone holds one); the
// queue always makes progress, and a request that cannot start even then
// fails with ResourceExhausted instead of waiting forever. A new request
// whose hit lock would take pages that started requests count on (free +
// evictable below what they still need) queues without the hit instead.
//
// Window restore: a prompt whose full KV is cached to M but whose SWA KV is
// window-safe only to L < M (the SWA pages in between were evicted) takes a
// full-KV hit and recomputes [s, M) (kv::WindowRestoreStart: the SWA and MTP
// layers' KV of the window at M is then exact) with its full layers reading
// the cached full KV, instead of recomputing [L, M) (or, when L itself lies
// inside that stretch, restores from L reading L's cached window); the
// scheduler sees it as a hit of s (or L) tokens, and so do cached_tokens and
// the router's usage. The restored window goes into the cache with the
// prompt, healing the path.
// Metrics swaserve_prefill_window_restore_{requests,tokens,saved_tokens,
// from_window_safe}_total.
//
// When shipping fails or the caller cancels during the ship, the computed
// prompt still goes into the prefix cache (its KV is complete and valid),
// so a retry of the same prompt hits.
//
// Cancellation (caller gone): the request leaves the scheduler, its callback
// gets Cancelled, and the chunks it had computed go into the prefix cache
// (page-aligned; with MTP layers up to where every MTP layer reached), so a
// retry of the same prompt — the client's own, or one through another router
// replica after the router died — resumes there instead of from its first
// token; the rest of its pages are freed. The same holds for a request whose
// forward pass failed (the chunks before it are valid) and for one still
// here when the core stops (a worker whose drain ran out: with an L3 store
// the worker writes the cache back on shutdown, so a retry elsewhere or
// after a restart resumes there). Metrics swaserve_prefill_partial_kept_{requests,
// tokens}_total. A worker killed -9 runs none of this: against that, long
// prefills write L3 checkpoints as they go (l3_checkpoint_tokens; metrics
// swaserve_prefill_l3_checkpoint{s,_tokens,s_skipped}_total), so a retry on a
// worker sharing the store resumes at the last one. A request already shipping completes
// the transfer first (the transfer owns the pages until it ends), then ends
// ok if its KV was delivered (the work is done: the router cancels the
// prefill leg it still holds once the decode leg answered) and Cancelled if
// the ship failed.
//
// Threading: one internal thread runs the loop and owns the engine calls (via
// EngineLock), the pools, the cache and every sequence. Submit/Cancel/GetLoad
// are thread-safe. Callbacks (ship, done) run on the loop thread and must not
// block; a ship function calls its `shipped` continuation from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lib/base/hash.h"
#include "absl/status/statusor.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/page_store.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"
#include "lib/metrics/registry.h"
#include "lib/model/sampling.h"
#include "lib/sched/prefill_scheduler.h"
#include "lib/worker/engine_lock.h"

namespace swaserve::worker {

struct PrefillResult {
  model::SampledToken first_token;
  // Final hidden state of the last prompt token (hidden_size floats): the
  // MTP input the decode worker drafts from.
  std::vector<float> last_hidden;
  // Final hidden states of the last min(prompt, MTP layers) prompt
  // positions, in order (rows × hidden_size floats; empty without MTP
  // layers): where decode's MTP layers start (DecodeJob::tail_hidden).
  std::vector<float> tail_hidden;
  int prompt_tokens = 0;
  // Served from the prefix cache. A window-restored hit counts its full-KV
  // match minus the recomputed stretch (restored_tokens).
  int cached_tokens = 0;
  int computed_tokens = 0;  // computed here (restored_tokens included)
  // Window restore: tokens recomputed before the full-KV match end for the
  // SWA KV of its window (0: no restore; the stretch [s, M)), and the tokens
  // that saved against computing from the window-safe hit (M − L minus the
  // restore's work: the pyramid's, in token-equivalents, when on).
  int restored_tokens = 0;
  int restore_saved_tokens = 0;
  // The restore started at the window-safe hit itself (reading its cached
  // window: PrefillCoreOptions::window_restore_from_window_safe).
  bool restore_from_window_safe = false;
  double queue_seconds = 0;
  double compute_seconds = 0;
  double transfer_seconds = 0;
};

// Ships a prefilled request's KV: reads `seq`'s pages (valid until
// `shipped` is called) and calls `shipped` exactly once, from any thread.
using ShipFn = std::function<void(const kv::Sequence& seq, const PrefillResult& result,
                                  std::function<void(absl::Status)> shipped)>;

// A multimodal item's placeholders in a job's prompt: prompt
// tokens [span.token_offset, + span.num_tokens) take `embeddings`
// (num_tokens x hidden_size f32, the encoder's output) as their input
// embedding (model::EmbeddingOverride, in the main model and the MTP layers),
// and span.content is mixed into the page hash of every page they overlap
// (base::ChainedPageHashes), so two different images never share cached KV
// and the same image does.
struct PrefillMultimodal {
  base::HashedSpan span;
  std::shared_ptr<const std::vector<float>> embeddings;
};

// A prefix of a job's prompt to keep in the prefix cache for a while
// (kv::CachePins).
struct PrefillCachePin {
  int tokens = 0;
  absl::Duration ttl;
};

struct PrefillJob {
  std::string id;
  std::vector<uint32_t> prompt;
  // Sorted by token_offset, disjoint, inside the prompt (Submit checks).
  std::vector<PrefillMultimodal> multimodal;
  model::SamplingOptions sampling;
  // Scheduling priority (sched::PrefillRequestInfo::priority): lower values
  // start first.
  int priority = 0;
  // Prefixes pinned once the prompt is cached (at most the prompt's cached
  // pages; ignored without a prefix cache).
  std::vector<PrefillCachePin> cache_pins;
  // The chain seed of the prompt's page hashes (PrefillRequest.
  // page_hash_seed: the caller's cache domain); 0: the default seed.
  uint64_t page_hash_seed = 0;
  // Null: prefill only (warm the prefix cache), no decode leg.
  ShipFn ship;
  // Called once on the loop thread: the result after shipping, or the error
  // (Cancelled, ResourceExhausted, the ship error, ...).
  std::function<void(absl::StatusOr<PrefillResult>)> done;
};

struct PrefillCoreOptions {
  // Not owned; must outlive the core.
  EngineLock* engine = nullptr;
  kv::KvPools* pools = nullptr;
  kv::PrefixCache* cache = nullptr;  // may be null: no prefix caching
  sched::PrefillSchedulerOptions scheduler;
  // Largest prompt accepted (the worker's length bucket upper bound); 0: any
  // that fits in the pools.
  int max_prompt_tokens = 0;
  // Window restore (kv/sequence.h): when a prompt's full KV is cached past
  // its window-safe hit, recompute only the bounded stretch before the
  // full-KV match end (kv::WindowRestoreStart) instead of everything from
  // the window-safe hit, when sched::ChooseWindowRestore finds that saves at
  // least this much work (token-equivalents of the scheduler's work clock).
  // < 0: never restore.
  double window_restore_min_saved_work = 64;
  // Compute a restore as a pyramid (model::ForwardItem::window_restore_end,
  // kv::WindowRestoreRows): each layer only the rows a later layer needs,
  // about half the work of every layer over [s, M); the restored window is
  // byte-identical either way. The restore choice then uses the pyramid's
  // work. false: every layer over the whole stretch.
  bool window_restore_pyramid = true;
  // A prefill that ends before its last chunk (cancelled, a forward failed)
  // hands the chunks it computed to the prefix cache (see "Cancellation"
  // above), so a retry resumes there. false: they are freed (for
  // comparisons).
  bool keep_cancelled_chunks = true;
  // L3 checkpoints of long prefills (when the cache has an L3): every this
  // many computed prompt tokens past its hit (and past its last
  // checkpoint), a request writes its computed pages' full KV, and the SWA
  // KV of the window where they end, to L3 (kv::PrefixCache::CheckpointToL3;
  // its hit's pages first, through the tree), so that a worker killed -9 in
  // the middle of a long prompt loses only the chunks since: the retry, on
  // any worker sharing the store (or this one restarted over a file store),
  // fetches the prefix. Paced by the store's write-behind queue: what it
  // has no room for now is written after a later chunk, from where the
  // checkpoint stopped. 0: off. Default 16384.
  int l3_checkpoint_tokens = 16384;
  // Share of the full pool that pinned prefixes (PrefillJob::cache_pins)
  // may hold together; the pins due soonest give way beyond it. 0: pins
  // are ignored. Default a quarter.
  double cache_pin_max_fraction = 0.25;
  // Start a restore at the window-safe hit L itself when L is past the
  // stretch's start (kv::PlanWindowRestoreStretch): the hit also locks L's
  // window, and [L, M) is computed through the pyramid's rows reading the
  // cached full KV — less than recomputing [L, M), which is what happens
  // without a restore. false: only restores from WindowRestoreStart(M).
  bool window_restore_from_window_safe = true;
  // SWA checkpoints (kv::SequenceOptions::swa_checkpoint_tokens): every
  // this many prompt tokens a request keeps the SWA window ending there for
  // the prefix cache, cold, so that a later prompt diverging from it is
  // window-safe at most this far back. 0 (the default): off.
  int swa_checkpoint_tokens = 0;
  // kv::SequenceOptions::checkpoints_yield: when the SWA pool is short, a
  // request's own checkpoint windows (cold once cached) give way after the
  // cache's cold SWA KV and before any hot window. Default true.
  bool swa_checkpoints_yield = true;
  // L2 tier (when the cache has one): a prompt's match is loaded back from
  // L2 into L1 (kv::PrefixCache::LoadBack) when at least this many of its
  // tokens are in L2. Default 64.
  int load_back_min_tokens = 64;
  // A load-back of at least this many bytes runs asynchronously: its copies
  // run on a copier thread (kv::LoadBackCopier) while the loop computes
  // other requests, and the request (with any other whose hit covers the
  // moved pages, kv::PrefixCache::Loading) starts when they are done.
  // Smaller ones copy inline, cheaper than a round trip. Default 1 MiB.
  int64_t async_load_back_min_bytes = int64_t{1} << 20;
  // L3 tier (when the cache has one, kv::PrefixCache "L3"): a new request
  // whose prompt extends at least l3_prefetch_min_tokens past the cache's
  // window-safe match is parked while its pages are read from L3 on the
  // prefetcher's thread (kv::L3Prefetcher; the loop keeps computing other
  // requests meanwhile), then attached and loaded back before its match.
  // It waits at most L3PrefetchWait (below): past that it is matched
  // without them and computes what it lacks (the fetch, when it lands, still
  // warms the cache). Not owned; must be the cache's store; null: no
  // prefetch.
  kv::PageStore* l3 = nullptr;
  int l3_prefetch_min_tokens = 256;
  // The wait's floor.
  int64_t l3_prefetch_max_wait_ms = 200;
  // The wait grows with what the fetch may save: up to this fraction of the
  // time computing the tokens it may bring would take (a ski-rental bound:
  // giving up late costs at most 1.5x computing at once, while a fetch that
  // lands saves the whole computation; a parked request holds no compute,
  // the loop runs others meanwhile). 0: the floor alone. A fixed 200 ms
  // lost a 54K-token prefix fetched from a shared Redis L3 in ~0.5 s, and
  // the prompt took 50 s to recompute (bench/cluster/agent_session.sh).
  double l3_prefetch_wait_fraction = 0.5;
  // The compute rate for that before this worker measured its own
  // (PrefillLoad::prefill_tokens_per_second, after its first steps); > 0.
  double l3_prefetch_assumed_tokens_per_second = 2000;
  metrics::Registry* registry = nullptr;
};

// How long a request parked for an L3 prefetch that may bring
// `stake_tokens` waits: max(l3_prefetch_max_wait_ms, l3_prefetch_wait_fraction
// x stake_tokens / rate), the rate being `measured_tokens_per_second` when
// > 0, else options.l3_prefetch_assumed_tokens_per_second.
absl::Duration L3PrefetchWait(const PrefillCoreOptions& options, int64_t stake_tokens,
                              double measured_tokens_per_second);

struct PrefillLoad {
  int queued_requests = 0;
  int64_t queued_uncached_tokens = 0;
  // Prompt tokens computed per second of forward steps (MTP over the prompt
  // included), an exponential average over recent steps (each step's weight
  // decays by 0.9 per later step); 0 before the first step.
  double prefill_tokens_per_second = 0;
  int running_requests = 0;  // computing or shipping
  int64_t completed_total = 0;
  int64_t computed_tokens_total = 0;
  int64_t cached_tokens_total = 0;
  // Queued requests that released their locked prefix hit to unblock
  // admission (requeued as cold prompts).
  int64_t released_hits_total = 0;
  // Prefills that restored a window (counted once the prompt is computed,
  // whether or not the ship then succeeded), and their restored and saved
  // tokens (PrefillResult).
  int64_t window_restores_total = 0;
  int64_t restored_tokens_total = 0;
  int64_t restore_saved_tokens_total = 0;
  // Of window_restores_total, those that started at the window-safe hit.
  int64_t window_restores_from_window_safe_total = 0;
  // Prefills that ended before their last chunk (cancelled, failed) and
  // left what they had computed in the prefix cache, and those tokens
  // (beyond their own hit): a retry resumes there.
  int64_t partial_kept_total = 0;
  int64_t partial_kept_tokens_total = 0;
  // L3 checkpoints written whole (l3_checkpoint_tokens), the tokens
  // checkpoints wrote (beyond the previous checkpoint or the hit; a
  // checkpoint put off in part writes some), and those put off in whole or
  // in part for want of room in the store's write-behind queue.
  int64_t l3_checkpoints_total = 0;
  int64_t l3_checkpoint_tokens_total = 0;
  int64_t l3_checkpoints_skipped_total = 0;
  // SWA checkpoint pages running prompts gave up before hot cached windows
  // (swa_checkpoints_yield).
  int64_t swa_checkpoint_pages_yielded_total = 0;
  // L3 prefetches by outcome: attached pages (hit), found nothing (miss),
  // read pages the cache could not use (unused), the request stopped
  // waiting (timeout), and full pages attached in all.
  int64_t l3_prefetch_hits = 0;
  int64_t l3_prefetch_misses = 0;
  int64_t l3_prefetch_unused = 0;
  int64_t l3_prefetch_timeouts = 0;
  int64_t l3_attached_pages = 0;
  // L2 -> L1 load-backs run on the copier thread (asynchronous) and inline.
  int64_t async_load_backs = 0;
  int64_t sync_load_backs = 0;
  // Cached tokens of completed prefills by the tier they were in when the
  // request arrived (they sum to cached_tokens_total).
  int64_t l1_cached_tokens_total = 0;
  int64_t l2_cached_tokens_total = 0;
  int64_t l3_cached_tokens_total = 0;
};

// Where one request stands (PrefillCore::Progress): what a client waiting
// for the first token of a long prompt is shown.
struct PrefillProgress {
  enum class State { kQueued, kComputing, kShipping };
  State state = State::kQueued;
  int prompt_tokens = 0;
  // Served from the prefix cache (known once the request was matched).
  int cached_tokens = 0;
  // Prompt tokens whose KV exists: cached + computed so far (a window
  // restore's stretch counts as it is recomputed).
  int done_tokens = 0;
  // kQueued: requests in the queue, this one included.
  int queued_requests = 0;
  // PrefillLoad::prefill_tokens_per_second.
  double tokens_per_second = 0;
};

class PrefillCore {
 public:
  static absl::StatusOr<std::unique_ptr<PrefillCore>> Create(const PrefillCoreOptions& options);
  // Stop(): pending requests end with Cancelled.
  ~PrefillCore();
  PrefillCore(const PrefillCore&) = delete;
  PrefillCore& operator=(const PrefillCore&) = delete;

  // Queues a request. InvalidArgument (empty prompt, token id out of range,
  // bad sampling, no callback), OutOfRange (longer than max_prompt_tokens),
  // ResourceExhausted (could never fit in these pools), AlreadyExists,
  // FailedPrecondition after Stop.
  absl::Status Submit(PrefillJob job);
  void Cancel(const std::string& id);
  PrefillLoad GetLoad() const;
  // The request `id`'s progress, or nullopt when it is not here (never
  // submitted, or its callback already ran). Thread-safe; updated by the
  // loop after every step.
  std::optional<PrefillProgress> Progress(const std::string& id) const;
  // For a draining worker, a little before its drain deadline: ends every
  // request that is not shipping its KV (queued, parked, computing) with
  // `status`, keeping what each computed in the prefix cache and writing it
  // through to L3, as a cancel does. Their callbacks run once those L3
  // writes are stored (no path pending in the cache, the store's queue
  // empty) or after l3_flush_timeout, so that the caller's retry on another
  // worker sharing the store finds the chunks there. Blocks until then
  // (or Stop). Requests shipping their KV go on. Once per core.
  void EndAllForDrain(absl::Status status, absl::Duration l3_flush_timeout);
  void Stop();

  struct Impl;

 private:
  explicit PrefillCore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace swaserve::worker
