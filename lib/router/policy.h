// The router's routing policy (docs/architecture.md#request-path, step 1): which length bucket
// a prompt belongs to, which prefill worker of that bucket computes it and
// which decode worker generates from it. Pure functions over snapshots the
// router has already read (worker loads from Redis, the prefix index's
// matched depth per worker): no I/O, no clocks, no randomness, so a decision
// is reproducible from its inputs and any router replica decides the same.
//
// Length buckets. bucket_bounds are EXCLUSIVE upper bounds: bucket i holds
// prompts with bounds[i-1] <= tokens < bounds[i] (bucket 0 starts at 0), the
// same [bucket_min_tokens, bucket_max_tokens) a worker registers
// (lib/cluster/key_schema.h). With the defaults: [0, 64K), [64K, 256K),
// [256K, 1M); a prompt of 1,048,576 tokens or more is OutOfRange (the router
// answers HTTP 413).
//
// Prefill (ChoosePrefill), over the bucket's candidates the caller passes:
//  1. Eligible = healthy and has a load report. None eligible but some
//     healthy: the healthy one with the most cached tokens (ties: tie-break
//     below), reason kNoLoadReport. None healthy: Unavailable.
//  2. cost(w) = queued_uncached_tokens(w)
//             + prompt_tokens - cache_credit * cached_tokens(w)
//     cached_tokens clamped to [0, prompt_tokens]. In words: the prefill
//     compute the worker still owes before it can start this request, plus
//     the compute this request adds there; with compute proportional to
//     uncached tokens that is the request's time to first token in token
//     units (Dynamo's KV-router cost, prefill part, with overlap credit
//     cache_credit, in tokens instead of blocks). Lowest cost wins.
//     Ties (exactly equal costs): fewer running + queued requests, then the
//     tie-break: with tie_break_key != 0 the highest rendezvous hash
//     Hash64(id, tie_break_key) (pass e.g. a hash of the request id, so
//     idle workers share fresh requests evenly instead of the lowest id
//     always winning), then the lower id (byte order).
//  3. Hotspot guard. Let L = the eligible candidate with the fewest
//     queued_uncached_tokens (ties: lower cost, then as in 2). If the
//     winner W of 2 has
//         q(W) - q(L) > hotspot_abs_tokens  AND  q(W) > hotspot_rel * q(L)
//     (q = queued_uncached_tokens; strictly more than BOTH margins, as
//     SGLang's balance_abs/rel thresholds), L is chosen instead, reason
//     kHotspotGuard. The cost in 2 already bounds q(W) - q(L) by
//     cache_credit * (cached(W) - cached(L)) <= cache_credit * prompt, so the
//     guard only acts on long cache hits sitting behind a long queue: it
//     caps the queue a request accepts for its cache, which protects against
//     stale load reports (several router replicas sending the same hot
//     prefix to one worker between reports) more than it changes exact-load
//     decisions.
//  4. Reason otherwise: kOnlyCandidate (one eligible), kCacheAffinity (the
//     winner has more cached tokens than the least-cached eligible
//     candidate: the cache decided), kLeastLoad (it does not).
//
// Decode (ChooseDecode): eligible as above (kNoLoadReport: lowest id of the
// healthy ones, or the tie-break). A request needs
//     full pages = ceil((prompt_tokens + max_tokens) / page_size)
//     SWA pages  = ceil(min(prompt_tokens + max_tokens,
//                           decode_sliding_window + page_size) / page_size)
// (its SWA KV is O(window)). Candidates are ranked by
//   tier: 0 = both needs fit in the free pages and running + staged <
//         max_running_requests (0 = no limit); 1 = the pages fit but the
//         batch is full (it will wait in host staging); 2 = the pages do not
//         fit (it waits for pages to free up);
//   then fewer running + staged requests, then the larger free fraction of
//   the full pool, then the tie-break, then the lower id. Reason: kLeastLoad
//   (tier 0), kNoFreeKv (best tier > 0: every worker is short of KV or batch
//   room), kOnlyCandidate (one eligible).
//
// All functions are thread-safe (pure).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace swaserve::router {

struct PolicyOptions {
  // Exclusive upper bounds of the length buckets 0..n-1 in prompt tokens;
  // strictly increasing, > 0. Defaults: 64K, 256K, 1M (docs/architecture.md#request-path).
  std::vector<int64_t> bucket_bounds = {65536, 262144, 1048576};

