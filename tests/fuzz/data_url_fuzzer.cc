// Fuzzes api::ParseDataUrl (lib/api/media_fetch.h), the parser of a request's
// inline media: any input gives the decoded bytes within the limit or
// InvalidArgument, never a crash, a hang or a sanitizer report; what decodes
// re-encodes to a URL that decodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "lib/api/media_fetch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  constexpr int64_t kMax = 4096;
  absl::StatusOr<swaserve::api::FetchedMedia> r = swaserve::api::ParseDataUrl(url, kMax);
  if (!r.ok()) {
    if (r.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (r->bytes.empty() || static_cast<int64_t>(r->bytes.size()) > kMax) std::abort();
  auto again = swaserve::api::ParseDataUrl(
      "data:" + r->mime_type + ";base64," + absl::Base64Escape(r->bytes), kMax);
  if (!again.ok() || again->bytes != r->bytes) std::abort();
  return 0;
}
