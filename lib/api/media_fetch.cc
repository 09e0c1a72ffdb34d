#include "lib/api/media_fetch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "lib/base/status.h"

namespace swaserve::api {
namespace {

absl::Status Bad(absl::string_view url, absl::string_view why) {
  std::string shown(url.substr(0, 200));
  if (url.size() > 200) shown += "...";
  return absl::InvalidArgumentError(absl::StrCat("media URL '", shown, "': ", why));
}

std::string Timeout(absl::Duration timeout) {
  return absl::StrCat("timed out after ", absl::FormatDuration(timeout));
}

// getaddrinfo's addresses of `host`, each once.
absl::StatusOr<std::vector<IpAddress>> SystemResolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::vector<IpAddress> out;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    IpAddress ip;
    if (a->ai_family == AF_INET) {
      ip.family = AF_INET;
      std::memcpy(ip.bytes.data(), &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, 4);
    } else if (a->ai_family == AF_INET6) {
      ip.family = AF_INET6;
      std::memcpy(ip.bytes.data(), &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr,
                  16);
    } else {
      continue;
    }
    if (std::find_if(out.begin(), out.end(), [&](const IpAddress& o) {
          return o.family == ip.family && o.bytes == ip.bytes;
        }) == out.end()) {
      out.push_back(ip);
    }
  }
  freeaddrinfo(res);
  return out;
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

struct MediaFetcher::Hop {
  int status = 0;
  std::string location;  // of a redirect
  FetchedMedia media;    // of a 200
};

absl::StatusOr<std::vector<IpAddress>> MediaFetcher::Vet(const MediaUrl& u) const {
  const std::string url = u.ToString();
  if (u.scheme != "https" && !(u.scheme == "http" && options_.allow_http)) {
    return Bad(url, absl::StrCat("scheme '", u.scheme, "' is not allowed (https only",
                                 u.scheme == "http" ? "; plain http is off" : "", ")"));
  }
  if (!options_.allowed_domains.empty() && !HostAllowed(u.host, options_.allowed_domains)) {
    return Bad(url, absl::StrCat("host ", u.host, " is not in the allowed domains"));
  }
  std::vector<IpAddress> addresses;
  if (absl::StatusOr<IpAddress> literal = IpAddress::Parse(u.host); literal.ok()) {
    addresses.push_back(*literal);
  } else {
    absl::StatusOr<std::vector<IpAddress>> r =
        options_.resolve ? options_.resolve(u.host) : SystemResolve(u.host);
    if (!r.ok()) return Bad(url, r.status().message());
    addresses = *std::move(r);
  }
  if (addresses.empty()) return Bad(url, absl::StrCat(u.host, " resolves to no address"));
  if (!options_.allow_private_addresses) {
    for (const IpAddress& a : addresses) {
      const bool listed = std::any_of(
          options_.allowed_addresses.begin(), options_.allowed_addresses.end(),
          [&](const IpAddress& x) { return x.family == a.family && x.bytes == a.bytes; });
      if (listed) continue;
      if (std::string range = SpecialPurposeRange(a); !range.empty()) {
        return Bad(url, absl::StrCat(u.host, " resolves to ", a.ToString(),
                                     ", a special-purpose address (", range,
                                     "); only public addresses are fetched"));
      }
    }
  }
  return addresses;
}

absl::StatusOr<MediaFetcher::Hop> MediaFetcher::Get(const MediaUrl& u,
                                                    const std::vector<IpAddress>& addresses,
                                                    absl::Time deadline) const {
  const std::string url = u.ToString();
  for (size_t i = 0;; ++i) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return Bad(url, Timeout(options_.timeout));
    httplib::Client cli(absl::StrCat(u.scheme, "://", u.HostForUrl(), ":", u.port));
    if (!cli.is_valid()) return Bad(url, absl::StrCat("scheme '", u.scheme, "' unsupported"));
    // The vetted address, never a second lookup of the name (which keeps
    // its place in the Host header, SNI and the certificate check).
    cli.set_hostname_addr_map({{u.host, addresses[i].ToString()}});
    const auto usec = std::chrono::microseconds(absl::ToInt64Microseconds(left));
    cli.set_connection_timeout(usec);
    cli.set_read_timeout(usec);
    cli.set_write_timeout(usec);
    cli.set_follow_location(false);
    cli.set_url_encode(false);  // ParseMediaUrl escaped the target
    cli.enable_server_certificate_verification(true);
    Hop hop;
    std::string abort_reason;
    httplib::Result r = cli.Get(
        u.target, httplib::Headers{},
        [&](const httplib::Response& resp) {
          hop.status = resp.status;
          if (resp.status >= 300 && resp.status < 400) {
            hop.location = resp.get_header_value("Location");
            return false;  // no body needed
          }
          if (resp.status != 200) return false;
          std::string& mime = hop.media.mime_type;
          mime = absl::AsciiStrToLower(
              absl::StripAsciiWhitespace(resp.get_header_value("Content-Type")));
          if (const size_t semi = mime.find(';'); semi != std::string::npos) mime.resize(semi);
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
          if (static_cast<int64_t>(hop.media.bytes.size() + n) > options_.max_bytes) {
            abort_reason = absl::StrCat("more than ", options_.max_bytes, " bytes");
            return false;
          }
          if (absl::Now() > deadline) {
            abort_reason = Timeout(options_.timeout);
            return false;
          }
          hop.media.bytes.append(data, n);
          return true;
        });
    if (!abort_reason.empty()) return Bad(url, abort_reason);
    if (hop.status != 0) return hop;
    const httplib::Error e = r.error();
    if (e == httplib::Error::Connection && i + 1 < addresses.size()) continue;
    if (absl::Now() >= deadline - absl::Milliseconds(50)) return Bad(url, Timeout(options_.timeout));
    return Bad(url, absl::StrCat("fetch failed: ", httplib::to_string(e)));
  }
}

absl::StatusOr<FetchedMedia> MediaFetcher::Fetch(absl::string_view url_in) const {
  if (absl::StartsWithIgnoreCase(url_in, "data:")) return ParseDataUrl(url_in, options_.max_bytes);
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::StatusOr<MediaUrl> u = ParseMediaUrl(url_in);
  if (!u.ok()) return Bad(url_in, u.status().message());
  for (int redirects = 0;; ++redirects) {
    ASSIGN_OR_RETURN(const std::vector<IpAddress> addresses, Vet(*u));
    ASSIGN_OR_RETURN(Hop hop, Get(*u, addresses, deadline));
    const std::string url = u->ToString();
    if (hop.status >= 300 && hop.status < 400 && hop.status != 304) {
      if (hop.location.empty()) return Bad(url, absl::StrCat("HTTP ", hop.status, " without Location"));
      if (redirects >= options_.max_redirects) {
        return Bad(url_in, absl::StrCat("too many redirects (more than ", options_.max_redirects,
                                        ")"));
      }
      absl::StatusOr<MediaUrl> next = ResolveRedirect(*u, hop.location);
      if (!next.ok()) {
        return Bad(url, absl::StrCat("bad redirect Location '", hop.location.substr(0, 200),
                                     "': ", next.status().message()));
      }
      u = *std::move(next);
      continue;
    }
    if (hop.status != 200) return Bad(url, absl::StrCat("returned HTTP ", hop.status));
    if (hop.media.bytes.empty()) return Bad(url, "empty body");
    return std::move(hop.media);
  }
}

}  // namespace swaserve::api
