// The parts of a remote media fetch that decide WHERE it goes, kept apart
// from the fetch itself so that they can be tested and fuzzed on their own:
//
//   ParseMediaUrl     an absolute http(s) URL -> scheme, host, port, target.
//                     Strict: no user info, no percent-encoding, zone ids or
//                     backslashes in the host, no control characters or
//                     spaces anywhere; non-ASCII bytes of the path and query
//                     are percent-encoded; the fragment is dropped. The host
//                     is lower-cased and loses one trailing dot.
//   ResolveRedirect   a Location header against the URL that answered it
//                     (RFC 3986 section 5.2: absolute, scheme-relative "//h/p",
//                     absolute-path "/p", query "?q" and relative "p" forms;
//                     dot segments removed), then parsed as above.
//   HostAllowed       whether a host matches an allowlist of exact names and
//                     "*.suffix" patterns (a pattern "*.example.com" matches
//                     a.example.com and a.b.example.com, not example.com).
//   IpAddress         a resolved IPv4 or IPv6 address.
//   SpecialPurposeRange  the name of the special-purpose range an address is
//                     in, or "" for an address a public fetch may reach.
//                     IPv4: 0/8, 10/8, 100.64/10 (CGNAT), 127/8, 169.254/16,
//                     172.16/12, 192.0.0/24, 192.0.2/24, 192.88.99/24,
//                     192.168/16, 198.18/15, 198.51.100/24, 203.0.113/24,
//                     224/4 (multicast), 240/4 (reserved, broadcast).
//                     IPv6: everything outside 2000::/3 (::, ::1, ::/96
//                     IPv4-compatible, 100::/64 discard-only, fc00::/7,
//                     fe80::/10, fec0::/10, ff00::/8, 64:ff9b:1::/48, ...),
//                     and inside it 2001::/23 (IETF protocol assignments, with
//                     Teredo 2001::/32), 2001:db8::/32 and 3fff::/20
//                     (documentation). Addresses that carry an IPv4 address
//                     are judged by it: ::ffff:0:0/96 (IPv4-mapped),
//                     64:ff9b::/96 (NAT64) and 2002::/16 (6to4).
//
// All functions are pure and thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swaserve::api {

struct MediaUrl {
  std::string scheme;  // "http" or "https"
  std::string host;    // lower case, IPv6 literals without brackets
  int port = 0;        // explicit, or 80 / 443
  std::string target;  // path and query, starts with '/'

  // "scheme://host:port/target" (IPv6 hosts bracketed).
  std::string ToString() const;
  // host, bracketed when it is an IPv6 literal.
  std::string HostForUrl() const;
};

// InvalidArgument naming the problem for anything but an absolute http(s)
// URL as described above (another scheme: "scheme 'ftp' is not http or
// https"); whether http is allowed is the fetcher's decision.
absl::StatusOr<MediaUrl> ParseMediaUrl(absl::string_view url);

// `location` (a Location header) resolved against `base`; InvalidArgument
// when it is empty or does not resolve to a valid http(s) URL.
absl::StatusOr<MediaUrl> ResolveRedirect(const MediaUrl& base, absl::string_view location);

// True when `host` (as MediaUrl::host) matches one of `patterns` (exact
// names, or "*.suffix"; case-insensitive, trailing dots ignored).
bool HostAllowed(absl::string_view host, absl::Span<const std::string> patterns);

struct IpAddress {
  int family = 0;                 // AF_INET or AF_INET6
  std::array<uint8_t, 16> bytes{};  // network order; IPv4 in the first 4

  // A numeric address (dotted quad or IPv6 text, no zone id); nothing
  // else parses.
  static absl::StatusOr<IpAddress> Parse(absl::string_view text);
  // inet_ntop's text.
  std::string ToString() const;
};

// "" for a public address; otherwise the range, e.g. "loopback 127.0.0.0/8"
// or "IPv4-mapped ::ffff:0:0/96 of 10.0.0.1 (private 10.0.0.0/8)".
std::string SpecialPurposeRange(const IpAddress& address);

}  // namespace swaserve::api
