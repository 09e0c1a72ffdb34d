#include "lib/api/rate_limiter.h"

#include <algorithm>

#include "absl/time/time.h"

namespace swaserve::api {

RateLimiter::RateLimiter(RateLimiterOptions options)
    : options_(options), clock_(options.clock != nullptr ? options.clock : base::Clock::Real()) {}

void RateLimiter::SetLimit(const std::string& tenant, RateLimit limit) {
  absl::MutexLock lock(&mu_);
  limits_[tenant] = limit;
}

RateLimit RateLimiter::LimitOf(absl::string_view tenant) const {
  auto it = limits_.find(tenant);
  return it == limits_.end() ? options_.defaults : it->second;
}

std::optional<double> RateLimiter::Take(Bucket& b, double per_minute, double amount,
                                        int64_t now_ns) {
  if (per_minute <= 0 || amount <= 0) return std::nullopt;
  const double rate = per_minute / 60e9;  // per nanosecond
  if (!b.started) {
    b.level = per_minute;  // a new tenant starts with a full minute
    b.at_ns = now_ns;
    b.started = true;
  }
  b.level = std::min(per_minute, b.level + rate * static_cast<double>(now_ns - b.at_ns));
  b.at_ns = now_ns;
  // A full bucket lets anything through (into debt); otherwise the amount
  // must be there.
  if (b.level >= amount || b.level >= per_minute) {
    b.level -= amount;
    return std::nullopt;
  }
  const double short_by = std::min(amount, per_minute) - b.level;
  return std::max(1e-3, short_by / rate * 1e-9);
}

std::optional<double> RateLimiter::TakeRequest(absl::string_view tenant) {
  const int64_t now = absl::ToUnixNanos(clock_->Now());
  absl::MutexLock lock(&mu_);
  const RateLimit l = LimitOf(tenant);
  if (l.requests_per_minute <= 0) return std::nullopt;
  return Take(state_[tenant].requests, l.requests_per_minute, 1, now);
}

std::optional<double> RateLimiter::TakeTokens(absl::string_view tenant, int64_t tokens) {
  const int64_t now = absl::ToUnixNanos(clock_->Now());
  absl::MutexLock lock(&mu_);
  const RateLimit l = LimitOf(tenant);
  if (l.tokens_per_minute <= 0) return std::nullopt;
  return Take(state_[tenant].tokens, l.tokens_per_minute, static_cast<double>(tokens), now);
}

}  // namespace swaserve::api
