// Process-wide settings for the long-running services (router, worker,
// encoder); tests and tools keep the library defaults.
//
// TuneForServing(): turns off Abseil's Mutex deadlock detection. Debian's
// libabsl is built without NDEBUG, so every absl::Mutex lock and unlock
// also updates a global lock-order graph (GraphCycles): measured at 8.5% of
// the router's CPU with 3,000 streams open (bench/RESULTS.md, "Router
// capacity"). The unit and integration tests keep the detection on, so a
// lock-order inversion still fails them. Call once at the start of main(),
// before threads start.
#pragma once

namespace swaserve::base {

void TuneForServing();

}  // namespace swaserve::base
