#include "lib/api/media_fetch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <httplib.h>

#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace swaserve::api {
namespace {

absl::Status Bad(absl::string_view url, absl::string_view why) {
  std::string shown(url.substr(0, 200));
  if (url.size() > 200) shown += "...";
  return absl::InvalidArgumentError(absl::StrCat("media URL '", shown, "': ", why));
}

struct Url {
  std::string scheme;  // http | https
  std::string host;    // without brackets
  int port = 0;
  std::string path;    // starts with '/'
};

std::optional<Url> ParseUrl(absl::string_view s) {
  Url u;
  const size_t colon = s.find("://");
  if (colon == absl::string_view::npos) return std::nullopt;
  u.scheme = absl::AsciiStrToLower(s.substr(0, colon));
  s.remove_prefix(colon + 3);
  const size_t slash = s.find_first_of("/?#");
  absl::string_view authority = s.substr(0, slash);
  u.path = slash == absl::string_view::npos ? "/" : std::string(s.substr(slash));
  if (!u.path.empty() && u.path[0] != '/') u.path = "/" + u.path;
  if (const size_t hash = u.path.find('#'); hash != std::string::npos) u.path.resize(hash);
  if (authority.empty() || absl::StrContains(authority, '@')) return std::nullopt;
  absl::string_view port;
  if (authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return std::nullopt;
    u.host = std::string(authority.substr(1, close - 1));
    absl::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return std::nullopt;
      port = rest.substr(1);
    }
  } else {
    const size_t c = authority.rfind(':');
    u.host = std::string(authority.substr(0, c));
    if (c != absl::string_view::npos) port = authority.substr(c + 1);
  }
  if (u.host.empty()) return std::nullopt;
  u.port = u.scheme == "https" ? 443 : 80;
  if (!port.empty() && (!absl::SimpleAtoi(port, &u.port) || u.port <= 0 || u.port > 65535)) {
    return std::nullopt;
  }
  return u;
}

bool PrivateV4(uint32_t a) {  // host order
  auto in = [&](uint32_t net, int bits) { return (a >> (32 - bits)) == (net >> (32 - bits)); };
  return in(0x00000000, 8) || in(0x0A000000, 8) || in(0x7F000000, 8) || in(0xA9FE0000, 16) ||
         in(0xAC100000, 12) || in(0xC0A80000, 16) || in(0x64400000, 10) || in(0xE0000000, 4) ||
         a == 0xFFFFFFFF;
}

bool PrivateAddress(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return PrivateV4(ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr));
  }
  if (sa->sa_family == AF_INET6) {
    const uint8_t* b = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr.s6_addr;
    static const uint8_t kZero[16] = {};
    if (std::memcmp(b, kZero, 15) == 0 && (b[15] == 0 || b[15] == 1)) return true;  // :: and ::1
    if ((b[0] & 0xFE) == 0xFC) return true;                                       // fc00::/7
    if (b[0] == 0xFE && (b[1] & 0xC0) == 0x80) return true;                       // fe80::/10
    if (b[0] == 0xFF) return true;                                                // multicast
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    if (std::memcmp(b, kMapped, 12) == 0) {
      return PrivateV4((uint32_t{b[12]} << 24) | (uint32_t{b[13]} << 16) | (uint32_t{b[14]} << 8) |
                       b[15]);
    }
    return false;
  }
  return true;  // unknown families are not fetched
}

// Ok when every address `host` resolves to is public.
absl::Status CheckPublic(absl::string_view url, const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return Bad(url, absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  absl::Status st;
  for (addrinfo* a = res; a != nullptr && st.ok(); a = a->ai_next) {
    if (PrivateAddress(a->ai_addr)) {
      st = Bad(url, absl::StrCat(host, " resolves to a loopback, private or link-local address"));
    }
  }
  freeaddrinfo(res);
  return st;
}

}  // namespace

absl::StatusOr<FetchedMedia> ParseDataUrl(absl::string_view url, int64_t max_bytes) {
  if (!absl::StartsWithIgnoreCase(url, "data:")) return Bad(url, "not a data: URL");
  const size_t comma = url.find(',');
  if (comma == absl::string_view::npos) return Bad(url, "no ',' before the payload");
  const absl::string_view meta = url.substr(5, comma - 5);
  const absl::string_view payload = url.substr(comma + 1);
  std::vector<absl::string_view> parts = absl::StrSplit(meta, ';');
  if (parts.empty() || !absl::EqualsIgnoreCase(parts.back(), "base64")) {
    return Bad(url, "only base64 data URLs are accepted (data:<mime>;base64,...)");
  }
  FetchedMedia out;
  out.mime_type = absl::AsciiStrToLower(parts[0]);
  if (payload.empty()) return Bad(url, "empty payload");
  // Decoded size bound before decoding: 3 bytes per 4 characters.
  if (static_cast<int64_t>(payload.size()) / 4 * 3 > max_bytes + 3) {
    return Bad(url, absl::StrCat("payload of more than ", max_bytes, " bytes"));
  }
  if (!absl::Base64Unescape(payload, &out.bytes) &&
      !absl::WebSafeBase64Unescape(payload, &out.bytes)) {
    return Bad(url, "invalid base64 payload");
  }
  if (out.bytes.empty()) return Bad(url, "empty payload");
  if (static_cast<int64_t>(out.bytes.size()) > max_bytes) {
    return Bad(url, absl::StrCat("payload of more than ", max_bytes, " bytes"));
  }
  return out;
}

