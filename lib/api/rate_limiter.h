// Per-tenant rate limits: requests per minute and tokens per minute, as
// token buckets that hold at most one minute's allowance and refill
// continuously.
//
// A request takes one from its tenant's request bucket when it arrives
// (TakeRequest) and, once its prompt is tokenized, prompt tokens + max_tokens
// from the token bucket (TakeTokens; OpenAI counts its TPM limit the same
// way). A take that finds the bucket short is refused with the seconds until
// it would succeed (the client's Retry-After) and takes nothing, except that
// a take larger than the whole bucket passes when the bucket is full and
// leaves it in debt, so a prompt bigger than a minute's allowance is slowed,
// never refused forever.
//
// Limits per tenant: RateLimitOptions' defaults, overridden per tenant
// (SetLimit, e.g. from the tenants file). 0 = unlimited.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/clock.h"

namespace swaserve::api {

struct RateLimit {
  // 0: unlimited.
  double requests_per_minute = 0;
  double tokens_per_minute = 0;
};

struct RateLimiterOptions {
  // The limit of a tenant without a limit of its own. Default: unlimited.
  RateLimit defaults;
  // Time source; nullptr: base::Clock::Real(). Not owned.
  base::Clock* clock = nullptr;
};

class RateLimiter {
 public:
  explicit RateLimiter(RateLimiterOptions options = {});

  // `tenant`'s own limit (replacing the defaults for it).
  void SetLimit(const std::string& tenant, RateLimit limit);

  // nullopt: taken. Else the seconds to wait before retrying (> 0).
  std::optional<double> TakeRequest(absl::string_view tenant);
  std::optional<double> TakeTokens(absl::string_view tenant, int64_t tokens);

 private:
  struct Bucket {
    double level = 0;  // what is left; negative: debt
    int64_t at_ns = 0;
    bool started = false;
  };
  struct State {
    Bucket requests;
    Bucket tokens;
  };
  std::optional<double> Take(Bucket& b, double per_minute, double amount, int64_t now_ns);
  RateLimit LimitOf(absl::string_view tenant) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const RateLimiterOptions options_;
  base::Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, RateLimit> limits_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, State> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace swaserve::api
