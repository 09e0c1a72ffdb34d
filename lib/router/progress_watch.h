// PrefillProgressWatch: what a client-facing sink knows of its request's
// prefill while the request waits for its first token (the HTTP API's SSE
// keep-alive comments, the gRPC API's progress messages).
//
// The router hands the sink a probe for the current prefill leg
// (GenerateSink::SetProgressProbe; a retry's leg replaces it). The sink asks
// Lead(interval) before each message it sends (Ask), and the message carries
// the worker's answer (Last), which usually arrives within milliseconds.
// An answer to a replaced probe is dropped: a retry's prefill starts over,
// and a late answer about the failed leg must not show.
//
// Thread-safety: every method may be called from any thread. Ask() calls the
// probe outside the lock; its answer may come on any thread, even after the
// watch is gone (it is then dropped).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/router/router.h"

namespace swaserve::router {

class PrefillProgressWatch {
 public:
  PrefillProgressWatch();

  // How long before a message, sent every `interval`, the probe is asked:
  // a quarter of the interval, at most 2 s.
  static absl::Duration Lead(absl::Duration interval);

  // Replaces the probe (null: none) and forgets the last answer.
  void Set(GenerateSink::ProgressProbe probe);
  // Asks the current probe, if any; its answer becomes Last() unless Set()
  // was called meanwhile.
  void Ask();
  // The last kept answer; nullopt before one came or after Set().
  std::optional<v1::PrefillProgress> Last() const;

 private:
  struct State {
    mutable absl::Mutex mu;
    GenerateSink::ProgressProbe probe ABSL_GUARDED_BY(mu);
    // Counts Set() calls: which probe an answer belongs to.
    uint64_t generation ABSL_GUARDED_BY(mu) = 0;
    std::optional<v1::PrefillProgress> last ABSL_GUARDED_BY(mu);
  };
  // Shared with pending answers (they hold it weakly).
  const std::shared_ptr<State> state_;
};

}  // namespace swaserve::router
