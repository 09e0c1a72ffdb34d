// TimerQueue: runs callbacks at deadlines on one background thread, for
// bounded waits on calls that cannot time out by themselves (e.g. the first
// message of a gRPC stream: the router's destination timeout) without a
// thread per wait.
//
// Callbacks run on the queue's thread, must not block and must not call
// back into the queue. Cancel() returns whether the callback was prevented
// (false: it already ran or is running).
//
// Ownership: owns its thread; the destructor drops pending timers without
// running them. Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace swaserve::base {

class TimerQueue {
 public:
  TimerQueue();
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at `when` (at once if past). Returns an id for Cancel.
  uint64_t Schedule(absl::Time when, std::function<void()> fn);
  // Prevents the timer; false if it already ran, is running or is unknown.
  // Never returns while the callback is running (so what it touches may be
  // destroyed after Cancel returns).
  bool Cancel(uint64_t id);

 private:
  void Run();

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> timers_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Time> when_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t running_ ABSL_GUARDED_BY(mu_) = 0;  // id of the callback running now
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace swaserve::base
