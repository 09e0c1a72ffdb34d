// ClusterLauncher: a whole swaserve cluster on one machine, on loopback — a
// redis-server (or an existing Redis), one prefill worker per prompt-length
// bucket, N decode workers and a router — for `swaserve up` and for tests.
//
//   launch::ClusterSpec spec;
//   spec.model = "/tmp/tiny";
//   spec.http_port = 0;  // any free port
//   auto cluster = launch::ClusterLauncher::Start(spec);
//   if (!cluster.ok()) ...  // names the process that failed + its log tail
//   (*cluster)->endpoints().http_url  // "http://127.0.0.1:NNNN"
//   ...
//   (*cluster)->Stop();  // router, then workers, then Redis (also in ~)
//
// Start order: Redis (waits for its port), then every worker at once (each
// registered in Redis with --redis and --model_name; waits until each wrote
// its --port_file), then the router (its port file), and finally until the
// router's /health answers 200, which means at least one prefill and one
// decode worker are registered. Each process logs to <run_dir>/<name>.log.
// On any failure everything started so far is stopped again.
//
// With spec.prometheus, a Prometheus (Debian's `prometheus`) starts last,
// scraping every process (jobs swaserve-<role>, instance = process name)
// with the recording and alert rules of deploy/prometheus, its config and
// TSDB in the run directory; it stops first.
//
// With a multimodal model, encoders (swaserve-encoder) start with the
// workers, registered in the same Redis.
//
// Process names: "redis", "redis-l3" (with l3_redis_mib), "prefill-<bucket>",
// "decode-<i>", "encoder-<i>", "router", "prometheus".
//
// Thread-compatible: one thread drives a ClusterLauncher.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lib/base/subprocess.h"
#include "lib/launch/kv_plan.h"
#include "lib/launch/service_process.h"

