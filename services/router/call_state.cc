#include "services/router/call_state.h"

#include <utility>

namespace swaserve::router_service {

bool CallState::Write(const v1::GenerateResponse& response) {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_ || queue_.size() < max_queued_;
  };
  mu_.Await(absl::Condition(&room));
  if (cancelled_) return false;
  queue_.push_back(response);
  return true;
}

void CallState::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  status_ = std::move(status);
}

CallState::Next CallState::Pop(v1::GenerateResponse* out, absl::Status* status,
                               absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || finished_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (!queue_.empty()) {
    *out = std::move(queue_.front());
    queue_.pop_front();
    return Next::kItem;
  }
  if (finished_) {
    *status = status_;
    return Next::kFinished;
  }
  return Next::kEmpty;
}

void CallState::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  cancel_.Cancel();
}

}  // namespace swaserve::router_service
