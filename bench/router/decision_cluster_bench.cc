// The prefix-affinity decision on a single Redis vs a 3-master Redis Cluster
// (and decision_bench's figure on a cluster): latency, router CPU and
// Redis CPU per decision — in total and per master — with the index split
// into 64 shards by anchor page (prefix_index.h, index_shard_mapper.h).
//
// Setup: a redis-server and a 3-master Redis Cluster (no replicas: the same
// work per write as the single server), started here on loopback through
// tests/integration/cluster's helpers (--save "" --appendonly no). Each holds
// the same index, written through cluster::PrefixIndex::Apply (the cluster's
// ops through IndexShardMapper, as WorkerRegistration does): 8 prefill
// workers, --hashes (10^6) page hashes of prompts of --prompt-pages (256:
// 4K tokens at 16 per page), prompt i on worker i mod 8; every prompt starts
// with the same --shared-pages (32: 512 tokens, the Mooncake conversation
// trace's shared first block) so that the anchor page, not the first, must
// spread the chains. Load reports of the 8 workers are set once.
//
// Queries (a pool of 600, cycled): 1/3 an indexed prompt (full hit on its
// worker), 1/3 its first half + fresh pages, 1/3 a fresh prompt after the
// shared pages; each checked (depth of the owner = 256 / 128 / 32). The
// decision is ClusterView::MatchPrefixesAndLoads over the 8 workers (what
// router::Router::Route calls: depths, window-safe depths, L1 depths, loads;
// on the cluster the loads come from the view's 25 ms cache). --decisions
// (20,000) over --threads (2) threads after a warm-up. Redis CPU: INFO cpu
// (used_cpu_sys + used_cpu_user) of every master before and after; "redis
// user" is the user part alone — commands and scripts — since on this VM
// most of the system part is the loopback sockets' wake-ups (perf: the
// reply's sock_def_readable and epoll_wait), which scale with round trips,
// not with the script.
//
// --coalesce N turns on the client's group commit (N pipelines in flight),
// as the router runs it: with many --threads, decisions that queue share a
// pipeline, so Redis reads, parses and answers them in one go.
//
// Usage: decision_cluster_bench [--hashes N] [--decisions N] [--threads N]
//          [--prompt-pages N] [--shared-pages N] [--coalesce N] [--mirror]
//          [--rate N] [--cluster-rate N] [--rounds N] [--node-timeout-ms N]
//          [--json FILE]
// --rate N paces the decisions at N per second over all threads (the same
// workload for the single Redis and the cluster) instead of a closed loop;
// --cluster-rate N paces the cluster rows at N instead (3 x --rate: the same
// load per server);
// --rounds N (with --mirror) measures the two mirrored rows N times,
// alternately.
// --mirror adds two rows: the cluster and a single Redis whose decisions
// take the depths from a router index mirror (index_mirror.h: the
// prefix_extend script only adds predictions and reads the loads; on the
// cluster the loads come from the view's cache), and the mirror's Redis CPU
// per event op it reads on one Redis (2,000 stored ops applied with the
// mirror reading vs without, in the order with, without, without, with: the
// averages).
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "bench/common/bench_util.h"
#include "absl/time/clock.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/index_mirror.h"
#include "lib/cluster/index_shard_mapper.h"
#include "lib/cluster/prefix_index.h"
#include "lib/cluster/redis_client.h"
#include "nlohmann/json.hpp"
#include "swaserve/v1/common.pb.h"
#include "tests/integration/cluster/redis_cluster_server.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve {
namespace {

using cluster::CacheEventOp;
using cluster::RedisClient;
using bench::ThreadCpuSeconds;

constexpr int kWorkers = 8;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "decision_cluster_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Flags {
  int64_t hashes = 1000000;
  int decisions = 20000;
  int threads = 2;
  int prompt_pages = 256;
  int shared_pages = 32;
  // The client's group commit (RedisOptions::coalesce_calls) with this many
  // pipelines in flight, as the router runs it (--redis_coalesce); 0 = off.
  int coalesce = 0;
  // Also measure a single Redis whose decisions take the depths from a
  // router index mirror (index_mirror.h), and the mirror's cost per event.
  bool mirror = false;
  // Decisions per second over all threads, paced (each thread sends its next
  // decision at its scheduled time, or at once when late); 0 = as fast as the
  // threads can (closed loop). Paced, the single Redis and the cluster serve
  // the same workload, so their Redis CPU per decision compares like for
  // like; closed loop, each runs at its own saturation point.
  double rate = 0;
  // The cluster rows' pace (0: --rate). At 3 x --rate each master serves
  // what the single Redis serves: the same load per server, so the same
  // requests per wake-up of its event loop.
  double cluster_rate = 0;
  // With --mirror: the mirrored single Redis and the mirrored cluster are
  // measured this many times, alternately, in one process (the VM's speed
  // drifts over minutes; alternating rounds see the same drift).
  int rounds = 1;
  // The cluster's cluster-node-timeout: Redis's default (the test helper's
  // 1 s is for fast failovers; the nodes ping each other at least every
  // half of it, idle CPU the decisions would be charged).
  int node_timeout_ms = 15000;
  std::string json;
};

