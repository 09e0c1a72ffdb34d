// Router policy on real traffic (policy simulation): a
// deterministic discrete-event SIMULATION of a prefill cluster that replays
// the Mooncake conversation trace (a data input outside the repository,
// ../shared/traces/mooncake_conversation_trace.jsonl: docs/benchmarks.md#traces) through four routing policies and compares cache hit rate,
// load balance and TTFT. It is not a cluster measurement.
//
// Cluster model (--workers, default 8 prefill workers of one bucket):
//   - each worker owns a REAL kv::PrefixCache over metadata-only dual
//     KvPools (allocate_memory = false) of the MiMo-V2.5-Pro shape, sized
//     like bench/kv/kv_trace_replay_bench: --capacity tokens of single-pool
//     KV (default 1M = 334 GiB per worker) split by SizePools with SWA/full
//     ratio 0.02 (~6.2M cached tokens of full KV per worker);
//   - one request at a time per worker, FIFO queue per worker. When a
//     request starts, its hit is the cache's window-safe MatchAndLock(prompt
//     hashes, len - 1) at that moment; a kv::Sequence from the hit appends
//     the rest in 4096-token chunks (evicting on demand) and Finish() hands
//     the prompt's pages to the cache when its prefill ends (decode is not
//     simulated; prompts only, as in the KV replay);
//   - prefill time = uncached tokens / --tokens-per-s (compute proportional
//     to uncached tokens; no per-step overhead, no attention term);
//     TTFT = queue wait + that compute (no network, no first decode step).
// Trace: loaded with swaserve::loadgen::LoadMooncakeTrace; token ids are
// synthesized per 512-token block id with continuations reconstructed
// exactly as kv_trace_replay_bench does (the README's caveat for SWA
// caches: without it a window-safe cache finds almost nothing). Lengths are
// not scaled (metadata-only pools need no memory per token); arrival times
// are the trace's own (59 minutes).
// Rate: the default --tokens-per-s 6200 per worker is what --utilization
// 0.7 finds (fixed-point iteration so that ROUND-ROBIN keeps the cluster
// busy 70% of the time on the first half of the trace: 6,231 at 1M
// capacity), rounded. The engine itself (bench/RESULTS.md "Scheduling":
// b = 7.41 ms/token on the mimo-v2.5-pro-mini checkpoint, one CPU thread,
// ~135 tokens/s) would need the trace's time stretched ~46x for the same
// utilization: the rate only sets the utilization, which is what matters
// for the comparison.
//
// What the router sees (the same for every policy that uses it): per worker
// the EXACT matched full-KV prefix depth of the prompt's page hashes in that
// worker's cache at the arrival instant (what our Redis prefix index holds:
// it mirrors the workers' stored/removed events and tracks full KV, not the
// window-safe part; dispatch predictions are not modelled), capped at len-1
// rounded down to pages; and its load: queued_uncached_tokens = the router's
// uncached estimate of each queued request + the running request's
// remaining compute, running (0/1) and queued requests.
//
// Policies:
//   round-robin  request i -> worker i mod N;
//   least-load   min queued_uncached_tokens (ties: lower index);
//   sglang       SGLang's cache-aware policy (sgl-model-gateway
//                policies/cache_aware.rs) with its defaults: load = queued +
//                running requests; imbalanced when max-min > 64 AND max >
//                1.5*min -> least load; else match rate = best depth /
//                prompt > 0.3 -> the worker with the deepest match (ties:
//                lower load, then index); else the worker with the smallest
//                cache (fewest cached full pages: SGLang's "smallest tree").
//                Unlike SGLang's approximate char tree it gets exact depths;
//   ours         router::ChoosePrefill with PolicyOptions defaults (or the
//                --hotspot-abs/--hotspot-rel/--cache-credit overrides),
//                tie-break key = a hash of the request's index.
//
// Metrics over a window of requests (by trace order): hit rate = actual
// window-safe hit tokens / prompt tokens; load max/mean = the largest
// worker's busy time (prefill compute of the window's requests) / the mean
// over workers; utilization = total busy / (workers x (last first token -
// first arrival)); TTFT P50/P90/P99.
// Tuning discipline: --tune sweeps our policy's knobs on the FIRST HALF of
// the trace (a run of only those requests) and picks the setting with the
// lowest P90 TTFT among those with load max/mean <= 1.3 and hit rate >= 2x
// round-robin's; the defaults in lib/router/policy.h are that pick. The main
// table runs the whole trace with the defaults and reports the held-out
// SECOND HALF (requests n/2..n-1, caches warmed by the first half) and the
// whole trace; the targets are judged on the second half.
//
// --swa-study: ours with and without window restore in the
// workers and with the full-KV vs the SWA-aware router view: the router's
// expected hit against the realised one, per worker too. Restoring workers
// restore as a pyramid and publish its work, as the prefill workers do by
// default; --no-pyramid: over the whole stretch, credited M − R.
//
// Usage: policy_sim [--trace FILE] [--json FILE] [--workers 8]
//          [--capacity 1M] [--tokens-per-s 6200 | --utilization 0.7]
//          [--hotspot-abs T] [--hotspot-rel R] [--cache-credit C]
//          [--tune] [--swa-study [--no-pyramid]] [--limit N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bench/common/bench_util.h"
#include "bench/common/prompt_synth.h"
#include "bench/common/swa_pattern.h"
#include "bench/common/window_restore_plan.h"
#include "bench/router/search_probes.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"
#include "lib/loadgen/mooncake_trace.h"
#include "lib/router/policy.h"
#include "lib/sched/prefill_scheduler.h"
#include "nlohmann/json.hpp"

