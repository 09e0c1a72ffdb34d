#include "lib/base/serving.h"

#include "absl/synchronization/mutex.h"

namespace swaserve::base {

void TuneForServing() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace swaserve::base
