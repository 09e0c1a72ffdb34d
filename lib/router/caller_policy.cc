#include "lib/router/caller_policy.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/router/router_request.h"

namespace swaserve::router {

CallerPolicy::CallerPolicy(CallerPolicyOptions options)
    : options_(options),
      limiter_(std::make_shared<api::RateLimiter>(
          api::RateLimiterOptions{.defaults = options.default_limit, .clock = options.clock})) {
  if (options_.tenants == nullptr) return;
  for (const std::string& tenant : options_.tenants->TenantNames()) {
    const api::TenantPolicy p = options_.tenants->PolicyOf(tenant);
    if (!p.requests_per_minute && !p.tokens_per_minute) continue;
    limiter_->SetLimit(tenant, {.requests_per_minute = p.requests_per_minute.value_or(
                                    options_.default_limit.requests_per_minute),
                                .tokens_per_minute = p.tokens_per_minute.value_or(
                                    options_.default_limit.tokens_per_minute)});
  }
}

absl::StatusOr<Caller> CallerPolicy::Admit(absl::string_view key_name) {
  const api::TenantMap none;
  const api::TenantMap& map = options_.tenants != nullptr ? *options_.tenants : none;
  const std::string tenant = map.TenantOf(key_name);
  if (std::optional<double> wait = limiter_->TakeRequest(tenant)) {
    return Overloaded(absl::StrCat("request rate limit of this API key's tenant reached; retry in ",
                                   std::ceil(*wait), " s"),
                      *wait);
  }
  Caller c;
  c.cache_domain = map.CacheDomainOf(key_name);
  c.min_priority = map.PolicyOf(tenant).min_priority.value_or(options_.default_min_priority);
  c.admit_tokens = [limiter = limiter_, tenant](int64_t tokens) -> absl::Status {
    if (std::optional<double> wait = limiter->TakeTokens(tenant, tokens)) {
      return Overloaded(absl::StrCat("token rate limit of this API key's tenant reached (",
                                     tokens, " tokens asked); retry in ", std::ceil(*wait), " s"),
                        *wait);
    }
    return absl::OkStatus();
  };
  return c;
}

}  // namespace swaserve::router