namespace swaserve::router {
namespace {

constexpr int kBlockTokens = bench::kTraceBlockTokens;
constexpr double kDefaultTokensPerS = 6200;
constexpr int kChunk = 4096;

using bench::Die;
using bench::Mix64;
using bench::ParseCount;
using bench::Percentile;
using search_probes::HintedProbes;
using search_probes::HintFirstProbes;
using search_probes::SearchProbes;

// ---------------------------------------------------------------------------
// Prompt synthesis with continuations reconstructed: bench/common's
// PromptSynthesizer, as in bench/kv/kv_trace_replay_bench.cc (see its header).

struct Workload {
  std::vector<int64_t> arrival_ns;
  std::vector<int> length;
  std::vector<int64_t> offset;  // into hashes; size() = requests + 1
  std::vector<uint64_t> hashes;
  size_t size() const { return length.size(); }
  absl::Span<const uint64_t> Hashes(size_t i) const {
    return absl::MakeConstSpan(hashes).subspan(offset[i],
                                               offset[i + 1] - offset[i]);
  }
};

Workload BuildWorkload(const std::vector<loadgen::TraceRequest>& trace,
                       int page_size) {
  Workload w;
  bench::PromptSynthesizer synth(/*reconstruct=*/true);
  std::vector<uint32_t> tokens;
  w.offset.push_back(0);
  for (const loadgen::TraceRequest& r : trace) {
    if (r.input_length <= 0) continue;
    if (static_cast<int64_t>(r.hash_ids.size()) * kBlockTokens <
        r.input_length) {
      Die("trace request with fewer hash_ids than its input_length needs");
    }
    int reconstructed = 0;
    synth.Tokens(r.hash_ids, static_cast<int>(r.input_length), &tokens,
                 &reconstructed);
    std::vector<uint64_t> h = base::ChainedPageHashes(tokens, page_size);
    w.hashes.insert(w.hashes.end(), h.begin(), h.end());
    w.offset.push_back(static_cast<int64_t>(w.hashes.size()));
    w.length.push_back(static_cast<int>(r.input_length));
    w.arrival_ns.push_back(r.timestamp_ms * 1000000);
  }
  return w;
}

// ---------------------------------------------------------------------------
// Simulation.

enum class Policy { kRoundRobin, kLeastLoad, kSglang, kOurs };
const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kRoundRobin:
      return "round-robin";
    case Policy::kLeastLoad:
      return "least-load";
    case Policy::kSglang:
      return "sglang";
    case Policy::kOurs:
      return "ours";
  }
  return "?";
}

struct SimConfig {
  int workers = 8;
  kv::KvShape shape;
  int64_t full_pages = 0;
  int64_t swa_pages = 0;
  double tokens_per_s = kDefaultTokensPerS;
  // Workers restore windows (kv::Sequence::BeginWindowRestore when
  // sched::ChooseWindowRestore saves work, as the prefill worker does by
  // default); their hit is then the restore start, or with `pyramid` M
  // minus the pyramid's work.
  bool restore = false;
  // Restores computed as a pyramid (kv::WindowRestoreRows; the prefill
  // worker's default, --prefill.window_restore_pyramid): a restore costs
  // kv::WindowRestorePyramidWork token-equivalents, about half the stretch,
  // and the router credits M minus the work the worker publishes
  // (kv::WindowRestoreWorkPerRestore). False (--no-pyramid): every layer
  // over the whole stretch [s, M).
  bool pyramid = true;
  // The router's view: false = the full-KV depth M of each worker; true =
  // what the real router credits (policy.h PrefixCredit: M when the match
  // ends window-safe, else the window-safe depth L or what the worker's
  // window restore reuses), the index's L (prefix_index.h) taken from the
  // worker's cache.
  bool swa_aware = false;
  PolicyOptions ours;
  // SGLang defaults.
  double sglang_cache_threshold = 0.3;
  int64_t sglang_balance_abs = 64;
  double sglang_balance_rel = 1.5;
};

struct RunResult {
  Policy policy;
  size_t n = 0;
  std::vector<int> worker;        // per request
  std::vector<int64_t> hit;       // actual window-safe hit tokens
  std::vector<int64_t> expected;  // router-view cached tokens of the pick
  std::vector<double> ttft_s;
  std::vector<double> compute_s;
  std::vector<int64_t> done_ns;
  std::vector<Reason> reason;  // ours only
  int64_t failed = 0;
  double wall_s = 0;
  // The match script's SISMEMBER probes (prefix_index.cc auth_depth) to
  // find each candidate's depth d of an n-page prompt, summed over every
  // candidate of every decision: [0] v8's search (page 1, page n, then
  // pages n-1, n-2, n-4, ... and a binary search), [1] page 1, page n, then
  // a plain binary search over 1..n-1.
  // [2] page 1, then the depths found for the earlier candidates of the
  // same decision as hints (up to 4, the latest first; page h, then h + 1:
  // each probe narrows the bracket), then page n while open, then a binary
  // search — v10's search (prefix_index.cc).
  // [3] v11's (prefix_index_scripts.cc): the hints first (a held page h
  // implies pages 1..h), page 1 only when no hint was held — or first, while
  // there are no hints or an earlier candidate of the decision missed it.
  int64_t probe_candidates = 0;
  int64_t probes[4] = {0, 0, 0, 0};
};

