// Micro-benchmarks of the metrics hot paths, each next to a baseline measured
// in the same run, and a ratio table at the end:
//
//   Histogram::Observe  vs a mutex-protected histogram (what a naive
//                       implementation does) and an unsharded lock-free
//                       histogram (one set of atomics all threads share)
//   Counter::Increment  vs one shared std::atomic<uint64_t>::fetch_add
//
// "threads:2" variants run two threads on the SAME child, i.e. the contended
// case a sharded design has to win. Times are per operation per thread
// (Google Benchmark's CPU column); ratios use the median when
// --benchmark_repetitions is given.
//
// Usage: metrics_bench [--json FILE] [--benchmark_* flags]
//   --json FILE   also write Google Benchmark JSON to FILE
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "bench/common/bench_util.h"
#include "benchmark/benchmark.h"
#include "lib/metrics/buckets.h"
#include "lib/metrics/instruments.h"
#include "lib/metrics/registry.h"

namespace swaserve::metrics {
namespace {

// 1024 latencies, log-uniform over 0.5 ms .. 20 s, fixed seed.
const std::vector<double>& Values() {
  static const std::vector<double> values = [] {
    std::vector<double> v(1024);
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (double& x : v) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(state >> 11) / 9007199254740992.0;
      x = 0.0005 * std::pow(40000.0, u);
    }
    return v;
  }();
  return values;
}

// Baseline 1: a histogram behind one mutex.
class MutexHistogram {
 public:
  explicit MutexHistogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Observe(double value) {
    size_t i = 0;
    while (i < bounds_.size() && value > bounds_[i]) ++i;
    absl::MutexLock lock(&mu_);
    ++counts_[i];
    sum_ += value;
  }

 private:
  const std::vector<double> bounds_;
  absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Baseline 2: lock-free but unsharded; all threads share the same words.
class UnshardedHistogram {
 public:
  explicit UnshardedHistogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void Observe(double value) {
    size_t i = 0;
    while (i < bounds_.size() && value > bounds_[i]) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    internal::AtomicAddDouble(sum_bits_, value);
  }

