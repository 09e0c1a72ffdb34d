#include "lib/worker/local_ship.h"

#include <memory>

#include "lib/transfer/kv_destination.h"

namespace swaserve::worker {

ShipFn MakeLocalShip(DecodeCore* decode, const kv::KvPools* prefill_pools,
                     LocalDecodeParams params) {
  auto p = std::make_shared<LocalDecodeParams>(std::move(params));
  return [decode, prefill_pools, p](const kv::Sequence& seq, const PrefillResult& result,
                                    std::function<void(absl::Status)> shipped) {
    absl::StatusOr<std::unique_ptr<KvStaging>> staging = KvStaging::Create(
        StagedKvLayout::For(prefill_pools->shape(), static_cast<int>(p->prompt.size()),
                            transfer::FirstSwaToken(prefill_pools->shape(),
                                                    static_cast<int>(p->prompt.size()),
                                                    p->mtp_lookback)));
    if (!staging.ok()) return shipped(staging.status());
    absl::Status st = CopySequenceToStaging(seq, *prefill_pools, staging->get());
    if (!st.ok()) return shipped(st);
    DecodeJob job;
    job.id = p->id;
    job.prompt = p->prompt;
    job.sampling = p->sampling;
    job.stop = p->stop;
    job.first_token = result.first_token;
    job.tail_hidden = result.tail_hidden;
    job.staging = std::move(*staging);
    job.cached_tokens = result.cached_tokens;
    job.sink = p->sink;
    shipped(decode->Submit(std::move(job)));
  };
}

}  // namespace swaserve::worker
