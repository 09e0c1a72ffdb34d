// RedisClient's private parts shared by its two source files
// (redis_client.cc: connections, the single-node path; redis_client_cluster.cc:
// cluster mode). Internal to lib/cluster; see redis_client.h for the
// ownership and thread-safety of the whole.
#pragma once

#include <hiredis/hiredis.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/cluster/redis_client.h"
#include "lib/metrics/registry.h"

namespace swaserve::cluster {

// The metrics label of a command: its name, lower-cased ("empty" for none).
std::string OpFromCommand(const RedisCommand& command);

struct RedisClient::Connection {
  absl::Mutex mu;
  redisContext* ctx ABSL_GUARDED_BY(mu) = nullptr;
  // Node::timeouts when it connected: a call on another connection of the
  // node timing out since then makes this one suspect (dropped, not used).
  uint64_t timeouts_seen ABSL_GUARDED_BY(mu) = 0;

  void Drop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (ctx != nullptr) redisFree(ctx);
    ctx = nullptr;
  }
};

struct RedisClient::Node {
  Node(std::string h, int p, int pool_size, absl::Duration initial_backoff)
      : host(std::move(h)), port(p), address(absl::StrCat(host, ":", p)),
        backoff(initial_backoff) {
    for (int i = 0; i < pool_size; ++i) connections.push_back(std::make_unique<Connection>());
  }
  ~Node() {
    for (auto& conn : connections) {
      absl::MutexLock lock(&conn->mu);
      conn->Drop();
    }
  }

  const std::string host;
  const int port;
  const std::string address;
  std::vector<std::unique_ptr<Connection>> connections;
  std::atomic<uint32_t> next_connection{0};
  // Group commit (RedisOptions::coalesce_calls): calls waiting to be sent,
  // oldest first, and the pipelines running (at most coalesce_in_flight).
  absl::Mutex coalesce_mu;
  std::deque<PendingCall*> pending ABSL_GUARDED_BY(coalesce_mu);
  int in_flight ABSL_GUARDED_BY(coalesce_mu) = 0;
  // Reconnect state: while now < retry_at, calls fail fast. A failed
  // connect or a call that timed out (the server does not answer) starts
  // it; `timeouts` counts the timed-out calls.
  absl::Mutex backoff_mu;
  uint64_t timeouts ABSL_GUARDED_BY(backoff_mu) = 0;
  absl::Time retry_at ABSL_GUARDED_BY(backoff_mu) = absl::InfinitePast();
  absl::Duration backoff ABSL_GUARDED_BY(backoff_mu);
  std::string last_error ABSL_GUARDED_BY(backoff_mu);
  // Whether the last connect failed on refused credentials: calls refused
  // during the backoff are then PermissionDenied, not Unavailable.
  bool last_refused_auth ABSL_GUARDED_BY(backoff_mu) = false;
};

// One caller's call waiting in Node::pending (it lives on the caller's
// stack). The pipeline's leader fills *replies and status, then sets done
// under Node::coalesce_mu.
struct RedisClient::PendingCall {
  absl::Span<const RedisCommand> commands;
  std::vector<RedisReply>* replies = nullptr;
  absl::Status status;
  bool taken = false;  // in a pipeline being sent
  bool done = false;
};

struct RedisClient::OpMetrics {
  metrics::Histogram* latency = nullptr;
  metrics::Counter* errors = nullptr;
};

}  // namespace swaserve::cluster
