// Randomized tests of lib/sched: >= 10^5 scheduler operations over many
// seeds, checks after every step, and the no-starvation bound of the
// compute-aware prefill policy (the scheduler never starves a long request
// under a stream of short ones).
//
// Every prefill step is checked twice: against direct invariants (budget,
// chunk size, request count, partial-request cap, every token handed out
// exactly once and in order, continuing requests before new ones, stats),
// and against a reference model in this file that restates the documented
// rules (continuations in start order; candidates in priority order;
// partial-cap skips; can_start answers, refusal limits): the step must
// equal the model's, chunk for chunk. The model computes priority keys with
// the scheduler's expression (no -ffast-math, no FMA in the baseline x86-64
// build), so ties break identically.
//
// The no-starvation bound. Notation: B = step_token_budget, C =
// chunk_tokens, M = max_requests_per_step, K = max_partial_requests, a =
// aging_tokens_per_second, D = the longest a step can take (here d0 + d1 *
// B). Request r arrives at t_r with U_r uncached tokens; can_start never
// refuses; requests are added in arrival order.
//  - r can only be overtaken by requests with a smaller priority key
//    U + a * t: requests present at t_r, or arrivals q with
//    U_q + a * t_q < U_r + a * t_r, i.e. t_q < t_r + U_r / a. Call this
//    set A_r and W_r the uncached tokens it still has to
//    compute at t_r (queued_uncached_tokens() just before Add(r), plus the
//    window's arrivals). For FCFS the window is empty.
//  - In every step built while r waits, r was either not reached or
//    skipped by the partial cap, and every chunk belongs to A_r:
//      not reached, budget used up: B tokens; at most W_r / B such steps;
//      not reached, M chunks, each a full C-token chunk or its request's
//        last (budget not binding): at most (W_r / C + |A_r|) / M steps;
//      skipped by the cap: K requests stay partial, each got a full
//        C-token chunk: at most W_r / (K * C) steps.
//  - The step running when r arrives ends within D.
//  So  wait_r <= D * (1 + W_r / B + (W_r / C + |A_r|) / M + W_r / (K * C)).
// The test checks this for every request (cancelled ones excepted) under
// random bursts that overload the worker, and checks that the same check
// FAILS when the scheduler runs without aging (pure shortest-first) while
// the bound still assumes the aging rate: the test can detect starvation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "lib/sched/decode_scheduler.h"
#include "lib/sched/prefill_scheduler.h"

