#include "lib/api/media_url.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace swaserve::api {
namespace {

absl::Status Bad(absl::string_view why) { return absl::InvalidArgumentError(std::string(why)); }

bool HostChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

// Bytes a request target may not carry as they are.
bool NeedsEscape(unsigned char c) {
  return c >= 0x80 || c == '"' || c == '<' || c == '>' || c == '\\' || c == '^' || c == '`' ||
         c == '{' || c == '|' || c == '}';
}

std::string EscapeTarget(absl::string_view t) {
  std::string out;
  for (const char ch : t) {
    const auto c = static_cast<unsigned char>(ch);
    if (NeedsEscape(c)) {
      absl::StrAppendFormat(&out, "%%%02X", c);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

// RFC 3986 section 5.2.4 on a path (no query).
std::string RemoveDotSegments(absl::string_view in) {
  std::string out;
  while (!in.empty()) {
    if (absl::StartsWith(in, "../")) {
      in.remove_prefix(3);
    } else if (absl::StartsWith(in, "./")) {
      in.remove_prefix(2);
    } else if (absl::StartsWith(in, "/./")) {
      in.remove_prefix(2);
    } else if (in == "/.") {
      in = "/";
    } else if (absl::StartsWith(in, "/../") || in == "/..") {
      in = in.size() == 3 ? absl::string_view("/") : in.substr(3);
      const size_t cut = out.rfind('/');
      out.resize(cut == std::string::npos ? 0 : cut);
    } else if (in == "." || in == "..") {
      in = {};
    } else {
      const size_t next = in.find('/', 1);
      const absl::string_view seg = in.substr(0, next);
      out.append(seg.data(), seg.size());
      in.remove_prefix(seg.size());
    }
  }
  return out;
}

bool HasScheme(absl::string_view s) {
  if (s.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (size_t i = 1; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ':') return true;
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') {
      return false;
    }
  }
  return false;
}

uint32_t V4(const uint8_t* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

IpAddress FromV4(uint32_t a) {
  IpAddress ip;
  ip.family = AF_INET;
  ip.bytes = {static_cast<uint8_t>(a >> 24), static_cast<uint8_t>(a >> 16),
              static_cast<uint8_t>(a >> 8), static_cast<uint8_t>(a)};
  return ip;
}

absl::string_view SpecialV4(uint32_t a) {
  struct Range {
    uint32_t net;
    int bits;
    const char* name;
  };
  static constexpr Range kRanges[] = {
      {0x00000000, 8, "\"this network\" 0.0.0.0/8"},
      {0x0A000000, 8, "private 10.0.0.0/8"},
      {0x64400000, 10, "shared address space (CGNAT) 100.64.0.0/10"},
      {0x7F000000, 8, "loopback 127.0.0.0/8"},
      {0xA9FE0000, 16, "link-local 169.254.0.0/16"},
      {0xAC100000, 12, "private 172.16.0.0/12"},
      {0xC0000000, 24, "IETF protocol assignments 192.0.0.0/24"},
      {0xC0000200, 24, "documentation 192.0.2.0/24"},
      {0xC0586300, 24, "6to4 relay anycast 192.88.99.0/24"},
      {0xC0A80000, 16, "private 192.168.0.0/16"},
      {0xC6120000, 15, "benchmarking 198.18.0.0/15"},
      {0xC6336400, 24, "documentation 198.51.100.0/24"},
      {0xCB007100, 24, "documentation 203.0.113.0/24"},
      {0xE0000000, 4, "multicast 224.0.0.0/4"},
      {0xF0000000, 4, "reserved 240.0.0.0/4 (and broadcast)"},
  };
  for (const Range& r : kRanges) {
    if ((a >> (32 - r.bits)) == (r.net >> (32 - r.bits))) return r.name;
  }
  return "";
}

// Whether the first `bits` bits of `b` equal those of `prefix`.
bool InPrefix(const std::array<uint8_t, 16>& b, std::initializer_list<uint8_t> prefix, int bits) {
  int i = 0;
  for (const uint8_t p : prefix) {
    const int take = std::min(8, bits - 8 * i);
    if (take <= 0) break;
    const uint8_t mask = static_cast<uint8_t>(0xFF << (8 - take));
    if ((b[i] & mask) != (p & mask)) return false;
    ++i;
  }
  return true;
}

std::string Embedded(absl::string_view what, uint32_t v4) {
  const absl::string_view inner = SpecialV4(v4);
  if (inner.empty()) return "";
  return absl::StrCat(what, " of ", FromV4(v4).ToString(), " (", inner, ")");
}

std::string SpecialV6(const std::array<uint8_t, 16>& b) {
  const uint8_t* p = b.data();
  static constexpr uint8_t kZero[16] = {};
  if (std::memcmp(p, kZero, 10) == 0 && p[10] == 0xFF && p[11] == 0xFF) {
    return Embedded("IPv4-mapped ::ffff:0:0/96", V4(p + 12));
  }
  if (InPrefix(b, {0x00, 0x64, 0xFF, 0x9B, 0, 0, 0, 0, 0, 0, 0, 0}, 96)) {
    return Embedded("NAT64 64:ff9b::/96", V4(p + 12));
  }
  if (InPrefix(b, {0x20, 0x02}, 16)) return Embedded("6to4 2002::/16", V4(p + 2));
  if (std::memcmp(p, kZero, 16) == 0) return "unspecified ::/128";
  if (std::memcmp(p, kZero, 15) == 0 && p[15] == 1) return "loopback ::1/128";
  if (std::memcmp(p, kZero, 12) == 0) return "IPv4-compatible ::/96";
  if (InPrefix(b, {0x01, 0x00, 0, 0, 0, 0, 0, 0}, 64)) return "discard-only 100::/64";
  if (InPrefix(b, {0x00, 0x64, 0xFF, 0x9B, 0x00, 0x01}, 48)) return "local-use NAT64 64:ff9b:1::/48";
  if (InPrefix(b, {0xFC}, 7)) return "unique local fc00::/7";
  if (InPrefix(b, {0xFE, 0x80}, 10)) return "link-local fe80::/10";
  if (InPrefix(b, {0xFE, 0xC0}, 10)) return "site-local fec0::/10";
  if (InPrefix(b, {0xFF}, 8)) return "multicast ff00::/8";
  if (!InPrefix(b, {0x20}, 3)) return "outside global unicast 2000::/3";
  if (InPrefix(b, {0x20, 0x01, 0x00, 0x00}, 32)) return "Teredo 2001::/32";
  if (InPrefix(b, {0x20, 0x01, 0x00}, 23)) return "IETF protocol assignments 2001::/23";
  if (InPrefix(b, {0x20, 0x01, 0x0D, 0xB8}, 32)) return "documentation 2001:db8::/32";
  if (InPrefix(b, {0x3F, 0xFF, 0x00}, 20)) return "documentation 3fff::/20";
  return "";
}

}  // namespace

std::string MediaUrl::HostForUrl() const {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host;
}

std::string MediaUrl::ToString() const {
  return absl::StrCat(scheme, "://", HostForUrl(), ":", port, target);
}

absl::StatusOr<MediaUrl> ParseMediaUrl(absl::string_view s) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7F) return Bad("control character or space in the URL");
  }
  const size_t colon = s.find("://");
  if (colon == absl::string_view::npos || !HasScheme(s.substr(0, colon + 1))) {
    return Bad("not an absolute URL (scheme://host/...)");
  }
  MediaUrl u;
  u.scheme = absl::AsciiStrToLower(s.substr(0, colon));
  if (u.scheme != "http" && u.scheme != "https") {
    return Bad(absl::StrCat("scheme '", u.scheme, "' is not http or https"));
  }
  s.remove_prefix(colon + 3);
  const size_t end = s.find_first_of("/?#");
  const absl::string_view authority = s.substr(0, end);
  absl::string_view rest = end == absl::string_view::npos ? "" : s.substr(end);
  if (authority.empty()) return Bad("no host");
  if (absl::StrContains(authority, '@')) return Bad("user information in the URL");
  absl::string_view host = authority, port;
  if (authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return Bad("unterminated IPv6 literal");
    host = authority.substr(1, close - 1);
    const absl::string_view after = authority.substr(close + 1);
    if (!after.empty() && after[0] != ':') return Bad("junk after the IPv6 literal");
    if (!after.empty()) port = after.substr(1);
    absl::StatusOr<IpAddress> ip = IpAddress::Parse(host);
    if (!ip.ok() || ip->family != AF_INET6) return Bad("bad IPv6 literal");
  } else {
    const size_t c = authority.rfind(':');
    if (c != absl::string_view::npos) {
      host = authority.substr(0, c);
      port = authority.substr(c + 1);
    }
    if (host.size() > 253) return Bad("host name longer than 253 characters");
    for (const char ch : host) {
      if (!HostChar(ch)) return Bad(absl::StrCat("character '", std::string(1, ch), "' in the host"));
    }
    if (absl::EndsWith(host, ".")) host.remove_suffix(1);
    if (absl::StartsWith(host, ".") || absl::EndsWith(host, ".") || absl::StrContains(host, "..")) {
      return Bad("empty label in the host");
    }
  }
  if (host.empty()) return Bad("no host");
  u.host = absl::AsciiStrToLower(host);
  u.port = u.scheme == "https" ? 443 : 80;
  if (!port.empty()) {
    for (const char ch : port) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(ch))) return Bad("bad port");
    }
    if (port.size() > 5 || !absl::SimpleAtoi(port, &u.port) || u.port <= 0 || u.port > 65535) {
      return Bad("bad port");
    }
  }
  if (const size_t hash = rest.find('#'); hash != absl::string_view::npos) rest = rest.substr(0, hash);
  u.target = EscapeTarget(rest);
  if (u.target.empty() || u.target[0] != '/') u.target.insert(0, "/");
  return u;
}

