// Monolithic mode (--role=both): a ShipFn that hands a prefilled request to
// a DecodeCore in the same process through the same host staging the
// disaggregated path uses (copy pool pages → KvStaging → admission), so the
// two modes differ only in how the staged bytes arrive.
#pragma once

#include "lib/worker/decode_core.h"
#include "lib/worker/prefill_core.h"

namespace swaserve::worker {

// What the decode leg of a request needs besides the prefill result.
struct LocalDecodeParams {
  std::string id;
  std::vector<uint32_t> prompt;
  model::SamplingOptions sampling;  // the same options prefill sampled with
  StopOptions stop;
  TokenSink sink;
  // SWA tokens staged before the window for decode's MTP layers (the
  // model's MTP layer count; DecodeCoreOptions::mtp).
  int mtp_lookback = 0;
};

// `decode` and `prefill_pools` must outlive every ship made with the result.
ShipFn MakeLocalShip(DecodeCore* decode, const kv::KvPools* prefill_pools,
                     LocalDecodeParams params);

}  // namespace swaserve::worker
