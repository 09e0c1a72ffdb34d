#include "lib/sched/sched_metrics.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "lib/metrics/registry.h"
#include "lib/sched/decode_scheduler.h"
#include "lib/sched/prefill_scheduler.h"

namespace swaserve::sched {
namespace {

constexpr int64_t kSec = 1'000'000'000;

// The value of the sample `series` (name plus labels exactly as rendered),
// or -1 when absent.
double Sample(const metrics::Registry& registry, absl::string_view series) {
  const std::string text = registry.RenderText();
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series) && line.size() > series.size() &&
        line[series.size()] == ' ') {
      return std::strtod(std::string(line.substr(series.size() + 1)).c_str(),
                         nullptr);
    }
  }
  return -1;
}

TEST(SchedMetricsTest, NoRegistryRecordsNothing) {
  auto m = SchedMetrics::Create(nullptr, "prefill");
  ASSERT_TRUE(m.ok());
  m->AddQueued(1, 2);  // must not crash
  m->ObserveWait(0, kSec);
}

TEST(SchedMetricsTest, ConflictingFamilyFailsCreate) {
  metrics::Registry registry;
  ASSERT_TRUE(registry.AddGauge("swaserve_sched_queue_depth", "other").ok());
  PrefillSchedulerOptions o;
  o.registry = &registry;
  EXPECT_EQ(PrefillScheduler::Create(o).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(SchedMetricsTest, PrefillSchedulerReports) {
  metrics::Registry registry;
  PrefillSchedulerOptions o;
  o.registry = &registry;
  o.chunk_tokens = 100;
  o.max_partial_requests = 2;
  {
    auto s = *PrefillScheduler::Create(o);
    ASSERT_TRUE(s->Add({"a", 250, 0, 0}).ok());
    ASSERT_TRUE(s->Add({"b", 40, 0, 0}).ok());
    ASSERT_TRUE(s->Add({"c", 900, 0, 0}).ok());
    EXPECT_EQ(Sample(registry, "swaserve_sched_queue_depth{role=\"prefill\"}"),
              3);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_queued_tokens{role=\"prefill\"}"),
        1190);
    s->NextStep(2 * kSec);  // b (done), a (100), c (100)
    EXPECT_EQ(Sample(registry, "swaserve_sched_queue_depth{role=\"prefill\"}"),
              0);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_running_requests{role=\"prefill\"}"),
        2);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_queued_tokens{role=\"prefill\"}"),
        950);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_admitted_total{role=\"prefill\"}"), 3);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_wait_seconds_count{role=\"prefill\"}"),
        3);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_wait_seconds_sum{role=\"prefill\"}"),
        6);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_batch_size_sum{role=\"prefill\"}"), 3);
    EXPECT_TRUE(s->Cancel("c"));
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_cancelled_total{role=\"prefill\"}"),
        1);
    EXPECT_EQ(
        Sample(registry, "swaserve_sched_queued_tokens{role=\"prefill\"}"),
        150);
    ASSERT_TRUE(s->Add({"d", 10, 0, 0}).ok());
  }
  // Destroyed with "a" in progress and "d" queued: gauges return to 0.
  EXPECT_EQ(Sample(registry, "swaserve_sched_queue_depth{role=\"prefill\"}"),
            0);
  EXPECT_EQ(
      Sample(registry, "swaserve_sched_running_requests{role=\"prefill\"}"), 0);
  EXPECT_EQ(Sample(registry, "swaserve_sched_queued_tokens{role=\"prefill\"}"),
            0);
}

TEST(SchedMetricsTest, DecodeSchedulerReports) {
  metrics::Registry registry;
  DecodeSchedulerOptions o;
  o.registry = &registry;
  auto s = *DecodeScheduler::Create(o);
  // The prefill scheduler shares the families on the same registry.
  PrefillSchedulerOptions po;
  po.registry = &registry;
  ASSERT_TRUE(PrefillScheduler::Create(po).ok());
  ASSERT_TRUE(s->Stage({"a", 100, 0}).ok());
  ASSERT_TRUE(s->Stage({"b", 50, kSec}).ok());
  EXPECT_EQ(Sample(registry, "swaserve_sched_queue_depth{role=\"decode\"}"), 2);
  EXPECT_EQ(Sample(registry, "swaserve_sched_queued_tokens{role=\"decode\"}"),
            150);
  auto all = [](const DecodeRequestInfo&) { return true; };
  s->NextIteration(3 * kSec, all);
  s->NextIteration(3 * kSec, all);
  EXPECT_EQ(
      Sample(registry, "swaserve_sched_running_requests{role=\"decode\"}"), 2);
  EXPECT_EQ(
      Sample(registry, "swaserve_sched_wait_seconds_sum{role=\"decode\"}"), 5);
  EXPECT_EQ(
      Sample(registry, "swaserve_sched_batch_size_count{role=\"decode\"}"), 2);
  EXPECT_EQ(Sample(registry, "swaserve_sched_batch_size_sum{role=\"decode\"}"),
            4);
  ASSERT_TRUE(s->Preempt("b", 60, 4 * kSec).ok());
  EXPECT_EQ(Sample(registry, "swaserve_sched_preempted_total{role=\"decode\"}"),
            1);
  EXPECT_EQ(Sample(registry, "swaserve_sched_queued_tokens{role=\"decode\"}"),
            60);
  s->NextIteration(4 * kSec, all);
  EXPECT_EQ(Sample(registry, "swaserve_sched_admitted_total{role=\"decode\"}"),
            3);
  ASSERT_TRUE(s->Finish("a").ok());
  EXPECT_TRUE(s->Cancel("b"));
  EXPECT_EQ(
      Sample(registry, "swaserve_sched_running_requests{role=\"decode\"}"), 0);
  EXPECT_EQ(Sample(registry, "swaserve_sched_queue_depth{role=\"decode\"}"), 0);
  EXPECT_EQ(Sample(registry, "swaserve_sched_cancelled_total{role=\"decode\"}"),
            1);
  EXPECT_EQ(
      Sample(registry, "swaserve_sched_preempted_total{role=\"prefill\"}"), 0);
}

