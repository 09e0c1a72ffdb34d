// PrefillScheduler: which prompt tokens a prefill worker computes in its next
// forward step (docs/architecture.md#request-path step 3). Pure policy and batch building: no
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
//     Ties go to the earlier arrival, then the earlier Add(), so the schedule is
//     a deterministic function of the calls.
//  Every step respects: total tokens <= step_token_budget, chunks <=
//  max_requests_per_step, tokens per request <= chunk_tokens, requests in
//  progress afterwards <= max_partial_requests; every uncached token of a
//  request is handed out exactly once, in order.
//
// No starvation (compute-aware, guard off): a request R (uncached U,
// arrival t) can only be overtaken by requests whose priority is lower, i.e. ones that arrived
// before it or arrive before t + U / aging_tokens_per_second. So R starts at
// the latest once the work queued at its arrival plus the work arriving in
// the next U / aging seconds is done (tests/unit/sched/sched_property_test.cc
// states and checks the exact bound, partial cap included).
// aging_tokens_per_second = 0 is pure shortest-first, which can starve long
// requests; a very large value approaches FCFS.
//
// FCFS-relative wait guard (compute-aware, fcfs_wait_ratio > 0): aging bounds
// how long a request waits, but not relative to what FCFS would have made it
// wait: a long prompt that arrives at a quiet moment starts at once under
// FCFS, yet every shorter prompt arriving during its first U / aging seconds
// may overtake it. The guard measures waits on a work clock, the work handed
// to steps so far (work_clock(); a token at prompt position s counts
// 1 + context_cost_per_token * s, so that long-context chunks count what
// they cost). A shadow FCFS scheduler (same options, policy kFcfs) is fed
// the same requests. When it starts a request that has not started here,
// that request's FCFS wait W is known (shadow work clock at the start of
// the step holding its first chunk minus at its Add) and it gets the
// deadline
//   deadline = A + max(fcfs_wait_ratio * max(W, floor) - S, 0)
// where A is this work clock at Add (the end of the step in flight, which
// was handed out before the request arrived), S that step's work (the wait
// counts from arrival, up to S before A) and floor fcfs_wait_floor_tokens,
// by default one step's budget (a request arriving mid-step waits for the
// step boundary under any policy). Each NextStep() first estimates where
// the step it builds will end (the next step's start: the chunks of the
// requests in progress, then the rest of the budget at a new chunk's
// context but no more than the queued work, at least the last step's work)
// and runs the shadow until every deadline
// before that point is known. Queued requests due before it start first,
// in deadline order, ahead of the requests in progress and beyond
// max_partial_requests. Before each further start, the queued requests with
// deadlines are laid out in deadline order behind the work in progress; a
// candidate (in priority order) may start only if starting it first would
// push no request with an earlier deadline past it (candidates without a
// deadline yet count as latest). The deadline order itself is always
// allowed, so the guard turns priority order into earliest-deadline-first
// exactly when shortest-first would break some request's bound, and costs
// one comparison otherwise (the earliest deadline against all queued work;
// the O(queued) layout runs only when some request is near its deadline).
// Nothing starves with the guard on either: the shadow (FCFS) gives every
// request a finite deadline, and a request past it is passed only by
// requests with earlier deadlines (all others now count as pushing it
// further). It is not a proof: the shadow sees this run's prefix hits,
// request sizes and step boundaries, not a real FCFS run's, so a few
// requests still exceed ratio x their FCFS wait, and under overload with
// prefix hits many can (a delayed turn loses the prefix hit of the next
// one, which then costs more, in the shadow too)
// (tests/unit/sched/fcfs_guard_property_test.cc, bench/RESULTS.md).
//
// Priorities: queued requests are ordered by PrefillRequestInfo::priority
// first (lower values first), then by the policy's key, in both policies and
// in the guard's shadow, which is therefore a priority-then-FCFS scheduler.
// So a request of a lower value is tried before every request of a higher
// one; requests in progress still continue first (no preemption), and a
// request skipped in a step (memory, the partial cap) lets the next in order
// try. Under the guard, a request whose turn came in the shadow keeps its
// deadline even if higher-priority requests arrive later: it may then start
// ahead of them when due, so no priority value starves one that the shadow
// has reached (a value that the shadow never reaches, because higher ones
// keep it busy, waits: strict priority).
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
  // Scheduling priority (the request's GenerateRequest.priority, vLLM's
  // convention): queued requests are tried in ascending priority, the
  // policy's order applying within one value (class comment, "Priorities").
  int priority = 0;

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
  // First chunks with the FCFS-wait guard on, when the shadow knew the
  // request's FCFS wait: the ratio swaserve_sched_fcfs_wait_ratio observes
  // (wait / max(FCFS wait, floor, step in flight at arrival), work clock)
  // and whether it started after its deadline. -1 / false otherwise.
  double fcfs_wait_ratio = -1;
  bool late = false;
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
  // compute time. Without the FCFS-wait guard, about 0.1 x X: in the trace
  // simulation (bench/sched/sched_trace_sim, bench/RESULTS.md "Scheduling
  // (lib/sched)") r = 0.1 cut P90 TTFT by 38-44% against FCFS, the longest
  // TTFT 1.3-1.4x FCFS's; r = 0 (pure shortest-first) cuts P90 by ~50% but
  // the longest TTFT grows to 3.1-3.3x FCFS's; larger r approaches FCFS
  // (r = 0.15: 30-36%, r = 1: 11-12%). With the guard (the default), which
  // bounds waits relative to FCFS itself, less aging keeps more of the gain:
  // the default, 2, is 0.025 x the throughput of the CPU engine measured
  // there (mimo-v2.5-pro-mini, one core, ~80 tokens/s); scale it with X.
  double aging_tokens_per_second = 2;
  // FCFS-relative wait guard of kComputeAware (class comment): a request
  // should start before fcfs_wait_ratio x max(its wait under FCFS, floor)
  // of work has been handed out since its arrival. 0 disables the guard;
  // >= 0, finite. Below the 2x the scheduler's target allows, as the guard's view of
  // FCFS is approximate: in the trace simulation (bench/RESULTS.md, prefix
  // hits) 1.7 left no request over 2x at 70-85% utilisation and cut P90
  // TTFT by 31-38% (2.0: 3 of 12,031 over 2x, P90 -46%); higher ratios keep
  // more of shortest-first's gain.
  double fcfs_wait_ratio = 1.7;
  // Least FCFS wait the guard assumes, in token-equivalents (>= 0; < 0
  // means step_token_budget, one full step): a request arriving mid-step
  // waits for the step boundary under any policy.
  int fcfs_wait_floor_tokens = -1;
  // The guard's work clock counts a prompt token as 1 + k x the keys it
  // attends to (its position), k = context_cost_per_token: the cost of
  // attention per key relative to the rest of a token's compute (the
  // worker derives it from the model; bench/sched/sched_trace_sim from its
  // cost fit). 0 counts plain tokens. >= 0, finite.
  double context_cost_per_token = 0;
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