// The client options of the bench: pool for the threads, group commit.
cluster::RedisOptions BenchClientOptions(cluster::RedisOptions ro, const Flags& f) {
  ro.pool_size = std::max(ro.pool_size, f.threads + 1);
  if (f.coalesce > 0) {
    ro.coalesce_calls = true;
    ro.coalesce_in_flight = f.coalesce;
  }
  return ro;
}

// CPU seconds of a redis-server: used_cpu_sys + used_cpu_user, and the user
// part alone (commands and scripts, without the kernel's socket work).
struct ServerCpu {
  double total = 0;
  double user = 0;
};

// ServerCpu of every master ("host:port" -> seconds).
std::map<std::string, ServerCpu> MasterCpu(RedisClient& redis) {
  auto replies = redis.CommandOnEveryMaster({"INFO", "cpu"}, "bench");
  if (!replies.ok()) Die("INFO cpu: " + replies.status().ToString());
  std::map<std::string, ServerCpu> out;
  for (const auto& [address, r] : *replies) {
    ServerCpu cpu;
    for (absl::string_view line : absl::StrSplit(r.str, "\r\n")) {
      double v = 0;
      if (absl::ConsumePrefix(&line, "used_cpu_sys:") && absl::SimpleAtod(line, &v)) {
        cpu.total += v;
      } else if (absl::ConsumePrefix(&line, "used_cpu_user:") && absl::SimpleAtod(line, &v)) {
        cpu.total += v;
        cpu.user += v;
      }
    }
    out[address] = cpu;
  }
  return out;
}

// Redis's own accounting over every master (INFO commandstats): calls and
// usec per command name.
struct CommandStat {
  double calls = 0;
  double usec = 0;
};
std::map<std::string, CommandStat> CommandStats(RedisClient& redis) {
  auto replies = redis.CommandOnEveryMaster({"INFO", "commandstats"}, "bench");
  if (!replies.ok()) Die("INFO commandstats: " + replies.status().ToString());
  std::map<std::string, CommandStat> out;
  for (const auto& [address, r] : *replies) {
    // cmdstat_evalsha:calls=20300,usec=512345,usec_per_call=25.24,...
    for (absl::string_view line : absl::StrSplit(r.str, "\r\n")) {
      if (!absl::ConsumePrefix(&line, "cmdstat_")) continue;
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos) continue;
      CommandStat& st = out[std::string(line.substr(0, colon))];
      for (absl::string_view kv : absl::StrSplit(line.substr(colon + 1), ',')) {
        double v = 0;
        if (absl::ConsumePrefix(&kv, "calls=") && absl::SimpleAtod(kv, &v)) st.calls += v;
        if (absl::ConsumePrefix(&kv, "usec=") && absl::SimpleAtod(kv, &v)) st.usec += v;
      }
    }
  }
  return out;
}

struct Workload {
  std::vector<uint64_t> shared;
  std::vector<std::vector<uint64_t>> prompts;  // indexed, prompt i on worker i % 8
};

Workload MakeWorkload(const Flags& f) {
  std::mt19937_64 rng(42);
  Workload w;
  for (int i = 0; i < f.shared_pages; ++i) w.shared.push_back(rng() | 1);
  const int64_t tail = f.prompt_pages - f.shared_pages;
  const int64_t n = std::max<int64_t>(kWorkers, (f.hashes - kWorkers * f.shared_pages) / tail);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<uint64_t> p = w.shared;
    for (int64_t j = 0; j < tail; ++j) p.push_back(rng() | 1);
    w.prompts.push_back(std::move(p));
  }
  return w;
}