  // Prefill: tokens of compute one cached token saves in the cost (>= 0).
  // 1.0: a cached token is exactly a token not computed.
  double cache_credit = 1.0;
  // Weight of a cached token in a worker's lower tier (L2, host memory) in
  // cached_tokens, relative to one in L1 (TieredCredit). Default 0.75: a
  // load-back is a copy at memory bandwidth, far cheaper than recomputing
  // but not free (with device L1 it crosses PCIe). Pages in L3 are not in
  // the index (prefix_index.h), so they are credited 0.
  double lower_tier_credit = 0.75;
  // Prefill hotspot guard: the least-loaded worker wins when the cost
  // winner's queued uncached tokens exceed the least-loaded one's by more
  // than hotspot_abs_tokens AND by a factor of more than hotspot_rel.
  // Defaults chosen on the first half of the Mooncake trace by
  // `policy_sim --tune` (bench/RESULTS.md "Router policy (simulation)"): the
  // lowest P90 TTFT of the sweep with balanced load and >= 2x round-robin's
  // hit rate was 64K tokens (the largest bucket-0 prompt) and 1.5x (SGLang's
  // balance_rel_threshold). With exact loads the guard rarely fires (once in
  // 12,031 requests there); it is a safety valve for stale load reports. Set
  // hotspot_abs_tokens to INT64_MAX to disable.
  int64_t hotspot_abs_tokens = 65536;
  double hotspot_rel = 1.5;

  // Decode: tokens per KV page and the model's sliding window (the router
  // sets them from the workers' records and the model config). Defaults:
  // the MiMo-V2.5-Pro shape (16, 128).
  int32_t page_size = 16;
  int32_t decode_sliding_window = 128;

  // Prefill workers that do not restore windows: how far (pages) below a
  // match's depth the index searches for its window-safe depth L
  // (WindowScanPages); an L further down is credited as 0. Bounds the
  // Redis work per unsafe candidate (one SMISMEMBER member per page).
  // Default 2048 (32K tokens at 16 per page).
  int64_t window_scan_pages = 2048;
};

// OK when the options are usable; InvalidArgument naming the field.
absl::Status ValidatePolicyOptions(const PolicyOptions& options);

// The prefill worker's cached tokens the router credits for a prefix-index
// match of full_tokens (M) tokens: all of them when the match
// ends window-safe or the model has no window; otherwise, for a worker that
// restores windows, M minus what the restore computes, max(L, M − work) for
// the index's window-safe depth L (prefix_index.h Match: exact, or -1 below
// the scan WindowScanPages asks for, where the restore wins anyway), work =
// min(restore_work, M − s) with s = kv::WindowRestoreStart(M) (M − s, the
// whole stretch, when the worker publishes no restore_work); for a worker
// that does not restore, L (0 when the index's scan stopped above it: a
// lower bound).
struct PrefixCreditInputs {
  int64_t full_tokens = 0;
  // L in tokens; >= full_tokens (the default) when the match ends
  // window-safe or nothing is known; -1: below the index's scan bound.
  int64_t window_safe_tokens = INT64_MAX;
  int sliding_window = 0;
  int page_size = 16;
  int swa_chain_layers = 0;
  bool window_restore = false;
  // The worker's cluster::WorkerInfo::window_restore_work: what a restore
  // computes in token-equivalents when it restores as a pyramid (about half
  // the stretch); <= 0: the whole stretch.
  int64_t restore_work = 0;
};
int64_t PrefixCredit(const PrefixCreditInputs& in);
// How many pages below a match's depth the index must search for L
// (PrefixIndex::Match window_scan_pages) for PrefixCredit to be exact: for a
// restoring worker, the fewest pages such that any L further down never
// beats the restore's credit (tested tight): wp + ceil((chain − 1)(W − 1) /
// page) − 1 (wp = WindowPages) for the whole stretch, ceil(restore_work /
// page) − 1 with restore_work; otherwise `non_restoring_pages`
// (PolicyOptions). Reads the fields other than full_tokens and
// window_safe_tokens.
int64_t WindowScanPages(const PrefixCreditInputs& worker, int64_t non_restoring_pages);
// Tiers: of a credit of `credit` tokens, the part past the
// worker's L1 (its first l1_tokens matched tokens) is in its L2 and needs a
// load-back copy before use: it is credited at lower_tier_credit (e.g. 0.75)
// of an L1 token. Returns the weighted credit (rounded down).
int64_t TieredCredit(int64_t credit, int64_t l1_tokens, double lower_tier_credit);
// Pages a window-safe check looks at: ceil((W − 1) / page_size); 0 without a
// window.
int WindowPages(int sliding_window, int page_size);