// The guard's starts are counted: a long prompt FCFS would start at once is
// moved ahead of a stream of short ones (prefill_scheduler_test.cc has the
// same scenario without metrics).
TEST(SchedMetricsTest, GuardedStartsAreCounted) {
  metrics::Registry registry;
  PrefillSchedulerOptions o;
  o.registry = &registry;
  o.aging_tokens_per_second = 0;
  o.chunk_tokens = 512;
  o.step_token_budget = 1024;
  auto s = *PrefillScheduler::Create(o);
  ASSERT_TRUE(s->Add({"long", 4000, 0, 0}).ok());
  for (int step = 1; step <= 3; ++step) {
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE(s->Add({"s" + std::to_string(step * 10 + k), 256, 0, step}).ok());
    }
    s->NextStep(step);
  }
  // "long" in step 2 ahead of the short prompts, then in step 3 two that
  // arrived during step 2 ahead of two older ones (FCFS would start them a
  // step after those, so their deadlines fall before the next step).
  EXPECT_EQ(s->guarded_starts(), 3);
  EXPECT_EQ(Sample(registry, "swaserve_sched_guarded_starts_total{role=\"prefill\"}"), 3);
  // The guard's own check: every start whose FCFS wait was known kept its
  // wait / max(FCFS wait, floor) under the ratio (1.7), none was late.
  const double n = Sample(registry, "swaserve_sched_fcfs_wait_ratio_count{role=\"prefill\"}");
  EXPECT_GE(n, 5);
  EXPECT_EQ(Sample(registry, "swaserve_sched_fcfs_wait_ratio_bucket{role=\"prefill\",le=\"1.75\"}"),
            n);
  EXPECT_EQ(s->late_starts(), 0);
  EXPECT_EQ(Sample(registry, "swaserve_sched_guard_late_starts_total{role=\"prefill\"}"), 0);
}

// A request memory refuses past its deadline starts late: counted, and its
// ratio lands above the guard's.
TEST(SchedMetricsTest, LateStartsAreCounted) {
  metrics::Registry registry;
  PrefillSchedulerOptions o;
  o.registry = &registry;
  o.chunk_tokens = 512;
  o.step_token_budget = 1024;
  o.max_partial_requests = 2;
  auto s = *PrefillScheduler::Create(o);
  ASSERT_TRUE(s->Add({"long", 20000, 0, 0}).ok());
  const PrefillStep first = s->NextStep(0);  // "long", one 512-token chunk a step
  ASSERT_EQ(first.chunks.size(), 1u);
  EXPECT_EQ(first.chunks[0].fcfs_wait_ratio, 0);  // started at once
  EXPECT_FALSE(first.chunks[0].late);
  ASSERT_TRUE(s->Add({"x", 100, 0, 1}).ok());
  int started_at = -1;
  PrefillChunk x_chunk;
  for (int step = 1; step <= 8 && started_at < 0; ++step) {
    const PrefillStep st = s->NextStep(step, [&](const PrefillRequestInfo& info) {
      return info.id != "x" || step >= 6;  // memory for "x" from step 6 on
    });
    for (const PrefillChunk& c : st.chunks) {
      if (c.id == "x") {
        started_at = step;
        x_chunk = c;
      }
    }
  }
  ASSERT_EQ(started_at, 6);
  EXPECT_TRUE(x_chunk.late);
  EXPECT_NEAR(x_chunk.fcfs_wait_ratio, 3.0, 1e-9);  // see below
  EXPECT_EQ(s->late_starts(), 1);
  EXPECT_EQ(Sample(registry, "swaserve_sched_guard_late_starts_total{role=\"prefill\"}"), 1);
  // Both starts had a known FCFS wait: "long" started at once (ratio 0);
  // "x", which FCFS would have started in step 1 (wait 0, so the floor of
  // one 1024-token step counts), waited 5 steps of one 512-token chunk of
  // "long" plus the step in flight: 3 floors, past the guard's 1.7.
  EXPECT_EQ(Sample(registry, "swaserve_sched_fcfs_wait_ratio_count{role=\"prefill\"}"), 2);
  EXPECT_EQ(Sample(registry, "swaserve_sched_fcfs_wait_ratio_bucket{role=\"prefill\",le=\"0.25\"}"), 1);
  EXPECT_EQ(Sample(registry, "swaserve_sched_fcfs_wait_ratio_bucket{role=\"prefill\",le=\"2.5\"}"), 1);
  EXPECT_EQ(Sample(registry, "swaserve_sched_fcfs_wait_ratio_bucket{role=\"prefill\",le=\"5\"}"), 2);
}

}  // namespace
}  // namespace swaserve::sched