struct Worker {
  std::unique_ptr<kv::KvPools> pools;
  std::unique_ptr<kv::PrefixCache> cache;
  std::deque<size_t> queue;
  int64_t queued_uncached = 0;  // router estimates of queued requests
  bool busy = false;
  size_t running = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::unique_ptr<kv::Sequence> seq;
};

RunResult Simulate(const Workload& wl, size_t n, Policy policy,
                   const SimConfig& cfg) {
  const auto t0 = std::chrono::steady_clock::now();
  const int ps = cfg.shape.page_size;
  const std::vector<bool> swa_pattern = bench::SwaPattern(cfg.shape);
  // What each worker publishes for the router's credit (WorkerInfo::
  // window_restore_work).
  const int64_t restore_work_published =
      kv::WindowRestoreWorkPerRestore(cfg.shape.sliding_window, ps, swa_pattern, 0);
  std::vector<Worker> workers(cfg.workers);
  kv::SequenceOptions so;
  for (Worker& w : workers) {
    kv::KvPoolsOptions po;
    po.shape = cfg.shape;
    po.full_pages = cfg.full_pages;
    po.swa_pages = cfg.swa_pages;
    po.allocate_memory = false;
    auto pools = kv::KvPools::Create(po);
    if (!pools.ok()) Die(std::string(pools.status().message()));
    w.pools = *std::move(pools);
    kv::PrefixCacheOptions co;
    co.pools = w.pools.get();
    co.keep_restorable_tombstones = cfg.restore;
    co.cold_superseded_windows = cfg.restore;  // as a restoring worker does
    auto cache = kv::PrefixCache::Create(co);
    if (!cache.ok()) Die(std::string(cache.status().message()));
    w.cache = *std::move(cache);
  }
  RunResult res;
  res.policy = policy;
  res.n = n;
  res.worker.assign(n, -1);
  res.hit.assign(n, 0);
  res.expected.assign(n, 0);
  res.ttft_s.assign(n, -1);
  res.compute_s.assign(n, 0);
  res.done_ns.assign(n, 0);
  res.reason.assign(n, Reason::kLeastLoad);
  std::vector<int64_t> estimate(n, 0);  // router's uncached estimate

  auto start = [&](Worker& w, int64_t t) {
    if (w.busy || w.queue.empty()) return;
    const size_t i = w.queue.front();
    w.queue.pop_front();
    w.queued_uncached -= estimate[i];
    const int len = wl.length[i];
    const absl::Span<const uint64_t> hashes = wl.Hashes(i);
    kv::MatchOptions mo{.max_tokens = len - 1};
    // As the worker does by default: from the window-safe hit itself when
    // it lies inside the stretch.
    bench::RestorePlan plan;
    if (cfg.restore) {
      plan = bench::PlanWindowRestore(*w.cache, hashes, cfg.shape, swa_pattern, cfg.pyramid,
                                      /*from_window_safe=*/true, &mo);
    }
    const sched::WindowRestoreChoice& choice = plan.choice;
    kv::CacheHit hit = w.cache->MatchAndLock(hashes, mo);
    const bool restoring = hit.needs_window_restore();
    so.pools = w.pools.get();
    so.cache = w.cache.get();
    so.evict_on_demand = true;
    w.seq = std::make_unique<kv::Sequence>(so, std::move(hit));
    int next = w.seq->length();
    res.hit[i] = next;  // tokens not computed (token-equivalents)
    if (restoring) {
      if (!w.seq->BeginWindowRestore(choice.compute_from).ok()) Die("window restore failed");
      res.hit[i] = next - std::llround(plan.work);  // compute_from without the pyramid
      next = choice.compute_from;
    }
    while (next < len) {
      const int c = std::min(kChunk, len - next);
      if (!w.seq->Prepare(next, c).ok()) {
        ++res.failed;
        w.seq->Abort();
        w.seq.reset();
        break;
      }
      next += c;
    }
    const double secs = (len - res.hit[i]) / cfg.tokens_per_s;
    res.compute_s[i] = secs;
    w.busy = true;
    w.running = i;
    w.start_ns = t;
    w.end_ns = t + std::max<int64_t>(1, std::llround(secs * 1e9));
  };

  std::vector<PrefillCandidate> cands(cfg.workers);
  for (int k = 0; k < cfg.workers; ++k) {
    cands[k].id = "p" + std::to_string(k);
  }
  std::vector<int64_t> depth(cfg.workers);
  size_t next = 0;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  while (true) {
    int64_t t = next < n ? wl.arrival_ns[next] : kNever;
    for (const Worker& w : workers) {
      if (w.busy) t = std::min(t, w.end_ns);
    }
    if (t == kNever) break;
    // 1. Prefills ending at t: cache the prompt, start the next request.
    for (Worker& w : workers) {
      if (!w.busy || w.end_ns != t) continue;
      const size_t i = w.running;
      if (w.seq) {
        w.seq->Finish(wl.Hashes(i));
        w.seq.reset();
      }
      res.ttft_s[i] = (t - wl.arrival_ns[i]) * 1e-9;
      res.done_ns[i] = t;
      w.busy = false;
      start(w, t);
    }
    // 2. Arrivals at t.
    while (next < n && wl.arrival_ns[next] == t) {
      const size_t i = next++;
      const int len = wl.length[i];
      const int64_t cap = static_cast<int64_t>((len - 1) / ps) * ps;
      std::vector<int64_t> hints;
      bool page1_missed = false;
      for (int k = 0; k < cfg.workers; ++k) {
        const Worker& w = workers[k];
        const kv::MatchLengths ml = w.cache->Match(wl.Hashes(i), len - 1);
        depth[k] = std::min<int64_t>(ml.matched_tokens, cap);
        {
          const int64_t pages = static_cast<int64_t>(wl.Hashes(i).size());
          const int64_t held = std::min<int64_t>(ml.matched_tokens / ps, pages);
          ++res.probe_candidates;
          res.probes[0] += SearchProbes(pages, held, /*from_end=*/true);
          res.probes[1] += SearchProbes(pages, held, /*from_end=*/false);
          res.probes[2] += HintedProbes(pages, held, hints);
          res.probes[3] += HintFirstProbes(pages, held, hints, &page1_missed);
          if (held > 0 && held < pages && hints.size() < 4 &&
              std::find(hints.begin(), hints.end(), held) == hints.end()) {
            hints.insert(hints.begin(), held);
          }
        }
        PrefillCandidate& c = cands[k];
        c.cached_tokens = depth[k];
        if (cfg.swa_aware) {
          // What the real router credits from the index's answer: the
          // window-safe depth L (the worker cache's own, which the index
          // mirrors: prefix_index.h Match), -1 below its scan bound.
          PrefixCreditInputs in{.full_tokens = depth[k],
                                .sliding_window = cfg.shape.sliding_window,
                                .page_size = ps,
                                .swa_chain_layers = cfg.shape.swa_layers,
                                .window_restore = cfg.restore,
                                .restore_work = cfg.restore && cfg.pyramid ? restore_work_published
                                                                           : 0};
          const int64_t safe = std::min<int64_t>(ml.safe_tokens, depth[k]);
          const int64_t scan = WindowScanPages(in, cfg.ours.window_scan_pages);
          in.window_safe_tokens = safe >= depth[k]                     ? INT64_MAX
                                  : safe / ps < depth[k] / ps - scan ? -1
                                                                     : safe;
          c.cached_tokens = std::min<int64_t>(PrefixCredit(in), cap);
        }
        const int64_t remaining =
            w.busy ? static_cast<int64_t>(
                         std::llround((w.end_ns - t) * 1e-9 * cfg.tokens_per_s))
                   : 0;
        c.queued_uncached_tokens = w.queued_uncached + remaining;
        c.running_requests = w.busy ? 1 : 0;
        c.queued_requests = static_cast<int32_t>(w.queue.size());
      }
      int pick = 0;
      switch (policy) {
        case Policy::kRoundRobin:
          pick = static_cast<int>(i % cfg.workers);
          break;
        case Policy::kLeastLoad:
          for (int k = 1; k < cfg.workers; ++k) {
            if (cands[k].queued_uncached_tokens <
                cands[pick].queued_uncached_tokens) {
              pick = k;
            }
          }
          break;
        case Policy::kSglang: {
          auto load = [&](int k) {
            return int64_t{cands[k].running_requests} +
                   cands[k].queued_requests;
          };
          int lo = 0, hi = 0;
          for (int k = 1; k < cfg.workers; ++k) {
            if (load(k) < load(lo)) lo = k;
            if (load(k) > load(hi)) hi = k;
          }
          if (load(hi) - load(lo) > cfg.sglang_balance_abs &&
              static_cast<double>(load(hi)) >
                  cfg.sglang_balance_rel * static_cast<double>(load(lo))) {
            pick = lo;
            break;
          }
          int best = 0;
          for (int k = 1; k < cfg.workers; ++k) {
            if (depth[k] > depth[best] ||
                (depth[k] == depth[best] && load(k) < load(best))) {
              best = k;
            }
          }
          if (static_cast<double>(depth[best]) / len >
              cfg.sglang_cache_threshold) {
            pick = best;
          } else {
            pick = 0;
            for (int k = 1; k < cfg.workers; ++k) {
              if (workers[k].cache->cached_full_pages() <
                  workers[pick].cache->cached_full_pages()) {
                pick = k;
              }
            }
          }
          break;
        }
        case Policy::kOurs: {
          auto d = ChoosePrefill(len, cands, cfg.ours, Mix64(i + 1));
          if (!d.ok()) Die(std::string(d.status().message()));
          pick = d->index;
          res.reason[i] = d->reason;
          break;
        }
      }
      res.worker[i] = pick;
      res.expected[i] = cands[pick].cached_tokens;
      estimate[i] = len - cands[pick].cached_tokens;
      Worker& w = workers[pick];
      w.queue.push_back(i);
      w.queued_uncached += estimate[i];
      start(w, t);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (res.ttft_s[i] < 0) Die("request never finished");
  }
  for (Worker& w : workers) {
    if (absl::Status s = w.cache->CheckInvariants(); !s.ok()) {
      Die("cache invariants: " + std::string(s.message()));
    }
  }
  res.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  return res;
}

struct Metrics {
  std::string policy;
  std::string window;
  size_t requests = 0;
  int64_t prompt_tokens = 0, hit_tokens = 0, expected_tokens = 0;
  double hit_rate = 0, expected_rate = 0;
  double load_max_over_mean = 0, utilization = 0;
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  std::vector<double> busy_s;
  // Router-expected minus realised hit tokens, over prompt tokens: the
  // whole window's, and the largest absolute one of a worker (over its own
  // prompt tokens).
  double gap = 0, worker_gap_max = 0;
  nlohmann::json reasons = nlohmann::json::object();
};

Metrics Measure(const RunResult& r, const Workload& wl, size_t lo, size_t hi,
                int workers, const std::string& window) {
  Metrics m;
  m.policy = PolicyName(r.policy);
  m.window = window;
  m.requests = hi - lo;
  m.busy_s.assign(workers, 0);
  std::vector<double> ttft;
  int64_t last_done = 0;
  absl::flat_hash_map<std::string, int64_t> reasons;
  for (size_t i = lo; i < hi; ++i) {
    m.prompt_tokens += wl.length[i];
    m.hit_tokens += r.hit[i];
    m.expected_tokens += r.expected[i];
    m.busy_s[r.worker[i]] += r.compute_s[i];
    ttft.push_back(r.ttft_s[i]);
    m.mean += r.ttft_s[i];
    last_done = std::max(last_done, r.done_ns[i]);
    if (r.policy == Policy::kOurs)
      ++reasons[std::string(ReasonName(r.reason[i]))];
  }
  m.hit_rate = static_cast<double>(m.hit_tokens) / m.prompt_tokens;
  m.expected_rate = static_cast<double>(m.expected_tokens) / m.prompt_tokens;
  m.gap = m.expected_rate - m.hit_rate;
  std::vector<int64_t> w_prompt(workers, 0), w_diff(workers, 0);
  for (size_t i = lo; i < hi; ++i) {
    w_prompt[r.worker[i]] += wl.length[i];
    w_diff[r.worker[i]] += r.expected[i] - r.hit[i];
  }
  for (int k = 0; k < workers; ++k) {
    if (w_prompt[k] > 0) {
      m.worker_gap_max = std::max(
          m.worker_gap_max, std::abs(static_cast<double>(w_diff[k]) / w_prompt[k]));
    }
  }
  double total = 0, mx = 0;
  for (double b : m.busy_s) {
    total += b;
    mx = std::max(mx, b);
  }
  m.load_max_over_mean = total > 0 ? mx / (total / workers) : 0;
  const double span = (last_done - wl.arrival_ns[lo]) * 1e-9;
  m.utilization = span > 0 ? total / (workers * span) : 0;
  m.p50 = Percentile(ttft, 0.5);
  m.p90 = Percentile(ttft, 0.9);
  m.p99 = Percentile(ttft, 0.99);
  m.mean /= std::max<size_t>(1, m.requests);
  for (const auto& [k, v] : reasons) m.reasons[k] = v;
  return m;
}

nlohmann::json ToJson(const Metrics& m) {
  return {{"policy", m.policy},
          {"window", m.window},
          {"requests", m.requests},
          {"prompt_tokens", m.prompt_tokens},
          {"hit_tokens", m.hit_tokens},
          {"hit_rate", m.hit_rate},
          {"router_expected_cached_rate", m.expected_rate},
          {"expected_minus_hit", m.gap},
          {"worker_expected_minus_hit_max_abs", m.worker_gap_max},
          {"load_max_over_mean", m.load_max_over_mean},
          {"busy_s_per_worker", m.busy_s},
          {"utilization", m.utilization},
          {"ttft_p50_s", m.p50},
          {"ttft_p90_s", m.p90},
          {"ttft_p99_s", m.p99},
          {"ttft_mean_s", m.mean},
          {"reasons", m.reasons}};
}

void PrintHeader() {
  std::printf("%-12s %-7s %8s %8s %9s %6s %9s %9s %9s %9s\n", "policy",
              "window", "hit", "expected", "max/mean", "util", "TTFT p50",
              "p90", "p99", "mean");
}

void PrintRow(const Metrics& m) {
  std::printf(
      "%-12s %-7s %7.2f%% %7.2f%% %9.3f %5.1f%% %8.2fs %8.2fs %8.2fs "
      "%8.2fs\n",
      m.policy.c_str(), m.window.c_str(), 100 * m.hit_rate,
      100 * m.expected_rate, m.load_max_over_mean, 100 * m.utilization, m.p50,
      m.p90, m.p99, m.mean);
  std::fflush(stdout);
}

struct Flags {
  std::string trace;
  std::string json;
  int workers = 8;
  double capacity = 1e6;
  double tokens_per_s = kDefaultTokensPerS;
  double utilization = 0;  // > 0: calibrate tokens_per_s on round-robin
  int64_t hotspot_abs = -1;
  double hotspot_rel = 0;
  double cache_credit = -1;
  bool tune = false;
  bool swa_study = false;
  bool pyramid = true;  // --no-pyramid: restores over the whole stretch
  int64_t limit = 0;
};

// Parses the command line (exits after --help; Die on a bad flag).
Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (bench::FlagReader r(argc, argv); r.Next();) {
    const std::string& a = r.flag();
    auto next = [&] { return r.Value(); };
    auto num = [&](double* out) { r.Number(out); };
    if (a == "--trace") {
      f.trace = next();
    } else if (a == "--json") {
      f.json = next();
    } else if (a == "--workers") {
      double v;
      num(&v);
      f.workers = static_cast<int>(v);
    } else if (a == "--capacity") {
      f.capacity = ParseCount(next());
    } else if (a == "--tokens-per-s") {
      num(&f.tokens_per_s);
    } else if (a == "--utilization") {
      num(&f.utilization);
    } else if (a == "--hotspot-abs") {
      f.hotspot_abs = static_cast<int64_t>(ParseCount(next()));
    } else if (a == "--hotspot-rel") {
      num(&f.hotspot_rel);
    } else if (a == "--cache-credit") {
      num(&f.cache_credit);
    } else if (a == "--swa-study") {
      f.swa_study = true;
    } else if (a == "--no-pyramid") {
      f.pyramid = false;
    } else if (a == "--tune") {
      f.tune = true;
    } else if (a == "--limit") {
      f.limit = static_cast<int64_t>(ParseCount(next()));
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: policy_sim [--trace FILE] [--json FILE] [--workers 8]\n"
          "  [--capacity 1M] [--tokens-per-s 6200 | --utilization 0.7]\n"
          "  [--hotspot-abs T] [--hotspot-rel R] [--cache-credit C]\n"
          "  [--tune] [--swa-study [--no-pyramid]] [--limit N]\n");
      std::exit(0);
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.workers < 1) Die("--workers must be >= 1");
  if (f.tokens_per_s <= 0) Die("--tokens-per-s must be > 0");
  if (f.trace.empty()) {
    f.trace = bench::RepoPath(bench::kMooncakeTracePath, SWASERVE_SOURCE_DIR);
  }
  return f;
}

