// DecodeScheduler: which requests a decode worker runs in each iteration
// (docs/architecture.md#request-path step 4). Pure policy: no threads, no I/O, no KV pools
// (the worker answers "do this request's pages fit now?" through a callback).
//
// Lifecycle of a request:
//   Stage()      its KV has arrived in host staging memory; it waits;
//   NextIteration() admits waiting requests into the running batch, in order,
//                while the batch has room and can_admit(info) says the pages
//                fit; the worker then moves their KV into the pools;
//   Finish()     a stop condition was hit (the worker decides which);
//   Cancel()     the caller went away, waiting or running;
//   Preempt()    the pools ran out during a running iteration: the worker
//                takes a victim (ChoosePreemptionVictim), frees or swaps out
//                its pages and re-queues it here; it is readmitted later,
//                never failed.
//
// Iteration-level scheduling (continuous batching): every NextIteration()
// returns the whole running batch, so requests join and leave between any
// two forward passes.
//
// Order. Each request gets an admission number the first time it is
// admitted; it keeps that number for life. The running batch is ordered by
// it. The preemption victim is the running request with the largest number
// (the most recently admitted one), so the oldest running request is never
// preempted while a younger one runs and always makes progress (no livelock
// as long as one request fits in the pools). Waiting requests are admitted
// strictly in order, stopping at the first that does not fit (so a large
// request is not starved by smaller ones slipping past it):
//   1. preempted requests, by admission number (the original order);
//   2. staged requests, first staged first.
//
// can_admit(info) returning true commits the scheduler to admit the request
// in this iteration, so the callback may reserve its pages for real (and
// keep some headroom for growth, e.g. a watermark).
//
// Not thread-safe: owned and called by the worker's scheduler thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/metrics/registry.h"
#include "lib/sched/sched_metrics.h"

namespace swaserve::sched {

// A decode request as the scheduler sees it.
struct DecodeRequestInfo {
  // Unique among the scheduler's current requests.
  std::string id;
  // Tokens whose KV must be in the pools when the request is admitted
  // (prompt, plus tokens generated before a preemption). > 0.
  int context_tokens = 0;
  // When it became admissible: staged, or preempted (for the wait metric).
  int64_t ready_ns = 0;
};

// One iteration's decisions.
struct DecodeIteration {
  // Admitted in this iteration, in admission order: the worker moves their
  // KV from staging into the pools before the forward pass.
  std::vector<std::string> admitted;
  // Every running request (admitted ones included), by admission number.
  std::vector<std::string> batch;
};

struct DecodeSchedulerOptions {
  // Most requests in the running batch, > 0.
  int max_batch_size = 64;
  // Optional; receives the role="decode" metrics of sched_metrics.h. Not
  // owned; must outlive the scheduler.
  metrics::Registry* registry = nullptr;
};

class DecodeScheduler {
 public:
  using CanAdmitFn = absl::FunctionRef<bool(const DecodeRequestInfo&)>;

  // InvalidArgument for out-of-range options; registry errors (see
  // SchedMetrics::Create).
  static absl::StatusOr<std::unique_ptr<DecodeScheduler>> Create(
      const DecodeSchedulerOptions& options);
  ~DecodeScheduler();
  DecodeScheduler(const DecodeScheduler&) = delete;
  DecodeScheduler& operator=(const DecodeScheduler&) = delete;

  // Queues a request whose KV is staged. InvalidArgument for an empty id or
  // context_tokens <= 0; AlreadyExists when the id is known.
  absl::Status Stage(const DecodeRequestInfo& info);

  // Admits waiting requests (see the class comment) and returns the batch
  // for the next forward pass. Records the batch-size metric when non-empty.
  DecodeIteration NextIteration(int64_t now_ns, CanAdmitFn can_admit);

  // The running request to preempt when the pools run out: the most
  // recently admitted one (largest admission number). nullopt when nothing
  // runs.
  std::optional<std::string> ChoosePreemptionVictim() const;

  // Moves running request `id` back to the waiting requests, ahead of every
  // staged one (class comment), needing `context_tokens` of KV when
  // readmitted. NotFound when it is not running; InvalidArgument for
  // context_tokens <= 0.
  absl::Status Preempt(absl::string_view id, int context_tokens,
                       int64_t now_ns);

  // Removes running request `id` (it hit a stop condition). NotFound when it
  // is not running.
  absl::Status Finish(absl::string_view id);

  // Removes a waiting or running request; returns whether it was found.
  bool Cancel(absl::string_view id);

  // Staged and preempted requests waiting for admission.
  int waiting_requests() const { return static_cast<int>(waiting_.size()); }
  int running_requests() const { return static_cast<int>(running_.size()); }
  bool IsRunning(absl::string_view id) const;
  bool IsWaiting(absl::string_view id) const;
  uint64_t admitted_total() const { return admitted_total_; }
  uint64_t preempted_total() const { return preempted_total_; }

  const DecodeSchedulerOptions& options() const { return options_; }

 private:
  // Waiting order: (0, admission number) for preempted requests, (1, stage
  // number) for staged ones.
  using WaitKey = std::pair<int, uint64_t>;
  struct Request {
    DecodeRequestInfo info;
    uint64_t admission = 0;  // 0 until first admitted
    uint64_t staged_seq = 0;
    bool running = false;
    WaitKey wait_key() const {
      return admission == 0 ? WaitKey{1, staged_seq} : WaitKey{0, admission};
    }
  };

  DecodeScheduler(const DecodeSchedulerOptions& options, SchedMetrics metrics);

  const DecodeSchedulerOptions options_;
  SchedMetrics metrics_;
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_;
  std::map<WaitKey, Request*> waiting_;
  std::map<uint64_t, Request*> running_;  // by admission number
  uint64_t next_staged_seq_ = 1;
  uint64_t next_admission_ = 1;
  uint64_t admitted_total_ = 0;
  uint64_t preempted_total_ = 0;
};

}  // namespace swaserve::sched
