// swaserve.v1.Decode over a DecodeCore and a UCX TransferEngine
// (ARCHITECTURE §4 steps 2 and 4).
//
// Decode(request) stream (issue 16: deadlines follow progress):
//   1. checks the request (a prompt whose KV could never fit this worker's
//      pools or staging budget fails now with RESOURCE_EXHAUSTED,
//      ERROR_CODE_TOO_LARGE_FOR_WORKER, not retryable), records it as
//      pending under its transfer id and sends `accepted`. No memory is
//      held and no timer runs while the prefill leg queues and computes:
//      the router keeps the stream open while that leg is alive and cancels
//      it when the leg fails;
//   2. GetKvDestination(transfer id), from the prefill worker about to ship,
//      takes a reservation of the staging bytes from the StagingBudget
//      (waiting in FIFO order while it is full; the caller's deadline bounds
//      the wait), then the staging: a block of the staging arena when there
//      is one and it has room (one TransferEngine::Allocate() at start-up:
//      UCX-allocated shared memory, registered once: single-copy puts),
//      otherwise heap memory registered for this request alone (counted in
//      swaserve_decode_staging_fallback_total). The transfer timeout
//      (commit_timeout) counts from here;
//   3. the prefill worker writes the KV and commits over UCX (the commit
//      payload is a CommitKvRequest: first token, last hidden state, cached
//      tokens, the prefill queue wait); the staged request then goes to the
//      DecodeCore, which admits it when pool pages free up (the staging and
//      its reservation are freed then);
//   4. generated tokens stream back, the last chunk with finish reason and
//      usage (cached_tokens as the prefill worker reported it).
// A transfer that does not complete within commit_timeout ends the stream
// with DEADLINE_EXCEEDED (ERROR_CODE_TRANSFER_FAILED). An arena block whose
// transfer failed is quarantined for staging_quarantine before reuse: puts
// are one-sided, so a sender that has not yet seen the failure may still
// write into it. A cancelled stream leaves the budget's line, cancels the
// pending transfer and the running request (a commit racing the cancel is
// cancelled in the core right after its submit).
// Draining (StartDraining, on SIGTERM): new Decode calls get UNAVAILABLE
// (ERROR_CODE_DRAINING, retryable); streams in progress continue until the
// server's drain deadline, after which the router migrates what is left.
//
// Thread-safe (gRPC callback API; reactors never block).
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/metrics/registry.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/staging_arena.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::worker_service {

struct DecodeServiceOptions {
  std::string worker_id;
  // Not owned; must outlive the service.
  worker::DecodeCore* core = nullptr;
  transfer::TransferEngine* transfer = nullptr;
  const kv::KvPools* pools = nullptr;  // for GetLoad and the KV shape
  std::vector<uint32_t> eos_ids;
  int default_max_tokens = 256;
  int max_max_tokens = 1 << 20;
  // Bound on one KV transfer, from GetKvDestination (the prefill worker is
  // about to ship) to the commit. Default 60 s.
  absl::Duration commit_timeout = absl::Seconds(60);
  // Host bytes all staged requests may hold at once (arena and heap
  // together); past it GetKvDestination waits in line. Default 4 GiB.
  size_t staging_budget_bytes = size_t{4} << 30;
  // Bytes of the staging arena Create() allocates from `transfer` (rounded
  // down to whole 4 KiB pages); 0: no arena, every request's staging is heap
  // memory registered per request.
  size_t staging_arena_bytes = 0;
  // How long an arena block whose transfer failed stays out of use; should
  // be at least the prefill workers' transfer timeout (their puts may land
  // until then).
  absl::Duration staging_quarantine = absl::Seconds(30);
  // Metrics (null: none): swaserve_decode_ttft_seconds, _tpot_seconds,
  // _commit_wait_seconds, _streams_total{result}, and with an arena
  // swaserve_decode_staging_arena_bytes{state="in_use|quarantined|free"}
  // (summing to the capacity),
  // swaserve_decode_staging_fallback_total (requests staged in heap memory
  // because the arena had no room).
  metrics::Registry* registry = nullptr;
};

class DecodeService final : public v1::Decode::CallbackService {
 public:
  // InvalidArgument without core, transfer or pools; the transfer engine's
  // error when the staging arena cannot be allocated.
  static absl::StatusOr<std::unique_ptr<DecodeService>> Create(const DecodeServiceOptions& options);
  ~DecodeService() override;

  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext* context,
                                                       const v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* GetKvDestination(grpc::CallbackServerContext* context,
                                             const v1::GetKvDestinationRequest* request,
                                             v1::KvDestination* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request,
                                    v1::WorkerLoad* response) override;

  // Refuses new Decode calls from now on (SIGTERM; see the header comment).
  void StartDraining();

  // The load report (also published to Redis).
  v1::WorkerLoad Load() const;

  // The staging arena (null when staging_arena_bytes is 0).
  const worker::StagingArena* staging_arena() const;

  struct Shared;

 private:
  explicit DecodeService(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

}  // namespace swaserve::worker_service
