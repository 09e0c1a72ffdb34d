// Runs asynchronous load-backs' page copies (PrefixCache::BeginLoadBack) on
// its own thread, so that the prefill loop keeps computing other requests
// while a prompt's L2 part is copied into L1: load-backs are
// asynchronous and overlap with compute. Each job's copies run in
// submission order; `done` gets the job back (its result.seconds set) on the
// copier's thread, and the owner then calls PrefixCache::FinishLoadBack on
// its own thread.
//
// Thread-safety: Submit is thread-safe. The destructor runs every queued job
// (their pages must stay valid until then) and calls `done` for each, so no
// job is ever lost: the owner must still be able to take them.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv {

class LoadBackCopier {
 public:
  using Done = std::function<void(PendingLoadBack)>;
  explicit LoadBackCopier(Done done);
  ~LoadBackCopier();
  LoadBackCopier(const LoadBackCopier&) = delete;
  LoadBackCopier& operator=(const LoadBackCopier&) = delete;

  void Submit(PendingLoadBack job);

 private:
  void Run();

  Done done_;
  absl::Mutex mu_;
  std::deque<PendingLoadBack> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace swaserve::kv
