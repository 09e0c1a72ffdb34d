#include "lib/transfer/ucx_util.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "lib/base/clock.h"

namespace swaserve::transfer::internal {

int64_t NowNanos() { return base::MonotonicNanos(); }

int64_t DurationNanos(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

absl::Duration Since(int64_t start_ns) {
  return absl::Nanoseconds(NowNanos() - start_ns);
}

absl::Status FromUcs(ucs_status_t status, absl::string_view context) {
  const std::string message =
      absl::StrCat(context, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_OK:
      return absl::OkStatus();
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return absl::DeadlineExceededError(message);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_REJECTED:
      return absl::UnavailableError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_UNSUPPORTED:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status PeerError(ucs_status_t status, absl::string_view context) {
  const std::string message =
      absl::StrCat(context, ": ", ucs_status_string(status));
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(message);
  return absl::UnavailableError(message);
}

Transport TransportOfName(absl::string_view tl) {
  if (tl == "self") return Transport::kSelf;
  if (tl == "tcp") return Transport::kTcp;
  if (tl == "posix" || tl == "sysv" || tl == "cma" || tl == "xpmem" ||
      tl == "knem") {
    return Transport::kSharedMemory;
  }
  if (absl::StartsWith(tl, "rc") || absl::StartsWith(tl, "dc") ||
      absl::StartsWith(tl, "ud")) {
    return Transport::kRdma;
  }
  return Transport::kUnknown;
}

Transport TransportOfEpInfo(absl::string_view text) {
  Transport first = Transport::kUnknown;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StrContains(line, "lane[")) continue;
    const size_t colon = line.find(':', line.find("lane["));
    if (colon == absl::string_view::npos) continue;
    absl::string_view rest =
        absl::StripLeadingAsciiWhitespace(line.substr(colon + 1));
    const size_t tl_start = rest.find(':');
    const size_t tl_end = rest.find('/');
    if (tl_start == absl::string_view::npos ||
        tl_end == absl::string_view::npos || tl_end < tl_start) {
      continue;
    }
    const Transport t =
        TransportOfName(rest.substr(tl_start + 1, tl_end - tl_start - 1));
    if (first == Transport::kUnknown) first = t;
    for (absl::string_view word : absl::StrSplit(rest, ' ')) {
      if (word == "am") return t;
    }
  }
  return first;
}

Transport DetectTransport(ucp_ep_h ep) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return Transport::kUnknown;
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::string text(buffer, size);
  std::free(buffer);
  return TransportOfEpInfo(text);
}

bool MayUseSharedMemory(const std::string& option) {
  std::string tls = option;
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env == nullptr ? "all" : env;
  }
  if (tls.empty() || tls == "all" || absl::StartsWith(tls, "^")) return true;
  for (absl::string_view t : absl::StrSplit(tls, ',')) {
    if (t == "posix" || t == "sysv" || t == "shm" || t == "sm" || t == "mm" ||
        t == "all") {
      return true;
    }
  }
  return false;
}

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

}  // namespace swaserve::transfer::internal
