// Scheduler overhead per step (Google Benchmark): what PrefillScheduler and
// DecodeScheduler cost a worker's scheduler thread, next to the cheapest
// possible queue measured in the same run.
//
//   Prefill/<policy>/<queued>   steady state with <queued> requests waiting:
//                               per iteration one Add (random 1..8000
//                               uncached tokens) and one NextStep that starts
//                               and finishes one request (max 1 request per
//                               step, one chunk), so the queue stays at
//                               <queued>
//   PrefillAddCancel/<queued>   Add + Cancel of one request at that depth
//   baseline/DequeFcfs/<queued> std::deque push_back + pop_front of the same
//                               request records (no policy at all)
//   Decode/<batch>              a running batch of <batch>: Finish the oldest,
//                               Stage one, NextIteration (admits it and
//                               returns the <batch> ids of the batch)
//
// Usage: sched_overhead_bench [--json FILE] [--benchmark_* flags]
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/common/bench_util.h"
#include "benchmark/benchmark.h"
#include "lib/sched/decode_scheduler.h"
#include "lib/sched/prefill_scheduler.h"

namespace swaserve::sched {
namespace {

using Policy = PrefillSchedulerOptions::Policy;

// Pre-made request records so id formatting is not measured.
std::vector<PrefillRequestInfo> MakeRequests(size_t n) {
  std::mt19937_64 rng(42);
  std::vector<PrefillRequestInfo> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].id = absl::StrFormat("req-%08d", static_cast<int>(i));
    out[i].prompt_tokens = 1 + static_cast<int>(rng() % 8000);
    out[i].cached_tokens = 0;
    out[i].arrival_ns = static_cast<int64_t>(i) * 1'000'000;
  }
  return out;
}

constexpr size_t kPool = 1 << 20;

const std::vector<PrefillRequestInfo>& Requests() {
  static const auto* r =
      new std::vector<PrefillRequestInfo>(MakeRequests(kPool));
  return *r;
}

void Prefill(benchmark::State& state, Policy policy, double fcfs_wait_ratio) {
  const size_t queued = static_cast<size_t>(state.range(0));
  PrefillSchedulerOptions o;
  o.policy = policy;
  o.fcfs_wait_ratio = fcfs_wait_ratio;
  o.max_requests_per_step = 1;
  o.chunk_tokens = 1 << 20;
  o.step_token_budget = 1 << 20;
  auto s = *PrefillScheduler::Create(o);
  const auto& reqs = Requests();
  size_t next = 0;
  for (; next < queued; ++next) (void)s->Add(reqs[next]);
  int64_t now = static_cast<int64_t>(queued) * 1'000'000;
  for (auto _ : state) {
    // Ids wrap around the pool; arrivals keep increasing.
    PrefillRequestInfo r = reqs[next];
    r.arrival_ns = now;
    (void)s->Add(r);
    if (++next == kPool) next = 0;
    now += 1'000'000;
    PrefillStep step = s->NextStep(now);
    benchmark::DoNotOptimize(step);
  }
  state.SetItemsProcessed(state.iterations());
}

void PrefillAddCancel(benchmark::State& state) {
  const size_t queued = static_cast<size_t>(state.range(0));
  auto s = *PrefillScheduler::Create({});
  const auto& reqs = Requests();
  for (size_t i = 0; i < queued; ++i) (void)s->Add(reqs[i]);
  size_t next = queued;
  for (auto _ : state) {
    const PrefillRequestInfo& r = reqs[next];
    (void)s->Add(r);
    benchmark::DoNotOptimize(s->Cancel(r.id));
    if (++next == kPool) next = queued;
  }
  state.SetItemsProcessed(state.iterations());
}

void DequeFcfs(benchmark::State& state) {
  const size_t queued = static_cast<size_t>(state.range(0));
  std::deque<PrefillRequestInfo> q;
  const auto& reqs = Requests();
  for (size_t i = 0; i < queued; ++i) q.push_back(reqs[i]);
  size_t next = queued;
  int64_t now = static_cast<int64_t>(queued) * 1'000'000;
  for (auto _ : state) {
    PrefillRequestInfo r = reqs[next];
    r.arrival_ns = now;
    now += 1'000'000;
    q.push_back(std::move(r));
    PrefillRequestInfo head = std::move(q.front());
    q.pop_front();
    benchmark::DoNotOptimize(head);
    if (++next == kPool) next = queued;
  }
  state.SetItemsProcessed(state.iterations());
}

void Decode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  DecodeSchedulerOptions o;
  o.max_batch_size = batch;
  auto s = *DecodeScheduler::Create(o);
  const auto& reqs = Requests();
  auto all = [](const DecodeRequestInfo&) { return true; };
  size_t next = 0;
  std::deque<std::string> running;
  for (; next < static_cast<size_t>(batch); ++next) {
    (void)s->Stage({reqs[next].id, 100, 0});
    running.push_back(reqs[next].id);
  }
  s->NextIteration(0, all);
  for (auto _ : state) {
    (void)s->Finish(running.front());
    running.pop_front();
    const std::string& id = reqs[next].id;
    (void)s->Stage({id, 100, 0});
    running.push_back(id);
    DecodeIteration it = s->NextIteration(0, all);
    benchmark::DoNotOptimize(it);
    if (++next == kPool) next = 0;
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK_CAPTURE(Prefill, fcfs, Policy::kFcfs, 0)->Arg(100)->Arg(10000);
BENCHMARK_CAPTURE(Prefill, compute_aware_noguard, Policy::kComputeAware, 0)
    ->Arg(100)
    ->Arg(10000);
// With the FCFS-wait guard (library default ratio): a shadow FCFS scheduler,
// and an O(queued) deadline layout while requests are near their deadlines
// (in this overloaded loop, always).
BENCHMARK_CAPTURE(Prefill, compute_aware, Policy::kComputeAware,
                  PrefillSchedulerOptions().fcfs_wait_ratio)
    ->Arg(100)
    ->Arg(10000);
BENCHMARK(PrefillAddCancel)->Arg(100)->Arg(10000);
BENCHMARK(DequeFcfs)->Name("baseline/DequeFcfs")->Arg(100)->Arg(10000);
BENCHMARK(Decode)->Arg(64)->Arg(256);

}  // namespace
}  // namespace swaserve::sched

int main(int argc, char** argv) {
  return swaserve::bench::RunBenchmarkMain(argc, argv);
}
