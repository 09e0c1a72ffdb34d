#include "lib/api/tenants.h"

#include "gtest/gtest.h"

namespace swaserve::api {
namespace {

TEST(TenantMapTest, KeysTenantsAndShareGroups) {
  absl::StatusOr<TenantMap> m = TenantMap::Parse(R"(
    # two tenants, one of them with two keys
    tenant acme: acme-prod acme-ci
    tenant globex: globex
    tenant initech: initech-1
    share public-demo: acme initech
  )");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tenants(), 3);
  EXPECT_EQ(m->TenantOf("acme-ci"), "acme");
  EXPECT_EQ(m->CacheDomainOf("acme-prod"), m->CacheDomainOf("acme-ci"));
  EXPECT_EQ(m->CacheDomainOf("acme-prod"), "share:public-demo");
  EXPECT_EQ(m->CacheDomainOf("initech-1"), "share:public-demo");
  EXPECT_EQ(m->CacheDomainOf("globex"), "tenant:globex");
  // A key in no tenant is a tenant of its own.
  EXPECT_EQ(m->TenantOf("stray"), "stray");
  EXPECT_EQ(m->CacheDomainOf("stray"), "tenant:stray");
  EXPECT_NE(m->CacheDomainOf("stray"), m->CacheDomainOf("globex"));
  // No key (the router runs without keys): the anonymous domain.
  EXPECT_EQ(m->CacheDomainOf(""), "");
  EXPECT_EQ(TenantMap().CacheDomainOf("k"), "tenant:k");
  EXPECT_EQ(m->TenantNames(), std::vector<std::string>({"acme", "globex", "initech"}));
}

TEST(TenantMapTest, LimitsAndPriorityFloors) {
  absl::StatusOr<TenantMap> m = TenantMap::Parse(R"(
    tenant acme: a1
    tenant globex: g1
    limit acme: requests_per_minute=600 tokens_per_minute=2000000
    priority acme: -10
    limit globex: tokens_per_minute=0
  )");
  ASSERT_TRUE(m.ok()) << m.status();
  const TenantPolicy a = m->PolicyOf("acme");
  EXPECT_EQ(a.requests_per_minute, 600);
  EXPECT_EQ(a.tokens_per_minute, 2000000);
  EXPECT_EQ(a.min_priority, -10);
  const TenantPolicy g = m->PolicyOf("globex");
  EXPECT_FALSE(g.requests_per_minute.has_value());
  EXPECT_EQ(g.tokens_per_minute, 0);
  EXPECT_FALSE(g.min_priority.has_value());
  EXPECT_FALSE(m->PolicyOf("stray").tokens_per_minute.has_value());
  for (const char* bad : {"tenant a: k\nlimit b: requests_per_minute=1",
                          "tenant a: k\nlimit a: requests_per_hour=1",
                          "tenant a: k\nlimit a: requests_per_minute=-1",
                          "tenant a: k\npriority a: soon", "tenant a: k\npriority a: 1 2"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(TenantMap::Parse(bad).status())) << bad;
  }
}

TEST(TenantMapTest, ErrorsNameTheLine) {
  for (const char* bad : {
           "tenant a: k1\ntenant b: k1",          // a key in two tenants
           "tenant a: k1\ntenant a: k2",          // a tenant twice
           "tenant a: k1\nshare g: a\nshare h: a",  // a tenant in two groups
           "tenant a: k1\nshare g: b",            // an undefined tenant
           "tenant a:",                           // nothing named
           "tenant a b: k",                       // bad head
           "group g: a",                          // unknown statement
           "tenant a: k/1",                       // bad name
           "tenant a k",                          // no colon
       }) {
    absl::StatusOr<TenantMap> m = TenantMap::Parse(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << bad;
    EXPECT_NE(m.status().message().find("line"), std::string::npos) << m.status();
  }
  EXPECT_TRUE(absl::IsNotFound(TenantMap::Load("/nonexistent/tenants").status()));
}

}  // namespace
}  // namespace swaserve::api