absl::StatusOr<MediaUrl> ResolveRedirect(const MediaUrl& base, absl::string_view location) {
  location = absl::StripAsciiWhitespace(location);
  if (location.empty()) return Bad("empty Location");
  if (const size_t sep = location.find("://");
      sep != absl::string_view::npos && HasScheme(location.substr(0, sep + 1))) {
    return ParseMediaUrl(location);
  }
  if (HasScheme(location)) return Bad("redirect to a URL without '//' after the scheme");
  if (absl::StartsWith(location, "//")) return ParseMediaUrl(absl::StrCat(base.scheme, ":", location));
  if (const size_t hash = location.find('#'); hash != absl::string_view::npos) {
    location = location.substr(0, hash);
  }
  const absl::string_view base_target = base.target;
  const size_t base_q = base_target.find('?');
  const absl::string_view base_path = base_target.substr(0, base_q);
  std::string target;
  if (location.empty()) {
    target = std::string(base_target);
  } else if (location[0] == '?') {
    target = absl::StrCat(base_path, location);
  } else {
    const size_t q = location.find('?');
    const absl::string_view path = location.substr(0, q);
    const absl::string_view query = q == absl::string_view::npos ? "" : location.substr(q);
    std::string merged;
    if (path.empty()) {
      merged = std::string(base_path);
    } else if (path[0] == '/') {
      merged = std::string(path);
    } else {
      const size_t slash = base_path.rfind('/');
      merged = absl::StrCat(base_path.substr(0, slash == absl::string_view::npos ? 0 : slash + 1),
                            path);
    }
    target = absl::StrCat(RemoveDotSegments(merged), query);
  }
  MediaUrl next = base;
  next.target = target;
  return ParseMediaUrl(next.ToString());
}

