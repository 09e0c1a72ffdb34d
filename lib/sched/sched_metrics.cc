#include "lib/sched/sched_metrics.h"

#include <algorithm>
#include <string>
#include <vector>

#include "lib/base/status.h"
#include "lib/metrics/buckets.h"

namespace swaserve::sched {

absl::StatusOr<SchedMetrics> SchedMetrics::Create(metrics::Registry* registry,
                                                  absl::string_view role) {
  SchedMetrics m;
  if (registry == nullptr) return m;
  const std::vector<std::string> labels = {"role"};
  const absl::string_view values[] = {role};
  ASSIGN_OR_RETURN(
      metrics::GaugeFamily * depth,
      registry->AddGauge("swaserve_sched_queue_depth",
                         "Requests waiting for the scheduler to start them "
                         "(prefill: not started; decode: staged or preempted).",
                         labels));
  ASSIGN_OR_RETURN(
      metrics::GaugeFamily * running,
      registry->AddGauge("swaserve_sched_running_requests",
                         "Prefill: requests started with chunks left; decode: "
                         "requests in the running batch.",
                         labels));
  ASSIGN_OR_RETURN(
      metrics::GaugeFamily * tokens,
      registry->AddGauge("swaserve_sched_queued_tokens",
                         "Prefill: uncached prompt tokens not yet scheduled; "
                         "decode: context tokens of waiting requests.",
                         labels));
  ASSIGN_OR_RETURN(
      metrics::HistogramFamily * wait,
      registry->AddHistogram("swaserve_sched_wait_seconds",
                             "Time from arrival (prefill) or staging/"
                             "preemption (decode) to being started/admitted.",
                             labels, metrics::DefaultLatencyBuckets()));
  ASSIGN_OR_RETURN(
      metrics::CounterFamily * admitted,
      registry->AddCounter("swaserve_sched_admitted_total",
                           "Requests started (prefill) or admitted into the "
                           "running batch (decode, readmissions included).",
                           labels));
  ASSIGN_OR_RETURN(metrics::CounterFamily * preempted,
                   registry->AddCounter(
                       "swaserve_sched_preempted_total",
                       "Running requests preempted and re-queued.", labels));
  ASSIGN_OR_RETURN(metrics::CounterFamily * cancelled,
                   registry->AddCounter(
                       "swaserve_sched_cancelled_total",
                       "Requests cancelled while queued or running.", labels));
  ASSIGN_OR_RETURN(metrics::CounterFamily * guarded,
                   registry->AddCounter(
                       "swaserve_sched_guarded_starts_total",
                       "Prefill starts the FCFS-wait guard moved ahead of a "
                       "request earlier in priority order (decode: 0).",
                       labels));
  ASSIGN_OR_RETURN(std::vector<double> batch_buckets,
                   metrics::ExponentialBuckets(1, 2, 10));  // 1 .. 512
  ASSIGN_OR_RETURN(
      metrics::HistogramFamily * batch,
      registry->AddHistogram("swaserve_sched_batch_size",
                             "Requests per prefill step or decode iteration.",
                             labels, batch_buckets));
  ASSIGN_OR_RETURN(
      metrics::HistogramFamily * ratio,
      registry->AddHistogram(
          "swaserve_sched_fcfs_wait_ratio",
          "Prefill starts with the FCFS-wait guard on: scheduling wait / "
          "max(the wait FCFS would have given it, one step, the step in "
          "flight at arrival), on the guard's work clock; the guard keeps it "
          "under fcfs_wait_ratio.",
          labels, {0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 5, 10}));
  ASSIGN_OR_RETURN(metrics::CounterFamily * late,
                   registry->AddCounter(
                       "swaserve_sched_guard_late_starts_total",
                       "Prefill starts after the FCFS-wait guard's deadline "
                       "(more requests due than a step holds, or memory).",
                       labels));
  m.queue_depth_ = &depth->WithLabels(values);
  m.running_ = &running->WithLabels(values);
  m.queued_tokens_ = &tokens->WithLabels(values);
  m.wait_seconds_ = &wait->WithLabels(values);
  m.admitted_ = &admitted->WithLabels(values);
  m.preempted_ = &preempted->WithLabels(values);
  m.cancelled_ = &cancelled->WithLabels(values);
  m.guarded_ = &guarded->WithLabels(values);
  m.batch_size_ = &batch->WithLabels(values);
  m.fcfs_wait_ratio_ = &ratio->WithLabels(values);
  m.late_starts_ = &late->WithLabels(values);
  return m;
}

void SchedMetrics::AddQueued(int requests, double tokens) {
  if (queue_depth_ == nullptr) return;
  queue_depth_->Increment(requests);
  queued_tokens_->Increment(tokens);
}

void SchedMetrics::AddRunning(int requests) {
  if (running_ != nullptr) running_->Increment(requests);
}

void SchedMetrics::ObserveWait(int64_t arrival_ns, int64_t now_ns) {
  if (wait_seconds_ == nullptr) return;
  wait_seconds_->Observe(std::max<int64_t>(0, now_ns - arrival_ns) * 1e-9);
}

void SchedMetrics::CountAdmitted() {
  if (admitted_ != nullptr) admitted_->Increment();
}

void SchedMetrics::CountPreempted() {
  if (preempted_ != nullptr) preempted_->Increment();
}

void SchedMetrics::CountCancelled() {
  if (cancelled_ != nullptr) cancelled_->Increment();
}

void SchedMetrics::CountGuarded() {
  if (guarded_ != nullptr) guarded_->Increment();
}

void SchedMetrics::ObserveBatch(int requests) {
  if (batch_size_ != nullptr) batch_size_->Observe(requests);
}

void SchedMetrics::ObserveFcfsWaitRatio(double ratio) {
  if (fcfs_wait_ratio_ != nullptr) fcfs_wait_ratio_->Observe(ratio);
}

void SchedMetrics::CountLateStart() {
  if (late_starts_ != nullptr) late_starts_->Increment();
}

}  // namespace swaserve::sched