// The prefill rate per worker at which round-robin runs the first half at
// f.utilization (its busy time scales ~1/rate).
double CalibrateRate(const Workload& wl, size_t half, const SimConfig& cfg, const Flags& f) {
  // Round-robin's busy time scales ~1/rate; iterate on the first half.
  double rate = cfg.tokens_per_s;
  for (int it = 0; it < 6; ++it) {
    SimConfig c = cfg;
    c.tokens_per_s = rate;
    const RunResult r = Simulate(wl, half, Policy::kRoundRobin, c);
    const Metrics m = Measure(r, wl, 0, half, f.workers, "first");
    std::fprintf(stderr, "calibration: %.0f tokens/s -> utilization %.3f\n",
                 rate, m.utilization);
    if (std::abs(m.utilization - f.utilization) < 0.002) break;
    rate *= m.utilization / f.utilization;
  }
  return rate;

}

// Sweeps our policy's options on the first half (run alone) and picks the
// lowest P90 that meets the constraints; returns the JSON of the sweep.
nlohmann::json Tune(const Workload& wl, size_t half, const SimConfig& cfg, const Flags& f) {
  std::printf("== Tuning on the first half (%zu requests, run alone) ==\n",
              half);
  const Metrics rr = Measure(Simulate(wl, half, Policy::kRoundRobin, cfg), wl,
                             0, half, f.workers, "first");
  const Metrics sg = Measure(Simulate(wl, half, Policy::kSglang, cfg), wl, 0,
                             half, f.workers, "first");
  PrintHeader();
  PrintRow(rr);
  PrintRow(sg);
  std::printf("%-7s %-7s %-7s %8s %9s %9s %9s %9s\n", "credit", "abs", "rel",
              "hit", "max/mean", "TTFT p50", "p90", "p99");
  nlohmann::json sweep = nlohmann::json::array();
  double best_p90 = std::numeric_limits<double>::infinity();
  nlohmann::json best;
  const int64_t kOff = std::numeric_limits<int64_t>::max();
  for (double credit : {1.0, 1.5, 2.0}) {
    for (int64_t abs : {int64_t{4096}, int64_t{16384}, int64_t{32768},
                        int64_t{65536}, kOff}) {
      for (double rel : {1.5, 2.0, 4.0}) {
        if (abs == kOff && rel != 2.0) continue;
        SimConfig c = cfg;
        c.ours.cache_credit = credit;
        c.ours.hotspot_abs_tokens = abs;
        c.ours.hotspot_rel = rel;
        const Metrics m = Measure(Simulate(wl, half, Policy::kOurs, c), wl, 0,
                                  half, f.workers, "first");
        const bool ok =
            m.load_max_over_mean <= 1.3 && m.hit_rate >= 2 * rr.hit_rate;
        std::printf("%-7g %-7s %-7g %7.2f%% %9.3f %8.2fs %8.2fs %8.2fs %s\n",
                    credit, abs == kOff ? "off" : std::to_string(abs).c_str(),
                    rel, 100 * m.hit_rate, m.load_max_over_mean, m.p50, m.p90,
                    m.p99, ok ? "" : "(fails a constraint)");
        nlohmann::json j = ToJson(m);
        j["cache_credit"] = credit;
        j["hotspot_abs_tokens"] =
            abs == kOff ? nlohmann::json("off") : nlohmann::json(abs);
        j["hotspot_rel"] = rel;
        j["meets_constraints"] = ok;
        sweep.push_back(j);
        if (ok && m.p90 < best_p90) {
          best_p90 = m.p90;
          best = j;
        }
      }
    }
  }
  std::printf(
      "pick (lowest P90 with max/mean <= 1.3 and hit >= 2x "
      "round-robin): %s\n\n",
      best.is_null() ? "none" : best.dump().c_str());
  return {{"round_robin", ToJson(rr)},
                   {"sglang", ToJson(sg)},
                   {"sweep", sweep},
                   {"pick", best}};

}

