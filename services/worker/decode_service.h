// swaserve.v1.Decode: a thin gRPC front over lib/worker's KvReceiver (the
// KV hand-off: pending transfers, the staging budget and arena, the
// in-band commit; its header has the protocol) and DecodeCore (the
// batch), writing tokens through rpc::StreamWriter.
//
// Decode(request) stream: the request is checked (sampling, stop options,
// KvReceiver::Expect: a prompt that could never fit this worker fails now
// with RESOURCE_EXHAUSTED, ERROR_CODE_TOO_LARGE_FOR_WORKER), then the first
// message `accepted` goes out; no memory is held while the prefill leg
// queues and computes (the router keeps the stream open while that leg is
// alive). GetKvDestination(transfer id) is KvReceiver::GetDestination (its
// cancel: CancelDestination). When the commit arrives the job goes to the
// core; tokens stream back, the last chunk with finish reason and usage
// (cached_tokens and the prefill queue wait as the prefill worker reported
// them). A failed transfer ends the stream with its error
// (ERROR_CODE_TRANSFER_FAILED). A cancelled stream forgets the transfer
// (KvReceiver::Forget) and cancels the request in the core (a commit racing
// the cancel is cancelled in the core right after its submit).
// Draining (StartDraining, on SIGTERM): new Decode calls get UNAVAILABLE
// (ERROR_CODE_DRAINING, retryable); streams in progress continue until the
// server's drain deadline, after which the router migrates what is left.
//
// Thread-safe (gRPC callback API; reactors never block).
#pragma once

#include <memory>
#include <string>

#include "lib/base/request_defaults.h"
#include "lib/metrics/registry.h"
#include "lib/worker/output_constraint.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/kv_receiver.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::worker_service {

struct DecodeServiceOptions {
  std::string worker_id;
  // Not owned; must outlive the service.
  worker::DecodeCore* core = nullptr;
  worker::KvReceiver* receiver = nullptr;
  const kv::KvPools* pools = nullptr;  // for GetLoad
  // Compiles requests' output constraints; null: constrained requests are
  // refused (a checkpoint without a tokenizer).
  const worker::ConstraintFactory* constraints = nullptr;
  std::vector<uint32_t> eos_ids;
  // max_tokens of a request that sets 0, and the largest accepted.
  int default_max_tokens = base::kDefaultMaxTokens;
  int max_max_tokens = 1 << 20;
  // Metrics (null: none): swaserve_decode_ttft_seconds, _tpot_seconds,
  // _streams_total{result="ok|error|cancelled"} (the receiver exports the
  // staging and commit metrics).
  metrics::Registry* registry = nullptr;
};

class DecodeService final : public v1::Decode::CallbackService {
 public:
  // InvalidArgument without core, receiver or pools.
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

  struct Shared;

 private:
  explicit DecodeService(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  std::shared_ptr<Shared> shared_;
};

}  // namespace swaserve::worker_service
