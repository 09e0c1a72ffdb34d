// Proto <-> lib/worker conversions shared by the KV sender/receiver and the
// prefill and decode services. Free functions: thread-safe.
#pragma once

#include "absl/status/statusor.h"
#include "lib/model/sampling.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/output_constraint.h"
#include "lib/worker/prefill_core.h"
#include "lib/worker/stop_checker.h"
#include "lib/kv/page_pool.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::worker {

// SamplingParams → SamplingOptions (seed absent: `default_seed`).
// InvalidArgument naming the field for out-of-range values. A constraint is
// made by `constraints` (null: a constrained request is refused).
absl::StatusOr<model::SamplingOptions> ToSamplingOptions(
    const v1::SamplingParams& p, uint64_t default_seed,
    const ConstraintFactory* constraints = nullptr);
// SamplingParams → StopOptions; max_tokens 0 means `default_max_tokens`.
absl::StatusOr<StopOptions> ToStopOptions(const v1::SamplingParams& p, int default_max_tokens,
                                          int max_max_tokens, std::vector<uint32_t> eos_ids);
// MultimodalItem (content_hash, token_offset, num_tokens, embeddings
// [num_tokens, hidden_size] DTYPE_F32 little-endian) → PrefillMultimodal.
// InvalidArgument naming the item and the field otherwise; PrefillCore's
// Submit checks placement against the prompt.
absl::StatusOr<PrefillMultimodal> ToPrefillMultimodal(const v1::MultimodalItem& item, int index,
                                                      int hidden_size);
v1::TokenLogprob ToProto(const model::SampledToken& t);
model::SampledToken FromProto(const v1::TokenLogprob& p);
v1::FinishReason ToProto(FinishReason r);

// A load report with id, role, the pools' free/total pages and the time set
// (the caller adds queue and batch figures).
v1::WorkerLoad PoolLoad(const std::string& worker_id, v1::Role role, const kv::KvPools& pools);

}  // namespace swaserve::worker
