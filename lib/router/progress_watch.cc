#include "lib/router/progress_watch.h"

#include <algorithm>
#include <utility>

namespace swaserve::router {

PrefillProgressWatch::PrefillProgressWatch() : state_(std::make_shared<State>()) {}

absl::Duration PrefillProgressWatch::Lead(absl::Duration interval) {
  return std::min(interval / 4, absl::Seconds(2));
}

void PrefillProgressWatch::Set(GenerateSink::ProgressProbe probe) {
  absl::MutexLock lock(&state_->mu);
  state_->probe = std::move(probe);
  ++state_->generation;
  state_->last.reset();  // a new leg's prefill starts over
}

void PrefillProgressWatch::Ask() {
  GenerateSink::ProgressProbe probe;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&state_->mu);
    probe = state_->probe;
    generation = state_->generation;
  }
  if (!probe) return;
  probe([weak = std::weak_ptr<State>(state_), generation](const v1::PrefillProgress& p) {
    if (std::shared_ptr<State> s = weak.lock()) {
      absl::MutexLock lock(&s->mu);
      if (s->generation == generation) s->last = p;
    }
  });
}

std::optional<v1::PrefillProgress> PrefillProgressWatch::Last() const {
  absl::MutexLock lock(&state_->mu);
  return state_->last;
}

}  // namespace swaserve::router
