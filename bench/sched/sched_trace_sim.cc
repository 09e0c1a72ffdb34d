// Prefill scheduling on real traffic: a deterministic
// discrete-event SIMULATION that drives lib/sched's PrefillScheduler (the
// real class, not a re-implementation) with the Mooncake conversation trace
// (a data input outside the repository, ../shared/traces/mooncake_conversation_
// trace.jsonl: docs/benchmarks.md#traces) and a fitted cost model of lib/model's
// engine, comparing TTFT under FCFS and under compute-aware priority with
// aging. bench/cluster/sched_replay.sh is the real-cluster replay.
//
// Model of a prefill worker:
//   - one forward step at a time: the scheduler's NextStep(now) is run; its
//     duration is the cost model
//         seconds = a + b * tokens + c * sum over chunks of n * (s + n / 2)
//     (n tokens of a chunk starting at prompt position s: full-attention
//     layers read on average s + n/2 keys per query; the sliding-window
//     layers' O(window) attention is part of b);
//   - a request's first token is ready when the step holding its last chunk
//     ends: TTFT = that time - arrival; wait = start of the step holding its
//     first chunk - arrival;
//   - memory never refuses (can_start is always true): this measures the
//     policy, not the pools.
// Trace scaling:
//   - prompt lengths divided by --length-scale (default 16: mean 12,035 ->
//     ~752 tokens, max 126,195 -> 7,888), rounded up;
//   - arrival times divided by a rate factor. By default the factor is found
//     by bisection so that the FCFS run keeps the worker(s) busy
//     --utilisation (default 0.8) of the time between the first arrival and
//     the last first token; --rate-factor sets it directly;
//   - cached tokens (--prefix hash, default): each worker has an unbounded
//     prefix cache of the trace's chained 512-token block ids; a request's
//     hit is its leading ids already cached on the worker it is routed to
//     (ids are inserted when its prefill finishes), x 512 / length-scale,
//     capped at prompt - 1. --prefix none: everything is uncached.
//   - several workers (--workers N): each request goes to the worker with
//     the least queued uncached tokens after adding its own uncached tokens
//     there (ties: lowest index).
// The table's hit% is the share of prompt tokens served from the prefix
// cache in that run (it depends on the order: a follow-up turn hits only if
// the turn it continues finished its prefill before it arrived).
// Compared per request against FCFS: wait ratio = wait / max(FCFS wait,
// floor) with floor = one full-budget step at empty context (a + b *
// budget: the scheduling granularity, since a request arriving mid-step
// waits for the step boundary under any policy), and TTFT ratio.
//
// Usage: sched_trace_sim [--trace FILE] [--json FILE] [--length-scale 16]
//          [--utilisation 0.8 | --rate-factor X] [--workers 1]
//          [--chunk 512] [--budget 2048] [--max-requests 8] [--max-partial 1]
//          [--aging 0,3,...] [--main-aging A] [--cost a,b,c]
//          [--prefix hash|none] [--limit N] [--show-worst N] [--per-request]
//          [--guard R] [--guard-floor T]
// --guard sets compute-aware's FCFS-wait guard ratio (fcfs_wait_ratio; the
// library default 2, 0 = off) and --guard-floor its slack in tokens (default
// one step budget); both apply to every compute-aware row.
// --aging lists the compute-aware aging rates (tokens/s) to run; the table
// shows each also as a multiple of the worker's measured throughput (a/X).
// --main-aging is the setting the target lines and the JSON's main_aging
// refer to. --show-worst N lists the N requests with the largest wait
// ratios under it; --per-request adds per-request arrays (prompt, cached,
// wait, TTFT under FCFS and under it) to the JSON.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/common/bench_util.h"
#include "absl/strings/string_view.h"
#include "lib/sched/prefill_scheduler.h"
#include "nlohmann/json.hpp"

