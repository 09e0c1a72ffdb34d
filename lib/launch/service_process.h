// Starting one swaserve service process, the piece ClusterLauncher (`swaserve
// up`) and the test fixture tests/integration/router/local_cluster.h share:
// spawn it with its log file, wait until it wrote its --port_file (failing
// with the log's tail when it exits first or the deadline passes), read its
// ports; and the command line every worker gets.
//
// Free functions over base::Subprocess: thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lib/base/subprocess.h"

namespace swaserve::launch {

// A started service process.
struct ServiceProcess {
  std::string name;
  std::string log_path;
  std::string port_file;
  std::unique_ptr<base::Subprocess> process;
  // From the port file once serving (routers write their HTTP port as
  // metrics_port: it serves /metrics).
  int grpc_port = 0;
  int metrics_port = 0;
};

struct SpawnOptions {
  std::string name;  // also the log and port file names
  std::vector<std::string> argv;
  std::string dir;  // where <name>.log and <name>.ports.json go
  // SIGTERM -> SIGKILL grace when the process is stopped.
  absl::Duration stop_grace = absl::Seconds(10);
  // Append "--port_file=<dir>/<name>.ports.json" (removing a stale one);
  // false for programs that write none (redis-server).
  bool port_file = true;
  // base::SubprocessOptions::nice_increment (> 0: lower CPU priority).
  int nice_increment = 0;
};

// Spawns the process logging to <dir>/<name>.log. Errors name the process.
absl::StatusOr<ServiceProcess> SpawnService(SpawnOptions options);

// Waits until the process wrote its port file and reads the ports.
// Unavailable naming the process with its log's tail when it exits first,
// does not serve by `deadline` (`budget` is the time it was given, for the
// message), or writes an unreadable file.
absl::Status WaitServing(ServiceProcess& p, absl::Time deadline, absl::Duration budget);

// "<name> <what> (log <path>); last lines:\n<tail>" as Unavailable.
absl::Status ProcessFailed(const ServiceProcess& p, absl::string_view what);

// What every worker process gets on its command line (lib/worker/
// worker_options.h names the flags); role-specific flags are appended.
struct WorkerArgs {
  std::string bin;  // swaserve-worker
  std::string model;
  std::string role;  // prefill | decode | both
  std::string worker_id;
  std::string redis;  // host:port
  std::string cluster = "default";
  std::string model_name;  // empty: not passed
  int threads = 0;         // 0: not passed
};
std::vector<std::string> WorkerArgv(const WorkerArgs& args);

// The last `lines` lines of a file ("" when unreadable).
std::string TailFile(const std::string& path, int lines = 30);

}  // namespace swaserve::launch
