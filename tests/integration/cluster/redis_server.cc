#include "tests/integration/cluster/redis_server.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::cluster::testing {
namespace {

constexpr absl::Duration kReadyTimeout = absl::Seconds(10);
constexpr char kRedisServer[] = "/usr/bin/redis-server";

}  // namespace

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(
    std::vector<std::string> extra_args) {
  return Start(RedisServerOptions{.extra_args = std::move(extra_args)});
}

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(RedisServerOptions options) {
  std::string program = kRedisServer;
  if (access(program.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        "redis-server not found at /usr/bin/redis-server: install it "
        "(Debian: apt-get install redis-server; scripts/install-deps.sh does)");
  }
  ASSIGN_OR_RETURN(std::string dir, base::MakeTempDir("swaserve-redis"));
  absl::Status last;
  // The picked port may be taken before redis binds it: retry a few times.
  for (int attempt = 0; attempt < 5; ++attempt) {
    ASSIGN_OR_RETURN(int port, base::PickFreePort());
    auto server = absl::WrapUnique(new RedisServer(dir, port, options));
    last = server->Launch();
    if (last.ok()) return server;
  }
  return last;
}

RedisServer::~RedisServer() {
  if (process_ != nullptr) {
    process_->Signal(SIGKILL).IgnoreError();
    process_->Wait(absl::Seconds(5)).IgnoreError();
    process_.reset();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::Status RedisServer::Launch() {
  ++launches_;
  std::vector<std::string> argv = o_.command_prefix;
  const std::vector<std::string> args = {
      kRedisServer, "--port",     absl::StrCat(port_), "--bind",   o_.bind,   "--save",
      "",           "--appendonly", "no",              "--dir",    dir_,      "--daemonize",
      "no",         "--loglevel", "warning",           "--databases", "4"};
  argv.insert(argv.end(), args.begin(), args.end());
  // Protected mode refuses every client but loopback's when no password is
  // set.
  if (o_.bind != "127.0.0.1") argv.insert(argv.end(), {"--protected-mode", "no"});
  argv.insert(argv.end(), o_.extra_args.begin(), o_.extra_args.end());
  ASSIGN_OR_RETURN(
      process_,
      base::Subprocess::Start(
          {.argv = argv,
           .log_path = absl::StrCat(dir_, "/redis-", launches_, ".log"),
           .stop_grace = absl::Seconds(2)}));
  absl::Status ready = base::WaitForTcpPort(o_.bind, port_, kReadyTimeout);
  if (!ready.ok() || !process_->Running()) {
    const std::string log = process_->ReadLog();
    process_->Signal(SIGKILL).IgnoreError();
    process_->Wait(absl::Seconds(5)).IgnoreError();
    process_.reset();
    return absl::UnavailableError(
        absl::StrCat("redis-server did not start on port ", port_, ": ",
                     ready.message(), "\nlog:\n", log));
  }
  return absl::OkStatus();
}

RedisOptions RedisServer::ClientOptions() const {
  return RedisOptions{.host = o_.bind,
                      .port = port_,
                      .connect_timeout = absl::Milliseconds(500),
                      .command_timeout = absl::Seconds(2),
                      .reconnect_backoff_initial = absl::Milliseconds(20),
                      .reconnect_backoff_max = absl::Milliseconds(200)};
}

absl::Status RedisServer::Kill() {
  if (process_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(process_->Signal(SIGKILL));
  absl::StatusOr<int> rc = process_->Wait(absl::Seconds(5));
  process_.reset();
  return rc.status();
}

absl::Status RedisServer::Restart() {
  if (process_ != nullptr) {
    return absl::FailedPreconditionError("RedisServer: still running");
  }
  // The kernel may hold the port briefly; Launch fails fast if so: retry.
  absl::Status s;
  for (int attempt = 0; attempt < 20; ++attempt) {
    s = Launch();
    if (s.ok()) return s;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return s;
}

std::string RedisServer::ReadLog() const {
  return process_ != nullptr ? process_->ReadLog() : "";
}

}  // namespace swaserve::cluster::testing