namespace swaserve::launch {

struct ClusterSpec {
  // Checkpoint directory (config.json, model.safetensors, tokenizer.json);
  // required.
  std::string model;
  // Model id clients use (router --model_name, worker registry records).
  // Empty: the model directory's name.
  std::string model_name;
  // Redis "host:port" of a running server. Empty: start a redis-server in
  // the run directory (no persistence) on `redis_port`.
  std::string redis;
  // Port of the started redis-server; 0 picks a free port.
  int redis_port = 0;
  // > 0: a second redis-server ("redis-l3") bounded to this many MiB
  // (maxmemory, allkeys-lru), which every prefill worker uses as its L3 KV
  // tier (--kv.l3=redis:...): KV pages a worker wrote there (after 2 hits,
  // near its bucket's bound at once, or leaving its cache) are found by the
  // others, so an agent's prompt that grows into the next length bucket, or
  // a restarted worker, gets its prefix back instead of recomputing it
  // (bench/cluster/agent_session.sh).
  // Its own server, not `redis`: evicting pages must never evict the
  // registry. 0 (the default here; `swaserve up` starts one of 1024 MiB):
  // none.
  int64_t l3_redis_mib = 0;
  // With the shared L3: --kv.l3_write_through_near_bound of every prefill
  // worker but the last bucket's. A prompt this far up its bucket is
  // written to the L3 at its insert, not after 2 hits, so the turn that
  // crosses the bound finds the whole previous turn there. 0: off.
  // Default 0.75: a conversation crossing the bound grew by less than a
  // quarter of it per turn.
  double l3_write_through_near_bound = 0.75;
  // Cluster name (the Redis key prefix; distinct clusters can share Redis).
  std::string cluster = "default";
  // Router endpoints. Port 0 picks a free port.
  std::string host = "127.0.0.1";
  int http_port = 8000;
  int grpc_port = 50051;
  // Exclusive upper bounds of the prompt-length buckets in tokens; one
  // prefill worker per bucket (bucket i serves [bounds[i-1], bounds[i])).
  std::vector<int64_t> bucket_bounds = {65536, 262144, 1048576};
  int decode_workers = 1;
  // Multimodal encoders (swaserve-encoder). -1 (default): one when
  // the model's config.json has a vision_config or an audio_config, else
  // none; 0: none.
  int encoders = -1;
  // Kernel threads per worker; 0: every core of the machine for each
  // worker. A worker's kernel threads block when it is idle, so a lone long
  // prefill gets the whole machine (a 100K-token prompt of the demo model
  // on 2 cores: first token after 116 s, 221 s with the cores divided among
  // the 4 workers); prefill_nice_step keeps shorter work first when
  // several are busy.
  int worker_threads = 0;
  // CPU priority by bucket: bucket i's prefill worker runs at nice
  // +min(19, i·step) relative to `swaserve up`, so that when the cores are
  // contended the shorter buckets' prefills (and the decode worker, at +0)
  // get them first, and a long prefill takes what they leave. 0: all equal.
  // Measured (bench/cluster/long_and_short.sh): 20 short chats during a
  // 100K-token prefill, p50 TTFT / total 75 / 121 ms with it (10), 87 / 164
  // without (0), 68 / 111 with the cores divided and no nice (idle: 61 / 97).
  int prefill_nice_step = 10;
  // KV pool per worker (MiB): --kv.prefill_mib / --kv.decode_mib. With
  // kv_fit_buckets (default) the least any worker gets: a prefill worker
  // gets enough for one prompt at its bucket's upper bound, a decode worker
  // enough for one of the largest bucket plus kDecodeHeadroomTokens
  // (kv_plan.h; memory is committed only as pages are used). Without it,
  // every worker gets exactly kv_mib, and a prefill worker whose bucket it
  // cannot hold refuses to start.
  int64_t kv_mib = 256;
  bool kv_fit_buckets = true;
  // Extra flags appended to each role's command line (they win over the
  // launcher's own, being later).
  std::vector<std::string> prefill_flags;
  std::vector<std::string> decode_flags;
  std::vector<std::string> router_flags;
  std::vector<std::string> redis_flags;
  std::vector<std::string> encoder_flags;
  // Binaries. worker_bin empty: swaserve-prefill for prefill workers and
  // swaserve-decode for decode workers; set: that binary (e.g.
  // swaserve-worker, which takes --role) for both. Found next to the running
  // executable (dirname of /proc/self/exe) when there, else on PATH, like
  // swaserve-router; redis-server on PATH.
  std::string worker_bin;
  std::string router_bin;
  std::string encoder_bin;  // empty: swaserve-encoder, found like the others
  std::string redis_server_bin = "redis-server";
  // Start a Prometheus scraping the cluster (see above) on prometheus_port
  // (0: a free port), with the rules file `prometheus_rules` (empty: none).
  bool prometheus = false;
  int prometheus_port = 9090;
  std::string prometheus_bin = "prometheus";
  std::string prometheus_rules;
  // Logs, port files and Redis' working directory. Empty:
  // ./swaserve-run/<YYYYmmdd-HHMMSS> (see DefaultRunDir). Created if missing.
  std::string run_dir;
  // How long the whole start may take (model loads included).
  absl::Duration start_timeout = absl::Seconds(120);
  // SIGTERM -> SIGKILL grace per process group at Stop().
  absl::Duration stop_grace = absl::Seconds(10);
  // Progress lines ("starting redis ...", "redis ok (port N)"); may be null.
  std::function<void(const std::string& line)> on_progress;
};

// One started process.
struct ProcessInfo {
  std::string name;  // redis, redis-l3, prefill-0, decode-0, encoder-0, router, prometheus
  std::string role;  // redis, prefill, decode, encoder, router, prometheus
  pid_t pid = 0;
  int grpc_port = 0;     // redis: its port
  int metrics_port = 0;  // router: the HTTP port (it serves /metrics)
  std::string log_path;
  std::string metrics_url() const;  // empty for redis
};

struct Endpoints {
  std::string http_url;      // http://HOST:PORT (OpenAI API under /v1)
  std::string grpc_address;  // HOST:PORT (swaserve.v1.Router)
  std::string redis_address;
  std::string l3_redis_address;  // empty without ClusterSpec::l3_redis_mib
  std::string model_name;
  std::string run_dir;
  int http_port = 0;
  int grpc_port = 0;
  // Every process's /metrics, in start order (router last).
  std::vector<std::pair<std::string, std::string>> metrics_urls;
  // http://127.0.0.1:PORT of the started Prometheus (empty without one).
  std::string prometheus_url;
};

// A child that exited while it should be running.
struct ProcessExit {
  std::string name;
  pid_t pid = 0;
  int exit_code = 0;  // 128 + signal when killed by a signal
  std::string log_tail;
};

class ClusterLauncher {
 public:
  // Starts everything (see the file comment). On failure stops whatever
  // started and returns an error naming the process, with its log's tail.
  static absl::StatusOr<std::unique_ptr<ClusterLauncher>> Start(
      ClusterSpec spec);