namespace swaserve::sched {
namespace {

constexpr int kBlockTokens = 512;
// Default cost model: a [s per step], b [s per token], c [s per token and
// attended key]. Least-squares fit (relative error) of lib/model's engine,
// `engine_bench --checkpoint DIR --threads 1 --prefill 64,256,1024,2048,4096`
// on a `swaserve make-model --shape=mimo-v2.5-pro-mini` checkpoint (70
// layers, 10 full + 60 SWA, bf16; 2048-token chunks): within 4% of every
// point from 64 to 4096 tokens (bench/RESULTS.md "Scheduling").
constexpr double kDefaultCost[3] = {0.1301, 7.41e-3, 4.358e-6};
using Policy = PrefillSchedulerOptions::Policy;

using bench::Die;
using bench::FileExists;
using bench::Percentile;

std::vector<double> ParseDoubles(absl::string_view s) {
  std::vector<double> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    double v;
    if (!absl::SimpleAtod(p, &v)) Die("not a number: " + std::string(p));
    out.push_back(v);
  }
  return out;
}

struct Flags {
  std::string trace = "../shared/traces/mooncake_conversation_trace.jsonl";
  std::string json;
  double length_scale = 16;
  double utilisation = 0.8;
  double rate_factor = 0;  // 0: bisect for `utilisation`
  int workers = 1;
  int chunk = 512;
  int budget = 2048;
  int max_requests = 8;
  int max_partial = 1;
  std::vector<double> aging = {0, 2, 4, 6, 8, 12, 16, 24, 40, 80};
  double main_aging = 8;
  double guard = PrefillSchedulerOptions().fcfs_wait_ratio;
  int guard_floor = -1;
  bool guard_context = true;
  int show_worst = 0;
  bool per_request = false;
  // 0, 0, 0: kDefaultCost.
  double cost_a = 0, cost_b = 0, cost_c = 0;
  bool prefix = true;
  int limit = 0;
};

struct TraceRequest {
  int64_t t_ms = 0;
  int input = 0;
  std::vector<int64_t> hash_ids;
};

std::vector<TraceRequest> LoadTrace(const Flags& f) {
  std::ifstream in(f.trace);
  if (!in) Die("cannot open trace " + f.trace);
  std::vector<TraceRequest> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      Die("trace line " + std::to_string(lineno) + ": bad JSON");
    }
    TraceRequest r;
    r.t_ms = j.at("timestamp").get<int64_t>();
    r.input = j.at("input_length").get<int>();
    r.hash_ids = j.at("hash_ids").get<std::vector<int64_t>>();
    if (r.input <= 0)
      Die("trace line " + std::to_string(lineno) + ": input_length <= 0");
    out.push_back(std::move(r));
    if (f.limit > 0 && static_cast<int>(out.size()) == f.limit) break;
  }
  if (out.empty()) Die("empty trace");
  return out;
}

struct CostModel {
  double a, b, c;
  double StepSeconds(const PrefillStep& step) const {
    double tokens = 0, context = 0;
    for (const PrefillChunk& ch : step.chunks) {
      tokens += ch.num_tokens;
      context += ch.num_tokens * (ch.start_token + ch.num_tokens / 2.0);
    }
    return a + b * tokens + c * context;
  }
};

struct Run {
  std::string policy;
  double aging = 0;
  double rate_factor = 0;
  std::vector<double> ttft_s, wait_s;  // per trace request
  std::vector<int> prompt, cached;
  std::vector<int64_t> queued_at_arrival;  // uncached tokens queued there
  // Seconds from arrival to the end of the step in flight on its worker (0
  // when idle): the least wait any (non-preemptive) order could give it.
  std::vector<double> residual_s;
  // The guard's own view at its start (PrefillChunk::fcfs_wait_ratio, -1
  // when the shadow had not started it yet) and whether it started late.
  std::vector<double> guard_ratio;
  std::vector<char> guard_late;
  double busy_s = 0, span_s = 0;
  int64_t steps = 0, tokens = 0;
  // The FCFS-wait guard's counters, summed over workers.
  int64_t guarded_starts = 0, late_starts = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;
  double utilisation() const { return span_s > 0 ? busy_s / span_s : 0; }
  double throughput() const { return busy_s > 0 ? tokens / busy_s : 0; }
};