// SWA-aware affinity: the router's expected hit against what the
// workers realise, with and without window restore in the workers and with
// the full-KV vs the SWA-aware view.
nlohmann::json SwaStudy(const Workload& wl, size_t half, const SimConfig& cfg, const Flags& f) {
  const size_t n = wl.size();
  std::printf("== SWA-aware affinity, ours, whole trace; 'second' = requests %zu..%zu ==\n",
              half, n - 1);
  std::printf("%-8s %-10s %-7s %8s %8s %8s %10s %9s %9s\n", "workers", "view", "window",
              "hit", "expected", "gap", "worker gap", "TTFT p50", "p90");
  nlohmann::json study = nlohmann::json::array();
  for (bool restore : {false, true}) {
    for (bool aware : {false, true}) {
      SimConfig c = cfg;
      c.restore = restore;
      c.swa_aware = aware;
      const RunResult r = Simulate(wl, n, Policy::kOurs, c);
      for (const auto& [lo, window] : {std::pair<size_t, const char*>{half, "second"},
                                       std::pair<size_t, const char*>{0, "whole"}}) {
        const Metrics m = Measure(r, wl, lo, n, f.workers, window);
        std::printf("%-8s %-10s %-7s %7.2f%% %7.2f%% %+7.2f%% %9.2f%% %8.2fs %8.2fs\n",
                    restore ? "restore" : "no-rest.", aware ? "swa-aware" : "full-kv",
                    window, 100 * m.hit_rate, 100 * m.expected_rate, 100 * m.gap,
                    100 * m.worker_gap_max, m.p50, m.p90);
        nlohmann::json j = ToJson(m);
        j["workers_restore"] = restore;
        j["router_view"] = aware ? "swa_aware" : "full_kv";
        j["failed_requests"] = r.failed;
        study.push_back(j);
      }
    }
  }
  std::printf("gap = router-expected minus realised hit tokens over prompt tokens; worker gap "
              "= the largest |gap| of one worker\n\n");
  return study;

}