// Writes the workload into `redis`'s index, as the workers' registrations
// would (sharded: through an IndexShardMapper per worker).
void Populate(RedisClient& redis, cluster::PrefixIndex& index, const Workload& w, int anchor) {
  std::vector<std::unique_ptr<cluster::IndexShardMapper>> mappers;
  for (int k = 0; k < kWorkers; ++k) {
    mappers.push_back(std::make_unique<cluster::IndexShardMapper>(index.keys(), anchor));
  }
  std::vector<std::vector<CacheEventOp>> pending(kWorkers);
  std::vector<size_t> pending_hashes(kWorkers, 0);
  std::vector<bool> has_shared(kWorkers, false);
  auto flush = [&](int k) {
    if (pending[k].empty()) return;
    auto s = index.Apply(absl::StrCat("prefill-", k), pending[k], "populate");
    if (!s.ok()) Die("populate: " + s.status().ToString());
    pending[k].clear();
    pending_hashes[k] = 0;
  };
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    const int k = static_cast<int>(i % kWorkers);
    const std::vector<uint64_t>& p = w.prompts[i];
    // Only the pages the worker does not hold yet are stored.
    const size_t first = has_shared[k] ? w.shared.size() : 0;
    has_shared[k] = true;
    const std::vector<uint64_t> stored(p.begin() + static_cast<ptrdiff_t>(first), p.end());
    if (index.sharded()) {
      cluster::PathEvent e{.kind = CacheEventOp::Kind::kStored,
                           .hashes = stored,
                           .depth = static_cast<int>(first),
                           .parent = first > 0 ? p[first - 1] : 0,
                           .anchor = p.size() > static_cast<size_t>(anchor) ? p[anchor] : 0};
      mappers[k]->Map(e, &pending[k]);
    } else {
      pending[k].push_back(CacheEventOp{.kind = CacheEventOp::Kind::kStored, .hashes = stored});
    }
    pending_hashes[k] += stored.size();
    if (pending_hashes[k] >= 10000) flush(k);
  }
  for (int k = 0; k < kWorkers; ++k) flush(k);
  for (int k = 0; k < kWorkers; ++k) {
    swaserve::v1::WorkerLoad load;
    load.set_worker_id(absl::StrCat("prefill-", k));
    load.set_queued_uncached_tokens(100 * k);
    auto s = redis.Command({"SET", index.keys().LoadKey(absl::StrCat("prefill-", k)),
                            load.SerializeAsString()},
                           "populate");
    if (!s.ok()) Die("load report: " + s.status().ToString());
  }
}

struct Query {
  std::vector<uint64_t> hashes;
  int owner = -1;
  int64_t want = 0;  // the owner's depth
};

std::vector<Query> MakeQueries(const Workload& w, int prompt_pages) {
  std::mt19937_64 rng(7);
  std::vector<Query> out;
  for (int i = 0; i < 600; ++i) {
    const size_t p = rng() % w.prompts.size();
    Query q;
    q.owner = static_cast<int>(p % kWorkers);
    if (i % 3 == 0) {
      q.hashes = w.prompts[p];
      q.want = prompt_pages;
    } else if (i % 3 == 1) {
      q.hashes.assign(w.prompts[p].begin(), w.prompts[p].begin() + prompt_pages / 2);
      while (static_cast<int>(q.hashes.size()) < prompt_pages) q.hashes.push_back(rng() | 1);
      q.want = prompt_pages / 2;
    } else {
      q.hashes = w.shared;
      while (static_cast<int>(q.hashes.size()) < prompt_pages) q.hashes.push_back(rng() | 1);
      q.want = static_cast<int64_t>(w.shared.size());
    }
    out.push_back(std::move(q));
  }
  return out;
}

struct Row {
  std::string name;
  int64_t n = 0;
  double p50_us = 0, p99_us = 0, per_s = 0, router_cpu_us = 0, redis_cpu_us = 0;
  double redis_user_us = 0;  // the user part of redis_cpu_us
  // Commands Redis executed per decision, all masters ("evalsha 1.00 (24.1
  // us)": calls per decision and usec per call, INFO commandstats).
  std::string commands;
  // Their execution time per decision (INFO commandstats usec, all
  // commands but the bench's INFO): Redis's work without its I/O and event
  // loop.
  double redis_exec_us = 0;
  std::map<std::string, double> per_master_us;
};

