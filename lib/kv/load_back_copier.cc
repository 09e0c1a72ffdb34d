#include "lib/kv/load_back_copier.h"

#include <utility>

namespace swaserve::kv {

LoadBackCopier::LoadBackCopier(Done done) : done_(std::move(done)) {
  thread_ = std::thread([this] { Run(); });
}

LoadBackCopier::~LoadBackCopier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void LoadBackCopier::Submit(PendingLoadBack job) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(job));
}

void LoadBackCopier::Run() {
  while (true) {
    PendingLoadBack job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.result.seconds = job.RunCopies();
    done_(std::move(job));
  }
}

}  // namespace swaserve::kv
