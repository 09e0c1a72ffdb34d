#include "lib/api/tenants.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace swaserve::api {

namespace {

bool ValidName(absl::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<TenantMap> TenantMap::Parse(absl::string_view text) {
  TenantMap m;
  // Share statements are checked once every tenant is known.
  // Share, limit and priority statements are checked once every tenant is
  // known.
  struct Share {
    int line;
    std::string group;
    std::vector<std::string> tenants;
  };
  std::vector<Share> shares;
  struct Setting {
    int line;
    std::string tenant;
    TenantPolicy policy;
  };
  std::vector<Setting> settings;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("tenants line ", line_no, ": ", why));
    };
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) return bad("expected 'tenant NAME: KEYS...' or 'share NAME: TENANTS...'");
    std::vector<absl::string_view> head =
        absl::StrSplit(line.substr(0, colon), ' ', absl::SkipWhitespace());
    std::vector<std::string> names =
        absl::StrSplit(line.substr(colon + 1), absl::ByAnyChar(" \t"), absl::SkipWhitespace());
    if (head.size() != 2 || (head[0] != "tenant" && head[0] != "share" && head[0] != "limit" &&
                             head[0] != "priority")) {
      return bad("expected 'tenant NAME: KEYS...', 'share NAME: TENANTS...', 'limit TENANT: "
                 "requests_per_minute=N tokens_per_minute=N' or 'priority TENANT: N'");
    }
    const std::string name(head[1]);
    if (!ValidName(name)) return bad(absl::StrCat("invalid name '", name, "'"));
    if (names.empty()) return bad(absl::StrCat("'", name, "' names nothing"));
    if (head[0] == "limit" || head[0] == "priority") {
      Setting st{.line = line_no, .tenant = name};
      for (const std::string& item : names) {
        if (head[0] == "priority") {
          int32_t p = 0;
          if (names.size() != 1 || !absl::SimpleAtoi(item, &p) || p < -1000000 || p > 1000000) {
            return bad("expected 'priority TENANT: N', N in [-1000000, 1000000]");
          }
          st.policy.min_priority = p;
          continue;
        }
        std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
        double v = 0;
        if (!absl::SimpleAtod(kv.second, &v) || !(v >= 0)) {
          return bad(absl::StrCat("'", item, "': expected NAME=N with N >= 0"));
        }
        if (kv.first == "requests_per_minute") {
          st.policy.requests_per_minute = v;
        } else if (kv.first == "tokens_per_minute") {
          st.policy.tokens_per_minute = v;
        } else {
          return bad(absl::StrCat("unknown limit '", kv.first,
                                  "' (requests_per_minute, tokens_per_minute)"));
        }
      }
      settings.push_back(std::move(st));
      continue;
    }
    for (const std::string& n : names) {
      if (!ValidName(n)) return bad(absl::StrCat("invalid name '", n, "'"));
    }
    if (head[0] == "share") {
      for (const Share& s : shares) {
        if (s.group == name) return bad(absl::StrCat("share group '", name, "' defined twice"));
      }
      shares.push_back({.line = line_no, .group = name, .tenants = std::move(names)});
      continue;
    }
    if (m.tenant_keys_.contains(name)) return bad(absl::StrCat("tenant '", name, "' defined twice"));
    for (const std::string& key : names) {
      auto [it, inserted] = m.key_tenant_.emplace(key, name);
      if (!inserted) {
        return bad(absl::StrCat("key '", key, "' is already in tenant '", it->second, "'"));
      }
    }
    m.tenant_keys_[name] = static_cast<int>(names.size());
  }
  for (const Share& s : shares) {
    for (const std::string& t : s.tenants) {
      if (!m.tenant_keys_.contains(t)) {
        return absl::InvalidArgumentError(absl::StrCat("tenants line ", s.line, ": tenant '", t,
                                                       "' is not defined by a 'tenant' line"));
      }
      auto [it, inserted] = m.tenant_group_.emplace(t, s.group);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tenants line ", s.line, ": tenant '", t,
                                                       "' is already in share group '",
                                                       it->second, "'"));
      }
    }
  }
  for (const Setting& st : settings) {
    if (!m.tenant_keys_.contains(st.tenant)) {
      return absl::InvalidArgumentError(absl::StrCat("tenants line ", st.line, ": tenant '",
                                                     st.tenant,
                                                     "' is not defined by a 'tenant' line"));
    }
    TenantPolicy& p = m.policies_[st.tenant];
    if (st.policy.requests_per_minute) p.requests_per_minute = st.policy.requests_per_minute;
    if (st.policy.tokens_per_minute) p.tokens_per_minute = st.policy.tokens_per_minute;
    if (st.policy.min_priority) p.min_priority = st.policy.min_priority;
  }
  return m;
}

std::vector<std::string> TenantMap::TenantNames() const {
  std::vector<std::string> out;
  for (const auto& [name, keys] : tenant_keys_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

TenantPolicy TenantMap::PolicyOf(absl::string_view tenant) const {
  auto it = policies_.find(tenant);
  return it == policies_.end() ? TenantPolicy() : it->second;
}

absl::StatusOr<TenantMap> TenantMap::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the tenants file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<TenantMap> m = Parse(ss.str());
  if (!m.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", m.status().message()));
  }
  return m;
}

std::string TenantMap::TenantOf(absl::string_view key_name) const {
  auto it = key_tenant_.find(key_name);
  return it == key_tenant_.end() ? std::string(key_name) : it->second;
}

std::string TenantMap::CacheDomainOf(absl::string_view key_name) const {
  if (key_name.empty()) return "";
  const std::string tenant = TenantOf(key_name);
  auto g = tenant_group_.find(tenant);
  if (g != tenant_group_.end()) return absl::StrCat("share:", g->second);
  return absl::StrCat("tenant:", tenant);
}

}  // namespace swaserve::api