  ~ClusterLauncher();
  ClusterLauncher(const ClusterLauncher&) = delete;
  ClusterLauncher& operator=(const ClusterLauncher&) = delete;

  const Endpoints& endpoints() const { return endpoints_; }
  const ClusterSpec& spec() const { return spec_; }
  // The KV pool each worker was given (kv_plan.h).
  const KvPlan& kv_plan() const { return kv_plan_; }
  // Started processes, in start order.
  std::vector<ProcessInfo> processes() const;

  // Children that exited since the last Poll() (reaps them). Empty while
  // everything runs; after Stop() always empty.
  std::vector<ProcessExit> Poll();
  // Every child that has exited unexpectedly so far (Poll()s first).
  std::vector<ProcessExit> Dead();

  // Stops the router, then the workers, then a started Redis: SIGTERM, up
  // to spec.stop_grace, then SIGKILL. Idempotent.
  void Stop();

 private:
  struct Child {
    ProcessInfo info;
    ServiceProcess svc;
    bool reported = false;
  };
  explicit ClusterLauncher(ClusterSpec spec) : spec_(std::move(spec)) {}
  absl::Status DoStart();
  // DoStart's parts: the spec checked and its defaults filled in (the KV
  // plan included); the prefill, decode and encoder processes started and
  // waited for; the router started and waited for (endpoints_ filled in).
  absl::Status CheckSpec();
  absl::Status StartWorkers(absl::Time deadline);
  absl::Status StartRouter(absl::Time deadline);
  // A redis-server `name` (role "redis") on `fixed_port` (0: a free one),
  // with `extra` arguments; its address in *address.
  absl::Status StartRedis(const std::string& name, int fixed_port,
                          const std::vector<std::string>& extra, std::string* address);
  absl::Status PlanKv();
  void ReportKvPlan() const;
  absl::Status StartPrometheus(absl::Time deadline);
  // nice_increment: SpawnOptions::nice_increment.
  absl::StatusOr<Child*> Spawn(const std::string& name, const std::string& role,
                               std::vector<std::string> argv, int nice_increment = 0);
  absl::Status WaitPortFile(Child& child, absl::Time deadline);
  absl::Status WaitHealthy(Child& router, absl::Time deadline);
  absl::Status ChildFailed(const Child& child, absl::string_view what) const;
  void Progress(const std::string& line) const;
  void StopGroup(const std::vector<Child*>& group);

  ClusterSpec spec_;
  Endpoints endpoints_;
  KvPlan kv_plan_;
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<ProcessExit> dead_;
  bool stopped_ = false;
};

// ./swaserve-run/<YYYYmmdd-HHMMSS> (local time).
std::string DefaultRunDir();

// The directory of the running executable (dirname of /proc/self/exe).
std::string SelfDir();

// "65536,262144" -> {65536, 262144}; errors name the bad item and require a
// strictly increasing list of positive numbers.
absl::StatusOr<std::vector<int64_t>> ParseBucketBounds(absl::string_view text);
absl::Status ValidateBucketBounds(const std::vector<int64_t>& bounds);

}  // namespace swaserve::launch
