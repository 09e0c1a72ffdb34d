#include "lib/api/rate_limiter.h"

#include "gtest/gtest.h"

namespace swaserve::api {
namespace {

TEST(RateLimiterTest, RequestsPerMinuteWithRetryAfter) {
  base::FakeClock clock;
  RateLimiter l({.defaults = {.requests_per_minute = 60}, .clock = &clock});
  for (int i = 0; i < 60; ++i) EXPECT_FALSE(l.TakeRequest("a").has_value()) << i;
  std::optional<double> wait = l.TakeRequest("a");
  ASSERT_TRUE(wait.has_value());
  EXPECT_NEAR(*wait, 1.0, 1e-6);  // one request a second comes back
  EXPECT_FALSE(l.TakeRequest("b").has_value());  // tenants have their own buckets
  clock.Advance(absl::Milliseconds(500));
  wait = l.TakeRequest("a");
  ASSERT_TRUE(wait.has_value());
  EXPECT_NEAR(*wait, 0.5, 1e-6);
  clock.Advance(absl::Milliseconds(500));
  EXPECT_FALSE(l.TakeRequest("a").has_value());
  // The bucket holds at most one minute's allowance.
  clock.Advance(absl::Hours(1));
  for (int i = 0; i < 60; ++i) EXPECT_FALSE(l.TakeRequest("a").has_value()) << i;
  EXPECT_TRUE(l.TakeRequest("a").has_value());
}

TEST(RateLimiterTest, TokensPerMinuteAndTenantOverrides) {
  base::FakeClock clock;
  RateLimiter l({.defaults = {.tokens_per_minute = 6000}, .clock = &clock});
  l.SetLimit("big", {.requests_per_minute = 0, .tokens_per_minute = 0});  // unlimited
  EXPECT_FALSE(l.TakeTokens("a", 5000).has_value());
  std::optional<double> wait = l.TakeTokens("a", 2000);
  ASSERT_TRUE(wait.has_value());
  EXPECT_NEAR(*wait, 10.0, 1e-6);  // 1,000 short at 100 tokens a second
  EXPECT_FALSE(l.TakeTokens("big", 1'000'000).has_value());
  EXPECT_FALSE(l.TakeRequest("a").has_value());  // no request limit by default
  // A take larger than a whole minute passes on a full bucket, into debt.
  EXPECT_FALSE(l.TakeTokens("c", 20000).has_value());
  wait = l.TakeTokens("c", 1);
  ASSERT_TRUE(wait.has_value());
  EXPECT_NEAR(*wait, 140.01, 1e-6);  // 14,001 tokens of debt and more at 100/s
  clock.Advance(absl::Seconds(141));
  EXPECT_FALSE(l.TakeTokens("c", 1).has_value());
}

}  // namespace
}  // namespace swaserve::api