Run Simulate(const std::vector<TraceRequest>& trace, const Flags& f,
             const CostModel& cost, Policy policy, double aging,
             double rate_factor) {
  PrefillSchedulerOptions o;
  o.policy = policy;
  o.aging_tokens_per_second = aging;
  o.chunk_tokens = f.chunk;
  o.step_token_budget = f.budget;
  o.max_requests_per_step = f.max_requests;
  o.max_partial_requests = f.max_partial;
  o.fcfs_wait_ratio = f.guard;
  o.fcfs_wait_floor_tokens = f.guard_floor;
  // The guard's work clock weighs attention like the cost model: c / b.
  o.context_cost_per_token = f.guard_context ? cost.c / cost.b : 0;
  struct Worker {
    std::unique_ptr<PrefillScheduler> sched;
    bool busy = false;
    int64_t end_ns = 0;
    PrefillStep step;
    absl::flat_hash_set<int64_t> cache;
  };
  std::vector<Worker> workers(f.workers);
  for (Worker& w : workers) {
    auto s = PrefillScheduler::Create(o);
    if (!s.ok()) Die(std::string(s.status().message()));
    w.sched = *std::move(s);
  }
  const size_t n = trace.size();
  Run run;
  run.policy = policy == Policy::kFcfs ? "fcfs" : "compute-aware";
  run.aging = aging;
  run.rate_factor = rate_factor;
  run.ttft_s.assign(n, -1);
  run.wait_s.assign(n, -1);
  run.prompt.assign(n, 0);
  run.cached.assign(n, 0);
  run.queued_at_arrival.assign(n, 0);
  run.residual_s.assign(n, 0);
  run.guard_ratio.assign(n, -1);
  run.guard_late.assign(n, 0);
  std::vector<int64_t> arrival(n);
  for (size_t i = 0; i < n; ++i) {
    arrival[i] =
        static_cast<int64_t>(std::llround(trace[i].t_ms * 1e6 / rate_factor));
  }
  auto index_of = [](const std::string& id) {
    return static_cast<size_t>(std::stoll(id.substr(1)));
  };
  auto matched_blocks = [](const Worker& w, const TraceRequest& r) {
    size_t k = 0;
    while (k < r.hash_ids.size() && w.cache.contains(r.hash_ids[k])) ++k;
    return k;
  };

  size_t next = 0;
  int64_t last_done = 0;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  while (true) {
    int64_t t = next < n ? arrival[next] : kNever;
    for (const Worker& w : workers) {
      if (w.busy) t = std::min(t, w.end_ns);
    }
    if (t == kNever) break;
    // 1. Steps ending at t.
    for (Worker& w : workers) {
      if (!w.busy || w.end_ns != t) continue;
      for (const PrefillChunk& ch : w.step.chunks) {
        if (!ch.last) continue;
        const size_t i = index_of(ch.id);
        run.ttft_s[i] = (t - arrival[i]) * 1e-9;
        last_done = std::max(last_done, t);
        if (f.prefix) {
          for (int64_t h : trace[i].hash_ids) w.cache.insert(h);
        }
      }
      w.busy = false;
    }
    // 2. Arrivals at t.
    while (next < n && arrival[next] == t) {
      const TraceRequest& r = trace[next];
      const int prompt = static_cast<int>(std::ceil(r.input / f.length_scale));
      int best = 0;
      int best_cached = 0;
      int64_t best_cost = std::numeric_limits<int64_t>::max();
      for (int wi = 0; wi < f.workers; ++wi) {
        int cached = 0;
        if (f.prefix) {
          const double hit =
              matched_blocks(workers[wi], r) * double{kBlockTokens};
          cached = std::min(
              static_cast<int>(std::min<double>(hit, r.input) / f.length_scale),
              prompt - 1);
        }
        const int64_t c =
            workers[wi].sched->queued_uncached_tokens() + (prompt - cached);
        if (c < best_cost) {
          best_cost = c;
          best = wi;
          best_cached = cached;
        }
      }
      run.queued_at_arrival[next] =
          workers[best].sched->queued_uncached_tokens();
      run.residual_s[next] =
          workers[best].busy ? (workers[best].end_ns - t) * 1e-9 : 0;
      run.prompt[next] = prompt;
      run.cached[next] = best_cached;
      run.prompt_tokens += prompt;
      run.cached_tokens += best_cached;
      const absl::Status s = workers[best].sched->Add(
          {absl::StrFormat("r%06d", static_cast<int>(next)), prompt,
           best_cached, t});
      if (!s.ok()) Die(std::string(s.message()));
      ++next;
    }
    // 3. Idle workers start their next step.
    for (Worker& w : workers) {
      if (w.busy) continue;
      w.step = w.sched->NextStep(t);
      if (w.step.empty()) continue;
      for (const PrefillChunk& ch : w.step.chunks) {
        if (ch.first) {
          const size_t i = index_of(ch.id);
          run.wait_s[i] = (t - arrival[i]) * 1e-9;
          run.guard_ratio[i] = ch.fcfs_wait_ratio;
          run.guard_late[i] = ch.late;
        }
      }
      const double dur = cost.StepSeconds(w.step);
      w.busy = true;
      w.end_ns = t + std::max<int64_t>(1, std::llround(dur * 1e9));
      run.busy_s += dur;
      run.tokens += w.step.total_tokens();
      ++run.steps;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (run.ttft_s[i] < 0 || run.wait_s[i] < 0) Die("request never finished");
  }
  run.span_s = (last_done - arrival.front()) * 1e-9 * f.workers;
  for (const Worker& w : workers) {
    run.guarded_starts += w.sched->guarded_starts();
    run.late_starts += w.sched->late_starts();
  }
  return run;
}

struct Comparison {
  double p90_reduction = 0;  // 1 - P90 TTFT / FCFS P90 TTFT
  double wait_ratio_max = 0, wait_ratio_p99 = 0;
  double ttft_ratio_max = 0, ttft_ratio_p99 = 0;
  int over_2x_wait = 0, over_2x_ttft = 0;
  size_t worst = 0;  // request with the largest wait ratio
};

Comparison Compare(const Run& r, const Run& fcfs, double floor_s) {
  Comparison c;
  c.p90_reduction =
      1 - Percentile(r.ttft_s, 0.9) / Percentile(fcfs.ttft_s, 0.9);
  std::vector<double> wr(r.wait_s.size()), tr(r.wait_s.size());
  for (size_t i = 0; i < wr.size(); ++i) {
    wr[i] = r.wait_s[i] / std::max(fcfs.wait_s[i], floor_s);
    tr[i] = r.ttft_s[i] / fcfs.ttft_s[i];
    if (wr[i] > 2) ++c.over_2x_wait;
    if (tr[i] > 2) ++c.over_2x_ttft;
    if (wr[i] > wr[c.worst]) c.worst = i;
  }
  c.wait_ratio_max = *std::max_element(wr.begin(), wr.end());
  c.wait_ratio_p99 = Percentile(wr, 0.99);
  c.ttft_ratio_max = *std::max_element(tr.begin(), tr.end());
  c.ttft_ratio_p99 = Percentile(tr, 0.99);
  return c;
}

nlohmann::json RunJson(const Run& r) {
  return {{"policy", r.policy},
          {"aging_tokens_per_second", r.aging},
          {"ttft_p50_s", Percentile(r.ttft_s, 0.5)},
          {"ttft_p90_s", Percentile(r.ttft_s, 0.9)},
          {"ttft_p99_s", Percentile(r.ttft_s, 0.99)},
          {"ttft_max_s", Percentile(r.ttft_s, 1.0)},
          {"wait_p50_s", Percentile(r.wait_s, 0.5)},
          {"wait_p90_s", Percentile(r.wait_s, 0.9)},
          {"wait_p99_s", Percentile(r.wait_s, 0.99)},
          {"wait_max_s", Percentile(r.wait_s, 1.0)},
          {"utilisation", r.utilisation()},
          {"cached_fraction", double(r.cached_tokens) / r.prompt_tokens},
          {"throughput_tokens_per_s", r.throughput()},
          {"steps", r.steps},
          {"guarded_starts", r.guarded_starts},
          {"late_starts", r.late_starts},
          {"tokens_per_step", r.steps ? double(r.tokens) / r.steps : 0}};
}

// Parses the command line and fills in the defaults (Die on a bad flag).
Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (bench::FlagReader r(argc, argv); r.Next();) {
    const std::string& a = r.flag();
    auto next = [&] { return r.Value(); };
    auto num = [&](double* out) { r.Number(out); };
    auto integer = [&](int* out) { r.Integer(out); };
    if (a == "--trace")
      f.trace = next();
    else if (a == "--json")
      f.json = next();
    else if (a == "--length-scale")
      num(&f.length_scale);
    else if (a == "--utilisation")
      num(&f.utilisation);
    else if (a == "--rate-factor")
      num(&f.rate_factor);
    else if (a == "--workers")
      integer(&f.workers);
    else if (a == "--chunk")
      integer(&f.chunk);
    else if (a == "--budget")
      integer(&f.budget);
    else if (a == "--max-requests")
      integer(&f.max_requests);
    else if (a == "--max-partial")
      integer(&f.max_partial);
    else if (a == "--aging")
      f.aging = ParseDoubles(next());
    else if (a == "--main-aging")
      num(&f.main_aging);
    else if (a == "--guard")
      num(&f.guard);
    else if (a == "--guard-tokens")
      f.guard_context = false;
    else if (a == "--guard-floor")
      integer(&f.guard_floor);
    else if (a == "--limit")
      integer(&f.limit);
    else if (a == "--per-request")
      f.per_request = true;
    else if (a == "--show-worst")
      integer(&f.show_worst);
    else if (a == "--prefix") {
      const std::string v = next();
      if (v != "hash" && v != "none") Die("--prefix hash|none");
      f.prefix = v == "hash";
    } else if (a == "--cost") {
      const std::vector<double> v = ParseDoubles(next());
      if (v.size() != 3) Die("--cost a,b,c");
      f.cost_a = v[0];
      f.cost_b = v[1];
      f.cost_c = v[2];
    } else {
      Die("unknown flag " + a +
          " (see the usage comment at the top of "
          "bench/sched/sched_trace_sim.cc)");
    }
  }
  if (f.length_scale < 1 || f.workers < 1 ||
      !(f.utilisation > 0 && f.utilisation < 1)) {
    Die("need --length-scale >= 1, --workers >= 1, 0 < --utilisation < 1");
  }
  if (f.cost_a == 0 && f.cost_b == 0 && f.cost_c == 0) {
    f.cost_a = kDefaultCost[0];
    f.cost_b = kDefaultCost[1];
    f.cost_c = kDefaultCost[2];
  }
#ifdef SWASERVE_SOURCE_DIR
  if (!FileExists(f.trace)) {
    f.trace = std::string(SWASERVE_SOURCE_DIR) +
              "/../shared/traces/mooncake_conversation_trace.jsonl";
  }
#endif
  if (std::find(f.aging.begin(), f.aging.end(), f.main_aging) ==
      f.aging.end()) {
    f.aging.push_back(f.main_aging);
  }
  return f;
}