// "prefill-0" .. "prefill-<kWorkers - 1>".
std::vector<std::string> WorkerIds() {
  std::vector<std::string> ids;
  for (int k = 0; k < kWorkers; ++k) ids.push_back(absl::StrCat("prefill-", k));
  return ids;
}

// `rate`: decisions/s, paced (0: closed loop).
Row Measure(const std::string& name, RedisClient& redis, cluster::ClusterView& view,
            const std::vector<Query>& queries, const Flags& f, bool sharded, double rate) {
  const std::vector<std::string> ids = WorkerIds();
  auto decide = [&](const Query& q) {
    auto r = view.MatchPrefixesAndLoads(q.hashes, ids, ids, /*window_pages=*/8);
    if (!r.ok()) Die(name + ": " + r.status().ToString());
    // The owner's depth is exact; a shallow (<= shared) answer may be less
    // on the cluster for workers whose head is not in this shard.
    if (r->depths[q.owner] != q.want && !(sharded && q.want <= f.shared_pages)) {
      Die(absl::StrCat(name, ": owner depth ", r->depths[q.owner], ", want ", q.want));
    }
    if (!r->loads[q.owner].has_value()) Die(name + ": no load report");
  };
  for (size_t i = 0; i < 300; ++i) decide(queries[i % queries.size()]);  // warm-up
  const std::map<std::string, CommandStat> stats0 = CommandStats(redis);
  const std::map<std::string, ServerCpu> cpu0 = MasterCpu(redis);
  std::vector<std::vector<double>> lat(f.threads);
  std::vector<double> cpu(f.threads, 0);
  const int per_thread = f.decisions / f.threads;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < f.threads; ++t) {
    threads.emplace_back([&, t] {
      const double c0 = ThreadCpuSeconds();
      // Paced: thread t's decision i is due at start + (i + t / threads) *
      // threads / rate (the threads' schedules interleave).
      const std::chrono::duration<double> gap(rate > 0 ? f.threads / rate : 0);
      for (int i = 0; i < per_thread; ++i) {
        const Query& q = queries[(static_cast<size_t>(t) * 7919 + i) % queries.size()];
        if (rate > 0) {
          std::this_thread::sleep_until(
              start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          gap * (i + static_cast<double>(t) / f.threads)));
        }
        const auto a = std::chrono::steady_clock::now();
        decide(q);
        lat[t].push_back(std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - a)
                             .count());
      }
      cpu[t] = ThreadCpuSeconds() - c0;
    });
  }
  for (std::thread& th : threads) th.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::map<std::string, ServerCpu> cpu1 = MasterCpu(redis);
  const std::map<std::string, CommandStat> stats1 = CommandStats(redis);
  Row row;
  row.name = name;
  for (const auto& [command, st] : stats1) {
    if (command == "info") continue;  // the bench's own
    const auto before = stats0.find(command);
    const double calls = st.calls - (before == stats0.end() ? 0 : before->second.calls);
    const double usec = st.usec - (before == stats0.end() ? 0 : before->second.usec);
    if (calls <= 0) continue;
    row.redis_exec_us += usec / static_cast<double>(f.decisions / f.threads * f.threads);
    absl::StrAppend(&row.commands, row.commands.empty() ? "" : ", ",
                    absl::StrFormat("%s %.2f (%.1f us)", command,
                                    calls / static_cast<double>(f.decisions / f.threads * f.threads),
                                    usec / calls));
  }
  std::vector<double> all;
  for (const auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  row.n = static_cast<int64_t>(all.size());
  row.p50_us = all[all.size() / 2];
  row.p99_us = all[all.size() * 99 / 100];
  row.per_s = static_cast<double>(row.n) / wall;
  double router = 0;
  for (double c : cpu) router += c;
  row.router_cpu_us = 1e6 * router / static_cast<double>(row.n);
  for (const auto& [address, c] : cpu1) {
    const double us = 1e6 * (c.total - cpu0.at(address).total) / static_cast<double>(row.n);
    row.per_master_us[address] = us;
    row.redis_cpu_us += us;
    row.redis_user_us += 1e6 * (c.user - cpu0.at(address).user) / static_cast<double>(row.n);
  }
  return row;
}

