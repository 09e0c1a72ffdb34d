// Where a request's images, audio and video come from:
// OpenAI content parts carry either a data: URL (base64) or an http(s) URL the
// router fetches. Both are untrusted input, so both are bounded:
//
//   ParseDataUrl   data:[<mime>][;<param>]*;base64,<payload>: the payload is
//                  decoded (standard or URL-safe alphabet, padding optional);
//                  a data URL without ;base64, an empty or oversized payload,
//                  or invalid base64 is InvalidArgument naming the problem.
//   MediaFetcher   GET of an http(s) URL with a byte limit (checked against
//                  Content-Length and while receiving), an overall deadline,
//                  at most max_redirects redirects (each one's target checked
//                  again), and by default no loopback, private, link-local or
//                  unspecified addresses (the router must not become a proxy
//                  into the cluster's network): every address the host
//                  resolves to must be public. Every failure is
//                  InvalidArgument naming the URL and the reason ("returned
//                  HTTP 404", "more than N bytes", "timed out after", "too
//                  many redirects", "resolves to a private address") — the
//                  client's input was bad — except that Unavailable is never
//                  returned: a fetch is the client's responsibility.
//
// Thread-safety: ParseDataUrl is pure; a MediaFetcher is immutable and Fetch
// may be called from many threads.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

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
  // Allow hosts that resolve to loopback, private (RFC 1918, fc00::/7),
  // link-local or unspecified addresses. Default false; tests on loopback set
  // it.
  bool allow_private_addresses = false;
  // Allow plain http:// (https:// always). Default true.
  bool allow_http = true;
};

class MediaFetcher {
 public:
  explicit MediaFetcher(MediaFetcherOptions options) : options_(options) {}
  // A data: URL is parsed (ParseDataUrl); http(s) URLs are fetched.
  absl::StatusOr<FetchedMedia> Fetch(absl::string_view url) const;
  const MediaFetcherOptions& options() const { return options_; }

 private:
  MediaFetcherOptions options_;
};

}  // namespace swaserve::api