namespace swaserve::sched {
namespace {

using Policy = PrefillSchedulerOptions::Policy;

struct Arrival {
  std::string id;
  int prompt = 0;
  int cached = 0;
  int64_t t_ns = 0;
  int uncached() const { return prompt - cached; }
};

struct SimParams {
  PrefillSchedulerOptions options;
  // Aging assumed by the bound; differs from options' only in the mutation
  // check. Ignored for FCFS.
  double bound_aging = 0;
  bool refusals = false;  // random can_start refusals (bound not checked)
  bool cancels = false;
  int64_t d0_ns = 2'000'000;  // step duration = d0 + d1 * tokens
  int64_t d1_ns = 20'000;
};

struct SimStats {
  int64_t operations = 0;  // Add + NextStep + Cancel calls
  int64_t checked = 0;     // requests whose wait was checked
  int64_t violations = 0;
  double max_wait_over_bound = 0;
};

// The test's own model of one request.
struct Model {
  Arrival a;
  double key = 0;
  int next = 0;
  bool started = false;
  uint64_t start_order = 0;
};

// Random arrivals in phases of random load (0.3x .. 1.6x of the budget-full
// throughput), 3-20% long requests.
std::vector<Arrival> MakeStream(std::mt19937_64& rng, const SimParams& p,
                                int n) {
  const double capacity_tps =
      p.options.step_token_budget /
      ((p.d0_ns + p.d1_ns * p.options.step_token_budget) * 1e-9);
  std::vector<Arrival> out;
  double t = 0;
  std::uniform_real_distribution<double> u01(0, 1);
  while (static_cast<int>(out.size()) < n) {
    const double loads[] = {0.3, 0.7, 1.0, 1.3, 1.6};
    const double load = loads[rng() % 5];
    const double p_long = 0.03 + 0.17 * u01(rng);
    const double phase_end = t + 0.5 + 4.5 * u01(rng);
    const double mean_tokens = (1 - p_long) * 150 + p_long * 10500;
    const double rate = load * capacity_tps / mean_tokens;  // requests/s
    while (t < phase_end && static_cast<int>(out.size()) < n) {
      t += -std::log(1 - u01(rng)) / rate;
      Arrival a;
      a.id = absl::StrFormat("r%06d", static_cast<int>(out.size()));
      const int uncached =
          u01(rng) < p_long ? 1000 + rng() % 19001 : 1 + rng() % 300;
      a.cached = u01(rng) < 0.3 ? static_cast<int>(rng() % 4000) : 0;
      a.prompt = a.cached + uncached;
      a.t_ns = static_cast<int64_t>(t * 1e9);
      out.push_back(a);
    }
  }
  return out;
}

bool Before(const Model* x, const Model* y) {
  return std::tie(x->key, x->a.t_ns, x->a.id) <
         std::tie(y->key, y->a.t_ns, y->a.id);
}

// Runs one seed's stream through a PrefillScheduler driven like a worker,
// checking invariants after every step (gtest failures) and the wait bound
// (counted in the result, so the mutation check can count violations).
SimStats Simulate(uint64_t seed, const SimParams& p, int n_arrivals) {
  SimStats st;
  std::mt19937_64 rng(seed);
  const std::vector<Arrival> stream = MakeStream(rng, p, n_arrivals);
  auto sched_or = PrefillScheduler::Create(p.options);
  EXPECT_TRUE(sched_or.ok());
  PrefillScheduler& s = **sched_or;
  const PrefillSchedulerOptions& o = p.options;
  const bool fcfs = o.policy == Policy::kFcfs;
  const double aging = fcfs ? 0 : o.aging_tokens_per_second;
  const double d_max_ns =
      p.d0_ns + p.d1_ns * static_cast<double>(o.step_token_budget);

  // Window sums for the bound: prefix sums of uncached tokens by index.
  std::vector<double> prefix(stream.size() + 1, 0);
  for (size_t i = 0; i < stream.size(); ++i) {
    prefix[i + 1] = prefix[i] + stream[i].uncached();
  }
  std::vector<double> bound_ns(stream.size(), 0);
  absl::flat_hash_map<std::string, size_t> index_of;
  std::map<std::string, Model> live;  // ordered: deterministic picks
  std::set<std::string> cancelled;
  uint64_t start_counter = 0;
  int64_t now = 0;
  size_t next_arrival = 0;
  std::uniform_real_distribution<double> u01(0, 1);
  while (next_arrival < stream.size() || !live.empty()) {
    if (live.empty() && stream[next_arrival].t_ns > now) {
      now = stream[next_arrival].t_ns;  // idle until the next arrival
    }
    // Arrivals up to now.
    while (next_arrival < stream.size() && stream[next_arrival].t_ns <= now) {
      const Arrival& a = stream[next_arrival];
      // The bound's inputs, observed just before Add.
      const double q_tokens = static_cast<double>(s.queued_uncached_tokens());
      const double q_count = s.queued_requests() + s.in_progress_requests();
      double window_end_ns = static_cast<double>(a.t_ns);
      if (!fcfs) {
        // +1 ms: slack for the rounding of the floating-point keys.
        window_end_ns +=
            p.bound_aging > 0 ? a.uncached() / p.bound_aging * 1e9 + 1e6 : 1e30;
      }
      const size_t end = static_cast<size_t>(
          std::upper_bound(stream.begin(), stream.end(), window_end_ns,
                           [](double t, const Arrival& x) {
                             return t < static_cast<double>(x.t_ns);
                           }) -
          stream.begin());
      const double w = q_tokens + prefix[end] - prefix[next_arrival + 1];
      const double count = q_count + (end - next_arrival - 1);
      bound_ns[next_arrival] =
          d_max_ns *
          (1 + w / o.step_token_budget +
           (w / o.chunk_tokens + count) / o.max_requests_per_step +
           w / (static_cast<double>(o.max_partial_requests) * o.chunk_tokens));
      EXPECT_TRUE(s.Add({a.id, a.prompt, a.cached, a.t_ns}).ok());
      ++st.operations;
      Model m;
      m.a = a;
      // The scheduler's expressions (prefill_scheduler.cc, Add).
      m.key = fcfs ? 0 : a.uncached() + aging * (a.t_ns * 1e-9);
      m.next = a.cached;
      live[a.id] = m;
      index_of[a.id] = next_arrival;
      ++next_arrival;
    }
    // Random cancellations (the caller went away).
    if (p.cancels && !live.empty() && u01(rng) < 0.05) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const std::string id = it->first;
      EXPECT_TRUE(s.Cancel(id));
      EXPECT_FALSE(s.Contains(id));
      ++st.operations;
      cancelled.insert(id);
      live.erase(id);
    }
    if (live.empty()) continue;

    // The model's view before the step.
    std::vector<const Model*> in_progress;
    std::vector<const Model*> queued;
    for (const auto& [id, m] : live) {
      (m.started ? in_progress : queued).push_back(&m);
    }
    std::sort(in_progress.begin(), in_progress.end(),
              [](const Model* x, const Model* y) {
                return x->start_order < y->start_order;
              });

    std::vector<std::pair<std::string, bool>> answers;  // can_start calls
    const PrefillStep step =
        s.NextStep(now, [&](const PrefillRequestInfo& info) {
          const bool ok = !p.refusals || u01(rng) < 0.7;
          answers.push_back({info.id, ok});
          return ok;
        });
    ++st.operations;

    // --- Direct invariants.
    EXPECT_LE(step.total_tokens(), o.step_token_budget);
    EXPECT_LE(static_cast<int>(step.chunks.size()), o.max_requests_per_step);
    std::set<std::string> in_step;
    size_t continuing = 0;
    bool seen_first = false;
    for (const PrefillChunk& c : step.chunks) {
      EXPECT_TRUE(in_step.insert(c.id).second) << "twice in a step: " << c.id;
      auto it = live.find(c.id);
      if (it == live.end()) {
        ADD_FAILURE() << "unknown or cancelled id " << c.id;
        return st;
      }
      const Model& m = it->second;
      EXPECT_GT(c.num_tokens, 0);
      EXPECT_LE(c.num_tokens, o.chunk_tokens);
      EXPECT_EQ(c.start_token, m.next) << c.id;  // in order, exactly once
      EXPECT_EQ(c.first, !m.started) << c.id;
      EXPECT_EQ(c.last, c.start_token + c.num_tokens == m.a.prompt) << c.id;
      if (c.first) {
        seen_first = true;
      } else {
        EXPECT_FALSE(seen_first) << "continuation after a new start";
        ++continuing;
      }
    }
    if (seen_first) {
      // New starts only once every request in progress got its chunk.
      EXPECT_EQ(continuing, in_progress.size());
    }

    // --- Reference model of NextStep (the rules in prefill_scheduler.h).
    std::vector<PrefillChunk> expect;
    int budget = o.step_token_budget;
    int partial = static_cast<int>(in_progress.size());
    auto full = [&] {
      return budget == 0 ||
             static_cast<int>(expect.size()) == o.max_requests_per_step;
    };
    for (const Model* m : in_progress) {
      if (full()) break;
      const int n = std::min({o.chunk_tokens, m->a.prompt - m->next, budget});
      budget -= n;
      const bool last = m->next + n == m->a.prompt;
      if (last) --partial;
      expect.push_back({m->a.id, m->next, n, false, last});
    }
    std::vector<const Model*> order = queued;  // priority order
    std::sort(order.begin(), order.end(), Before);
    size_t answer = 0;
    int refusals = 0;
    for (const Model* m : order) {
      if (full()) break;
      const int n = std::min({o.chunk_tokens, m->a.uncached(), budget});
      const bool stays_partial = n < m->a.uncached();
      if (stays_partial && partial >= o.max_partial_requests) continue;
      if (answer >= answers.size() || answers[answer].first != m->a.id) {
        ADD_FAILURE() << "can_start call " << answer << ": expected " << m->a.id
                      << ", got "
                      << (answer < answers.size() ? answers[answer].first
                                                  : "none");
        return st;
      }
      if (!answers[answer++].second) {
        if (static_cast<double>(now - m->a.t_ns) >=
                o.refusal_block_after_seconds * 1e9 ||
            ++refusals >= o.max_refusals_per_step) {
          break;
        }
        continue;
      }
      budget -= n;
      if (stays_partial) ++partial;
      expect.push_back({m->a.id, m->next, n, true, !stays_partial});
    }
    EXPECT_EQ(answer, answers.size()) << "unexpected can_start calls";
    EXPECT_EQ(step.chunks.size(), expect.size());
    for (size_t i = 0; i < std::min(step.chunks.size(), expect.size()); ++i) {
      const PrefillChunk& c = step.chunks[i];
      const PrefillChunk& e = expect[i];
      EXPECT_TRUE(c.id == e.id && c.start_token == e.start_token &&
                  c.num_tokens == e.num_tokens && c.first == e.first &&
                  c.last == e.last)
          << "chunk " << i << ": got " << c.id << "@" << c.start_token << "+"
          << c.num_tokens << ", model " << e.id << "@" << e.start_token << "+"
          << e.num_tokens;
    }

    // Apply the step to the model; check waits.
    for (const PrefillChunk& c : step.chunks) {
      Model& m = live.at(c.id);
      if (c.first) {
        m.started = true;
        m.start_order = ++start_counter;
        const size_t i = index_of.at(c.id);
        const double wait = static_cast<double>(now - m.a.t_ns);
        if (!p.refusals) {
          ++st.checked;
          st.max_wait_over_bound =
              std::max(st.max_wait_over_bound, wait / bound_ns[i]);
          if (wait > bound_ns[i]) ++st.violations;
        }
      }
      m.next += c.num_tokens;
      if (c.last) live.erase(c.id);
    }
    // Stats agree with the model.
    int64_t tokens = 0;
    int n_queued = 0, n_running = 0;
    for (const auto& [id, m] : live) {
      tokens += m.a.prompt - m.next;
      (m.started ? n_running : n_queued)++;
    }
    EXPECT_EQ(s.queued_uncached_tokens(), tokens);
    EXPECT_EQ(s.queued_requests(), n_queued);
    EXPECT_EQ(s.in_progress_requests(), n_running);
    EXPECT_LE(n_running, o.max_partial_requests);
    if (::testing::Test::HasFailure()) return st;  // one report per seed

    // The step runs; time advances.
    now += p.d0_ns + p.d1_ns * step.total_tokens();
  }
  EXPECT_EQ(s.queued_requests(), 0);
  EXPECT_EQ(s.in_progress_requests(), 0);
  return st;
}

SimParams RandomParams(std::mt19937_64& rng, Policy policy) {
  SimParams p;
  const int budgets[] = {256, 512, 1024, 2048, 4096};
  p.options.policy = policy;
  // The reference model restates the rules without the FCFS-wait guard;
  // fcfs_guard_property_test.cc covers the guard.
  p.options.fcfs_wait_ratio = 0;
  p.options.step_token_budget = budgets[rng() % 5];
  p.options.chunk_tokens = std::max(
      16, static_cast<int>(p.options.step_token_budget >> (rng() % 4)));
  p.options.max_requests_per_step = 1 + static_cast<int>(rng() % 8);
  const int partial[] = {1, 1, 2, 3, 8};
  p.options.max_partial_requests = partial[rng() % 5];
  const double capacity_tps =
      p.options.step_token_budget /
      ((p.d0_ns + p.d1_ns * p.options.step_token_budget) * 1e-9);
  const double aging_x[] = {0.25, 1, 4};
  p.options.aging_tokens_per_second = capacity_tps * aging_x[rng() % 3];
  p.bound_aging = p.options.aging_tokens_per_second;
  return p;
}

TEST(PrefillPropertyTest, InvariantsWithRefusalsAndCancels) {
  int64_t ops = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed * 7919);
    SimParams p = RandomParams(
        rng, seed % 4 == 0 ? Policy::kFcfs : Policy::kComputeAware);
    p.refusals = true;
    p.cancels = true;
    p.options.max_refusals_per_step = 1 + static_cast<int>(rng() % 4);
    p.options.refusal_block_after_seconds = (seed % 3 == 0) ? 0.5 : 1e9;
    ops += Simulate(seed, p, 400).operations;
    ASSERT_FALSE(HasFailure()) << "seed " << seed;
  }
  std::printf("operations: %lld\n", static_cast<long long>(ops));
  EXPECT_GE(ops, 30'000);
}