absl::StatusOr<FetchedMedia> MediaFetcher::Fetch(absl::string_view url_in) const {
  if (absl::StartsWithIgnoreCase(url_in, "data:")) return ParseDataUrl(url_in, options_.max_bytes);
  const absl::Time deadline = absl::Now() + options_.timeout;
  std::string url(url_in);
  for (int redirects = 0;; ++redirects) {
    std::optional<Url> u = ParseUrl(url);
    if (!u) return Bad(url, "not an http(s) or data: URL");
    if (u->scheme != "https" && !(u->scheme == "http" && options_.allow_http)) {
      return Bad(url, absl::StrCat("scheme '", u->scheme, "' is not allowed"));
    }
    if (!options_.allow_private_addresses) {
      if (absl::Status s = CheckPublic(url, u->host); !s.ok()) return s;
    }
    const std::string host = absl::StrContains(u->host, ':') ? absl::StrCat("[", u->host, "]")
                                                              : u->host;
    httplib::Client cli(absl::StrCat(u->scheme, "://", host, ":", u->port));
    if (!cli.is_valid()) return Bad(url, absl::StrCat("scheme '", u->scheme, "' unsupported"));
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return Bad(url, absl::StrCat("timed out after ", absl::FormatDuration(options_.timeout)));
    }
    const auto usec = std::chrono::microseconds(absl::ToInt64Microseconds(left));
    cli.set_connection_timeout(usec);
    cli.set_read_timeout(usec);
    cli.set_write_timeout(usec);
    cli.set_follow_location(false);
    FetchedMedia out;
    std::string abort_reason;
    int status = 0;
    std::string location;
    httplib::Result r = cli.Get(
        u->path, httplib::Headers{},
        [&](const httplib::Response& resp) {
          status = resp.status;
          if (resp.status >= 300 && resp.status < 400) {
            location = resp.get_header_value("Location");
            return false;  // no body needed
          }
          if (resp.status != 200) return false;
          out.mime_type = absl::AsciiStrToLower(
              absl::StripAsciiWhitespace(resp.get_header_value("Content-Type")));
          if (const size_t semi = out.mime_type.find(';'); semi != std::string::npos) {
            out.mime_type.resize(semi);
          }
          int64_t length = 0;
          if (absl::SimpleAtoi(resp.get_header_value("Content-Length"), &length) &&
              length > options_.max_bytes) {
            abort_reason = absl::StrCat("more than ", options_.max_bytes, " bytes (Content-Length ",
                                        length, ")");
            return false;
          }
          return true;
        },
        [&](const char* data, size_t n) {
          if (static_cast<int64_t>(out.bytes.size() + n) > options_.max_bytes) {
            abort_reason = absl::StrCat("more than ", options_.max_bytes, " bytes");
            return false;
          }
          if (absl::Now() > deadline) {
            abort_reason =
                absl::StrCat("timed out after ", absl::FormatDuration(options_.timeout));
            return false;
          }
          out.bytes.append(data, n);
          return true;
        });
    if (!abort_reason.empty()) return Bad(url, abort_reason);
    if (status >= 300 && status < 400 && status != 304) {
      if (location.empty()) return Bad(url, absl::StrCat("HTTP ", status, " without Location"));
      if (redirects >= options_.max_redirects) {
        return Bad(url_in, absl::StrCat("too many redirects (more than ", options_.max_redirects,
                                        ")"));
      }
      url = location[0] == '/' ? absl::StrCat(u->scheme, "://", host, ":", u->port, location)
                               : location;
      continue;
    }
    if (status != 0 && status != 200) return Bad(url, absl::StrCat("returned HTTP ", status));
    if (!r) {
      const httplib::Error e = r.error();
      if (e == httplib::Error::ConnectionTimeout || e == httplib::Error::Read ||
          absl::Now() >= deadline) {
        if (absl::Now() >= deadline - absl::Milliseconds(50)) {
          return Bad(url, absl::StrCat("timed out after ", absl::FormatDuration(options_.timeout)));
        }
      }
      return Bad(url, absl::StrCat("fetch failed: ", httplib::to_string(e)));
    }
    if (out.bytes.empty()) return Bad(url, "empty body");
    return out;
  }
}

}  // namespace swaserve::api
