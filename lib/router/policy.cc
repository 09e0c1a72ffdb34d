#include "lib/router/policy.h"

#include <climits>

#include "lib/kv/sequence.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "lib/base/hash.h"

namespace swaserve::router {
namespace {

// Rendezvous weight of a worker for a tie-break key; 0 when no key (then
// ties go to the lower id).
uint64_t TieWeight(const std::string& id, uint64_t key) {
  if (key == 0) return 0;
  return base::Hash64(id.data(), id.size(), key);
}

// True when candidate a (weight wa) beats b (weight wb) on the final
// tie-break: higher rendezvous weight, then lower id.
bool TieBreakLess(const std::string& a, uint64_t wa, const std::string& b,
                  uint64_t wb) {
  if (wa != wb) return wa > wb;
  return a < b;
}

int64_t ClampCached(int64_t prompt_tokens, int64_t cached) {
  return std::clamp<int64_t>(cached, 0, prompt_tokens);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string_view ReasonName(Reason reason) {
  switch (reason) {
    case Reason::kCacheAffinity:
      return "cache_affinity";
    case Reason::kLeastLoad:
      return "least_load";
    case Reason::kHotspotGuard:
      return "hotspot_guard";
    case Reason::kOnlyCandidate:
      return "only_candidate";
    case Reason::kNoLoadReport:
      return "no_load_report";
    case Reason::kNoFreeKv:
      return "no_free_kv";
  }
  return "unknown";
}

int WindowPages(int sliding_window, int page_size) {
  if (sliding_window <= 1 || page_size <= 0) return 0;
  return (sliding_window - 1 + page_size - 1) / page_size;
}

int64_t PrefixCredit(const PrefixCreditInputs& in) {
  if (in.full_tokens <= 0) return 0;
  if (in.window_safe_tokens >= in.full_tokens || in.sliding_window <= 1) return in.full_tokens;
  const int64_t safe = std::max<int64_t>(0, in.window_safe_tokens);
  if (!in.window_restore || in.swa_chain_layers <= 0 || in.page_size <= 0 ||
      in.full_tokens > INT32_MAX) {
    return safe;
  }
  const int64_t stretch =
      in.full_tokens - kv::WindowRestoreStart(static_cast<int>(in.full_tokens), in.sliding_window,
                                              in.page_size, in.swa_chain_layers);
  const int64_t work = in.restore_work > 0 ? std::min(in.restore_work, stretch) : stretch;
  return std::max<int64_t>(safe, in.full_tokens - work);
}

int64_t WindowScanPages(const PrefixCreditInputs& worker, int64_t non_restoring_pages) {
  if (!worker.window_restore || worker.swa_chain_layers <= 0 || worker.page_size <= 0 ||
      worker.sliding_window <= 1) {
    return std::max<int64_t>(0, non_restoring_pages);
  }
  // M is page aligned, so M − WindowRestoreStart(M) = wp·page + reach (or
  // less where the start clamps at 0); an L below d − S with
  // S = wp + ceil(reach / page) − 1 has L·page <= M − (S + 1)·page <= the
  // restore start.
  const int64_t page = worker.page_size;
  if (worker.restore_work > 0) {
    // The credit is at least M − restore_work (less work where the stretch
    // clamps at 0), and an L below d − S with S = ceil(work / page) − 1 has
    // L·page <= M − (S + 1)·page <= M − work.
    return std::max<int64_t>(0, (worker.restore_work + page - 1) / page - 1);
  }
  const int64_t w1 = worker.sliding_window - 1;
  const int64_t reach = int64_t{worker.swa_chain_layers - 1} * w1;
  return std::max<int64_t>(0, (w1 + page - 1) / page + (reach + page - 1) / page - 1);
}

int64_t TieredCredit(int64_t credit, int64_t l1_tokens, double lower_tier_credit) {
  const int64_t lower = std::max<int64_t>(0, credit - std::max<int64_t>(0, l1_tokens));
  return credit - lower + static_cast<int64_t>(static_cast<double>(lower) * lower_tier_credit);
}

absl::Status ValidatePolicyOptions(const PolicyOptions& options) {
  if (!(options.lower_tier_credit >= 0 && options.lower_tier_credit <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lower_tier_credit = ", options.lower_tier_credit, ": must be in [0, 1]"));
  }
  if (options.bucket_bounds.empty()) {
    return absl::InvalidArgumentError("bucket_bounds: empty");
  }
  if (options.window_scan_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("window_scan_pages = ", options.window_scan_pages, ": must be >= 0"));
  }
  int64_t prev = 0;
  for (size_t i = 0; i < options.bucket_bounds.size(); ++i) {
    const int64_t b = options.bucket_bounds[i];
    if (b <= prev) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket_bounds[", i, "] = ", b,
                       ": bounds must be > 0 and strictly increasing"));
    }
    prev = b;
  }
  if (!(options.cache_credit >= 0) || !std::isfinite(options.cache_credit)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache_credit = ", options.cache_credit, ": must be finite and >= 0"));
  }
  if (options.hotspot_abs_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hotspot_abs_tokens = ", options.hotspot_abs_tokens, ": must be >= 0"));
  }
  if (!(options.hotspot_rel >= 1) || std::isnan(options.hotspot_rel)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hotspot_rel = ", options.hotspot_rel, ": must be >= 1"));
  }
  if (options.page_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size = ", options.page_size, ": must be > 0"));
  }
  if (options.decode_sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode_sliding_window = ", options.decode_sliding_window,
                     ": must be >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> BucketFor(int64_t prompt_tokens,
                              const PolicyOptions& options) {
  if (absl::Status s = ValidatePolicyOptions(options); !s.ok()) return s;
  if (prompt_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_tokens = ", prompt_tokens, ": must be >= 0"));
  }
  const auto& bounds = options.bucket_bounds;
  const auto it = std::upper_bound(bounds.begin(), bounds.end(), prompt_tokens);
  if (it == bounds.end()) {
    return absl::OutOfRangeError(
        absl::StrCat("prompt of ", prompt_tokens,
                     " tokens exceeds the largest length bucket (< ",
                     bounds.back(), " tokens)"));
  }
  return static_cast<int>(it - bounds.begin());
}

double PrefillCost(int64_t prompt_tokens, const PrefillCandidate& candidate,
                   const PolicyOptions& options) {
  const int64_t cached = ClampCached(prompt_tokens, candidate.cached_tokens);
  return static_cast<double>(
             std::max<int64_t>(candidate.queued_uncached_tokens, 0)) +
         static_cast<double>(prompt_tokens) -
         options.cache_credit * static_cast<double>(cached);
}

absl::StatusOr<Decision> ChoosePrefill(
    int64_t prompt_tokens, absl::Span<const PrefillCandidate> candidates,
    const PolicyOptions& options, uint64_t tie_break_key) {
  if (absl::Status s = ValidatePolicyOptions(options); !s.ok()) return s;
  if (prompt_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_tokens = ", prompt_tokens, ": must be > 0"));
  }
  const int n = static_cast<int>(candidates.size());
  std::vector<uint64_t> weight(n);
  for (int i = 0; i < n; ++i) {
    weight[i] = TieWeight(candidates[i].id, tie_break_key);
  }
  auto requests = [&](int i) {
    return static_cast<int64_t>(candidates[i].running_requests) +
           candidates[i].queued_requests;
  };
  auto cached = [&](int i) {
    return ClampCached(prompt_tokens, candidates[i].cached_tokens);
  };
  auto queued = [&](int i) {
    return std::max<int64_t>(candidates[i].queued_uncached_tokens, 0);
  };
  // Final tie-breaks shared by every ordering below.
  auto tie_less = [&](int a, int b) {
    if (requests(a) != requests(b)) return requests(a) < requests(b);
    return TieBreakLess(candidates[a].id, weight[a], candidates[b].id,
                        weight[b]);
  };

  int eligible = 0;
  int best = -1;
  int no_report_best = -1;
  for (int i = 0; i < n; ++i) {
    const PrefillCandidate& c = candidates[i];
    if (!c.healthy) continue;
    if (!c.has_load) {
      if (no_report_best < 0 || cached(i) > cached(no_report_best) ||
          (cached(i) == cached(no_report_best) &&
           TieBreakLess(c.id, weight[i], candidates[no_report_best].id,
                        weight[no_report_best]))) {
        no_report_best = i;
      }
      continue;
    }
    ++eligible;
    if (best < 0) {
      best = i;
      continue;
    }
    const double ci = PrefillCost(prompt_tokens, c, options);
    const double cb = PrefillCost(prompt_tokens, candidates[best], options);
    if (ci < cb || (ci == cb && tie_less(i, best))) best = i;
  }
  if (best < 0) {
    if (no_report_best < 0) {
      return absl::UnavailableError(
          absl::StrCat("no healthy prefill worker among ", n, " candidates"));
    }
    return Decision{no_report_best, Reason::kNoLoadReport,
                    cached(no_report_best)};
  }
  if (eligible == 1) {
    return Decision{best, Reason::kOnlyCandidate, cached(best)};
  }
  // The least-loaded eligible candidate and the least cached one.
  int least = -1;
  int64_t min_cached = cached(best);
  for (int i = 0; i < n; ++i) {
    if (!candidates[i].healthy || !candidates[i].has_load) continue;
    min_cached = std::min(min_cached, cached(i));
    if (least < 0 || queued(i) < queued(least)) {
      least = i;
      continue;
    }
    if (queued(i) == queued(least)) {
      const double ci = PrefillCost(prompt_tokens, candidates[i], options);
      const double cl = PrefillCost(prompt_tokens, candidates[least], options);
      if (ci < cl || (ci == cl && tie_less(i, least))) least = i;
    }
  }
  const int64_t qb = queued(best);
  const int64_t ql = queued(least);
  if (qb - ql > options.hotspot_abs_tokens &&
      static_cast<double>(qb) > options.hotspot_rel * static_cast<double>(ql)) {
    return Decision{least, Reason::kHotspotGuard, cached(least)};
  }
  return Decision{
      best,
      cached(best) > min_cached ? Reason::kCacheAffinity : Reason::kLeastLoad,
      cached(best)};
}

absl::StatusOr<Decision> ChooseDecode(
    int64_t prompt_tokens, int64_t max_tokens,
    absl::Span<const DecodeCandidate> candidates, const PolicyOptions& options,
    uint64_t tie_break_key) {
  if (absl::Status s = ValidatePolicyOptions(options); !s.ok()) return s;
  if (prompt_tokens <= 0 || max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_tokens = ", prompt_tokens, ", max_tokens = ", max_tokens,
        ": need prompt_tokens > 0, max_tokens >= 0"));
  }
  const int64_t total = prompt_tokens + max_tokens;
  const int64_t need_full = CeilDiv(total, options.page_size);
  const int64_t need_swa =
      CeilDiv(std::min<int64_t>(total, int64_t{options.decode_sliding_window} +
                                           options.page_size),
              options.page_size);
  const int n = static_cast<int>(candidates.size());
  std::vector<uint64_t> weight(n);
  for (int i = 0; i < n; ++i) {
    weight[i] = TieWeight(candidates[i].id, tie_break_key);
  }
  auto tier = [&](const DecodeCandidate& c) {
    if (c.free_full_pages < need_full || c.free_swa_pages < need_swa) return 2;
    if (c.max_running_requests > 0 &&
        int64_t{c.running_requests} + c.staged_requests >=
            c.max_running_requests) {
      return 1;
    }
    return 0;
  };
  auto free_fraction = [](const DecodeCandidate& c) {
    return c.total_full_pages > 0 ? static_cast<double>(c.free_full_pages) /
                                        static_cast<double>(c.total_full_pages)
                                  : 0.0;
  };
  auto less = [&](int a, int b) {
    const DecodeCandidate& ca = candidates[a];
    const DecodeCandidate& cb = candidates[b];
    const int ta = tier(ca), tb = tier(cb);
    if (ta != tb) return ta < tb;
    const int64_t qa = int64_t{ca.running_requests} + ca.staged_requests;
    const int64_t qb = int64_t{cb.running_requests} + cb.staged_requests;
    if (qa != qb) return qa < qb;
    const double fa = free_fraction(ca), fb = free_fraction(cb);
    if (fa != fb) return fa > fb;
    return TieBreakLess(ca.id, weight[a], cb.id, weight[b]);
  };
  int eligible = 0;
  int best = -1;
  int no_report_best = -1;
  for (int i = 0; i < n; ++i) {
    const DecodeCandidate& c = candidates[i];
    if (!c.healthy) continue;
    if (!c.has_load) {
      if (no_report_best < 0 ||
          TieBreakLess(c.id, weight[i], candidates[no_report_best].id,
                       weight[no_report_best])) {
        no_report_best = i;
      }
      continue;
    }
    ++eligible;
    if (best < 0 || less(i, best)) best = i;
  }
  if (best < 0) {
    if (no_report_best < 0) {
      return absl::UnavailableError(
          absl::StrCat("no healthy decode worker among ", n, " candidates"));
    }
    return Decision{no_report_best, Reason::kNoLoadReport, 0};
  }
  if (eligible == 1) return Decision{best, Reason::kOnlyCandidate, 0};
  return Decision{
      best,
      tier(candidates[best]) == 0 ? Reason::kLeastLoad : Reason::kNoFreeKv, 0};
}

std::optional<double> ShedRetryAfterSeconds(absl::Span<const PrefillCandidate> candidates,
                                            double max_backlog_seconds,
                                            double min_retry_seconds) {
  if (!(max_backlog_seconds > 0)) return std::nullopt;
  double least = -1;
  for (const PrefillCandidate& c : candidates) {
    if (!c.healthy || !c.has_load) continue;
    if (!(c.tokens_per_second > 0)) return std::nullopt;  // unmeasured: admit
    const double backlog =
        static_cast<double>(std::max<int64_t>(c.queued_uncached_tokens, 0)) / c.tokens_per_second;
    if (backlog <= max_backlog_seconds) return std::nullopt;
    least = least < 0 ? backlog : std::min(least, backlog);
  }
  if (least < 0) return std::nullopt;
  return std::max(least - max_backlog_seconds, min_retry_seconds);
}

}  // namespace swaserve::router
