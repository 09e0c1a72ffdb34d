// Child processes and loopback ports, for tests that start real servers
// (redis-server, prometheus, the services) and for `swaserve up`.
//
// A Subprocess owns its child: the destructor sends SIGTERM, waits up to the
// configured grace period, then SIGKILLs and reaps it, so a failing test never
// leaks a server. Thread-compatible: one thread drives a given Subprocess.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace swaserve::base {

struct SubprocessOptions {
  // argv[0] is looked up on PATH when it has no '/'.
  std::vector<std::string> argv;
  // Extra environment entries ("NAME=value"), added to (and overriding) the
  // parent's environment.
  std::vector<std::string> env;
  // When set, stdout and stderr go to this file (created or truncated);
  // otherwise they are inherited from the parent.
  std::string log_path;
  // Working directory of the child; empty keeps the parent's.
  std::string working_dir;
  // How long the destructor and Stop() wait after SIGTERM before SIGKILL.
  absl::Duration stop_grace = absl::Seconds(5);
  // Added to the parent's nice value in the child before exec (nice(2); the
  // child's threads inherit it): > 0 lowers its CPU priority. 0 (default):
  // the parent's.
  int nice_increment = 0;
};

class Subprocess {
 public:
  // Forks and execs. Fails (with the reason) when the program is not found or
  // cannot be executed.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const SubprocessOptions& options);

  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Sends a signal to the child (no-op once it has been reaped).
  absl::Status Signal(int signo);

  // True while the child has not exited.
  bool Running();

  // Waits for the child to exit, up to `timeout`. Returns its exit code, or
  // 128 + signal number when a signal ended it; DeadlineExceeded on timeout.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // SIGTERM, wait stop_grace, then SIGKILL. Returns the exit code as Wait.
  absl::StatusOr<int> Stop();

  // The contents of the log file (empty when no log_path was set).
  std::string ReadLog() const;

 private:
  Subprocess(pid_t pid, SubprocessOptions options)
      : pid_(pid), options_(std::move(options)) {}
  pid_t pid_;
  SubprocessOptions options_;
  std::optional<int> exit_code_;
};

// A TCP port on 127.0.0.1 that was free when asked (bound to port 0, then
// released). Another process may take it before the caller does; callers
// retry on bind failure when that matters.
absl::StatusOr<int> PickFreePort();

// Waits until a TCP connection to host:port succeeds, or `timeout` passes.
absl::Status WaitForTcpPort(const std::string& host, int port,
                            absl::Duration timeout);

// Runs a command to completion, capturing stdout+stderr into *output (when
// non-null). Returns the exit code (128 + signal when killed by a signal);
// DeadlineExceeded when it ran longer than `timeout` (it is then killed).
absl::StatusOr<int> RunCommand(const std::vector<std::string>& argv,
                               std::string* output,
                               absl::Duration timeout = absl::Seconds(60),
                               const std::string& stdin_data = "");

// Makes a fresh directory under $TMPDIR (or /tmp) named prefix-XXXXXX.
absl::StatusOr<std::string> MakeTempDir(const std::string& prefix);

}  // namespace swaserve::base
