// swaserve.v1.Prefill over a PrefillCore and a UCX TransferEngine
// (ARCHITECTURE §4 step 3).
//
// Prefill(request): queues the prompt in the core (prefix-cache match,
// compute-aware scheduling, chunked prefill); once the first token is
// sampled, ships full KV for every prompt token and SWA KV for the last
// window to the decode target's staging area over UCX, with the commit
// (first token, last hidden state, cached tokens) in-band; answers when the
// decode worker acknowledged the commit. Without a decode target it only
// warms the prefix cache. When the target carries no destination, the
// service asks the decode worker (Decode.GetKvDestination) first.
// A cancelled call stops the work and frees its memory.
//
// Thread-safe (gRPC callback API; reactors never block).
#pragma once

#include <memory>
#include <string>

#include "lib/metrics/registry.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/worker/prefill_core.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::worker_service {

struct PrefillServiceOptions {
  std::string worker_id;
  // Not owned; must outlive the service.
  worker::PrefillCore* core = nullptr;
  transfer::TransferEngine* transfer = nullptr;
  const kv::KvPools* pools = nullptr;
  absl::Duration transfer_timeout = absl::Seconds(30);
  // Metrics (null: none): swaserve_prefill_kv_sent_bytes_total,
  // swaserve_prefill_kv_sends_total{primitive="am|put",transport}.
  metrics::Registry* registry = nullptr;
};

class PrefillService final : public v1::Prefill::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<PrefillService>> Create(
      const PrefillServiceOptions& options);
  ~PrefillService() override;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request,
                                    v1::WorkerLoad* response) override;

  v1::WorkerLoad Load() const;

  struct Shared;

 private:
  explicit PrefillService(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

}  // namespace swaserve::worker_service