struct PrefillCandidate {
  std::string id;
  // Matched prefix depth in tokens (the Redis prefix index).
  int64_t cached_tokens = 0;
  // From the worker's load report (swaserve.v1.WorkerLoad).
  int64_t queued_uncached_tokens = 0;
  int32_t running_requests = 0;
  int32_t queued_requests = 0;
  bool healthy = true;
  // False when the worker has no (live) load report.
  bool has_load = true;
  // Its measured prefill throughput (WorkerLoad.prefill_tokens_per_second);
  // 0 = not measured yet.
  double tokens_per_second = 0;
};

struct DecodeCandidate {
  std::string id;
  int64_t free_full_pages = 0;
  int64_t total_full_pages = 0;
  int64_t free_swa_pages = 0;
  int64_t total_swa_pages = 0;
  int32_t running_requests = 0;
  int32_t staged_requests = 0;
  // 0 = unknown / no limit.
  int32_t max_running_requests = 0;
  bool healthy = true;
  bool has_load = true;
};

// Why a worker was chosen (the router's decisions-by-reason metric label).
enum class Reason {
  kCacheAffinity,  // prefill: its cached tokens decided
  kLeastLoad,      // lowest cost / least queue without cache advantage
  kHotspotGuard,   // prefill: the guard overrode the cache winner
  kOnlyCandidate,  // one eligible worker
  kNoLoadReport,   // no eligible worker had a load report
  kNoFreeKv,       // decode: no worker had free KV and batch room
};

// snake_case name of `reason` ("cache_affinity", ...), for metric labels.
std::string_view ReasonName(Reason reason);

struct Decision {
  // Index into the candidate span.
  int index = -1;
  Reason reason = Reason::kLeastLoad;
  // Prefill: the chosen worker's cached tokens (clamped to the prompt).
  int64_t expected_cached_tokens = 0;
};

// Bucket index of a prompt. OutOfRange when prompt_tokens >= the last bound;
// InvalidArgument when prompt_tokens < 0 or the options are invalid.
absl::StatusOr<int> BucketFor(int64_t prompt_tokens,
                              const PolicyOptions& options);

// The prefill worker for a prompt among the candidates of its bucket (see
// the file comment). Unavailable when no candidate is healthy;
// InvalidArgument when prompt_tokens <= 0 or the options are invalid.
absl::StatusOr<Decision> ChoosePrefill(
    int64_t prompt_tokens, absl::Span<const PrefillCandidate> candidates,
    const PolicyOptions& options, uint64_t tie_break_key = 0);

// The decode worker (see the file comment). Unavailable when no candidate is
// healthy; InvalidArgument when prompt_tokens <= 0, max_tokens < 0 or the
// options are invalid.
absl::StatusOr<Decision> ChooseDecode(
    int64_t prompt_tokens, int64_t max_tokens,
    absl::Span<const DecodeCandidate> candidates, const PolicyOptions& options,
    uint64_t tie_break_key = 0);

// Load shedding. A candidate's
// backlog is the prefill compute it still owes in seconds,
// queued_uncached_tokens / tokens_per_second. When EVERY eligible candidate
// (healthy, with a load report) has a measured throughput and a backlog
// above max_backlog_seconds, the bucket is saturated: a new request there
// would only deepen a queue it waits behind, so the router sheds it (429 /
// RESOURCE_EXHAUSTED) instead of letting it time out in a worker's queue.
// Returns the Retry-After in seconds: the time the least-backlogged
// candidate needs at its rate to drain back under the bound (at least
// min_retry_seconds); nullopt when the request is admitted (also when some
// eligible candidate has no measured throughput yet, or none is eligible:
// other checks handle that). max_backlog_seconds <= 0 disables shedding.
std::optional<double> ShedRetryAfterSeconds(absl::Span<const PrefillCandidate> candidates,
                                            double max_backlog_seconds,
                                            double min_retry_seconds = 1.0);

// The prefill cost of a candidate as ChoosePrefill computes it (for
// diagnostics, tests and simulations).
double PrefillCost(int64_t prompt_tokens, const PrefillCandidate& candidate,
                   const PolicyOptions& options);

}  // namespace swaserve::router
