#include "tests/integration/cluster/redis_cluster_server.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/status.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/redis_cluster_protocol.h"

namespace swaserve::cluster::testing {

absl::StatusOr<std::unique_ptr<RedisClusterServer>> RedisClusterServer::Start(
    int masters, int replicas, absl::Duration node_timeout) {
  if (access("/usr/bin/redis-cli", X_OK) != 0) {
    return absl::FailedPreconditionError(
        "redis-cli not found at /usr/bin/redis-cli (Debian: apt-get install redis-tools)");
  }
  auto cluster = absl::WrapUnique(new RedisClusterServer());
  const int n = masters * (1 + replicas);
  for (int i = 0; i < n; ++i) {
    // The cluster bus gets its own free port (cluster-port, Redis 7): the
    // default port + 10000 may be out of range for an ephemeral port.
    ASSIGN_OR_RETURN(int bus, base::PickFreePort());
    ASSIGN_OR_RETURN(auto server,
                     RedisServer::Start({"--cluster-enabled", "yes", "--cluster-config-file",
                                         "nodes.conf", "--cluster-node-timeout",
                                         absl::StrCat(absl::ToInt64Milliseconds(node_timeout)),
                                         "--cluster-port", absl::StrCat(bus), "--repl-diskless-sync-delay", "0"}));
    cluster->nodes_.push_back(std::move(server));
  }
  std::vector<std::string> argv = {"/usr/bin/redis-cli", "--cluster", "create"};
  for (const std::string& a : cluster->Addresses()) argv.push_back(a);
  argv.insert(argv.end(), {"--cluster-replicas", absl::StrCat(replicas), "--cluster-yes"});
  ASSIGN_OR_RETURN(std::string dir, base::MakeTempDir("swaserve-redis-cluster"));
  ASSIGN_OR_RETURN(auto cli, base::Subprocess::Start(
                                 {.argv = argv, .log_path = absl::StrCat(dir, "/create.log")}));
  ASSIGN_OR_RETURN(int rc, cli->Wait(absl::Seconds(60)));
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("redis-cli --cluster create exited with ", rc, ":\n", cli->ReadLog()));
  }
  cluster->replicas_ = replicas;
  RETURN_IF_ERROR(cluster->WaitHealthy(absl::Seconds(30), /*replicas_online=*/true));
  return cluster;
}

std::vector<std::string> RedisClusterServer::Addresses() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(absl::StrCat("127.0.0.1:", n->port()));
  return out;
}

RedisOptions RedisClusterServer::ClientOptions() const {
  RedisOptions o = nodes_[0]->ClientOptions();
  o.cluster_seeds = Addresses();
  o.cluster_refresh_interval = absl::Milliseconds(50);
  return o;
}

std::string RedisClusterServer::Url() const {
  return absl::StrCat("redis-cluster://", absl::StrJoin(Addresses(), ","));
}

absl::StatusOr<RedisReply> RedisClusterServer::Ask(int i, const RedisCommand& command) {
  if (!nodes_[i]->running()) return absl::UnavailableError("node not running");
  ASSIGN_OR_RETURN(auto client, RedisClient::Create(nodes_[i]->ClientOptions()));
  return client->Command(command, "test");
}

absl::StatusOr<int> RedisClusterServer::MasterOfSlot(int slot) {
  for (int i = 0; i < size(); ++i) {
    absl::StatusOr<RedisReply> slots = Ask(i, {"CLUSTER", "SLOTS"});
    if (!slots.ok()) continue;
    ASSIGN_OR_RETURN(std::vector<RedisSlotRange> ranges, ParseClusterSlots(*slots, "127.0.0.1"));
    for (const RedisSlotRange& r : ranges) {
      if (slot < r.start || slot > r.end) continue;
      for (int j = 0; j < size(); ++j) {
        if (absl::StrCat("127.0.0.1:", nodes_[j]->port()) == r.master) return j;
      }
    }
  }
  return absl::NotFoundError(absl::StrCat("no running node knows the master of slot ", slot));
}

absl::Status RedisClusterServer::WaitHealthy(absl::Duration timeout, bool replicas_online) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "not asked yet";
  while (absl::Now() < deadline) {
    bool ok = true;
    for (int i = 0; i < size() && ok; ++i) {
      if (!nodes_[i]->running()) continue;
      absl::StatusOr<RedisReply> info = Ask(i, {"CLUSTER", "INFO"});
      if (!info.ok() || !absl::StrContains(info->str, "cluster_state:ok")) {
        ok = false;
        last = info.ok() ? info->str.substr(0, 200) : info.status().ToString();
        break;
      }
      absl::StatusOr<RedisReply> slots = Ask(i, {"CLUSTER", "SLOTS"});
      absl::StatusOr<std::vector<RedisSlotRange>> ranges =
          slots.ok() ? ParseClusterSlots(*slots, "127.0.0.1")
                     : absl::StatusOr<std::vector<RedisSlotRange>>(slots.status());
      if (!ranges.ok()) {
        ok = false;
        last = ranges.status().ToString();
        break;
      }
      int covered = 0;
      for (const RedisSlotRange& r : *ranges) {
        bool master_up = false;
        for (const auto& n : nodes_) {
          master_up |= n->running() && absl::StrCat("127.0.0.1:", n->port()) == r.master;
        }
        if (master_up) covered += r.end - r.start + 1;
      }
      if (covered != kRedisClusterSlots) {
        ok = false;
        last = absl::StrCat("node ", i, " sees ", covered, " slots on running masters");
      }
      absl::StatusOr<RedisReply> repl = Ask(i, {"INFO", "replication"});
      if (ok && replicas_online && repl.ok() && absl::StrContains(repl->str, "role:master")) {
        int online = 0;
        for (size_t at = repl->str.find("state=online"); at != std::string::npos;
             at = repl->str.find("state=online", at + 1)) {
          ++online;
        }
        if (online < replicas_) {
          ok = false;
          last = absl::StrCat("master ", i, " has ", online, " of ", replicas_,
                              " replicas online");
        }
      }
    }
    if (ok) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("redis cluster not healthy: ", last));
}

}  // namespace swaserve::cluster::testing