TEST(PrefillPropertyTest, ComputeAwareWaitIsBounded) {
  int64_t ops = 0, checked = 0;
  double worst = 0;
  for (uint64_t seed = 100; seed < 200; ++seed) {
    std::mt19937_64 rng(seed * 104729);
    SimParams p = RandomParams(rng, Policy::kComputeAware);
    p.cancels = seed % 2 == 0;
    const SimStats s = Simulate(seed, p, 400);
    ASSERT_FALSE(HasFailure()) << "seed " << seed;
    EXPECT_EQ(s.violations, 0)
        << "seed " << seed << ": max wait/bound " << s.max_wait_over_bound;
    ops += s.operations;
    checked += s.checked;
    worst = std::max(worst, s.max_wait_over_bound);
  }
  std::printf("operations: %lld, waits checked: %lld, max wait/bound %.3f\n",
              static_cast<long long>(ops), static_cast<long long>(checked),
              worst);
  EXPECT_GE(ops, 70'000);
}

TEST(PrefillPropertyTest, FcfsWaitIsBounded) {
  for (uint64_t seed = 300; seed < 320; ++seed) {
    std::mt19937_64 rng(seed);
    SimParams p = RandomParams(rng, Policy::kFcfs);
    const SimStats s = Simulate(seed, p, 400);
    ASSERT_FALSE(HasFailure()) << "seed " << seed;
    EXPECT_EQ(s.violations, 0) << "seed " << seed;
  }
}

// The bound check detects starvation: without aging (pure shortest-first)
// long requests wait past the bound that aging guarantees.
TEST(PrefillPropertyTest, WithoutAgingTheBoundFails) {
  int64_t violations = 0;
  for (uint64_t seed = 100; seed < 120; ++seed) {
    std::mt19937_64 rng(seed * 104729);
    SimParams p = RandomParams(rng, Policy::kComputeAware);
    p.options.aging_tokens_per_second = 0;  // the mutation
    violations += Simulate(seed, p, 400).violations;
    ASSERT_FALSE(HasFailure()) << "seed " << seed;
  }
  std::printf("violations without aging: %lld\n",
              static_cast<long long>(violations));
  EXPECT_GT(violations, 0);
}

// Decode: random staging, a page pool, growth by one token per iteration,
// preemption when a page is missing, finishes and cancels. Invariants after
// every iteration; everything finishes (no livelock).
TEST(DecodePropertyTest, RandomAdmissionPreemption) {
  int64_t ops = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u01(0, 1);
    const int page = 16;
    const int pool_pages = 40 + static_cast<int>(rng() % 200);
    DecodeSchedulerOptions o;
    o.max_batch_size = 1 + static_cast<int>(rng() % 16);
    auto s = *DecodeScheduler::Create(o);
    struct Req {
      int context = 0;      // tokens with KV
      int to_generate = 0;  // left
      int pages = 0;        // held while running
      uint64_t first_admission = 0;
      bool waiting = true;
      bool preempted = false;
    };
    std::map<std::string, Req> reqs;
    int free_pages = pool_pages;
    uint64_t admission_counter = 0;
    int staged = 0;
    const int total = 150;
    int64_t now = 0;
    // Expected waiting order: preempted by first admission, then staged.
    std::map<std::pair<int, uint64_t>, std::string> expect_waiting;
    std::map<std::string, std::pair<int, uint64_t>> waiting_key;
    uint64_t stage_counter = 0;
    int iterations = 0;
    while (staged < total || !reqs.empty()) {
      ASSERT_LT(++iterations, 200'000) << "no progress, seed " << seed;
      ++now;
      if (staged < total && u01(rng) < 0.4) {
        const std::string id = absl::StrFormat("d%04d", staged++);
        Req r;
        // Fits alone in the pool, with its generation.
        r.to_generate = 1 + static_cast<int>(rng() % 64);
        r.context = 1 + static_cast<int>(
                            rng() % ((pool_pages - 5) * page - r.to_generate));
        ASSERT_TRUE(s->Stage({id, r.context, now}).ok());
        ++ops;
        reqs[id] = r;
        waiting_key[id] = {1, ++stage_counter};
        expect_waiting[{1, stage_counter}] = id;
      }
      if (!reqs.empty() && u01(rng) < 0.02) {
        auto it = reqs.begin();
        std::advance(it, rng() % reqs.size());
        EXPECT_TRUE(s->Cancel(it->first));
        ++ops;
        if (it->second.waiting) {
          expect_waiting.erase(waiting_key.at(it->first));
        } else {
          free_pages += it->second.pages;
        }
        reqs.erase(it);
      }
      // Admission.
      std::vector<std::string> asked;
      const DecodeIteration iter =
          s->NextIteration(now, [&](const DecodeRequestInfo& info) {
            asked.push_back(info.id);
            const Req& r = reqs.at(info.id);
            EXPECT_EQ(info.context_tokens, r.context);
            const int need = (r.context + page - 1) / page;
            if (need > free_pages) return false;
            free_pages -= need;
            reqs.at(info.id).pages = need;
            return true;
          });
      ++ops;
      // Asked strictly in the expected waiting order, from its head.
      {
        auto it = expect_waiting.begin();
        for (const std::string& id : asked) {
          ASSERT_NE(it, expect_waiting.end());
          EXPECT_EQ(id, it->second);
          ++it;
        }
      }
      ASSERT_LE(iter.admitted.size(), asked.size());
      for (size_t i = 0; i < iter.admitted.size(); ++i) {
        EXPECT_EQ(iter.admitted[i], asked[i]);
        Req& r = reqs.at(iter.admitted[i]);
        r.waiting = false;
        if (r.first_admission == 0) r.first_admission = ++admission_counter;
        expect_waiting.erase(waiting_key.at(iter.admitted[i]));
      }
      EXPECT_LE(static_cast<int>(iter.batch.size()), o.max_batch_size);
      EXPECT_EQ(static_cast<int>(iter.batch.size()), s->running_requests());
      for (size_t i = 1; i < iter.batch.size(); ++i) {
        EXPECT_LT(reqs.at(iter.batch[i - 1]).first_admission,
                  reqs.at(iter.batch[i]).first_admission);
      }
      // Forward pass: each request appends one token; a missing page
      // preempts the youngest until the page is there or the request
      // itself was preempted.
      for (const std::string& id : iter.batch) {
        if (!s->IsRunning(id)) continue;  // preempted earlier this iteration
        Req& r = reqs.at(id);
        const int need = (r.context + 1 + page - 1) / page;
        while (need > r.pages && free_pages == 0) {
          const std::optional<std::string> victim = s->ChoosePreemptionVictim();
          ASSERT_TRUE(victim.has_value());
          Req& v = reqs.at(*victim);
          // The victim is the youngest running request.
          for (const std::string& other : iter.batch) {
            if (s->IsRunning(other)) {
              EXPECT_LE(reqs.at(other).first_admission, v.first_admission);
            }
          }
          ASSERT_TRUE(s->Preempt(*victim, v.context, now).ok());
          ++ops;
          free_pages += v.pages;
          v.pages = 0;
          v.waiting = true;
          waiting_key[*victim] = {0, v.first_admission};
          expect_waiting[{0, v.first_admission}] = *victim;
          if (*victim == id) break;
        }
        if (!s->IsRunning(id)) continue;
        if (need > r.pages) {
          --free_pages;
          ++r.pages;
        }
        ++r.context;
        if (--r.to_generate == 0) {
          ASSERT_TRUE(s->Finish(id).ok());
          ++ops;
          free_pages += r.pages;
          reqs.erase(id);
        }
      }
      int held = 0;
      for (const auto& [id, r] : reqs) held += r.pages;
      ASSERT_EQ(held + free_pages, pool_pages);
      ASSERT_GE(free_pages, 0);
      ASSERT_EQ(s->waiting_requests(), static_cast<int>(expect_waiting.size()));
    }
  }
  std::printf("decode operations: %lld\n", static_cast<long long>(ops));
  EXPECT_GE(ops, 20'000);
}

}  // namespace
}  // namespace swaserve::sched
