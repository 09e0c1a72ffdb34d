// Where a request's images, audio and video come from:
// OpenAI content parts carry either a data: URL (base64) or an http(s) URL the
// router fetches. Both are untrusted input, so both are bounded:
//
//   ParseDataUrl   data:[<mime>][;<param>]*;base64,<payload>: the payload is
//                  decoded (standard or URL-safe alphabet, padding optional);
//                  a data URL without ;base64, an empty or oversized payload,
//                  or invalid base64 is InvalidArgument naming the problem.
//   MediaFetcher   GET of an https URL (http only when allowed) with a byte
//                  limit (checked against Content-Length and while
//                  receiving), an overall deadline and at most max_redirects
//                  redirects. The router must not become a proxy into the
//                  cluster's network, so every hop, the first and each
//                  redirect's target (lib/api/media_url.h ResolveRedirect),
//                  is vetted on its own:
//                    1. the scheme (https; http when allow_http);
//                    2. the host against allowed_domains, when set;
//                    3. the host resolved ONCE (options.resolve; an address
//                       literal is not resolved), and every address it
//                       resolves to must be public (SpecialPurposeRange:
//                       loopback, private, link-local, CGNAT, multicast,
//                       documentation, IPv4-mapped/NAT64/6to4 forms of those,
//                       ...) unless allow_private_addresses or listed in
//                       allowed_addresses;
//                    4. the connection is made to one of those vetted
//                       addresses itself (the next on a refused connection),
//                       never to the result of a second lookup, so a name
//                       that resolves differently the second time (DNS
//                       rebinding) cannot steer it; the Host header, TLS SNI
//                       and certificate check use the name.
//                  Every failure is InvalidArgument naming the URL and the
//                  reason ("returned HTTP 404", "more than N bytes", "timed
//                  out after", "too many redirects", "resolves to 10.0.0.1, a
//                  special-purpose address (private 10.0.0.0/8)", "not in the
//                  allowed domains", "scheme 'http' is not allowed") — the
//                  client's input was bad; Unavailable is never returned: a
//                  fetch is the client's responsibility.
//
// Thread-safety: ParseDataUrl is pure; a MediaFetcher is immutable and Fetch
// may be called from many threads (so may options.resolve).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lib/api/media_url.h"

namespace swaserve::api {

struct FetchedMedia {
  std::string mime_type;  // from the data URL or Content-Type; may be empty
  std::string bytes;
};

// `max_bytes` bounds the decoded payload.
absl::StatusOr<FetchedMedia> ParseDataUrl(absl::string_view url, int64_t max_bytes);

struct MediaFetcherOptions {
  // Largest body accepted. Default 32 MiB.
  int64_t max_bytes = int64_t{32} << 20;
  // The whole fetch, redirects included. Default 10 s.
  absl::Duration timeout = absl::Seconds(10);
  // Redirects followed (301, 302, 303, 307, 308). Default 3.
  int max_redirects = 3;
  // Allow hosts that resolve to special-purpose addresses (loopback,
  // private, link-local, ...: SpecialPurposeRange). Default false; only tests
  // on loopback set it.
  bool allow_private_addresses = false;
  // Special-purpose addresses fetched anyway, exactly these (e.g. a test
  // server's 127.0.0.1, or an internal media store's address). Default none.
  std::vector<IpAddress> allowed_addresses;
  // Allow plain http:// on any hop (https:// always). Default false.
  bool allow_http = false;
  // Non-empty: only hosts matching one of these are fetched, on every hop
  // (HostAllowed: exact names and "*.suffix"). Default empty: any host.
  std::vector<std::string> allowed_domains;
  // Resolves a host name to its addresses, once per hop. Default (empty):
  // getaddrinfo. Tests set it to name hosts without DNS.
  std::function<absl::StatusOr<std::vector<IpAddress>>(const std::string& host)> resolve;
};

class MediaFetcher {
 public:
  explicit MediaFetcher(MediaFetcherOptions options) : options_(std::move(options)) {}
  // A data: URL is parsed (ParseDataUrl); http(s) URLs are fetched.
  absl::StatusOr<FetchedMedia> Fetch(absl::string_view url) const;
  const MediaFetcherOptions& options() const { return options_; }

 private:
  struct Hop;
  // Steps 1-3 above for one hop: the addresses to connect to.
  absl::StatusOr<std::vector<IpAddress>> Vet(const MediaUrl& url) const;
  // One GET of `url` connected to `addresses` (in order, the next on a
  // refused connection).
  absl::StatusOr<Hop> Get(const MediaUrl& url, const std::vector<IpAddress>& addresses,
                          absl::Time deadline) const;
  MediaFetcherOptions options_;
};

}  // namespace swaserve::api
