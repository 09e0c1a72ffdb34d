// The transfer engine's metrics (internal to lib/transfer): the families
// documented at TransferEngineOptions::registry, one set of children per
// direction, and the failure reasons.
//
// TransferMetrics caches the children when exported (looking one up is not
// lock-free, observing is). Without a registry, or when a conflicting
// definition is already registered (logged), every call is a no-op.
// Thread-safe (the children are); the engine calls it from its progress
// thread only.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lib/metrics/registry.h"

namespace swaserve::transfer::internal {

// Reasons of swaserve_kv_transfer_failures_total.
enum class Reason : int {
  kTimeout,
  kPeerFailure,
  kRejected,
  kInvalid,
  kCancelled,
  kInternal,
  kCount
};
// "timeout", "peer_failure", "rejected", "invalid", "cancelled", "internal".
absl::string_view ReasonName(Reason reason);

enum class Direction : int { kSend, kReceive };

class TransferMetrics {
 public:
  // Disabled until Export.
  TransferMetrics() = default;
  // Registers (or joins) the families on `registry` and caches the
  // children; null: stays disabled. Call once, before any observation.
  void Export(metrics::Registry* registry);
  TransferMetrics(const TransferMetrics&) = delete;
  TransferMetrics& operator=(const TransferMetrics&) = delete;

  // Whether the families are exported.
  bool enabled() const { return enabled_; }

  // A transfer began: in_flight + 1.
  void Started(Direction direction);
  // It ended (in_flight - 1) with success: result="ok", `bytes` and
  // `elapsed` observed.
  void Succeeded(Direction direction, uint64_t bytes, absl::Duration elapsed);
  // It ended (in_flight - 1) with a failure: result="failed" and `reason`.
  void Failed(Direction direction, Reason reason);

 private:
  struct Children {
    metrics::Counter* bytes = nullptr;
    metrics::Counter* ok = nullptr;
    metrics::Counter* failed = nullptr;
    metrics::Histogram* seconds = nullptr;
    metrics::Gauge* in_flight = nullptr;
    metrics::Counter* reasons[static_cast<int>(Reason::kCount)] = {};
  };
  Children& Of(Direction d) { return children_[static_cast<int>(d)]; }

  bool enabled_ = false;
  Children children_[2];
};

}  // namespace swaserve::transfer::internal