// The simulated cluster the flags describe (dies on bad policy options).
SimConfig ConfigFromFlags(const Flags& f) {
  SimConfig cfg;
  cfg.workers = f.workers;
  cfg.shape = kv::KvShape::MiMoV25Pro();
  const double single_token_bytes = static_cast<double>(
      cfg.shape.Full().TokenBytes() + cfg.shape.Swa().TokenBytes());
  auto sizes = kv::SizePools(
      cfg.shape, static_cast<int64_t>(f.capacity * single_token_bytes), 0.02);
  if (!sizes.ok()) Die(std::string(sizes.status().message()));
  cfg.full_pages = sizes->full_pages;
  cfg.swa_pages = sizes->swa_pages;
  cfg.tokens_per_s = f.tokens_per_s;
  cfg.pyramid = f.pyramid;
  if (f.hotspot_abs >= 0) cfg.ours.hotspot_abs_tokens = f.hotspot_abs;
  if (f.hotspot_rel > 0) cfg.ours.hotspot_rel = f.hotspot_rel;
  if (f.cache_credit >= 0) cfg.ours.cache_credit = f.cache_credit;
  if (absl::Status s = ValidatePolicyOptions(cfg.ours); !s.ok()) {
    Die(std::string(s.message()));
  }
  return cfg;
}

