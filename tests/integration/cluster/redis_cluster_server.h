// RedisClusterServer: a real Redis Cluster for integration tests: `masters`
// redis-server processes in cluster mode (each with `replicas` replicas) on
// free loopback ports, joined by `redis-cli --cluster create`, with a short
// cluster-node-timeout (default 1 s) so that a killed master fails over
// within a few seconds. No persistence.
//
// Owns the processes (killed in the destructor). Thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/cluster/redis_client.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve::cluster::testing {

class RedisClusterServer {
 public:
  // FailedPrecondition when redis-server or redis-cli is not installed.
  // `node_timeout`: cluster-node-timeout. The nodes ping each other at
  // least every half of it (the cluster bus's idle CPU grows as it shrinks):
  // benchmarks that kill no node pass Redis's default, 15 s.
  static absl::StatusOr<std::unique_ptr<RedisClusterServer>> Start(
      int masters = 3, int replicas = 1, absl::Duration node_timeout = absl::Seconds(1));

  // "127.0.0.1:port" of every node (masters and replicas, in start order).
  std::vector<std::string> Addresses() const;
  // Options for a cluster-mode client seeded with every node (short
  // timeouts and backoff).
  RedisOptions ClientOptions() const;
  // "redis-cluster://..." for --redis flags.
  std::string Url() const;

  int size() const { return static_cast<int>(nodes_.size()); }
  RedisServer& node(int i) { return *nodes_[i]; }

  // The node index of the master currently serving `slot` (asked of the
  // running nodes).
  absl::StatusOr<int> MasterOfSlot(int slot);
  // Waits until every running node reports cluster_state:ok and every slot
  // is served by a running master; with `replicas_online`, also until every
  // master has its replicas attached and in sync (state=online).
  absl::Status WaitHealthy(absl::Duration timeout, bool replicas_online = false);

 private:
  RedisClusterServer() = default;
  absl::StatusOr<RedisReply> Ask(int i, const RedisCommand& command);

  std::vector<std::unique_ptr<RedisServer>> nodes_;
  int replicas_ = 0;
};

}  // namespace swaserve::cluster::testing
