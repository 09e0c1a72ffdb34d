// Proto <-> lib/worker conversions shared by the prefill and decode services.
#pragma once

#include "absl/status/statusor.h"
#include "lib/model/sampling.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/stop_checker.h"
#include "grpcpp/grpcpp.h"
#include "lib/kv/page_pool.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::worker_service {

// SamplingParams → SamplingOptions (seed absent: `default_seed`).
// InvalidArgument naming the field for out-of-range values.
absl::StatusOr<model::SamplingOptions> ToSamplingOptions(const v1::SamplingParams& p,
                                                         uint64_t default_seed);
// SamplingParams → StopOptions; max_tokens 0 means `default_max_tokens`.
absl::StatusOr<worker::StopOptions> ToStopOptions(const v1::SamplingParams& p,
                                                  int default_max_tokens, int max_max_tokens,
                                                  std::vector<uint32_t> eos_ids);
v1::TokenLogprob ToProto(const model::SampledToken& t);
model::SampledToken FromProto(const v1::TokenLogprob& p);
v1::FinishReason ToProto(worker::FinishReason r);

// A load report with id, role, the pools' free/total pages and the time set
// (the caller adds queue and batch figures).
v1::WorkerLoad PoolLoad(const std::string& worker_id, v1::Role role, const kv::KvPools& pools);

// Answers a GetLoad call with `load` (unary reactor, never blocks).
grpc::ServerUnaryReactor* FinishWithLoad(grpc::CallbackServerContext* context,
                                         v1::WorkerLoad load, v1::WorkerLoad* response);

}  // namespace swaserve::worker_service
