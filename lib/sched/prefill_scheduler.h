// PrefillScheduler: which prompt tokens a prefill worker computes in its next
// forward step (ARCHITECTURE §4 step 3). Pure policy and batch building: no
// threads, no I/O, no KV pools (the worker answers "does this request's KV
// fit now?" through a callback).
//
// A request is Add()ed with its prompt length and the tokens its prefix-cache
// match covers; only the uncached rest [cached_tokens, prompt_tokens) is
// scheduled, in chunks. Each NextStep() builds one step (one forward pass):
//
//  1. requests already in progress continue first, in the order they started,
//     each with min(chunk_tokens, remaining) tokens, so partially computed KV
//     does not sit idle and few requests are half-done at a time;
//  2. then, while the step has token budget and request slots left, queued
//     requests start in policy order, each with min(chunk_tokens, uncached,
//     budget left) tokens; one that would not finish in this step is skipped
//     (keeping its place) while max_partial_requests requests stay partial:
//       kFcfs          by arrival time;
//       kComputeAware  by uncached tokens minus a wait-time credit,
//                        priority = uncached - aging_tokens_per_second * wait_s
//                      (lowest first). Because every queued request's credit
//                      grows at the same rate, the order never changes while
//                      requests wait: it is the order of
//                        uncached + aging_tokens_per_second * arrival_s,
//                      kept in a balanced tree (O(log n) per operation).
//     Ties go to the earlier arrival, then the smaller id, so the schedule is
//     a deterministic function of the calls.
//  Every step respects: total tokens <= step_token_budget, chunks <=
//  max_requests_per_step, tokens per request <= chunk_tokens, requests in
//  progress afterwards <= max_partial_requests; every uncached token of a
//  request is handed out exactly once, in order.
//
// No starvation (compute-aware): a request R (uncached U, arrival t) can only
// be overtaken by requests whose priority is lower, i.e. ones that arrived
// before it or arrive before t + U / aging_tokens_per_second. So R starts at
// the latest once the work queued at its arrival plus the work arriving in
// the next U / aging seconds is done (tests/unit/sched/sched_property_test.cc
// states and checks the exact bound, partial cap included).
// aging_tokens_per_second = 0 is pure shortest-first, which can starve long
// requests; a very large value approaches FCFS.
//
// Memory: before a queued request starts, NextStep() calls can_start(info).
// true commits the scheduler to start it in this very step, so the callback
// may reserve the request's KV pages for real (all of its uncached tokens; a
// started request's later chunks are not asked again). false skips it for
// this step; it keeps its place in the queue. To keep memory pressure from
// starving a large request, once a refused request has waited
// refusal_block_after_seconds no request behind it starts (requests in
// progress continue and free memory as they finish). The worker must
// therefore reject, before Add(), any request that could not fit in empty
// pools.
//
// State advances when a step is handed out: its tokens count as done. The
// worker runs the step, then asks for the next one (steps may be pipelined).
// A request leaves the scheduler with its last chunk (chunk.last); if the
// forward pass fails the worker fails those requests itself and Cancel()s
// the others it wants to drop. Cancel() of a queued or in-progress request
// removes it from all future steps; the worker frees its memory.
//
// Not thread-safe: owned and called by the worker's scheduler thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/metrics/registry.h"
#include "lib/sched/sched_metrics.h"

namespace swaserve::sched {

// A prefill request as the scheduler sees it.
struct PrefillRequestInfo {
  // Unique among the scheduler's current requests (e.g. the request id).
  std::string id;
  // Prompt length in tokens (> 0).
  int prompt_tokens = 0;
  // Leading tokens whose KV comes from the prefix cache, 0 <= cached <
  // prompt_tokens: the last prompt token is always computed, since its
  // logits give the first output token.
  int cached_tokens = 0;
  // Arrival time (any monotonic clock; the same one as NextStep's now_ns).
  int64_t arrival_ns = 0;

  int uncached_tokens() const { return prompt_tokens - cached_tokens; }
};

// Tokens [start_token, start_token + num_tokens) of one request's prompt.
struct PrefillChunk {
  std::string id;
  // Position in the prompt of the chunk's first token (the first chunk
  // starts at cached_tokens).
  int start_token = 0;
  int num_tokens = 0;
  // The request started in this step (its can_start returned true).
  bool first = false;
  // The chunk ends the prompt: the worker samples the first token, and the
  // request has left the scheduler.
  bool last = false;
};

// One forward step: continuing requests first (in start order), then new
// starts (in policy order). Empty when there is nothing to run.
struct PrefillStep {
  std::vector<PrefillChunk> chunks;

