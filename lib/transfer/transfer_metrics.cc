#include "lib/transfer/transfer_metrics.h"

#include "lib/base/logging.h"
#include "lib/metrics/buckets.h"

namespace swaserve::transfer::internal {
namespace {

constexpr const char* kReasonNames[] = {"timeout", "peer_failure", "rejected",
                                        "invalid", "cancelled",    "internal"};
static_assert(std::size(kReasonNames) == static_cast<int>(Reason::kCount));

}  // namespace

absl::string_view ReasonName(Reason reason) {
  const int i = static_cast<int>(reason);
  if (i < 0 || i >= static_cast<int>(Reason::kCount)) return "?";
  return kReasonNames[i];
}

void TransferMetrics::Export(metrics::Registry* reg) {
  if (reg == nullptr) return;
  auto bytes = reg->AddCounter(
      "swaserve_kv_transfer_bytes_total",
      "KV bytes of successful transfers (committed and acknowledged: visible "
      "at the receiver), by direction",
      {"direction"});
  auto transfers = reg->AddCounter(
      "swaserve_kv_transfers_total",
      "KV transfers finished, by direction and result (ok: committed and "
      "acknowledged)",
      {"direction", "result"});
  auto buckets = metrics::ExponentialBuckets(1e-4, 2, 22);
  auto seconds = reg->AddHistogram(
      "swaserve_kv_transfer_seconds",
      "Duration of successful KV transfers: sender from Send to the commit "
      "acknowledgement, receiver from ExpectTransfer to the commit",
      {"direction"},
      buckets.ok() ? *buckets : metrics::DefaultLatencyBuckets());
  auto failures = reg->AddCounter(
      "swaserve_kv_transfer_failures_total",
      "Failed KV transfers by direction and reason (timeout, peer_failure, "
      "rejected, invalid, cancelled, internal)",
      {"direction", "reason"});
  auto in_flight =
      reg->AddGauge("swaserve_kv_transfers_in_flight",
                    "KV transfers in progress, by direction", {"direction"});
  if (!bytes.ok() || !transfers.ok() || !seconds.ok() || !failures.ok() ||
      !in_flight.ok()) {
    SWA_LOG(err,
            "transfer metrics not exported: a conflicting definition is "
            "registered");
    return;
  }
  for (Direction d : {Direction::kSend, Direction::kReceive}) {
    Children& m = Of(d);
    const absl::string_view dir = d == Direction::kSend ? "send" : "receive";
    m.bytes = &(*bytes)->WithLabels({dir});
    m.ok = &(*transfers)->WithLabels({dir, "ok"});
    m.failed = &(*transfers)->WithLabels({dir, "failed"});
    m.seconds = &(*seconds)->WithLabels({dir});
    m.in_flight = &(*in_flight)->WithLabels({dir});
    for (int i = 0; i < static_cast<int>(Reason::kCount); ++i) {
      m.reasons[i] = &(*failures)->WithLabels({dir, kReasonNames[i]});
    }
  }
  enabled_ = true;
}

void TransferMetrics::Started(Direction direction) {
  if (enabled_) Of(direction).in_flight->Increment();
}

void TransferMetrics::Succeeded(Direction direction, uint64_t bytes,
                                absl::Duration elapsed) {
  if (!enabled_) return;
  Children& m = Of(direction);
  m.in_flight->Decrement();
  m.ok->Increment();
  m.bytes->Increment(static_cast<double>(bytes));
  m.seconds->Observe(absl::ToDoubleSeconds(elapsed));
}

void TransferMetrics::Failed(Direction direction, Reason reason) {
  if (!enabled_) return;
  Children& m = Of(direction);
  m.in_flight->Decrement();
  m.failed->Increment();
  m.reasons[static_cast<int>(reason)]->Increment();
}

}  // namespace swaserve::transfer::internal
