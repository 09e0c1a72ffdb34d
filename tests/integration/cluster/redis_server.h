// RedisServer: a real redis-server for integration tests, on a free loopback
// port, without persistence (--save "" --appendonly no), in a temporary
// directory. Kill() and Restart() simulate a Redis crash and its return on
// the same port (empty, as a restarted cache-only Redis is).
//
// Owns the process (killed in the destructor, even when a test fails) and
// the directory. Thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/redis_client.h"

namespace swaserve::cluster::testing {

struct RedisServerOptions {
  // Extra redis-server arguments, e.g. {"--requirepass", "pw"}.
  std::vector<std::string> extra_args;
  // The address it binds and clients use. Default: loopback.
  std::string bind = "127.0.0.1";
  // Put before its command line, e.g. to run it in another network
  // namespace (HostNetwork::Wrap); empty (default): none.
  std::vector<std::string> command_prefix;
};

class RedisServer {
 public:
  // Starts redis-server with `extra_args` (e.g. {"--requirepass", "pw"}) and
  // waits until it accepts connections. FailedPrecondition when
  // redis-server is not installed.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(
      std::vector<std::string> extra_args = {});
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(RedisServerOptions options);
  ~RedisServer();

  int port() const { return port_; }
  const std::string& host() const { return o_.bind; }
  // The running server's pid (0 after Kill()).
  pid_t pid() const { return process_ != nullptr ? process_->pid() : 0; }
  // Options for a client of this server (short timeouts and backoff).
  RedisOptions ClientOptions() const;

  // SIGKILLs the server and waits for it to exit.
  absl::Status Kill();
  // Starts it again on the same port (after Kill()).
  absl::Status Restart();
  bool running() const { return process_ != nullptr; }
  std::string ReadLog() const;

 private:
  RedisServer(std::string dir, int port, RedisServerOptions o)
      : dir_(std::move(dir)), port_(port), o_(std::move(o)) {}
  absl::Status Launch();

  std::string dir_;
  int port_;
  RedisServerOptions o_;
  std::unique_ptr<base::Subprocess> process_;
  int launches_ = 0;
};

}  // namespace swaserve::cluster::testing