// The rate factor: --rate_factor, or (when <= 0) the one at which FCFS runs
// at --utilisation, by bisection (utilisation is monotone in the factor).
double FitRateFactor(const std::vector<TraceRequest>& trace, const Flags& f,
                     const CostModel& cost) {
  if (f.rate_factor > 0) return f.rate_factor;
  double lo = 1e-4, hi = 1e3;
  for (int bisections = 0; bisections < 40; ++bisections) {
    const double mid = std::sqrt(lo * hi);
    const double u = Simulate(trace, f, cost, Policy::kFcfs, 0, mid).utilisation();
    (u < f.utilisation ? lo : hi) = mid;
    if (hi / lo < 1.001) break;
  }
  return std::sqrt(lo * hi);
}

// The requests that waited more than 2x their FCFS wait under the main
// setting, and why.
void ReportOver2x(const std::vector<TraceRequest>& trace, const Run& fcfs, const Run& run,
                  double floor_s, nlohmann::json& j) {
  // Who waits more than 2x: FCFS wait, uncached tokens, and the reason.
  std::vector<double> all_u, over_u;
  int quiet = 0, cache_lost = 0, first_boundary = 0, late = 0, unknown = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    all_u.push_back(run.prompt[i] - run.cached[i]);
    if (run.wait_s[i] <= 2 * std::max(fcfs.wait_s[i], floor_s)) {
      continue;
    }
    over_u.push_back(run.prompt[i] - run.cached[i]);
    if (fcfs.wait_s[i] < floor_s) ++quiet;
    if (run.cached[i] < fcfs.cached[i]) ++cache_lost;
    // Started by the first step after its arrival: the step in flight
    // alone made it wait that long, and no order could start it sooner.
    if (run.wait_s[i] <= run.residual_s[i] + 1e-9) ++first_boundary;
    if (run.guard_late[i]) ++late;
    if (run.guard_ratio[i] < 0) ++unknown;
  }
  std::printf(
      "  the %zu requests above 2x: %d had an FCFS wait under the floor; "
      "%d got fewer cached tokens than under FCFS; %d started in the first "
      "step after their arrival (the step in flight was longer than 2x "
      "their FCFS wait; no order could start them sooner); %d started "
      "after the guard's deadline; %d before the guard knew their FCFS "
      "wait; median uncached tokens %.0f (all requests: %.0f)\n",
      over_u.size(), quiet, cache_lost, first_boundary, late, unknown,
      Percentile(over_u, 0.5), Percentile(all_u, 0.5));
  j["over_2x"] = {{"requests", over_u.size()},
                  {"fcfs_wait_under_floor", quiet},
                  {"fewer_cached_tokens_than_fcfs", cache_lost},
                  {"started_in_first_step_after_arrival", first_boundary},
                  {"started_after_guard_deadline", late},
                  {"started_before_fcfs_wait_known", unknown},
                  {"median_uncached_tokens", Percentile(over_u, 0.5)},
                  {"median_uncached_tokens_all", Percentile(all_u, 0.5)}};
}