  bool empty() const { return chunks.empty(); }
  // Sum of num_tokens over the chunks.
  int total_tokens() const;
};

struct PrefillSchedulerOptions {
  enum class Policy { kFcfs, kComputeAware };
  Policy policy = Policy::kComputeAware;
  // Wait-time credit of kComputeAware, in tokens per second of waiting
  // (>= 0, finite). A request with U uncached tokens can be overtaken only
  // by requests arriving within U / aging seconds after it: with aging = r x
  // the worker's prefill throughput X (tokens/s), within 1/r times its own
  // compute time. Set it to about 0.1 x X: in the trace simulation
  // (bench/sched/sched_trace_sim, bench/RESULTS.md "Scheduling (lib/sched)")
  // r = 0.1 cut P90 TTFT by 38-44% against FCFS, the longest TTFT 1.3-1.4x
  // FCFS's; r = 0 (pure shortest-first) cuts P90 by ~50% but the longest
  // TTFT grows to 3.1-3.3x FCFS's; larger r approaches FCFS (r = 0.15:
  // 30-36%, r = 1: 11-12%). The default, 8, is 0.1 x the throughput of the
  // CPU engine measured there (mimo-v2.5-pro-mini, one core, ~80 tokens/s);
  // scale it with X.
  double aging_tokens_per_second = 8;
  // Most tokens of one request in one step (the chunk size), > 0.
  int chunk_tokens = 512;
  // Most tokens of one step over all requests, > 0.
  int step_token_budget = 2048;
  // Most requests in one step, > 0.
  int max_requests_per_step = 8;
  // Most requests left partially computed after a step (vLLM's
  // max_num_partial_prefills): a queued request that would not finish in
  // the step it starts in may start only while fewer than this many are in
  // progress; requests that finish in one step may always start. Keeps a
  // few long prompts in progress from taking every step's whole budget
  // (they continue first) while short ones queue. > 0.
  int max_partial_requests = 1;
  // Most can_start refusals per NextStep; after that no more new requests
  // are tried in that step (bounds the callback work when memory is full).
  // > 0.
  int max_refusals_per_step = 16;
  // A refused request that has waited at least this long blocks every
  // request behind it in the queue from starting (head-of-line) until it
  // fits. >= 0; +infinity disables the guard.
  double refusal_block_after_seconds = 5.0;
  // Optional; receives the role="prefill" metrics of sched_metrics.h. Not
  // owned; must outlive the scheduler.
  metrics::Registry* registry = nullptr;
};

class PrefillScheduler {
 public:
  using CanStartFn = absl::FunctionRef<bool(const PrefillRequestInfo&)>;

  // InvalidArgument for out-of-range options; registry errors (see
  // SchedMetrics::Create).
  static absl::StatusOr<std::unique_ptr<PrefillScheduler>> Create(
      const PrefillSchedulerOptions& options);
  ~PrefillScheduler();
  PrefillScheduler(const PrefillScheduler&) = delete;
  PrefillScheduler& operator=(const PrefillScheduler&) = delete;

  // Queues a request. InvalidArgument for an empty id or out-of-range token
  // counts; AlreadyExists when the id is queued or in progress.
  absl::Status Add(const PrefillRequestInfo& info);

  // Removes a queued or in-progress request from all future steps; returns
  // whether it was found (false also after its last chunk was handed out).
  bool Cancel(absl::string_view id);

  // Builds the next step at time `now_ns` (see the class comment); calls
  // `can_start` for each queued request it is about to start.
  PrefillStep NextStep(int64_t now_ns, CanStartFn can_start);
  // As above with memory never refusing.
  PrefillStep NextStep(int64_t now_ns);

  // Requests not yet started.
  int queued_requests() const { return static_cast<int>(queue_.size()); }
  // Requests started with chunks still to hand out.
  int in_progress_requests() const {
    return static_cast<int>(in_progress_.size());
  }
  // Uncached tokens not yet handed to a step, over queued and in-progress
  // requests (the load a worker reports, ARCHITECTURE §5).
  int64_t queued_uncached_tokens() const { return queued_uncached_tokens_; }
  // Arrival of the oldest not-started request; nullopt when none.
  std::optional<int64_t> oldest_arrival_ns() const;
  // now_ns minus oldest_arrival_ns(), 0 when none (or negative).
  int64_t OldestWaitNs(int64_t now_ns) const;
  // Whether `id` is queued or in progress.
  bool Contains(absl::string_view id) const;

  const PrefillSchedulerOptions& options() const { return options_; }

 private:
  struct Request {
    PrefillRequestInfo info;
    // Static priority: smaller starts first (class comment).
    double key = 0;
    // Next prompt position to hand out.
    int next_token = 0;
    // Order of start; 0 while queued.
    uint64_t start_seq = 0;
  };
  struct PriorityLess {
    bool operator()(const Request* a, const Request* b) const;
  };
  struct ArrivalLess {
    bool operator()(const Request* a, const Request* b) const;
  };

  PrefillScheduler(const PrefillSchedulerOptions& options,
                   SchedMetrics metrics);
  // Appends a chunk of `n` tokens of `r` to `step`; true when it was the last.
  bool TakeChunk(Request* r, int n, bool first, PrefillStep* step);
  // Removes queued `r` from the queue's indexes.
  void Unqueue(Request* r);

  const PrefillSchedulerOptions options_;
  SchedMetrics metrics_;
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_;
  std::set<Request*, PriorityLess> queue_;      // not started, policy order
  std::set<Request*, ArrivalLess> by_arrival_;  // not started, arrival order
  std::map<uint64_t, Request*> in_progress_;    // by start_seq
  uint64_t next_start_seq_ = 1;
  int64_t queued_uncached_tokens_ = 0;
};

}  // namespace swaserve::sched