// Waits (up to 2 min) until the mirror has read every event of `ids`.
void WaitForMirror(RedisClient& redis, cluster::ClusterView& view, cluster::IndexMirror& mirror,
                   const std::vector<std::string>& ids) {
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  for (const std::string& id : ids) {
    while (true) {
      auto r = redis.Command({"GET", view.keys().EventSeqKey(id)});
      if (!r.ok()) Die("mirror wait: " + r.status().ToString());
      uint64_t counter = 0;
      if (!r->is_nil() && !absl::SimpleAtoi(r->str, &counter)) Die("mirror wait: bad counter");
      if (mirror.Seq(id).value_or(UINT64_MAX) == counter) break;
      if (absl::Now() > deadline) Die("the index mirror did not catch up with " + id);
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
}

// A fresh redis-server, the bench's client to it and a view (cluster "bench").
struct SingleRedis {
  std::unique_ptr<cluster::testing::RedisServer> server;
  std::unique_ptr<RedisClient> redis;
  std::unique_ptr<cluster::ClusterView> view;
};

SingleRedis StartSingleRedis(const Flags& f, const cluster::PrefixIndexOptions& io) {
  SingleRedis one;
  auto server = cluster::testing::RedisServer::Start();
  if (!server.ok()) Die("redis-server: " + server.status().ToString());
  one.server = *std::move(server);
  auto redis = RedisClient::Create(BenchClientOptions(one.server->ClientOptions(), f));
  if (!redis.ok()) Die(redis.status().ToString());
  one.redis = *std::move(redis);
  auto view = cluster::ClusterView::Create({.redis = one.redis.get(), .cluster = "bench", .index = io});
  if (!view.ok()) Die(view.status().ToString());
  one.view = *std::move(view);
  return one;
}

constexpr int kMirrorEventOps = 2000;

// The index mirror of the kWorkers workers, reading through `mirror_redis`.
std::unique_ptr<cluster::IndexMirror> StartMirror(RedisClient& mirror_redis,
                                                  const cluster::KeySchema& keys) {
  auto m = cluster::IndexMirror::Start(
      &mirror_redis, keys, []() -> absl::StatusOr<std::vector<std::string>> { return WorkerIds(); },
      {});
  if (!m.ok()) Die(m.status().ToString());
  return *std::move(m);
}

// Redis CPU (all masters) while `ops` stored ops of 16 fresh pages are
// applied (and, with a mirror, until it has read them all).
double EventOpsCpu(RedisClient& redis, cluster::ClusterView& view, cluster::IndexMirror* mirror,
                   const std::vector<std::string>& ids, uint64_t seed) {
  const auto before = MasterCpu(redis);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < kMirrorEventOps; ++i) {
    std::vector<uint64_t> pages(16);
    for (uint64_t& h : pages) h = rng() | 1;
    CacheEventOp op{.kind = CacheEventOp::Kind::kStored, .hashes = pages};
    auto s = view.index().Apply(ids[i % ids.size()], absl::MakeConstSpan(&op, 1), "events");
    if (!s.ok()) Die("events: " + s.status().ToString());
  }
  if (mirror != nullptr) WaitForMirror(redis, view, *mirror, ids);
  const auto after = MasterCpu(redis);
  double us = 0;
  for (const auto& [address, c] : after) us += 1e6 * (c.total - before.at(address).total);
  return us;
}

// Redis CPU per event op applied, with and without a mirror reading them.
struct MirrorEventCost {
  double with_us = 0;
  double without_us = 0;
};
MirrorEventCost EventCost(RedisClient& redis, cluster::ClusterView& view,
                          RedisClient& mirror_redis, std::unique_ptr<cluster::IndexMirror> mirror);

// The mirrored single Redis (--mirror): a fresh redis-server with the event
// streams on, populated while its index mirror reads them, the mirror set on
// its view.
struct MirroredSingle {
  SingleRedis one;
  std::unique_ptr<RedisClient> mirror_redis;
  std::unique_ptr<cluster::IndexMirror> mirror;
};

MirroredSingle StartMirroredSingle(const Workload& w, const Flags& f,
                                   cluster::PrefixIndexOptions io) {
  io.event_stream_max_len = 1000;  // the mirror reads the streams
  MirroredSingle m;
  m.one = StartSingleRedis(f, io);
  cluster::RedisOptions mo = m.one.server->ClientOptions();
  mo.command_timeout = absl::Seconds(5);  // above the mirror's XREAD BLOCK
  auto mirror_redis = RedisClient::Create(mo);
  if (!mirror_redis.ok()) Die(mirror_redis.status().ToString());
  m.mirror_redis = *std::move(mirror_redis);
  m.mirror = StartMirror(*m.mirror_redis, m.one.view->keys());
  Populate(*m.one.redis, m.one.view->index(), w, io.anchor_page);
  WaitForMirror(*m.one.redis, *m.one.view, *m.mirror, WorkerIds());
  m.one.view->SetIndexMirror(m.mirror.get());
  return m;
}

// The event ops' cost with and without the mirror reading them, in the order
// with, without, without, with (each batch adds pages, so a later one may
// cost more): the averages. `mirror` is running (on mirror_redis).
MirrorEventCost EventCost(RedisClient& redis, cluster::ClusterView& view,
                          RedisClient& mirror_redis, std::unique_ptr<cluster::IndexMirror> mirror) {
  const std::vector<std::string> ids = WorkerIds();
  MirrorEventCost cost;
  uint64_t seed = 1;
  for (const bool with : {true, false, false, true}) {
    if (with && mirror == nullptr) {
      mirror = StartMirror(mirror_redis, view.keys());
      WaitForMirror(redis, view, *mirror, ids);
    }
    if (!with) mirror.reset();
    const double us = EventOpsCpu(redis, view, mirror.get(), ids, seed++) / kMirrorEventOps / 2;
    (with ? cost.with_us : cost.without_us) += us;
  }
  return cost;
}

// Parses the command line (Die on a bad flag).
Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    auto num = [&](int64_t* v) {
      if (!absl::SimpleAtoi(next(), v) || *v <= 0) Die("bad value for " + a);
    };
    int64_t v = 0;
    if (a == "--hashes") {
      num(&f.hashes);
    } else if (a == "--decisions") {
      num(&v);
      f.decisions = static_cast<int>(v);
    } else if (a == "--threads") {
      num(&v);
      f.threads = static_cast<int>(v);
    } else if (a == "--prompt-pages") {
      num(&v);
      f.prompt_pages = static_cast<int>(v);
    } else if (a == "--shared-pages") {
      if (!absl::SimpleAtoi(next(), &v) || v < 0) Die("bad value for " + a);
      f.shared_pages = static_cast<int>(v);
    } else if (a == "--mirror") {
      f.mirror = true;
    } else if (a == "--coalesce") {
      if (!absl::SimpleAtoi(next(), &v) || v < 0) Die("bad value for " + a);
      f.coalesce = static_cast<int>(v);
    } else if (a == "--rate") {
      num(&v);
      f.rate = static_cast<double>(v);
    } else if (a == "--cluster-rate") {
      num(&v);
      f.cluster_rate = static_cast<double>(v);
    } else if (a == "--rounds") {
      num(&v);
      f.rounds = static_cast<int>(v);
    } else if (a == "--node-timeout-ms") {
      num(&v);
      f.node_timeout_ms = static_cast<int>(v);
    } else if (a == "--json") {
      f.json = next();
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.shared_pages >= f.prompt_pages) Die("--shared-pages must be below --prompt-pages");
  return f;
}