// The main setting's verdicts against the targets, its worst requests, and
// (--per-request) every request's figures in the JSON.
void ReportMainSetting(const Flags& f, const std::vector<TraceRequest>& trace, const Run& fcfs,
                       const Run& run, const Comparison& main_cmp, double floor_s,
                       nlohmann::json& j) {
  const size_t w = main_cmp.worst;
  std::printf(
      "\nmain setting: compute-aware, aging %.0f tokens/s (%.2fx worker "
      "throughput)\n",
      f.main_aging, f.main_aging / fcfs.throughput());
  std::printf(
      "  P90 TTFT %.2f s vs FCFS %.2f s: %.1f%% lower (target >= 30%%): %s\n",
      Percentile(run.ttft_s, 0.9), Percentile(fcfs.ttft_s, 0.9),
      100 * main_cmp.p90_reduction,
      main_cmp.p90_reduction >= 0.3 ? "MET" : "NOT MET");
  std::printf(
      "  wait / FCFS wait (floor %.3f s): max %.2f, p99 %.2f; %d requests "
      "above 2x "
      "(target: none): %s\n",
      floor_s, main_cmp.wait_ratio_max, main_cmp.wait_ratio_p99,
      main_cmp.over_2x_wait, main_cmp.over_2x_wait == 0 ? "MET" : "NOT MET");
  std::printf(
      "  guard: %lld guarded starts, %lld late starts (after their deadline "
      "on the work clock)\n",
      static_cast<long long>(run.guarded_starts),
      static_cast<long long>(run.late_starts));
  std::printf(
      "  TTFT / FCFS TTFT: max %.2f, p99 %.2f; %d requests above 2x\n",
      main_cmp.ttft_ratio_max, main_cmp.ttft_ratio_p99,
      main_cmp.over_2x_ttft);
  std::printf(
      "  worst wait ratio: request %zu, %d prompt / %d uncached tokens, "
      "waited %.2f s "
      "vs %.2f s under FCFS\n",
      w, run.prompt[w], run.prompt[w] - run.cached[w],
      run.wait_s[w], fcfs.wait_s[w]);
  j["main_aging"] = f.main_aging;
  if (f.per_request) {
    j["per_request"] = {{"arrival_ms", nlohmann::json::array()},
                        {"prompt", run.prompt},
                        {"cached_fcfs", fcfs.cached},
                        {"cached", run.cached},
                        {"wait_fcfs_s", fcfs.wait_s},
                        {"wait_s", run.wait_s},
                        {"ttft_fcfs_s", fcfs.ttft_s},
                        {"ttft_s", run.ttft_s}};
    for (const TraceRequest& r : trace) {
      j["per_request"]["arrival_ms"].push_back(r.t_ms);
    }
  }
  ReportOver2x(trace, fcfs, run, floor_s, j);
  if (f.show_worst > 0) {
    std::vector<size_t> idx(trace.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    auto ratio = [&](size_t i) {
      return run.wait_s[i] / std::max(fcfs.wait_s[i], floor_s);
    };
    std::sort(idx.begin(), idx.end(),
              [&](size_t x, size_t y) { return ratio(x) > ratio(y); });
    std::printf(
        "  the %d largest wait ratios (request, uncached tokens, wait, FCFS "
        "wait, "
        "queued tokens at arrival under FCFS / this policy, seconds left of "
        "the step in flight at arrival, the guard's own ratio, late):\n",
        f.show_worst);
    for (int k = 0; k < f.show_worst && k < static_cast<int>(idx.size());
         ++k) {
      const size_t i = idx[k];
      std::printf(
          "    %6zu %6d %8.2f %8.2f  ratio %5.2f  ttft %8.2f vs %8.2f  "
          "queued %lld / %lld  in flight %.2f  guard %.2f%s\n",
          i, run.prompt[i] - run.cached[i], run.wait_s[i],
          fcfs.wait_s[i], ratio(i), run.ttft_s[i], fcfs.ttft_s[i],
          static_cast<long long>(fcfs.queued_at_arrival[i]),
          static_cast<long long>(run.queued_at_arrival[i]),
          run.residual_s[i], run.guard_ratio[i],
          run.guard_late[i] ? " late" : "");
    }
  }
}

int Main(int argc, char** argv) {
  bench::SetProgramName("sched_trace_sim");
  const Flags f = ParseFlags(argc, argv);
  const std::vector<TraceRequest> trace = LoadTrace(f);
  const CostModel cost{f.cost_a, f.cost_b, f.cost_c};
  const double rf = FitRateFactor(trace, f, cost);

  const Run fcfs = Simulate(trace, f, cost, Policy::kFcfs, 0, rf);
  std::vector<Run> runs;
  for (double a : f.aging) {
    runs.push_back(Simulate(trace, f, cost, Policy::kComputeAware, a, rf));
  }
  const double floor_s = f.cost_a + f.cost_b * f.budget;

  std::printf(
      "== Prefill scheduling, trace replay SIMULATION with a fitted cost "
      "model\n");
  std::printf(
      "trace %s: %zu requests over %.0f s (x 1/%.4g rate factor -> %.0f s)\n",
      f.trace.c_str(), trace.size(), trace.back().t_ms / 1e3, rf,
      trace.back().t_ms / 1e3 / rf);
  std::printf("lengths / %.4g: mean prompt %.0f tokens, cached %.1f%% (%s)\n",
              f.length_scale, double(fcfs.prompt_tokens) / trace.size(),
              100.0 * fcfs.cached_tokens / fcfs.prompt_tokens,
              f.prefix ? "prefix hits from hash_ids" : "no prefix cache");
  std::printf(
      "cost: step s = %.4g + %.4g*tokens + %.4g*tokens*context; workers %d; "
      "chunk %d, budget %d, max %d requests/step\n",
      f.cost_a, f.cost_b, f.cost_c, f.workers, f.chunk, f.budget,
      f.max_requests);
  std::printf(
      "FCFS utilisation %.1f%%, worker throughput %.0f tokens/s, "
      "ratio floor (one full step) %.3f s\n\n",
      100 * fcfs.utilisation(), fcfs.throughput(), floor_s);
  std::printf(
      "%-14s %7s %5s %8s %8s %8s %8s %8s %8s %6s %5s %7s %10s %6s %10s %5s\n",
      "policy", "aging", "a/X", "TTFT p50", "p90", "p99", "max", "wait p99",
      "max", "util%", "hit%", "p90 red", "wait/F max", "p99", "TTFT/F max",
      ">2x");
  auto row = [&](const Run& r, const Comparison* c) {
    std::printf(
        "%-14s %7.0f %5.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %6.1f %5.1f",
        r.policy.c_str(), r.aging, r.aging / fcfs.throughput(),
        Percentile(r.ttft_s, 0.5), Percentile(r.ttft_s, 0.9),
        Percentile(r.ttft_s, 0.99), Percentile(r.ttft_s, 1.0),
        Percentile(r.wait_s, 0.99), Percentile(r.wait_s, 1.0),
        100 * r.utilisation(), 100.0 * r.cached_tokens / r.prompt_tokens);
    if (c != nullptr) {
      std::printf(" %6.1f%% %10.2f %6.2f %10.2f %5d\n", 100 * c->p90_reduction,
                  c->wait_ratio_max, c->wait_ratio_p99, c->ttft_ratio_max,
                  c->over_2x_wait);
    } else {
      std::printf("\n");
    }
  };
  row(fcfs, nullptr);
  nlohmann::json j;
  j["simulation"] = "discrete-event simulation with a fitted cost model";
  j["trace"] = f.trace;
  j["requests"] = trace.size();
  j["length_scale"] = f.length_scale;
  j["rate_factor"] = rf;
  j["target_utilisation"] = f.rate_factor > 0 ? 0.0 : f.utilisation;
  j["prefix"] = f.prefix ? "hash" : "none";
  j["cached_fraction"] = double(fcfs.cached_tokens) / fcfs.prompt_tokens;
  j["mean_prompt_tokens"] = double(fcfs.prompt_tokens) / trace.size();
  j["cost"] = {{"a", f.cost_a}, {"b", f.cost_b}, {"c", f.cost_c}};
  j["workers"] = f.workers;
  j["chunk_tokens"] = f.chunk;
  j["step_token_budget"] = f.budget;
  j["max_requests_per_step"] = f.max_requests;
  j["ratio_floor_s"] = floor_s;
  j["fcfs"] = RunJson(fcfs);
  const Run* main_run = nullptr;
  Comparison main_cmp;
  for (const Run& r : runs) {
    const Comparison c = Compare(r, fcfs, floor_s);
    row(r, &c);
    nlohmann::json rj = RunJson(r);
    rj["aging_over_throughput"] = r.aging / fcfs.throughput();
    rj["p90_ttft_reduction_vs_fcfs"] = c.p90_reduction;
    rj["wait_ratio_max"] = c.wait_ratio_max;
    rj["wait_ratio_p99"] = c.wait_ratio_p99;
    rj["ttft_ratio_max"] = c.ttft_ratio_max;
    rj["ttft_ratio_p99"] = c.ttft_ratio_p99;
    rj["requests_wait_over_2x_fcfs"] = c.over_2x_wait;
    rj["requests_ttft_over_2x_fcfs"] = c.over_2x_ttft;
    rj["worst_wait_ratio_request"] = {
        {"index", c.worst},
        {"prompt_tokens", r.prompt[c.worst]},
        {"uncached_tokens", r.prompt[c.worst] - r.cached[c.worst]},
        {"wait_s", r.wait_s[c.worst]},
        {"fcfs_wait_s", fcfs.wait_s[c.worst]}};
    j["compute_aware"].push_back(rj);
    if (r.aging == f.main_aging) {
      main_run = &r;
      main_cmp = c;
    }
  }
  if (main_run != nullptr) ReportMainSetting(f, trace, fcfs, *main_run, main_cmp, floor_s, j);
  if (!f.json.empty()) {
    bench::WriteJsonFile(f.json, j);
  }
  return 0;
}

}  // namespace
}  // namespace swaserve::sched

int main(int argc, char** argv) { return swaserve::sched::Main(argc, argv); }