// Every policy over the whole trace with the defaults: prints and records
// (out["results"], out["probes_per_candidate"]) the held-out second half and
// the whole trace; returns the second half's metrics, in the order
// round-robin, least-load, sglang, ours.
std::vector<Metrics> ComparePolicies(const Workload& wl, size_t half, const SimConfig& cfg,
                                     const Flags& f, nlohmann::json& out) {
  const size_t n = wl.size();
  std::printf(
      "== Whole trace with the defaults; 'second' = held-out requests "
      "%zu..%zu ==\n",
      half, n - 1);
  PrintHeader();
  std::vector<Metrics> second, whole;
  std::string probe_line;
  nlohmann::json results = nlohmann::json::array();
  for (Policy p : {Policy::kRoundRobin, Policy::kLeastLoad, Policy::kSglang,
                   Policy::kOurs}) {
    const RunResult r = Simulate(wl, n, p, cfg);
    if (r.failed > 0) {
      std::fprintf(stderr, "%s: %lld requests did not fit the pools\n",
                   PolicyName(p), static_cast<long long>(r.failed));
    }
    second.push_back(Measure(r, wl, half, n, f.workers, "second"));
    whole.push_back(Measure(r, wl, 0, n, f.workers, "whole"));
    PrintRow(second.back());
    PrintRow(whole.back());
    if (p == Policy::kOurs) {
      const double c = std::max<int64_t>(1, r.probe_candidates);
      probe_line = absl::StrFormat(
          "ours, the match script's SISMEMBER probes per candidate (whole trace, %lld): "
          "v8 (search from the end) %.2f, plain binary search %.2f, v10 (hinted by the earlier "
          "candidates' depths) %.2f, v11 (hints before page 1) %.2f",
          static_cast<long long>(r.probe_candidates), r.probes[0] / c, r.probes[1] / c,
          r.probes[2] / c, r.probes[3] / c);
      out["probes_per_candidate"] = {{"from_end", r.probes[0] / c},
                                     {"binary", r.probes[1] / c},
                                     {"hinted", r.probes[2] / c},
                                     {"hint_first", r.probes[3] / c}};
    }
    nlohmann::json a = ToJson(second.back());
    nlohmann::json b = ToJson(whole.back());
    a["failed_requests"] = b["failed_requests"] = r.failed;
    a["sim_wall_s"] = b["sim_wall_s"] = r.wall_s;
    results.push_back(a);
    results.push_back(b);
  }
  std::printf(
      "\ncolumns: hit = window-safe hit tokens / prompt tokens; expected = "
      "the router's view (full-KV depth) of the chosen worker; max/mean = "
      "busiest worker's prefill seconds / mean; util = busy / (workers x "
      "span); TTFT = queue + prefill compute\n");
  if (!whole.back().reasons.empty()) {
    std::printf("ours, decisions by reason (whole trace): %s\n",
                whole.back().reasons.dump().c_str());
  }
  if (!probe_line.empty()) std::printf("%s\n", probe_line.c_str());
  out["results"] = results;
  return second;
}

