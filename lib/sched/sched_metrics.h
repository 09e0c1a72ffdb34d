// Prometheus metrics of the prefill and decode schedulers (docs/architecture.md#observability).
// Every family carries the label role="prefill"|"decode":
//
//   swaserve_sched_queue_depth{role}        gauge: requests waiting to start
//                                           (prefill: not started; decode:
//                                           staged or preempted)
//   swaserve_sched_running_requests{role}   gauge: prefill: started, chunks
//                                           left; decode: the running batch
//   swaserve_sched_queued_tokens{role}      gauge: prefill: uncached tokens not
//                                           yet handed to a step (queued and
//                                           in progress); decode: context
//                                           tokens of waiting requests
//   swaserve_sched_wait_seconds{role}       histogram: arrival -> first chunk
//                                           (prefill); staged or preempted ->
//                                           admitted (decode)
//   swaserve_sched_admitted_total{role}     prefill starts; decode admissions
//                                           (readmissions after preemption
//                                           count again)
//   swaserve_sched_preempted_total{role}    decode preemptions (prefill: 0)
//   swaserve_sched_cancelled_total{role}    Cancel() calls that found the id
//   swaserve_sched_guarded_starts_total{role} prefill starts the FCFS-wait
//                                           guard moved ahead of a request
//                                           earlier in priority order
//   swaserve_sched_batch_size{role}         histogram: requests in a non-empty
//                                           prefill step / decode iteration
//   swaserve_sched_fcfs_wait_ratio{role}    histogram: prefill starts with the
//                                           FCFS-wait guard on, whose FCFS
//                                           wait the shadow knew: wait /
//                                           max(FCFS wait, one step, the
//                                           step in flight at arrival), on
//                                           the guard's work clock (the guard
//                                           keeps it <= fcfs_wait_ratio)
//   swaserve_sched_guard_late_starts_total{role} of those, starts after the
//                                           deadline (the guard missed it)
//
// Gauges are changed by increments, so several schedulers of one role on one
// registry add up; a scheduler subtracts what it still holds when destroyed.
//
// SchedMetrics is a bundle of cached child pointers into a Registry the
// caller owns (it must outlive the scheduler). A default-constructed bundle
// (no registry) records nothing. Thread-safe as the registry is.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/metrics/registry.h"

namespace swaserve::sched {

class SchedMetrics {
 public:
  // Registers the families above on `registry` (or finds the identical
  // existing ones) and caches the children of `role`. AlreadyExists when a
  // family of the same name with another definition is registered. A null
  // registry gives the no-op bundle.
  static absl::StatusOr<SchedMetrics> Create(metrics::Registry* registry,
                                             absl::string_view role);

  SchedMetrics() = default;

  // Each is a no-op without a registry.
  void AddQueued(int requests, double tokens);
  void AddRunning(int requests);
  void ObserveWait(int64_t arrival_ns, int64_t now_ns);
  void CountAdmitted();
  void CountPreempted();
  void CountCancelled();
  void CountGuarded();
  void ObserveBatch(int requests);
  void ObserveFcfsWaitRatio(double ratio);
  void CountLateStart();

 private:
  metrics::Gauge* queue_depth_ = nullptr;
  metrics::Gauge* running_ = nullptr;
  metrics::Gauge* queued_tokens_ = nullptr;
  metrics::Histogram* wait_seconds_ = nullptr;
  metrics::Counter* admitted_ = nullptr;
  metrics::Counter* preempted_ = nullptr;
  metrics::Counter* cancelled_ = nullptr;
  metrics::Counter* guarded_ = nullptr;
  metrics::Histogram* batch_size_ = nullptr;
  metrics::Histogram* fcfs_wait_ratio_ = nullptr;
  metrics::Counter* late_starts_ = nullptr;
};

}  // namespace swaserve::sched
