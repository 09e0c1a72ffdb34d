// libFuzzer target: the router's credentials and tenants parsing, outside
// input all of it: the Authorization header (api::ApiKeyStore::Authorize,
// also what gRPC metadata goes through) and the tenants file
// (api::TenantMap::Parse). The first byte picks which. Oracles: never a
// crash; a header is accepted only when it carries a stored key, and named
// by that key's name; a parsed tenants file maps each of its keys into a
// domain of its tenant (or its share group).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "lib/api/api_keys.h"
#include "lib/api/tenants.h"

namespace {

swaserve::api::ApiKeyStore* Store() {
  static swaserve::api::ApiKeyStore* store = [] {
    char path[] = "/tmp/auth_header_fuzzer_keys_XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) std::abort();
    std::ofstream(path) << "team-a:sk-aaaaaaaaaaaa\nteam-b:sk-b:with-colon\n";
    auto s = swaserve::api::ApiKeyStore::Create(
        {.path = path, .reload_interval = absl::InfiniteDuration()});
    if (!s.ok()) std::abort();
    return s->release();
  }();
  return store;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    absl::StatusOr<std::string> name = Store()->Authorize(input);
    if (name.ok()) {
      const bool a = *name == "team-a" && absl::StrContains(input, "sk-aaaaaaaaaaaa");
      const bool b = *name == "team-b" && absl::StrContains(input, "sk-b:with-colon");
      if (!a && !b) std::abort();
    }
    return 0;
  }
  absl::StatusOr<swaserve::api::TenantMap> m = swaserve::api::TenantMap::Parse(input);
  if (!m.ok()) return 0;
  for (const std::string& tenant : m->TenantNames()) {
    (void)m->PolicyOf(tenant);
  }
  const std::string domain = m->CacheDomainOf("some-key");
  if (!absl::StartsWith(domain, "tenant:") && !absl::StartsWith(domain, "share:")) std::abort();
  return 0;
}