// The targets on the held-out second half (`second` as ComparePolicies
// returns it): printed and recorded in out["targets"].
void ReportTargets(const std::vector<Metrics>& second, const SimConfig& cfg, nlohmann::json& out) {
  const Metrics& rr = second[0];
  const Metrics& sg = second[2];
  const Metrics& us = second[3];
  const bool t1 = us.hit_rate >= 2 * rr.hit_rate;
  const bool t2 = us.load_max_over_mean <= 1.3;
  const bool t3 = us.p90 < sg.p90 && us.hit_rate >= sg.hit_rate;
  std::printf("\n== Targets (held-out second half) ==\n");
  std::printf("ours hit %.2f%% >= 2x round-robin %.2f%% (%.2fx): %s\n",
              100 * us.hit_rate, 100 * rr.hit_rate, us.hit_rate / rr.hit_rate,
              t1 ? "MET" : "NOT MET");
  std::printf("ours load max/mean %.3f <= 1.3: %s\n", us.load_max_over_mean,
              t2 ? "MET" : "NOT MET");
  std::printf(
      "ours P90 TTFT %.2f s < sglang %.2f s at hit %.2f%% >= sglang "
      "%.2f%%: %s\n",
      us.p90, sg.p90, 100 * us.hit_rate, 100 * sg.hit_rate,
      t3 ? "MET" : "NOT MET");
  out["targets"] = {{"hit_2x_round_robin", t1},
                    {"load_max_over_mean_le_1_3", t2},
                    {"p90_below_sglang_at_equal_or_better_hit", t3}};
  out["ours_options"] = {{"cache_credit", cfg.ours.cache_credit},
                         {"hotspot_abs_tokens", cfg.ours.hotspot_abs_tokens},
                         {"hotspot_rel", cfg.ours.hotspot_rel}};
}

int Main(int argc, char** argv) {
  bench::SetProgramName("policy_sim");
  const Flags f = ParseFlags(argc, argv);
  auto trace = loadgen::LoadMooncakeTrace(f.trace, f.limit);
  if (!trace.ok()) Die(std::string(trace.status().message()));
  std::stable_sort(trace->begin(), trace->end(),
                   [](const auto& a, const auto& b) {
                     return a.timestamp_ms < b.timestamp_ms;
                   });

  SimConfig cfg = ConfigFromFlags(f);

  const Workload wl = BuildWorkload(*trace, cfg.shape.page_size);
  const size_t n = wl.size();
  const size_t half = n / 2;
  int64_t total_tokens = 0;
  for (int l : wl.length) total_tokens += l;

  nlohmann::json out = {{"benchmark", "policy_sim"},
                        {"trace", f.trace},
                        {"requests", n},
                        {"prompt_tokens", total_tokens},
                        {"workers", f.workers},
                        {"capacity_single_pool_tokens", f.capacity},
                        {"full_pages_per_worker", cfg.full_pages},
                        {"swa_pages_per_worker", cfg.swa_pages}};

  if (f.utilization > 0) {
    cfg.tokens_per_s = CalibrateRate(wl, half, cfg, f);
    out["calibrated_for_utilization"] = f.utilization;
  }
  out["tokens_per_s"] = cfg.tokens_per_s;

  std::printf(
      "trace %s: %zu requests, %lld prompt tokens, %.0f s; continuations "
      "reconstructed\n"
      "%d prefill workers, each a PrefixCache over dual pools of %g "
      "single-pool tokens (%lld full + %lld SWA pages, ratio 0.02, "
      "MiMo-V2.5-Pro shape, metadata only)\n"
      "prefill %.0f tokens/s per worker, one request at a time, FIFO; "
      "router sees exact full-KV matched depth per worker\n"
      "ours: cache_credit %g, hotspot_abs_tokens %lld, hotspot_rel %g\n\n",
      f.trace.c_str(), n, static_cast<long long>(total_tokens),
      (wl.arrival_ns.back() - wl.arrival_ns.front()) * 1e-9, f.workers,
      f.capacity, static_cast<long long>(cfg.full_pages),
      static_cast<long long>(cfg.swa_pages), cfg.tokens_per_s,
      cfg.ours.cache_credit,
      static_cast<long long>(cfg.ours.hotspot_abs_tokens),
      cfg.ours.hotspot_rel);

  if (f.tune) out["tuning"] = Tune(wl, half, cfg, f);
  if (f.swa_study) out["swa_study"] = SwaStudy(wl, half, cfg, f);

  const std::vector<Metrics> second = ComparePolicies(wl, half, cfg, f, out);
  ReportTargets(second, cfg, out);
  if (!f.json.empty()) {
    bench::WriteJsonFile(f.json, out);
  }
  return 0;
}

}  // namespace
}  // namespace swaserve::router

int main(int argc, char** argv) { return swaserve::router::Main(argc, argv); }
