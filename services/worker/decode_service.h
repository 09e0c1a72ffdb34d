// swaserve.v1.Decode over a DecodeCore and a UCX TransferEngine
// (ARCHITECTURE §4 steps 2 and 4).
//
// Decode(request) stream:
//   1. allocates the request's KV staging in host memory (full KV for every
//      prompt token + SWA KV for the last window), registers it with UCX and
//      announces the transfer; the first response carries the KvDestination;
//   2. the prefill worker writes the KV and commits over UCX (the commit
//      payload is a CommitKvRequest: first token, last hidden state, cached
//      tokens); the staged request then goes to the DecodeCore, which admits
//      it when pool pages free up;
//   3. generated tokens stream back, the last chunk with finish reason and
//      usage.
// No commit within commit_timeout → the stream ends with DEADLINE_EXCEEDED
// (ERROR_CODE_TRANSFER_FAILED) and the staging is freed. A cancelled stream
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
  metrics::Registry* registry = nullptr;
};

class DecodeService final : public v1::Decode::CallbackService {
 public:
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

  struct Shared;

 private:
  explicit DecodeService(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

}  // namespace swaserve::worker_service
