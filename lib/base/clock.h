// An injectable source of time, so tests can drive timeouts, TTLs and aging
// deterministically.
//
// Production code takes a `Clock*` (default Clock::Real()) and never calls
// absl::Now() or sleeps directly. Clock::Real() is a process-wide singleton and
// is never destroyed. FakeClock is thread-safe.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace swaserve::base {

class Clock {
 public:
  virtual ~Clock() = default;
  // Current time.
  virtual absl::Time Now() const = 0;
  // Blocks the calling thread for `d` (a FakeClock advances instead).
  virtual void SleepFor(absl::Duration d) = 0;
  // The real wall clock.
  static Clock* Real();
};

// A clock that only moves when told to. SleepFor(d) advances it by d, so code
// that sleeps in a loop makes progress in tests without real waiting.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : now_(start) {}
  absl::Time Now() const override;
  void SleepFor(absl::Duration d) override { Advance(d); }
  void Advance(absl::Duration d);
  void SetTime(absl::Time t);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

// Nanoseconds from a monotonic clock (CLOCK_MONOTONIC), for measuring
// intervals such as latencies; unaffected by wall-clock changes.
int64_t MonotonicNanos();

}  // namespace swaserve::base