 private:
  const std::vector<double> bounds_;
  std::vector<std::atomic<uint64_t>> counts_;
  std::atomic<uint64_t> sum_bits_{0};
};

template <typename H>
void ObserveLoop(benchmark::State& state, H& histogram) {
  const std::vector<double>& values = Values();
  size_t i = static_cast<size_t>(state.thread_index()) * 512;
  for (auto _ : state) {
    histogram.Observe(values[i++ & 1023]);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_HistogramObserve(benchmark::State& state) {
  // The same child for every thread, obtained as services do.
  static Histogram& histogram = []() -> Histogram& {
    static Registry registry;
    return (*registry.AddHistogram("swaserve_bench_latency_seconds", "Bench.",
                                   {}, DefaultLatencyBuckets()))
        ->WithLabels();
  }();
  ObserveLoop(state, histogram);
}
BENCHMARK(BM_HistogramObserve)->Threads(1)->Threads(2);

void BM_MutexHistogramObserve(benchmark::State& state) {
  static MutexHistogram histogram(DefaultLatencyBuckets());
  ObserveLoop(state, histogram);
}
BENCHMARK(BM_MutexHistogramObserve)->Threads(1)->Threads(2);

void BM_UnshardedHistogramObserve(benchmark::State& state) {
  static UnshardedHistogram histogram(DefaultLatencyBuckets());
  ObserveLoop(state, histogram);
}
BENCHMARK(BM_UnshardedHistogramObserve)->Threads(1)->Threads(2);

void BM_CounterIncrement(benchmark::State& state) {
  static Counter& counter = []() -> Counter& {
    static Registry registry;
    return (*registry.AddCounter("swaserve_bench_tokens_total", "Bench."))
        ->WithLabels();
  }();
  for (auto _ : state) counter.Increment();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CounterIncrement)->Threads(1)->Threads(2);

void BM_SharedAtomicFetchAdd(benchmark::State& state) {
  static std::atomic<uint64_t> counter{0};
  for (auto _ : state) counter.fetch_add(1, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SharedAtomicFetchAdd)->Threads(1)->Threads(2);

void BM_GaugeSet(benchmark::State& state) {
  static Gauge gauge;
  double v = 0;
  for (auto _ : state) gauge.Set(v++);
}
BENCHMARK(BM_GaugeSet);

// Why callers cache children: the cost of a WithLabels lookup.
void BM_WithLabelsLookup(benchmark::State& state) {
  Registry registry;
  CounterFamily* family = *registry.AddCounter("swaserve_bench_decisions_total",
                                               "Bench.", {"reason", "target"});
  for (auto _ : state) {
    family->WithLabels({"prefix_affinity", "decode-3"}).Increment();
  }
}
BENCHMARK(BM_WithLabelsLookup);

// One scrape of a service-sized registry: 20 histogram children (18 buckets
// each) and 100 counter children.
void BM_RenderText(benchmark::State& state) {
  Registry registry;
  HistogramFamily* ttft = *registry.AddHistogram(
      "swaserve_ttft_seconds", "Bench.", {"bucket"}, DefaultLatencyBuckets());
  CounterFamily* tokens =
      *registry.AddCounter("swaserve_tokens_total", "Bench.", {"kind"});
  for (int i = 0; i < 20; ++i) {
    ttft->WithLabels({std::to_string(i)}).Observe(0.01 * i);
  }
  for (int i = 0; i < 100; ++i) {
    tokens->WithLabels({std::to_string(i)}).Increment(i);
  }
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string text = registry.RenderText();
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_RenderText);

// Console output as usual, plus a table of ratios against the baselines.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter()
      : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_Defaults : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string name = run.run_name.str();
      const Times times{Ns(run, run.GetAdjustedCPUTime()),
                        Ns(run, run.GetAdjustedRealTime()), run.threads};
      if (run.run_type == Run::RT_Aggregate) {
        if (run.aggregate_name == "median") median_[name] = times;
      } else {
        last_[name] = times;
      }
    }
  }

  void PrintRatios() const {
    struct Pair {
      const char* what;
      const char* ours;
      const char* baseline;
    };
    const Pair pairs[] = {
        {"Histogram::Observe vs mutex histogram, 1 thread",
         "BM_HistogramObserve/threads:1", "BM_MutexHistogramObserve/threads:1"},
        {"Histogram::Observe vs mutex histogram, 2 threads same child",
         "BM_HistogramObserve/threads:2", "BM_MutexHistogramObserve/threads:2"},
        {"Histogram::Observe vs unsharded atomics, 1 thread",
         "BM_HistogramObserve/threads:1",
         "BM_UnshardedHistogramObserve/threads:1"},
        {"Histogram::Observe vs unsharded atomics, 2 threads same child",
         "BM_HistogramObserve/threads:2",
         "BM_UnshardedHistogramObserve/threads:2"},
        {"Counter::Increment vs shared atomic fetch_add, 1 thread",
         "BM_CounterIncrement/threads:1", "BM_SharedAtomicFetchAdd/threads:1"},
        {"Counter::Increment vs shared atomic fetch_add, 2 threads",
         "BM_CounterIncrement/threads:2", "BM_SharedAtomicFetchAdd/threads:2"},
    };
    // "parallel" is CPU time / (real time x threads) of the baseline run:
    // ~1.0 when its threads really ran at the same time, ~0.5 when a busy
    // machine time-sliced them on one core (then there was no contention to
    // measure, and the ratio says little).
    std::printf("\n%-62s %9s %9s %8s %9s\n", "ratio (CPU ns/op per thread)",
                "ours", "baseline", "speedup", "parallel");
    for (const Pair& pair : pairs) {
      const Times* ours = Lookup(pair.ours);
      const Times* baseline = Lookup(pair.baseline);
      if (ours == nullptr || baseline == nullptr || ours->cpu_ns <= 0) {
        continue;
      }
      std::printf("%-62s %9.2f %9.2f %7.2fx %9.2f\n", pair.what, ours->cpu_ns,
                  baseline->cpu_ns, baseline->cpu_ns / ours->cpu_ns,
                  baseline->Parallelism());
    }
    const Times* contended_times = Lookup("BM_HistogramObserve/threads:2");
    if (contended_times != nullptr) {
      const double contended = contended_times->cpu_ns;
      std::printf(
          "target: Histogram::Observe, 2 threads contending < 100 ns: "
          "%.2f ns -> %s\n",
          contended, contended < 100 ? "MET" : "NOT MET");
    }
  }

 private:
  struct Times {
    double cpu_ns;
    double real_ns;
    int64_t threads;
    double Parallelism() const {
      return real_ns > 0 ? cpu_ns / (real_ns * static_cast<double>(threads))
                         : 0;
    }
  };

  static double Ns(const Run& run, double t) {
    switch (run.time_unit) {
      case benchmark::kNanosecond:
        return t;
      case benchmark::kMicrosecond:
        return t * 1e3;
      case benchmark::kMillisecond:
        return t * 1e6;
      case benchmark::kSecond:
        return t * 1e9;
    }
    return t;
  }
  const Times* Lookup(const std::string& name) const {
    if (auto it = median_.find(name); it != median_.end()) return &it->second;
    if (auto it = last_.find(name); it != last_.end()) return &it->second;
    return nullptr;
  }

  std::map<std::string, Times> median_;
  std::map<std::string, Times> last_;
};

}  // namespace
}  // namespace swaserve::metrics

int main(int argc, char** argv) {
  swaserve::metrics::RatioReporter reporter;
  return swaserve::bench::RunBenchmarkMain(argc, argv, &reporter,
                                           [&] { reporter.PrintRatios(); });
}
