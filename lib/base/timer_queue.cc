#include "lib/base/timer_queue.h"

#include "absl/time/clock.h"

namespace swaserve::base {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  thread_.join();
}

uint64_t TimerQueue::Schedule(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  timers_.emplace(std::make_pair(when, id), std::move(fn));
  when_.emplace(id, when);
  cv_.Signal();
  return id;
}

bool TimerQueue::Cancel(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = when_.find(id);
  if (it == when_.end()) {
    // Ran, or running now: wait for it to finish.
    auto done = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return running_ != id;
    };
    mu_.Await(absl::Condition(&done));
    return false;
  }
  timers_.erase(std::make_pair(it->second, id));
  when_.erase(it);
  return true;
}

void TimerQueue::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (timers_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    auto first = timers_.begin();
    const absl::Time now = absl::Now();
    if (first->first.first > now) {
      cv_.WaitWithDeadline(&mu_, first->first.first);
      continue;
    }
    const uint64_t id = first->first.second;
    std::function<void()> fn = std::move(first->second);
    timers_.erase(first);
    when_.erase(id);
    running_ = id;
    mu_.Unlock();
    fn();
    mu_.Lock();
    running_ = 0;
  }
}

}  // namespace swaserve::base
