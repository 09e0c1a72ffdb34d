// swaserve.v1.Decode over a DecodeCore and a UCX TransferEngine
// (ARCHITECTURE §4 steps 2 and 4).
//
// Decode(request) stream:
//   1. takes the request's KV staging in host memory (full KV for every
//      prompt token + SWA KV for the last window) and announces the
//      transfer; the first response carries the KvDestination. The staging
//      is a block of the staging arena when there is one and it has room:
//      one TransferEngine::Allocate() at start-up (UCX-allocated shared
//      memory, registered once: a sender on this host writes into it with
//      single-copy puts). Otherwise — no arena, or no free run large enough
//      — it is heap memory registered for this request alone (active
//      messages over shared memory; counted in
//      swaserve_decode_staging_fallback_total);
//   2. the prefill worker writes the KV and commits over UCX (the commit
//      payload is a CommitKvRequest: first token, last hidden state, cached
//      tokens); the staged request then goes to the DecodeCore, which admits
//      it when pool pages free up;
//   3. generated tokens stream back, the last chunk with finish reason and
//      usage.
// No commit within commit_timeout → the stream ends with DEADLINE_EXCEEDED
// (ERROR_CODE_TRANSFER_FAILED) and the staging is freed. An arena block whose
// transfer failed is quarantined for staging_quarantine before reuse: puts
// are one-sided, so a sender that has not yet seen the failure may still
// write into it. A cancelled stream
// cancels the pending transfer or the running request.
// CommitKv: the commit travels in-band with the UCX transfer; the RPC
// answers FAILED_PRECONDITION saying so.
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
  absl::Duration commit_timeout = absl::Seconds(60);
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
  grpc::ServerUnaryReactor* CommitKv(grpc::CallbackServerContext* context,
                                     const v1::CommitKvRequest* request,
                                     v1::CommitKvResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request,
                                    v1::WorkerLoad* response) override;

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
