// CallerPolicy: what the router's services make of an authenticated API key
// (router::Caller): its tenant's prefix-cache domain, priority floor and
// rate limits (api::TenantMap, api::RateLimiter).
//
// Admit() runs when a request arrives: it takes one from the tenant's
// request bucket (refused: ResourceExhausted with ErrorDetail.retry_after_ms,
// which the HTTP API sends as 429 with Retry-After and gRPC as
// RESOURCE_EXHAUSTED) and returns the Caller, whose admit_tokens takes
// prompt + max_tokens from the token bucket once the router has tokenized
// the prompt.
//
// Ownership: borrows the TenantMap (may be null: every key a tenant of its
// own); the rate limiter is shared with the Callers it makes, so a request
// may outlive the policy.
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/api/rate_limiter.h"
#include "lib/api/tenants.h"
#include "lib/router/router.h"

namespace swaserve::router {

struct CallerPolicyOptions {
  // Not owned; null: every key a tenant of its own, no per-tenant settings.
  const api::TenantMap* tenants = nullptr;
  // Limits of a tenant the tenants file does not limit. Default: none.
  api::RateLimit default_limit;
  // The priority floor of a tenant the file gives none: a keyed caller may
  // not ask to be served before ordinary requests (priority 0) unless its
  // tenant's line allows it. Default 0.
  int32_t default_min_priority = 0;
  // For the rate limiter; nullptr: the real clock. Not owned.
  base::Clock* clock = nullptr;
};

class CallerPolicy {
 public:
  explicit CallerPolicy(CallerPolicyOptions options);

  // The Caller of an authenticated key (its ApiKeyStore name), or the
  // request-rate refusal.
  absl::StatusOr<Caller> Admit(absl::string_view key_name);

 private:
  const CallerPolicyOptions options_;
  std::shared_ptr<api::RateLimiter> limiter_;
};

}  // namespace swaserve::router
