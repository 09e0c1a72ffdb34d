// What the transfer engine's parts share (internal to lib/transfer): the
// options, the UCP context and worker, this engine's identity, the request
// tracker, the metrics and the progress thread's clocks. EngineState owns it
// and hands a pointer to RegistrationTable, PeerTable, Sender and Receiver.
//
// Thread-safety: none. Every field is progress-thread state: read and
// written only on the engine's progress thread (or, once that thread has
// stopped, by one caller at a time under the engine's inline mutex), except
// the fields set once before the thread starts (marked "immutable").
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "absl/functional/any_invocable.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/transfer/transfer_metrics.h"
#include "lib/transfer/ucx_request.h"
#include "lib/transfer/wire.h"

namespace swaserve::transfer::internal {

struct EngineContext {
  explicit EngineContext(const TransferEngineOptions& o) : options(o) {}
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  const TransferEngineOptions options;  // immutable
  ucp_context_h context = nullptr;      // immutable once created
  // Null once the engine has shut down (EngineState::DestroyWorker).
  ucp_worker_h worker = nullptr;
  uint64_t engine_id = 0;              // immutable, nonzero
  wire::ProcessIdentity self_process;  // immutable
  std::string framed_address;          // immutable: wire::PackWorkerAddress
  std::mt19937_64 rng;                 // rkey tags
  // Exported (options.registry) once the engine is up.
  TransferMetrics metrics;
  // Last sign of activity (a message, a completed request): the progress
  // loop polls for spin_before_sleep after it before sleeping.
  int64_t last_activity_ns = 0;
  RequestTracker requests{&last_activity_ns};
  // Set by BeginShutdown: new transfers are refused or fail Cancelled.
  bool shutting_down = false;
  // Earliest deadline of a pending transfer (max: none); lowered by whoever
  // adds one, recomputed by EngineState::CheckDeadlines.
  int64_t next_deadline_ns = std::numeric_limits<int64_t>::max();
  // Publishes the live counters for TransferEngine::Stats (set by
  // EngineState; called when a transfer starts or finishes, before its
  // callback runs, so a callback sees itself gone).
  absl::AnyInvocable<void()> publish_stats = [] {};
};

}  // namespace swaserve::transfer::internal
