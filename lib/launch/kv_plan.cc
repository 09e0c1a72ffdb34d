#include "lib/launch/kv_plan.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "lib/model/config.h"
#include "lib/worker/worker_options.h"

namespace swaserve::launch {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Tokens the full pool of a `mib` MiB budget holds.
absl::StatusOr<int64_t> Holds(const KvPlanOptions& o, int64_t mib) {
  absl::StatusOr<kv::PoolSizes> sizes = kv::SizePools(o.shape, mib * kMiB, o.swa_full_ratio);
  if (!sizes.ok()) return sizes.status();
  return sizes->full_pages * o.shape.page_size;
}

// max(min_mib, the least MiB holding `tokens`), or `set` when > 0, and what
// it holds.
absl::Status Fit(const KvPlanOptions& o, int64_t tokens, int64_t set, int64_t* mib,
                 int64_t* holds) {
  *mib = set > 0 ? set : o.min_mib;
  if (o.fit_buckets && set <= 0) {
    absl::StatusOr<int64_t> need =
        kv::MinBudgetForFullTokens(o.shape, tokens, o.swa_full_ratio, o.swa_tokens);
    if (!need.ok()) return need.status();
    *mib = std::max(*mib, *need / kMiB);
  }
  absl::StatusOr<int64_t> h = Holds(o, *mib);
  if (!h.ok()) return h.status();
  *holds = *h;
  return absl::OkStatus();
}

// An explicit pool flag's MiB among `flags`, 0 when absent.
int64_t MibFlag(absl::Span<const std::string> flags, const std::string& key) {
  return static_cast<int64_t>(FlagValueOr(flags, key, 0));
}

}  // namespace

absl::StatusOr<KvPlan> PlanKvPools(const KvPlanOptions& options) {
  if (options.bucket_bounds.empty()) return absl::InvalidArgumentError("no buckets");
  if (options.min_mib < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_mib must be >= 1, got ", options.min_mib));
  }
  KvPlan plan;
  for (int64_t hi : options.bucket_bounds) {
    int64_t mib = 0, holds = 0;
    if (absl::Status s = Fit(options, hi, options.prefill_mib_set, &mib, &holds); !s.ok()) {
      return s;
    }
    plan.prefill_mib.push_back(mib);
    plan.prefill_tokens.push_back(holds);
    plan.prefill_l2_mib.push_back(static_cast<int64_t>(options.l2_ratio * mib));
  }
  const int64_t largest =
      *std::max_element(options.bucket_bounds.begin(), options.bucket_bounds.end());
  if (absl::Status s = Fit(options, largest + kDecodeHeadroomTokens, options.decode_mib_set,
                           &plan.decode_mib, &plan.decode_tokens);
      !s.ok()) {
    return s;
  }
  return plan;
}

std::string KvPlan::Describe(int decode_workers) const {
  std::string out;
  for (size_t i = 0; i < prefill_mib.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", "prefill-", i, " ", prefill_mib[i], " MiB (",
                    prefill_tokens[i], " tokens)");
    if (i < prefill_l2_mib.size() && prefill_l2_mib[i] > 0) {
      absl::StrAppend(&out, " + L2 ", prefill_l2_mib[i], " MiB");
    }
  }
  absl::StrAppend(&out, ", decode ", decode_workers > 1 ? absl::StrCat(decode_workers, " x ") : "",
                  decode_mib, " MiB (", decode_tokens, " tokens)");
  return out;
}

int64_t KvPlan::TotalMib(int decode_workers) const {
  int64_t total = int64_t{decode_workers} * decode_mib;
  for (int64_t m : prefill_mib) total += m;
  for (int64_t m : prefill_l2_mib) total += m;
  return total;
}

absl::StatusOr<KvPlan> PlanKvPoolsForModel(const std::string& model_dir,
                                           absl::Span<const int64_t> bucket_bounds,
                                           int64_t min_mib, bool fit_buckets,
                                           absl::Span<const std::string> prefill_flags,
                                           absl::Span<const std::string> decode_flags) {
  absl::StatusOr<model::ModelConfig> config = model::ModelConfig::Load(model_dir);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: ", model_dir, ": ", config.status().message()));
  }
  const worker::WorkerOptions defaults;
  auto plan_for = [&](absl::Span<const std::string> flags) -> absl::StatusOr<KvPlan> {
    worker::WorkerOptions o = defaults;
    o.page_size = static_cast<int64_t>(
        FlagValueOr(flags, "kv.page_size", static_cast<double>(defaults.page_size)));
    o.chunk_tokens = static_cast<int64_t>(
        FlagValueOr(flags, "prefill.chunk_tokens", static_cast<double>(defaults.chunk_tokens)));
    if (o.page_size < 1 || o.chunk_tokens < 1) {
      return absl::InvalidArgumentError("kv.page_size and prefill.chunk_tokens must be >= 1");
    }
    const kv::KvShape shape = config->KvShape(static_cast<int>(o.page_size));
    return PlanKvPools({.shape = shape,
                        .swa_full_ratio =
                            FlagValueOr(flags, "kv.swa_full_ratio", defaults.swa_full_ratio),
                        .bucket_bounds = {bucket_bounds.begin(), bucket_bounds.end()},
                        .swa_tokens = worker::PrefillSwaWorkingTokens(o, shape),
                        .min_mib = min_mib,
                        .fit_buckets = fit_buckets,
                        .prefill_mib_set = MibFlag(flags, "kv.prefill_mib"),
                        .decode_mib_set = MibFlag(flags, "kv.decode_mib"),
                        .l2_ratio = FlagValueOr(flags, "kv.l2_ratio", defaults.l2_ratio)});
  };
  absl::StatusOr<KvPlan> plan = plan_for(prefill_flags);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<KvPlan> decode = plan_for(decode_flags);
  if (!decode.ok()) return decode.status();
  plan->decode_mib = decode->decode_mib;
  plan->decode_tokens = decode->decode_tokens;
  return plan;
}

double FlagValueOr(absl::Span<const std::string> flags, const std::string& key,
                   double fallback) {
  const std::string prefix = absl::StrCat("--", key, "=");
  double value = fallback;
  for (const std::string& f : flags) {
    double v = 0;
    if (absl::StartsWith(f, prefix) && absl::SimpleAtod(f.substr(prefix.size()), &v)) value = v;
  }
  return value;
}

}  // namespace swaserve::launch
