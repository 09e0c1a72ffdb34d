// Tenants: which API keys belong together, and which tenants share a prefix
// cache.
//
// A tenant's requests never share cached KV with another tenant's: the
// router seeds the page hashes of each cache domain apart
// (base::PageHashSeedFor), so neither the prefix cache's hits nor the
// `cached_tokens` a response reports can tell one tenant what another sent.
// A key's cache domain is
//   * "share:<group>" when its tenant is in a share group (operators share a
//     public system prompt this way, and only this way);
//   * else "tenant:<tenant>", where a key the file puts in no tenant is a
//     tenant of its own, named by the key's name.
// Without API keys there is one anonymous domain ("").
//
// The file (`--tenants=PATH` of the router), one statement per line:
//
//   # comment
//   tenant acme: acme-prod acme-ci      key names (ApiKeyStore names) of one tenant
//   tenant globex: globex-main
//   share public-demo: acme globex      tenants that share one prefix cache
//   limit acme: requests_per_minute=600 tokens_per_minute=2000000
//                                        the tenant's rate limits (all its keys
//                                        together; RateLimiter), overriding the
//                                        router's defaults; 0 = unlimited
//   priority acme: -10                   the most urgent GenerateRequest.priority
//                                        the tenant may ask for (lower values are
//                                        served first; more urgent asks are served
//                                        at this value); overrides the default
//
// Names are [A-Za-z0-9._-]+. A key in two tenants, a tenant in two share
// groups, a tenant or group defined twice, a share group, limit or priority
// naming a tenant that is not defined, or a malformed value is an error
// (InvalidArgument naming the line). Keys
// named here but absent from the key store are allowed (a key may be added
// later).
//
// Immutable after Parse/Load; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swaserve::api {

// What the file sets for one tenant; unset fields take the router's
// defaults.
struct TenantPolicy {
  std::optional<double> requests_per_minute;
  std::optional<double> tokens_per_minute;
  std::optional<int32_t> min_priority;
};

class TenantMap {
 public:
  // No tenants file: every key a tenant of its own.
  TenantMap() = default;
  static absl::StatusOr<TenantMap> Parse(absl::string_view text);
  // Reads and parses `path`; NotFound when it cannot be read.
  static absl::StatusOr<TenantMap> Load(const std::string& path);

  // The tenant of an authenticated key (by its ApiKeyStore name).
  std::string TenantOf(absl::string_view key_name) const;
  // The prefix-cache domain of an authenticated key (see above); "" for an
  // anonymous caller (empty key name: the router runs without keys).
  std::string CacheDomainOf(absl::string_view key_name) const;

  // The tenant's policy (all fields unset for a tenant the file does not
  // limit, or a key in no tenant).
  TenantPolicy PolicyOf(absl::string_view tenant) const;

  int tenants() const { return static_cast<int>(tenant_keys_.size()); }
  // The tenants the file defines, sorted.
  std::vector<std::string> TenantNames() const;

 private:
  // key name -> tenant; tenant -> share group.
  absl::flat_hash_map<std::string, std::string> key_tenant_;
  absl::flat_hash_map<std::string, std::string> tenant_group_;
  // tenant -> its number of keys (tenants() and validation).
  absl::flat_hash_map<std::string, int> tenant_keys_;
  absl::flat_hash_map<std::string, TenantPolicy> policies_;
};

}  // namespace swaserve::api
