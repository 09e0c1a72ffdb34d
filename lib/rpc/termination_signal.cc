#include "lib/rpc/termination_signal.h"

#include <errno.h>
#include <string.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/rpc/grpc_server.h"

namespace swaserve::rpc {
namespace {

std::atomic<bool> g_instance_alive{false};
// The live watcher thread (0: none): where ForwardToWatcher sends a signal
// that a thread with the signals unblocked received.
std::atomic<pthread_t> g_watcher{0};

extern "C" void ForwardToWatcher(int signo) {
  const int saved = errno;
  const pthread_t w = g_watcher.load();
  if (w != 0) pthread_kill(w, signo);
  errno = saved;
}

bool Positive(int* count) { return *count > 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<TerminationSignal>> TerminationSignal::Create() {
  if (g_instance_alive.exchange(true)) {
    return absl::FailedPreconditionError(
        "a TerminationSignal already exists in this process");
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  if (const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0) {
    g_instance_alive = false;
    return absl::InternalError(absl::StrCat("pthread_sigmask: ", strerror(rc)));
  }
  // The watcher is created after the mask change and so inherits it.
  auto signal = std::unique_ptr<TerminationSignal>(new TerminationSignal(set));
  signal->watcher_ = std::thread([s = signal.get()] { s->WatchLoop(); });
  g_watcher = signal->watcher_.native_handle();
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = ForwardToWatcher;
  sigfillset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGTERM, SIGINT}) {
    if (sigaction(s, &sa, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigaction: ", strerror(errno)));
    }
  }
  return signal;
}

TerminationSignal::TerminationSignal(sigset_t set) : set_(set) {}

TerminationSignal::~TerminationSignal() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // A thread-directed SIGTERM wakes the watcher's sigwait; it sees stopping_.
  g_watcher = 0;  // the forwarding handler stays installed and drops signals now
  pthread_kill(watcher_.native_handle(), SIGTERM);
  watcher_.join();
  g_instance_alive = false;
}

void TerminationSignal::WatchLoop() {
  while (true) {
    int signo = 0;
    if (sigwait(&set_, &signo) != 0) continue;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    Deliver(signo);
  }
}

void TerminationSignal::Deliver(int signo) {
  int count = 0;
  {
    absl::MutexLock lock(&mu_);
    count = ++count_;
    if (count == 1) first_signal_ = signo;
  }
  SWA_LOG(info, "received signal {} ({}), #{}", signo,
          signo > 0 ? strsignal(signo) : "trigger", count);
  absl::MutexLock lock(&callback_mu_);
  if (callback_) callback_(signo, count);
}

int TerminationSignal::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&Positive, &count_));
  return first_signal_;
}

std::optional<int> TerminationSignal::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&Positive, &count_), timeout)) {
    return std::nullopt;
  }
  return first_signal_;
}

int TerminationSignal::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

void TerminationSignal::Trigger(int signo) { Deliver(signo); }

void TerminationSignal::OnSignal(
    std::function<void(int signo, int count)> callback) {
  absl::MutexLock lock(&callback_mu_);
  callback_ = std::move(callback);
}

int ServeUntilTerminated(GrpcServer& server, TerminationSignal& signal) {
  signal.OnSignal([&server](int /*signo*/, int count) {
    if (count >= 2) server.CancelAllCalls();
  });
  const int signo = signal.Wait();
  SWA_LOG(info, "shutting down on signal {}", signo);
  server.Shutdown();
  signal.OnSignal(nullptr);
  return signo;
}

}  // namespace swaserve::rpc
