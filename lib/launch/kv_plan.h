// KvPlan: the KV pool each worker of a `swaserve up` cluster gets, so that
// every length bucket the cluster advertises can really be served.
//
// A prefill worker of bucket [lo, hi) must hold one prompt of hi tokens in
// its full pool (the worker refuses to start otherwise:
// worker::CheckPrefillPoolHoldsBucket), and a decode worker must hold one
// prompt of the largest bucket plus the tokens it generates (else the router
// answers 413 for it). One fixed size for every worker (the old
// `kv_mib`, 256 MiB) held 65,792 tokens of the demo model: every prompt of the
// 64K–256K and 256K–1M buckets was refused. So each worker gets
//   max(kv_mib, kv::MinBudgetForFullTokens(its largest prompt))
// with the model's KV shape and the workers' --kv.page_size and
// --kv.swa_full_ratio, the SWA pool holding at least a prefill step's
// working set (a chunk after its window). Pool memory is committed as pages are used (a worker
// with a 4 GiB pool and short prompts stays small), so sizing for the
// bucket's top costs memory only when such a prompt comes.
//
// Plain functions and values; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"

namespace swaserve::launch {

// Tokens a decode worker's pool holds beyond the largest prompt: what its
// longest request may generate before it must be preempted.
inline constexpr int64_t kDecodeHeadroomTokens = 8192;

struct KvPlanOptions {
  // The model's KV shape at the workers' page size.
  kv::KvShape shape;
  // The workers' --kv.swa_full_ratio. Default: the worker default.
  double swa_full_ratio = 0.25;
  // Exclusive upper bounds of the buckets (ClusterSpec::bucket_bounds).
  std::vector<int64_t> bucket_bounds;
  // SWA tokens a worker's step needs at once (worker::PrefillSwaWorkingTokens:
  // a prefill chunk after its window); every pool holds at least these.
  int64_t swa_tokens = 0;
  // The least pool any worker gets (MiB; ClusterSpec::kv_mib).
  int64_t min_mib = 256;
  // false: every worker gets min_mib (the old behaviour; the prefill
  // workers of buckets it cannot hold then refuse to start).
  bool fit_buckets = true;
  // > 0: the pool an explicit --kv.prefill_mib / --kv.decode_mib among the
  // workers' extra flags sets (it follows the plan's flag on the command
  // line, so it wins): the plan reports that pool, not the fitted one.
  int64_t prefill_mib_set = 0;
  int64_t decode_mib_set = 0;
  // The prefill workers' --kv.l2_ratio: each also holds an L2 tier of this
  // many times its pool's bytes (host memory that fills as the cache
  // demotes; 0: none). Counted in KvPlan::TotalMib, not fitted.
  double l2_ratio = 0;
};

struct KvPlan {
  std::vector<int64_t> prefill_mib;     // per bucket
  std::vector<int64_t> prefill_tokens;  // tokens each one's full pool holds
  std::vector<int64_t> prefill_l2_mib;  // per bucket: its L2 tier (0: none)
  int64_t decode_mib = 0;
  int64_t decode_tokens = 0;
  // "prefill-0 256 MiB (65,792 tokens) + L2 512 MiB, ..., decode 4,160 MiB
  // (...)".
  std::string Describe(int decode_workers) const;
  // Every pool's MiB added up, the prefill workers' L2 tiers included
  // (prefill workers + decode_workers decode workers): the memory the
  // workers' KV takes once the caches have filled and a prompt at the top
  // of every bucket is in flight.
  int64_t TotalMib(int decode_workers) const;
};

// InvalidArgument for no buckets, min_mib < 1 or a bad shape / ratio.
absl::StatusOr<KvPlan> PlanKvPools(const KvPlanOptions& options);

// The plan for the checkpoint in `model_dir` (its config.json's KV shape),
// for prefill and decode workers started with `prefill_flags` and
// `decode_flags` (their --kv.page_size, --kv.swa_full_ratio,
// --prefill.chunk_tokens, --kv.l2_ratio and --kv.prefill_mib /
// --kv.decode_mib; the worker defaults where absent): what
// `swaserve up` gives its workers and `swaserve kv-plan` prints.
// InvalidArgument for an unreadable config or PlanKvPools' errors.
absl::StatusOr<KvPlan> PlanKvPoolsForModel(const std::string& model_dir,
                                           absl::Span<const int64_t> bucket_bounds,
                                           int64_t min_mib, bool fit_buckets,
                                           absl::Span<const std::string> prefill_flags,
                                           absl::Span<const std::string> decode_flags);

// The value of `--<key>=V` in `flags` (the last one wins, as for the
// workers' own flag parsing), or `fallback`.
double FlagValueOr(absl::Span<const std::string> flags, const std::string& key,
                   double fallback);

}  // namespace swaserve::launch
