// LocalCluster: real swaserve processes on loopback for integration and
// end-to-end tests — a redis-server, swaserve-worker processes registered in
// it, and swaserve-router replicas — each on ports it picks itself, with its
// log in the cluster's temporary directory (printed when a start fails).
// Processes are stopped (SIGTERM, then SIGKILL) when the cluster is
// destroyed, also when a test fails.
//
// With LocalClusterOptions::network every process runs on a host of its own
// (tests/integration/router/host_network.h): Redis on host "redis", each
// worker and router on a host named by its id, each listening on its host's
// address, UCX over TCP between hosts.
//
// The model is the tiny random checkpoint with the Qwen3 tokenizer, made
// once per cluster with `swaserve make-model` (the binary path is given).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/base/subprocess.h"
#include "swaserve/v1/router.grpc.pb.h"
#include "swaserve/v1/worker.grpc.pb.h"
#include "tests/integration/cluster/redis_server.h"
#include "tests/integration/router/host_network.h"

namespace swaserve::testing {

struct LocalProcess {
  std::unique_ptr<base::Subprocess> process;
  std::string id;
  std::string log_path;
  int grpc_port = 0;
  int http_port = 0;  // router: OpenAI API + /metrics; worker: /metrics
  bool is_router = false;
  // The address it listens on (its host's with a HostNetwork).
  std::string host = "127.0.0.1";
  std::string grpc_address() const;
};

struct LocalClusterOptions {
  std::string cli_bin;     // swaserve (make-model)
  std::string worker_bin;  // swaserve-worker
  std::string router_bin;  // swaserve-router
  // Extra flags for every worker / router.
  std::vector<std::string> worker_flags;
  std::vector<std::string> router_flags;
  // Extra make-model flags (e.g. --vision, --audio for an encoder) and the
  // encoder binary (StartEncoder).
  std::vector<std::string> model_flags;
  std::string encoder_bin;  // swaserve-encoder
  // A model directory every process serves as it is (e.g. models/demo);
  // empty (default): make-model makes a tiny random one with model_flags.
  std::string model_dir;
  // Hosts to run the processes on (not owned; must outlive the cluster, so
  // declare it before the cluster). Null (default): all on loopback.
  HostNetwork* network = nullptr;
};

class LocalCluster {
 public:
  // Makes the model (unless options.model_dir) and starts redis-server.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Create(const LocalClusterOptions& options);
  ~LocalCluster();

  // Starts a worker (role prefill | decode | both) registered in Redis and
  // waits until it serves and has registered.
  absl::StatusOr<LocalProcess*> StartWorker(const std::string& role, const std::string& id,
                                            std::vector<std::string> extra = {});
  // Starts a swaserve-encoder (options.encoder_bin) registered in Redis;
  // waits until it serves. http_port is its /metrics port.
  absl::StatusOr<LocalProcess*> StartEncoder(const std::string& id);
  // Starts a router replica and waits until it serves HTTP.
  absl::StatusOr<LocalProcess*> StartRouter(const std::string& id,
                                            std::vector<std::string> extra = {});
  // Sends `signo` to a process (SIGSTOP / SIGCONT: a hung process).
  absl::Status Signal(const std::string& id, int signo);
  // SIGKILLs a process (a crash).
  absl::Status Kill(const std::string& id);
  // SIGTERMs a process (a drain) and waits up to `timeout` for it to exit.
  absl::Status Terminate(const std::string& id, absl::Duration timeout);
  LocalProcess* Get(const std::string& id);

  // Waits until the router's /health is 200.
  absl::Status WaitHealthy(const std::string& router_id, absl::Duration timeout);

  // HTTP request to a router: returns {status, body}. `method` GET or POST.
  struct HttpResult {
    int status = 0;
    std::string body;
    // Response headers, names lower-cased.
    std::map<std::string, std::string> headers;
  };
  absl::StatusOr<HttpResult> Http(const std::string& router_id, const std::string& method,
                                  const std::string& path, const std::string& body = "",
                                  const std::vector<std::pair<std::string, std::string>>&
                                      headers = {});
  // The value of a metric line "name{labels} value" (exact prefix before the
  // space) on a process's /metrics; -1 when absent.
  double Metric(const std::string& id, const std::string& line_prefix);

  std::unique_ptr<v1::Router::Stub> RouterStub(const std::string& router_id);

  const std::string& model_dir() const { return model_dir_; }
  const std::string& dir() const { return dir_; }
  cluster::testing::RedisServer& redis() { return *redis_; }
  std::string redis_address() const;

 private:
  LocalCluster(LocalClusterOptions o, std::string dir) : o_(std::move(o)), dir_(std::move(dir)) {}
  absl::StatusOr<LocalProcess*> Start(const std::string& id, std::vector<std::string> argv,
                                      bool is_router);
  // With a network: adds host `id`, points the loopback listen flags of
  // argv at its address and wraps argv to run there. Returns the address.
  absl::StatusOr<std::string> PlaceOnHost(const std::string& id, std::vector<std::string>& argv);

  LocalClusterOptions o_;
  std::string dir_;
  std::string model_dir_;
  std::unique_ptr<cluster::testing::RedisServer> redis_;
  std::map<std::string, std::unique_ptr<LocalProcess>> procs_;
};

}  // namespace swaserve::testing
