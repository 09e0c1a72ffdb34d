// Header-only (it needs lib/kv and lib/sched, which bench_util does not
// link): the window-restore choice the prefill worker makes for a prompt,
// for the benches that replay a trace through a kv::PrefixCache
// (kv_trace_replay_bench, policy_sim).
#pragma once

#include <vector>

#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"
#include "lib/sched/prefill_scheduler.h"

namespace swaserve::bench {

struct RestorePlan {
  sched::WindowRestoreChoice choice;  // choice.restore: restore the window
  // The restore's work in token-equivalents (kv::WindowRestoreStretch::work:
  // the pyramid's, or M − compute_from without it); a restored hit is worth
  // M minus this. 0 without a full-KV match past the window-safe one.
  double work = 0;
};

// Matches `hashes` (up to mo->max_tokens) and, where the full-KV match M
// passes the window-safe hit L, plans the stretch
// (kv::PlanWindowRestoreStretch, no MTP layers) and chooses as the worker
// does, with its default least saving of 64 token-equivalents; a restore
// sets mo->full_kv (and lock_safe_window when it starts at L).
inline RestorePlan PlanWindowRestore(const kv::PrefixCache& cache,
                                     absl::Span<const uint64_t> hashes, const kv::KvShape& shape,
                                     const std::vector<bool>& swa_pattern, bool pyramid,
                                     bool from_window_safe, kv::MatchOptions* mo) {
  RestorePlan plan;
  const kv::MatchLengths ml = cache.Match(hashes, mo->max_tokens);
  if (ml.matched_tokens <= ml.safe_tokens) return plan;
  const kv::WindowRestoreStretch st =
      kv::PlanWindowRestoreStretch(ml.matched_tokens, ml.safe_tokens, shape.sliding_window,
                                   shape.page_size, swa_pattern, 0, pyramid, from_window_safe);
  plan.work = st.work;
  plan.choice = sched::ChooseWindowRestore({.window_safe_tokens = ml.safe_tokens,
                                            .full_tokens = ml.matched_tokens,
                                            .restore_from = st.from,
                                            .restore_tokens = st.work,
                                            .min_saved_work = 64});
  mo->full_kv = plan.choice.restore;
  mo->lock_safe_window = plan.choice.restore && st.from_window_safe;
  return plan;
}

}  // namespace swaserve::bench
