// Fuzzes where a media fetch may go (lib/api/media_url.h): the URL parser,
// redirect Location resolution, the domain allowlist and the address-range
// check. The input is a base URL, a newline, and a Location. Any input gives
// a URL or InvalidArgument, never a crash, a hang or a sanitizer report;
// what parses is normalised (lower-case host of host characters, a port in
// 1..65535, a target starting with '/' free of spaces and control bytes)
// and parses again to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "lib/api/media_url.h"

namespace {

using swaserve::api::MediaUrl;

void Check(const absl::StatusOr<MediaUrl>& u) {
  if (!u.ok()) {
    if (u.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return;
  }
  if (u->scheme != "http" && u->scheme != "https") std::abort();
  if (u->host.empty() || u->port < 1 || u->port > 65535) std::abort();
  if (u->target.empty() || u->target[0] != '/') std::abort();
  for (const char ch : u->target) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7F || c == '#') std::abort();
  }
  for (const char c : u->host) {
    if (c >= 'A' && c <= 'Z') std::abort();
  }
  const std::string text = u->ToString();
  absl::StatusOr<MediaUrl> again = swaserve::api::ParseMediaUrl(text);
  if (!again.ok() || again->ToString() != text) std::abort();
  // The range check takes any address the host may name.
  if (absl::StatusOr<swaserve::api::IpAddress> ip = swaserve::api::IpAddress::Parse(u->host);
      ip.ok()) {
    (void)swaserve::api::SpecialPurposeRange(*ip);
  }
  static const std::vector<std::string> kAllow = {"*.example.com", "media.test", "*."};
  (void)swaserve::api::HostAllowed(u->host, kAllow);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const absl::string_view base = in.substr(0, nl);
  const absl::string_view location = nl == absl::string_view::npos ? "" : in.substr(nl + 1);
  const absl::StatusOr<MediaUrl> b = swaserve::api::ParseMediaUrl(base);
  Check(b);
  if (b.ok()) Check(swaserve::api::ResolveRedirect(*b, location));
  // The Location alone, as a URL.
  Check(swaserve::api::ParseMediaUrl(location));
  return 0;
}
