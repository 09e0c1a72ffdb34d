// Graceful termination on SIGTERM / SIGINT without signal handlers.
//
// TerminationSignal blocks SIGTERM and SIGINT in the calling thread and
// waits for them with sigwait() on a dedicated watcher thread; nothing but a
// forward runs in signal-handler context. Because a signal mask is inherited
// only by threads created afterwards, create it FIRST in main(), before
// anything starts threads (gRPC, spdlog async sinks, thread pools). Threads
// that exist before main() cannot be covered that way (a shared library's
// constructor may start them: OpenBLAS starts its thread pool when loaded),
// so Create also installs a handler for both signals that only forwards a
// signal delivered to such a thread to the watcher (pthread_kill, which is
// async-signal-safe), instead of letting the default action end the process.
//
//   int main(int argc, char** argv) {
//     auto signal = rpc::TerminationSignal::Create();  // first line
//     ...build services and the GrpcServer...
//     const int signo = rpc::ServeUntilTerminated(*server, **signal);
//     return 0;
//   }
//
// One instance per process (Create fails while another is alive). The
// destructor stops the watcher thread; the signals stay blocked (a process
// that opted in never falls back to dying on SIGTERM mid-teardown).
// Thread-safe.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace swaserve::rpc {

class GrpcServer;

class TerminationSignal {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread and starts the watcher.
  // FailedPrecondition when another TerminationSignal exists.
  static absl::StatusOr<std::unique_ptr<TerminationSignal>> Create();

  ~TerminationSignal();
  TerminationSignal(const TerminationSignal&) = delete;
  TerminationSignal& operator=(const TerminationSignal&) = delete;

  // Blocks until the first SIGTERM/SIGINT (or Trigger) and returns its
  // number (the value passed to Trigger for a Trigger).
  int Wait();
  // As Wait, but gives up after `timeout` (nullopt).
  std::optional<int> WaitFor(absl::Duration timeout);

  // Signals received (and Trigger calls) so far.
  int count() const;

  // Behaves as if signal `signo` had arrived (programmatic shutdown, tests);
  // the callback then runs on the calling thread.
  void Trigger(int signo = SIGTERM);

  // Runs `callback(signo, count)` on the watcher thread after each signal
  // (count includes this one). Replaces an earlier callback; nullptr removes
  // it, and once OnSignal returns the old callback is not running and will
  // not run again. The callback must not block or call OnSignal.
  void OnSignal(std::function<void(int signo, int count)> callback);

 private:
  explicit TerminationSignal(sigset_t set);
  void WatchLoop();
  void Deliver(int signo);

  const sigset_t set_;  // {SIGTERM, SIGINT}
  std::thread watcher_;

  mutable absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  int first_signal_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Held while a callback runs, so that OnSignal(nullptr) can wait it out.
  absl::Mutex callback_mu_;
  std::function<void(int, int)> callback_ ABSL_GUARDED_BY(callback_mu_);
};

// Serves until the first SIGTERM/SIGINT, then runs server.Shutdown() (its
// configured lame duck and drain deadline). A second signal during the drain
// cancels the remaining calls at once (server.CancelAllCalls()). Returns the
// first signal's number once the server has stopped.
int ServeUntilTerminated(GrpcServer& server, TerminationSignal& signal);

}  // namespace swaserve::rpc
