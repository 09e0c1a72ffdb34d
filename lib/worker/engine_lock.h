// Shares one model::Engine between the loops of one process (monolithic mode:
// a prefill core and a decode core): Forward is not reentrant, so each call
// holds the mutex. The loops alternate per call; weights are loaded once.
// Thread-safe.
#pragma once

#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "lib/kv/page_pool.h"
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
                          absl::Span<const float> hidden, model::ForwardOutput* out,
                          const model::DraftHead* head = nullptr) {
    absl::MutexLock lock(&mu_);
    return engine_->ForwardMtp(k, items, hidden, out, head);
  }

 private:
  model::Engine* engine_;
  absl::Mutex mu_;
};

// The cores' shared start-up check: `engine` and `pools` are set and the
// pools have the model's KV shape at their page size. InvalidArgument naming
// `core` ("DecodeCore") otherwise.
inline absl::Status CheckEngineAndPools(const char* core, const EngineLock* engine,
                                        const kv::KvPools* pools) {
  if (engine == nullptr || pools == nullptr) {
    return absl::InvalidArgumentError(std::string(core) + " needs an engine and KV pools");
  }
  const kv::KvShape want = engine->config().KvShape(pools->shape().page_size);
  const kv::KvShape& have = pools->shape();
  if (want.Full().PageBytes() != have.Full().PageBytes() ||
      want.Swa().PageBytes() != have.Swa().PageBytes() ||
      want.sliding_window != have.sliding_window) {
    return absl::InvalidArgumentError("the KV pools do not have the model's shape");
  }
  return absl::OkStatus();
}

// The cores' shared stop: sets *stopping under `mu`, wakes the loop, joins
// its thread. Idempotent.
inline void StopLoop(absl::Mutex* mu, absl::CondVar* cv, bool* stopping, std::thread* thread) {
  {
    absl::MutexLock lock(mu);
    *stopping = true;
    cv->Signal();
  }
  if (thread->joinable()) thread->join();
}

}  // namespace swaserve::worker
