// Randomized test of the compute-aware prefill scheduler's FCFS-wait guard
// (lib/sched/prefill_scheduler.h, fcfs_wait_ratio): the same random
// workload runs twice through a simulated worker, once with FCFS and once
// with compute-aware priority + the guard, and every request's wait
// (arrival -> start of the step holding its first chunk) is compared:
//
//   wait_guarded <= 2 * max(wait_fcfs, floor) + slack
//
// (the target: "no request waits more than 2x its FCFS wait"), floor = one
// full step at empty context (a request arriving mid-step waits for the
// step boundary under any policy; the guard's own floor), slack = the
// longest step of the run: a request arriving during a long-context step
// waits for its end under any policy, and the step in flight at that moment
// differs between the runs. The simulated worker takes
// exactly the guard's cost per step (d0 + sum over tokens of 1 + k * position,
// k = context_cost_per_token), so this checks the mechanism, not a cost
// model; bench/sched/sched_trace_sim measures it on the Mooncake trace with a
// fitted engine cost. Prefix hits are fixed per request (the same in both
// runs), can_start never refuses.
//
// Workloads: bursts of short prompts with long ones mixed in, utilisation
// 50-95%, random chunk/budget/partial cap/aging/k. The check must be able to
// fail: with the guard off (fcfs_wait_ratio = 0) it fails on the same
// workloads, with or without aging.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/sched/prefill_scheduler.h"