bool HostAllowed(absl::string_view host, absl::Span<const std::string> patterns) {
  std::string h = absl::AsciiStrToLower(host);
  if (absl::EndsWith(h, ".")) h.pop_back();
  for (const std::string& raw : patterns) {
    std::string p = absl::AsciiStrToLower(absl::StripAsciiWhitespace(raw));
    if (absl::EndsWith(p, ".")) p.pop_back();
    if (absl::StartsWith(p, "*.")) {
      const absl::string_view suffix = absl::string_view(p).substr(1);  // ".example.com"
      if (suffix.size() > 1 && h.size() > suffix.size() && absl::EndsWith(h, suffix)) return true;
    } else if (!p.empty() && h == p) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<IpAddress> IpAddress::Parse(absl::string_view text) {
  const std::string s(text);
  IpAddress ip;
  if (inet_pton(AF_INET, s.c_str(), ip.bytes.data()) == 1) {
    ip.family = AF_INET;
    return ip;
  }
  if (inet_pton(AF_INET6, s.c_str(), ip.bytes.data()) == 1) {
    ip.family = AF_INET6;
    return ip;
  }
  return Bad(absl::StrCat("'", s.substr(0, 64), "' is not a numeric IP address"));
}

std::string IpAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family != AF_INET && family != AF_INET6) return "?";
  inet_ntop(family, bytes.data(), buf, sizeof(buf));
  return buf;
}

std::string SpecialPurposeRange(const IpAddress& address) {
  if (address.family == AF_INET) return std::string(SpecialV4(V4(address.bytes.data())));
  if (address.family == AF_INET6) return SpecialV6(address.bytes);
  return "unknown address family";
}

}  // namespace swaserve::api
