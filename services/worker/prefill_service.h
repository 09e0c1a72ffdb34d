// swaserve.v1.Prefill: a thin gRPC front over lib/worker's PrefillCore (prefix
// match, compute-aware scheduling, chunked prefill; docs/architecture.md#request-path step 3)
// and KvSender (the KV hand-off; its header has the protocol and the error
// taxonomy of a failed ship).
//
// Prefill(request): queues the prompt in the core for as long as the call's
// deadline allows; once the first token is sampled the sender asks the
// decode target for its staging (a Decode.GetKvDestination call made here)
// and ships the KV with the commit over UCX; answers when the decode worker
// acknowledged the commit. Without a decode target it only warms the prefix
// cache. When the KV cannot be shipped the prompt's pages still go into the
// prefix cache (PrefillCore), and the error names the decode worker, so the
// router retries that leg elsewhere and the retry here is a prefix hit.
// Errors follow the router's taxonomy: request errors (prompt beyond this
// worker's bucket or pools, invalid input) carry a non-retryable
// ErrorDetail; a draining worker answers UNAVAILABLE (ERROR_CODE_DRAINING).
// A cancelled call stops the work and frees its memory.
//
// Thread-safe (gRPC callback API; reactors never block).
#pragma once

#include <memory>
#include <string>

#include "lib/worker/output_constraint.h"
#include "lib/worker/kv_sender.h"
#include "lib/worker/prefill_core.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::worker_service {

struct PrefillServiceOptions {
  std::string worker_id;
  // Not owned; must outlive the service.
  worker::PrefillCore* core = nullptr;
  const worker::KvSender* sender = nullptr;
  const kv::KvPools* pools = nullptr;  // for GetLoad
  // Compiles requests' output constraints; null: constrained requests are
  // refused (a checkpoint without a tokenizer).
  const worker::ConstraintFactory* constraints = nullptr;
  // The model's hidden size: multimodal embeddings must have it.
  int hidden_size = 0;
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
  grpc::ServerUnaryReactor* GetProgress(grpc::CallbackServerContext* context,
                                        const v1::GetPrefillProgressRequest* request,
                                        v1::PrefillProgress* response) override;

  v1::WorkerLoad Load() const;

  // Refuses new Prefill calls (UNAVAILABLE, ERROR_CODE_DRAINING) from now
  // on; calls in progress finish (SIGTERM).
  void StartDraining();

  struct Shared;

 private:
  explicit PrefillService(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

}  // namespace swaserve::worker_service
