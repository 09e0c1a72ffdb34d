#include "lib/router/caller_policy.h"

#include "gtest/gtest.h"
#include "lib/rpc/status_conversion.h"

namespace swaserve::router {
namespace {

TEST(CallerPolicyTest, TenantsDomainsFloorsAndLimits) {
  absl::StatusOr<api::TenantMap> map = api::TenantMap::Parse(R"(
    tenant acme: a1 a2
    tenant vip: v1
    limit acme: requests_per_minute=2 tokens_per_minute=600
    priority vip: -5
  )");
  ASSERT_TRUE(map.ok()) << map.status();
  base::FakeClock clock;
  CallerPolicy policy({.tenants = &*map,
                       .default_limit = {.requests_per_minute = 100},
                       .default_min_priority = 0,
                       .clock = &clock});
  absl::StatusOr<Caller> a1 = policy.Admit("a1");
  ASSERT_TRUE(a1.ok()) << a1.status();
  EXPECT_EQ(a1->cache_domain, "tenant:acme");
  EXPECT_EQ(a1->min_priority, 0);
  // The tenant's two keys share its request bucket (2 a minute).
  ASSERT_TRUE(policy.Admit("a2").ok());
  absl::StatusOr<Caller> third = policy.Admit("a1");
  ASSERT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(third.status());
  ASSERT_TRUE(d.has_value());
  EXPECT_NEAR(d->retry_after_ms(), 30000, 1);
  // Tokens: 600 a minute; a 500-token request passes, the next waits.
  EXPECT_TRUE(a1->admit_tokens(500).ok());
  absl::Status tokens = a1->admit_tokens(200);
  EXPECT_TRUE(absl::IsResourceExhausted(tokens)) << tokens;
  EXPECT_NEAR(rpc::GetErrorDetail(tokens)->retry_after_ms(), 10000, 1);
  clock.Advance(absl::Seconds(10));
  EXPECT_TRUE(a1->admit_tokens(200).ok());
  // Another tenant: its own domain, its own floor, the default limits.
  absl::StatusOr<Caller> vip = policy.Admit("v1");
  ASSERT_TRUE(vip.ok());
  EXPECT_EQ(vip->cache_domain, "tenant:vip");
  EXPECT_EQ(vip->min_priority, -5);
  EXPECT_TRUE(vip->admit_tokens(1'000'000).ok());  // no token limit by default
  // A key in no tenant is a tenant of its own.
  absl::StatusOr<Caller> stray = policy.Admit("stray");
  ASSERT_TRUE(stray.ok());
  EXPECT_EQ(stray->cache_domain, "tenant:stray");
}

}  // namespace
}  // namespace swaserve::router