// With --mirror: (cluster, single) CPU per decision of one round.
struct Pair {
  double cluster = 0, single = 0;            // Redis CPU per decision
  double cluster_exec = 0, single_exec = 0;  // commands' execution time
};

// The 3-master Redis Cluster (64 index shards): its row and, with --mirror,
// the mirrored rounds alternating with the single Redis `single`, and the
// mirror's polling and event costs.
void RunCluster(const Flags& f, const Workload& w, const std::vector<Query>& queries,
                const cluster::PrefixIndexOptions& io, double cluster_rate,
                MirroredSingle* single, std::vector<Row>* rows, std::vector<Pair>* mirrored) {
  auto server =
      cluster::testing::RedisClusterServer::Start(3, 0, absl::Milliseconds(f.node_timeout_ms));
  if (!server.ok()) Die("redis cluster: " + server.status().ToString());
  auto redis = RedisClient::Create(BenchClientOptions((*server)->ClientOptions(), f));
  if (!redis.ok()) Die(redis.status().ToString());
  cluster::PrefixIndexOptions cio = io;
  if (f.mirror) cio.event_stream_max_len = 1000;  // the mirror row reads the streams
  auto view = cluster::ClusterView::Create({.redis = redis->get(), .cluster = "bench", .index = cio});
  if (!view.ok()) Die(view.status().ToString());
  Populate(**redis, (*view)->index(), w, cio.anchor_page);
  rows->push_back(Measure("3-master cluster, 64 shards", **redis, **view, queries, f, true,
                         cluster_rate));
  if (f.mirror) {
    // The cluster's mirror starts from snapshots (the union of the 64
    // shards) and answers exactly: every owner depth checked as on one
    // Redis (sharded = false).
    cluster::RedisOptions mo = (*server)->ClientOptions();
    mo.command_timeout = absl::Seconds(30);  // the snapshots of 125,000 pages per worker
    auto mirror_redis = RedisClient::Create(mo);
    if (!mirror_redis.ok()) Die(mirror_redis.status().ToString());
    std::unique_ptr<cluster::IndexMirror> mirror = StartMirror(**mirror_redis, (*view)->keys());
    WaitForMirror(**redis, **view, *mirror, WorkerIds());
    (*view)->SetIndexMirror(mirror.get());
    // Alternating rounds, the order flipped every round.
    for (int r = 0; r < f.rounds; ++r) {
      auto cluster_row = [&] {
        rows->push_back(Measure("3-master cluster, mirror", **redis, **view, queries, f, false,
                               cluster_rate));
        return rows->back().redis_cpu_us;
      };
      auto single_row = [&] {
        rows->push_back(Measure("single Redis, index mirror", *single->one.redis,
                               *single->one.view, queries, f, false, f.rate));
        return rows->back().redis_cpu_us;
      };
      Pair p;
      if (r % 2 == 0) {
        p.cluster = cluster_row();
        p.cluster_exec = rows->back().redis_exec_us;
        p.single = single_row();
        p.single_exec = rows->back().redis_exec_us;
      } else {
        p.single = single_row();
        p.single_exec = rows->back().redis_exec_us;
        p.cluster = cluster_row();
        p.cluster_exec = rows->back().redis_exec_us;
      }
      mirrored->push_back(p);
    }
    (*view)->SetIndexMirror(nullptr);
    // The cost of the mirror's polls on a quiet cluster (no events): all
    // masters' CPU over 3 s with the mirror polling, then without it.
    auto idle_ms_per_s = [&] {
      const auto a = MasterCpu(**redis);
      absl::SleepFor(absl::Seconds(3));
      const auto b = MasterCpu(**redis);
      double s = 0;
      for (const auto& [address, c] : b) s += c.total - a.at(address).total;
      return 1e3 * s / 3;
    };
    const double with_polls = idle_ms_per_s();
    const double without = (mirror.reset(), idle_ms_per_s());
    std::printf("cluster mirror, quiet: %.2f ms of Redis CPU per s polling (%.2f with, %.2f "
                "without)\n", with_polls - without, with_polls, without);
    mirror = StartMirror(**mirror_redis, (*view)->keys());
    WaitForMirror(**redis, **view, *mirror, WorkerIds());
    const MirrorEventCost busy = EventCost(**redis, **view, **mirror_redis, std::move(mirror));
    std::printf("cluster mirror, busy: Redis CPU per event op (all masters, 2 x %d stored ops "
                "of 16 new pages each way): %.1f us with the mirror polling, %.1f without: "
                "%+.1f us per op\n", kMirrorEventOps, busy.with_us, busy.without_us,
                busy.with_us - busy.without_us);
  }
}

