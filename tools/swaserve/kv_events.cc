// swaserve kv-events: the KV events API (lib/cluster/kv_events.h) from the
// command line, for operators and for whoever writes an external router:
//
//   swaserve kv-events --redis=HOST:PORT                 # workers, seq, epoch
//   swaserve kv-events --redis=... --worker=ID           # snapshot + events
//   swaserve kv-events --redis=... --worker=ID --follow  # ... and keep reading
//   swaserve kv-events --redis=... --worker=ID --history # the events the
//                                                        # stream still holds
//
// One line per event: "seq <n> <op> pool=<full|swa|> tier=<l1|l2|> pages=<k>
// first=<hash>". A gap (trimmed stream, Redis restarted) prints a line and
// resyncs from a new snapshot, as a consumer should.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "lib/base/config.h"
#include "lib/base/logging.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/kv_events.h"
#include "lib/cluster/redis_client.h"
#include "tools/swaserve/commands.h"

namespace swaserve::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// The stream's incarnation (kv_events.h), "-" before the first event.
const char* EpochOf(const std::string& epoch) { return epoch.empty() ? "-" : epoch.c_str(); }

void PrintSnapshot(const cluster::KvSnapshot& s) {
  std::printf(
      "snapshot seq %llu (stream id %s): %zu pages, %zu without SWA KV, %zu in L2; epoch %s\n",
      static_cast<unsigned long long>(s.seq), s.id.c_str(), s.pages.size(), s.swa_gone.size(),
      s.lower.size(), EpochOf(s.epoch));
}

void PrintEvent(const cluster::KvEvent& e) {
  std::printf("seq %llu %s pool=%s tier=%s pages=%zu", static_cast<unsigned long long>(e.seq),
              std::string(cluster::KvEventOpName(e.op)).c_str(), e.pool.c_str(), e.tier.c_str(),
              e.hashes.size());
  if (!e.hashes.empty()) {
    std::printf(" first=%016llx", static_cast<unsigned long long>(e.hashes.front()));
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int KvEvents(int argc, const char* const* argv) {
  std::string redis = "127.0.0.1:6379";
  std::string cluster_name = "default";
  std::string worker;
  bool follow = false;
  bool history = false;
  std::string log_level;
  base::Config config("swaserve kv-events",
                      "Prints the prefill workers' KV events (lib/cluster/kv_events.h, v1).");
  config.Add("redis", &redis, "Redis of the cluster, HOST:PORT or redis://...")
      .Add("cluster", &cluster_name, "cluster name (the key prefix swaserve:v1:<cluster>:)")
      .Add("worker", &worker, "worker id; empty: list the workers and their last seq")
      .Add("follow", &follow, "keep reading new events until Ctrl-C")
      .Add("history", &history,
           "start from the first event instead of a snapshot (a trimmed history resyncs "
           "from a snapshot)")
      .Add("log_level", &log_level, "log level (default $SWASERVE_LOG_LEVEL or warn)");
  base::ParseConfigOrExit(config, argc, argv);
  if (absl::Status s = base::InitLogging(
          {.level = log_level.empty() ? "warn" : log_level, .name = "swaserve"});
      !s.ok()) {
    std::fprintf(stderr, "swaserve kv-events: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  cluster::RedisOptions ro;
  if (absl::Status s = cluster::ParseRedisAddress(redis, &ro); !s.ok()) {
    std::fprintf(stderr, "swaserve kv-events: key 'redis': %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<cluster::RedisClient>> client = cluster::RedisClient::Create(ro);
  if (!client.ok()) {
    std::fprintf(stderr, "swaserve kv-events: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<cluster::KeySchema> keys = cluster::KeySchema::Create(
      cluster_name, cluster::IndexShardCount(**client, cluster::PrefixIndexOptions{}));
  if (!keys.ok()) {
    std::fprintf(stderr, "swaserve kv-events: key 'cluster': %s\n",
                 std::string(keys.status().message()).c_str());
    return 2;
  }
  cluster::KvEventReader reader(client->get(), *keys);
  if (worker.empty()) {
    auto view = cluster::ClusterView::Create({.redis = client->get(), .cluster = cluster_name});
    absl::StatusOr<std::vector<cluster::WorkerInfo>> workers =
        view.ok() ? (*view)->ListWorkers() : view.status();
    if (!workers.ok()) {
      std::fprintf(stderr, "swaserve kv-events: cannot read the registry at %s: %s\n",
                   redis.c_str(), std::string(workers.status().message()).c_str());
      return 1;
    }
    for (const cluster::WorkerInfo& w : *workers) {
      absl::StatusOr<cluster::KvSnapshot> s = reader.Snapshot(w.id);
      if (!s.ok()) continue;
      // The epoch last: scripts that parse "seq=N pages=M" keep working.
      std::printf("%s seq=%llu pages=%zu epoch=%s\n", w.id.c_str(),
                  static_cast<unsigned long long>(s->seq), s->pages.size(), EpochOf(s->epoch));
    }
    return 0;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  cluster::KvWorkerState state;  // empty: seq 0, before the first event
  bool need_snapshot = !history;
  while (!g_stop) {
    if (need_snapshot) {
      absl::StatusOr<cluster::KvSnapshot> s = reader.Snapshot(worker);
      if (!s.ok()) {
        std::fprintf(stderr, "swaserve kv-events: snapshot of %s: %s\n", worker.c_str(),
                     std::string(s.status().message()).c_str());
        return 1;
      }
      PrintSnapshot(*s);
      state.Reset(*s);
      need_snapshot = false;
    }
    absl::StatusOr<std::vector<cluster::KvEvent>> events =
        reader.Read(worker, state.id(), state.seq(), 100,
                    follow ? absl::Milliseconds(500) : absl::ZeroDuration(), state.epoch());
    if (absl::IsDataLoss(events.status())) {
      std::printf("gap: %s\n", std::string(events.status().message()).c_str());
      need_snapshot = true;
      continue;
    }
    if (!events.ok()) {
      std::fprintf(stderr, "swaserve kv-events: %s\n", std::string(events.status().message()).c_str());
      return 1;
    }
    for (const cluster::KvEvent& e : *events) {
      PrintEvent(e);
      if (absl::Status s = state.Apply(e); !s.ok()) {
        std::printf("gap: %s\n", std::string(s.message()).c_str());
        need_snapshot = true;
        break;
      }
    }
    if (events->empty() && !follow) break;
  }
  return 0;
}

}  // namespace swaserve::cli