// Work of prompt tokens [start, start + n) in token-equivalents: each
// token counts 1 + k × the keys it attends to (its position), k =
// context_cost_per_token (see PrefillSchedulerOptions). The same for any
// chunking of the range.
double PrefillWork(double context_cost_per_token, int64_t start, int64_t n);

// Window restore (kv::WindowRestoreStart, docs/architecture.md#kv-cache): a prompt whose
// full KV is cached to M but whose window-safe hit ends at L < M either
// computes from L (recomputing [L, M)) or restores the window: recomputes
// only [s, M), s = the restore start, whose full layers attend over the
// cached full KV, then continues from M. Both compute everything after M
// alike, so the choice compares the work of [L, M) with that of [s, M).
// A restore may also start at L itself (kv::PlanWindowRestoreStretch: when
// L is past s, the stretch [L, M) with the cached full KV is less work than
// an ordinary prefill of it); a start below L is not a restore.
struct WindowRestoreInputs {
  int window_safe_tokens = 0;  // L
  int full_tokens = 0;         // M
  int restore_from = 0;        // s (or L)
  // The restore's work in tokens: computed as that many tokens ending at M.
  // < 0: M − s (every layer over [s, M)); a pyramid restore
  // (kv::WindowRestorePyramidWork) costs about half.
  double restore_tokens = -1;
  double context_cost_per_token = 0;
  // Least work the restore must save, in token-equivalents (>= 0).
  double min_saved_work = 0;
};
struct WindowRestoreChoice {
  bool restore = false;
  // Where the request's compute starts: s when restoring, else L. The
  // scheduler's cached tokens (what it credits) are exactly this.
  int compute_from = 0;
  // Work of [L, M) minus the work of [s, M) (0 without a restore).
  double saved_work = 0;
};
WindowRestoreChoice ChooseWindowRestore(const WindowRestoreInputs& in);

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
  // requests (the load a worker reports, docs/architecture.md#redis-state).
  int64_t queued_uncached_tokens() const { return queued_uncached_tokens_; }
  // Arrival of the oldest not-started request; nullopt when none.
  std::optional<int64_t> oldest_arrival_ns() const;
  // now_ns minus oldest_arrival_ns(), 0 when none (or negative).
  int64_t OldestWaitNs(int64_t now_ns) const;
  // Whether `id` is queued or in progress.
  bool Contains(absl::string_view id) const;
  // Work handed to steps so far, in token-equivalents (the guard's work
  // clock; see context_cost_per_token).
  double work_clock() const { return work_clock_; }
  // Starts the FCFS-wait guard moved ahead of a request earlier in priority
  // order.
  int64_t guarded_starts() const { return guarded_starts_; }
  // Starts at a step that began after the request's deadline (the guard
  // missed it: more requests were due than one step holds, a step ran past
  // its estimate, or memory refused it). Requests that start before the shadow knows their FCFS
  // wait are not counted (they started no later than FCFS would have).
  int64_t late_starts() const { return late_starts_; }

  const PrefillSchedulerOptions& options() const { return options_; }

 private:
  struct Request {
    PrefillRequestInfo info;
    // Static priority: smaller starts first (class comment).
    double key = 0;
    // Order of Add(): the last tie-break (a shadow given the same calls
    // breaks ties the same way).
    uint64_t add_seq = 0;
    // Next prompt position to hand out.
    int next_token = 0;
    // Order of start; 0 while queued.
    uint64_t start_seq = 0;
    // FCFS-wait guard (class comment): id in the shadow FCFS scheduler, work
    // clocks here and there at Add(), and the deadline on this work clock
    // once the shadow has started the request.
    uint64_t shadow_id = 0;
    double add_clock = 0;
    double shadow_add_clock = 0;
    // Work of the step in flight at Add() (handed out before it arrived):
    // its wait counts from arrival, up to this much before add_clock.
    double arrival_slack = 0;
    bool has_deadline = false;
    double deadline = 0;
    // Its FCFS wait on the shadow's work clock, once has_deadline.
    double fcfs_wait = 0;
    // Work of the uncached tokens, Cost(cached_tokens, uncached_tokens).
    double cost = 0;
    // Scratch of the guard's layout: the least slack (deadline minus
    // projected start) among requests with an earlier deadline.
    double slack_before = 0;
  };
  struct PriorityLess {
    bool operator()(const Request* a, const Request* b) const;
  };
  struct ArrivalLess {
    bool operator()(const Request* a, const Request* b) const;
  };
  struct DeadlineLess {
    bool operator()(const Request* a, const Request* b) const;
  };

  PrefillScheduler(const PrefillSchedulerOptions& options,
                   SchedMetrics metrics);
  // Appends a chunk of `n` tokens of `r` to `step`; true when it was the last.
  bool TakeChunk(Request* r, int n, bool first, PrefillStep* step);
  // NextStep's parts. One step's working state (prefill_scheduler.cc).
  struct StepState;
  // Chunks of requests in progress, oldest start first, within the step's
  // budget less `reserve` and at most `slots` chunks.
  void ContinueInProgress(StepState& s, int reserve, size_t slots);
  // Tries to start queued `r` (`urgent`: may pass the partial cap); sets
  // s.stop when no other may be tried. Returns whether it started.
  bool TryStart(StepState& s, Request* r, bool urgent);
  // Starts queued requests with the guard on: `due` first, then policy
  // order with each start re-laying the deadlines out.
  void StartGuarded(StepState& s, const std::vector<Request*>& due);
  // Removes queued `r` from the queue's indexes.
  void Unqueue(Request* r);
  bool guard_on() const;
  // Work of prompt tokens [start, start + n) in token-equivalents.
  double Cost(int start, int n) const;
  // Work clock at which the next queued request's work would start.
  double WorkAhead() const;
  // Lays the queued requests out in deadline order and sets their
  // slack_before; false when every request is safe whatever starts (the
  // fast path), in which case slack_before is not set.
  bool LayOutDeadlines();
  // The guard's least FCFS wait, in token-equivalents.
  double GuardFloor() const;
  // Deadline of `r` given its FCFS wait on the shadow's work clock.
  double DeadlineFor(const Request& r, double fcfs_wait) const;
  // Estimate of the work of the step about to be built (class comment).
  double StepWorkEstimate() const;
  // Adds `r` (queued here, not started by the shadow) to or removes it from
  // unshadowed_a_ / unshadowed_b_.
  void TrackUnshadowed(Request* r, bool insert);
  // Whether the shadow must run on for every deadline before `target` to
  // be known: its clock is before `target`, or a request it has not started
  // could get a deadline before `target`.
  bool ShadowBehind(double target) const;
  // Runs the shadow FCFS scheduler while ShadowBehind(target), giving
  // deadlines to the requests it starts.
  void AdvanceShadow(int64_t now_ns, double target);

  const PrefillSchedulerOptions options_;
  SchedMetrics metrics_;
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_;
  std::set<Request*, PriorityLess> queue_;      // not started, policy order
  std::set<Request*, ArrivalLess> by_arrival_;  // not started, arrival order
  // FCFS-wait guard only: requests not started here whose deadline is
  // known, the shadow FCFS scheduler, and requests not started here that
  // the shadow has not started either, by shadow id.
  std::set<Request*, DeadlineLess> by_deadline_;
  std::unique_ptr<PrefillScheduler> shadow_;
  absl::flat_hash_map<uint64_t, Request*> by_shadow_id_;
  // The same requests by the two terms of their least possible deadline
  // (TrackUnshadowed), with their shadow ids.
  std::set<std::pair<double, uint64_t>> unshadowed_a_, unshadowed_b_;
  uint64_t next_shadow_id_ = 1;
  double least_slack_ = 0;
  std::map<uint64_t, Request*> in_progress_;    // by start_seq
  uint64_t next_start_seq_ = 1;
  uint64_t next_add_seq_ = 1;
  int64_t queued_uncached_tokens_ = 0;
  // Work (Cost) not yet handed out, of queued and in-progress requests, and
  // of the queued ones only; the work clock.
  double pending_cost_ = 0;
  double not_started_cost_ = 0;
  double work_clock_ = 0;
  // Work of the last step handed out: the step in flight for requests
  // added now (arrival_slack) and a floor of StepWorkEstimate().
  double last_step_cost_ = 0;
  int64_t guarded_starts_ = 0;
  int64_t late_starts_ = 0;
};

}  // namespace swaserve::sched