// The rows as a table on stdout and as the JSON array.
nlohmann::json PrintRows(const std::vector<Row>& rows) {
  std::printf("%-28s %8s %8s %8s %10s %10s %10s %10s  %s\n", "", "n", "p50 us", "p99 us",
              "dec/s", "rtr cpu us", "redis cpu", "redis user", "per master (us/decision)");
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    std::string masters;
    nlohmann::json pm = nlohmann::json::object();
    for (const auto& [address, us] : r.per_master_us) {
      absl::StrAppend(&masters, masters.empty() ? "" : " ", absl::StrFormat("%.1f", us));
      pm[address] = us;
    }
    std::printf("%-28s %8lld %8.1f %8.1f %10.0f %10.1f %10.1f %10.1f  %s\n", r.name.c_str(),
                static_cast<long long>(r.n), r.p50_us, r.p99_us, r.per_s, r.router_cpu_us,
                r.redis_cpu_us, r.redis_user_us, masters.c_str());
    std::printf("%-28s   commands per decision (%.1f us executing): %s\n", "", r.redis_exec_us,
                r.commands.c_str());
    out.push_back({{"name", r.name}, {"decisions", r.n}, {"p50_us", r.p50_us},
                   {"p99_us", r.p99_us}, {"decisions_per_s", r.per_s},
                   {"router_cpu_us_per_decision", r.router_cpu_us},
                   {"redis_cpu_us_per_decision", r.redis_cpu_us},
                   {"redis_user_cpu_us_per_decision", r.redis_user_us}, {"per_master_us", pm},
                   {"commands_per_decision", r.commands},
                   {"redis_exec_us_per_decision", r.redis_exec_us}});
  }
  return out;
}

