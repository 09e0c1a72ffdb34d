#include "services/router/call_state.h"

#include <utility>

namespace swaserve::router_service {

bool CallState::Write(const v1::GenerateResponse& response) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  queue_.push_back(response);
  return true;
}

void CallState::OnReady(std::function<void()> ready) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_ && queue_.size() >= max_queued_) {
      ready_ = std::move(ready);
      return;
    }
  }
  ready();
}

void CallState::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  status_ = std::move(status);
}

CallState::Next CallState::Pop(v1::GenerateResponse* out, absl::Status* status,
                               absl::Duration timeout) {
  std::function<void()> ready;
  Next next = Next::kEmpty;
  {
    absl::MutexLock lock(&mu_);
    auto have = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !queue_.empty() || finished_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&have), timeout);
    if (!queue_.empty()) {
      *out = std::move(queue_.front());
      queue_.pop_front();
      next = Next::kItem;
      if (ready_ != nullptr && queue_.size() < max_queued_) {
        ready = std::move(ready_);
        ready_ = nullptr;
      }
    } else if (finished_) {
      *status = status_;
      next = Next::kFinished;
    }
  }
  if (ready != nullptr) ready();  // the request reads on (never with the lock)
  return next;
}

void CallState::Cancel() {
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    ready = std::move(ready_);
    ready_ = nullptr;
  }
  cancel_.Cancel();
  if (ready != nullptr) ready();
}

}  // namespace swaserve::router_service
