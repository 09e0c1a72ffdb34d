// Shares one model::Engine between the loops of one process (monolithic mode:
// a prefill core and a decode core): Forward is not reentrant, so each call
// holds the mutex. The loops alternate per call; weights are loaded once.
// Thread-safe.
#pragma once

#include "absl/synchronization/mutex.h"
#include "lib/model/forward.h"

namespace swaserve::worker {

class EngineLock {
 public:
  // `engine` is not owned and must outlive this object.
  explicit EngineLock(model::Engine* engine) : engine_(engine) {}

  const model::ModelConfig& config() const { return engine_->config(); }
  const model::Engine& engine() const { return *engine_; }

  absl::Status Forward(absl::Span<const model::ForwardItem> items, model::ForwardOutput* out,
                       bool keep_all_hidden = false) {
    absl::MutexLock lock(&mu_);
    return engine_->Forward(items, out, keep_all_hidden);
  }
  absl::Status ForwardMtp(int k, absl::Span<const model::ForwardItem> items,
                          absl::Span<const float> hidden, model::ForwardOutput* out) {
    absl::MutexLock lock(&mu_);
    return engine_->ForwardMtp(k, items, hidden, out);
  }

 private:
  model::Engine* engine_;
  absl::Mutex mu_;
};

}  // namespace swaserve::worker