// With --mirror: the cluster against the single Redis per round, and the
// mirror's cost per event op on the single Redis.
void PrintMirrorSummary(const std::vector<Pair>& mirrored, const MirrorEventCost& event_cost) {
  std::vector<double> growth_by_round;
  for (const Pair& p : mirrored) {
    growth_by_round.push_back(100 * (p.cluster / p.single - 1));
    std::printf("with the index mirror, cluster total Redis CPU vs single: %+.1f%% (commands' "
                "execution time: %.1f vs %.1f us per decision, %+.1f%%)\n",
                growth_by_round.back(), p.cluster_exec, p.single_exec,
                100 * (p.cluster_exec / p.single_exec - 1));
  }
  std::sort(growth_by_round.begin(), growth_by_round.end());
  if (growth_by_round.size() > 1) {
    std::printf("with the index mirror, over %zu alternating rounds: median %+.1f%% (range "
                "%+.1f%% .. %+.1f%%)\n", growth_by_round.size(),
                growth_by_round[growth_by_round.size() / 2], growth_by_round.front(),
                growth_by_round.back());
  }
  std::printf("index mirror: Redis CPU per event op (2 x %d stored ops of 16 new pages each "
              "way): %.1f us with the mirror reading, %.1f without: %+.1f us per op read\n",
              kMirrorEventOps, event_cost.with_us, event_cost.without_us,
              event_cost.with_us - event_cost.without_us);
}

int Main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  const Workload w = MakeWorkload(f);
  const std::vector<Query> queries = MakeQueries(w, f.prompt_pages);
  std::printf("index: %zu prompts of %d pages (first %d shared), %lld hashes, %d workers\n",
              w.prompts.size(), f.prompt_pages, f.shared_pages,
              static_cast<long long>(w.prompts.size() * (f.prompt_pages - f.shared_pages) +
                                     kWorkers * f.shared_pages),
              kWorkers);
  std::vector<Row> rows;
  cluster::PrefixIndexOptions io;
  io.event_stream_max_len = 0;  // the decision is measured, not the events API
  {
    SingleRedis one = StartSingleRedis(f, io);
    Populate(*one.redis, one.view->index(), w, io.anchor_page);
    rows.push_back(Measure("single Redis", *one.redis, *one.view, queries, f, false, f.rate));
  }
  const double cluster_rate = f.cluster_rate > 0 ? f.cluster_rate : f.rate;
  std::optional<MirroredSingle> single;
  if (f.mirror) single = StartMirroredSingle(w, f, io);
  std::vector<Pair> mirrored;
  RunCluster(f, w, queries, io, cluster_rate, single ? &*single : nullptr, &rows, &mirrored);
  MirrorEventCost event_cost;
  if (f.mirror) {
    single->one.view->SetIndexMirror(nullptr);
    event_cost = EventCost(*single->one.redis, *single->one.view, *single->mirror_redis,
                           std::move(single->mirror));
  }
  const nlohmann::json out = PrintRows(rows);
  const double growth = rows[1].redis_cpu_us / rows[0].redis_cpu_us - 1;
  std::printf("cluster total Redis CPU vs single: %+.1f%% (target <= +20%%)\n", 100 * growth);
  if (f.mirror) PrintMirrorSummary(mirrored, event_cost);
  if (!f.json.empty()) bench::WriteJsonFile(f.json, out);
  return 0;
}

}  // namespace
}  // namespace swaserve

int main(int argc, char** argv) { return swaserve::Main(argc, argv); }