namespace swaserve::sched {
namespace {

using Policy = PrefillSchedulerOptions::Policy;

struct Req {
  int prompt = 0;
  int cached = 0;
  int64_t t_ns = 0;
};

struct Workload {
  std::vector<Req> reqs;
  PrefillSchedulerOptions options;
  int64_t d0_ns = 0;      // per step
  int64_t unit_ns = 0;    // per token-equivalent of work
};

double WorkOf(const PrefillSchedulerOptions& o, int start, int n) {
  return n + o.context_cost_per_token * n * (start + 0.5 * n);
}

// Waits (ns) of every request; also the longest step (ns).
std::vector<int64_t> Simulate(const Workload& w, const PrefillSchedulerOptions& o,
                              int64_t* longest_step_ns) {
  auto created = PrefillScheduler::Create(o);
  EXPECT_TRUE(created.ok()) << created.status();
  PrefillScheduler& s = **created;
  const size_t n = w.reqs.size();
  std::vector<int64_t> wait(n, -1);
  size_t next = 0;
  int64_t now = 0;
  *longest_step_ns = 0;
  auto add_until = [&](int64_t t) {
    for (; next < n && w.reqs[next].t_ns <= t; ++next) {
      const Req& r = w.reqs[next];
      EXPECT_TRUE(s.Add({absl::StrCat(next), r.prompt, r.cached, r.t_ns}).ok());
    }
  };
  while (true) {
    add_until(now);
    const PrefillStep step = s.NextStep(now);
    if (step.empty()) {
      if (next == n) break;
      now = w.reqs[next].t_ns;  // idle until the next arrival
      continue;
    }
    double work = 0;
    for (const PrefillChunk& c : step.chunks) {
      work += WorkOf(o, c.start_token, c.num_tokens);
      if (c.first) wait[std::stoul(c.id)] = now - w.reqs[std::stoul(c.id)].t_ns;
    }
    const int64_t d = w.d0_ns + static_cast<int64_t>(std::llround(work * w.unit_ns));
    *longest_step_ns = std::max(*longest_step_ns, d);
    now += d;  // arrivals during the step are added at its end, in order
  }
  return wait;
}

Workload RandomWorkload(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  Workload w;
  PrefillSchedulerOptions& o = w.options;
  o.chunk_tokens = std::vector<int>{128, 256, 512}[rng() % 3];
  o.step_token_budget = o.chunk_tokens * static_cast<int>(2 + rng() % 3);
  o.max_requests_per_step = 4 + static_cast<int>(rng() % 5);
  o.max_partial_requests = 1 + static_cast<int>(rng() % 2);
  o.context_cost_per_token = rng() % 2 ? 0 : uniform(1e-4, 1e-3);
  w.unit_ns = 10'000;
  w.d0_ns = 20 * w.unit_ns;
  // Work throughput X (token-equivalents/s) of a full step at empty context.
  const double step_s = (w.d0_ns + o.step_token_budget * w.unit_ns) * 1e-9;
  const double x = o.step_token_budget / step_s;
  o.aging_tokens_per_second = std::vector<double>{0, 0.02, 0.1}[rng() % 3] * x;
  // Arrivals in bursts of 1-8 requests; mostly short prompts, some long
  // ones, some with cached prefixes; Poisson bursts at `util` of X.
  const double util = uniform(0.5, 0.95);
  const int count = 300;
  std::vector<Req> reqs;
  double mean_work = 0;
  for (int i = 0; i < count; ++i) {
    Req r;
    const bool long_prompt = rng() % 8 == 0;
    r.prompt = long_prompt ? static_cast<int>(uniform(1000, 6000)) : static_cast<int>(uniform(8, 400));
    r.cached = rng() % 3 == 0 ? static_cast<int>(uniform(0, r.prompt - 1)) : 0;
    mean_work += WorkOf(o, r.cached, r.prompt - r.cached);
    reqs.push_back(r);
  }
  mean_work /= count;
  const double burst_mean = 3;
  const double bursts_per_s = util * x / (mean_work * burst_mean);
  double t = 0;
  for (size_t i = 0; i < reqs.size();) {
    t += std::exponential_distribution<double>(bursts_per_s)(rng);
    const size_t k = 1 + rng() % 5;
    for (size_t j = 0; j < k && i < reqs.size(); ++j, ++i) {
      reqs[i].t_ns = static_cast<int64_t>(t * 1e9);
    }
  }
  w.reqs = std::move(reqs);
  return w;
}

struct Outcome {
  int violations = 0;  // over the bound
  int strict = 0;      // over 2 * max(wait_fcfs, floor), without the slack
  double worst = 0;    // wait_guarded - bound, in floors
};

Outcome Compare(const Workload& w, double ratio, std::string* first) {
  PrefillSchedulerOptions fcfs = w.options;
  fcfs.policy = Policy::kFcfs;
  PrefillSchedulerOptions guarded = w.options;
  guarded.policy = Policy::kComputeAware;
  guarded.fcfs_wait_ratio = ratio;
  int64_t longest_f = 0, longest_g = 0;
  const std::vector<int64_t> wf = Simulate(w, fcfs, &longest_f);
  const std::vector<int64_t> wg = Simulate(w, guarded, &longest_g);
  const double floor_ns =
      w.d0_ns + static_cast<double>(w.options.step_token_budget) * w.unit_ns;
  const double slack_ns = static_cast<double>(std::max(longest_f, longest_g));
  Outcome out;
  for (size_t i = 0; i < w.reqs.size(); ++i) {
    EXPECT_GE(wf[i], 0);
    EXPECT_GE(wg[i], 0);
    const double strict = 2 * std::max<double>(wf[i], floor_ns);
    if (wg[i] > strict) ++out.strict;
    const double bound = strict + slack_ns;
    const double over = (wg[i] - bound) / floor_ns;
    out.worst = std::max(out.worst, over);
    if (over > 0) {
      if (out.violations++ == 0 && first != nullptr) {
        *first = absl::StrCat("request ", i, " (", w.reqs[i].prompt, " tokens, ",
                              w.reqs[i].cached, " cached): waited ", wg[i] * 1e-6,
                              " ms vs ", wf[i] * 1e-6, " ms under FCFS, bound ",
                              bound * 1e-6, " ms");
      }
    }
  }
  return out;
}

// The guard is not a proof: its FCFS shadow sees this run's in-progress
// requests and step boundaries, which differ from a real FCFS run's, so a
// few requests still exceed the bound. What is checked: over the 45,000
// requests of 150 workloads, the guard at the library default ratio keeps
// at most 0.1% of requests over 2x their FCFS wait (+ one step) and at most
// a twentieth as many as the same workloads without guard and aging
// (measured when written: 3 vs 626; without the step's slack 68 vs 1,182;
// printed on every run).
TEST(FcfsGuardPropertyTest, GuardKeepsWaitsWithinTwiceFcfs) {
  int guarded = 0, unguarded = 0, requests = 0;
  int guarded_strict = 0, unguarded_strict = 0;
  double worst = -1e9;
  std::string worst_first;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    Workload w = RandomWorkload(seed);
    std::string first;
    const Outcome on = Compare(w, PrefillSchedulerOptions().fcfs_wait_ratio, &first);
    guarded += on.violations;
    guarded_strict += on.strict;
    if (on.worst > worst) {
      worst = on.worst;
      worst_first = absl::StrCat("seed ", seed, ": ", first);
    }
    requests += static_cast<int>(w.reqs.size());
    w.options.aging_tokens_per_second = 0;
    const Outcome off = Compare(w, 0, nullptr);
    unguarded += off.violations;
    unguarded_strict += off.strict;
  }
  std::printf("%d requests over 2x FCFS wait + one step: %d with the guard (worst by %.2f "
              "floors), %d without guard or aging; over 2x without the step: %d vs %d\n",
              requests, guarded, worst, unguarded, guarded_strict, unguarded_strict);
  if (guarded > 0) std::printf("workload with the worst: %s\n", worst_first.c_str());
  EXPECT_GT(unguarded, 0) << "the workloads must be able to break the bound";
  EXPECT_LE(guarded, requests / 1000);
  EXPECT_LE(guarded * 20, unguarded);
}

// Without the guard the bound does not hold even with aging: aging bounds
// waits absolutely, not relative to FCFS.
TEST(FcfsGuardPropertyTest, AgingAloneBreaksTheBound) {
  int total = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    total += Compare(RandomWorkload(seed), 0, nullptr).violations;
  }
  std::printf("guard off, random aging: %d requests over the bound\n", total);
  EXPECT_GT(total, 0);
}

}  // namespace
}  // namespace swaserve::sched
