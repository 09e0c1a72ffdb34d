// UCX helpers of the transfer engine (internal to lib/transfer): status
// mapping, transport names, the UCX_TLS check for shared memory and the
// monotonic clock the engine's deadlines use. Includes UCX: never include
// this from a public header.
//
// Pure functions (DetectTransport asks UCX about one endpoint; call it on the
// thread that owns the endpoint's worker). Thread-safe otherwise.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lib/transfer/transfer_engine.h"

namespace swaserve::transfer::internal {

// The monotonic clock of every deadline (base::MonotonicNanos).
int64_t NowNanos();
int64_t DurationNanos(absl::Duration d);
absl::Duration Since(int64_t start_ns);

// Maps a UCX status to an absl::Status whose message is
// "<context>: <UCX's reason>": Cancelled, DeadlineExceeded (timeouts),
// Unavailable (unreachable, reset, not connected, I/O error, rejected),
// ResourceExhausted, InvalidArgument, Unimplemented, else Internal.
absl::Status FromUcs(ucs_status_t status, absl::string_view context);

// A failed request or endpoint: the peer or the path to it failed, whatever
// UCX's code (a reset tcp connection reports "Endpoint timeout"), so
// Unavailable — except a request we cancelled ourselves (Cancelled).
absl::Status PeerError(ucs_status_t status, absl::string_view context);

// The class of a UCX transport name ("tcp", "sysv", "rc_mlx5", ...).
Transport TransportOfName(absl::string_view tl);

// The transport of the active-message lane in the text ucp_ep_print_info
// writes (UCX 1.13 has no query for it); the first lane's when no lane says
// "am", kUnknown when no lane parses. Lines look like
//   "#  lane[0]:  3:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0"
Transport TransportOfEpInfo(absl::string_view text);
// TransportOfEpInfo of the endpoint's ucp_ep_print_info.
Transport DetectTransport(ucp_ep_h ep);

// Whether a UCX_TLS value (`option`, else the UCX_TLS environment variable,
// else "all") can select the posix/sysv transports; the engine sets
// MM_ERROR_HANDLING only then (UCX warns about settings no loaded transport
// uses).
bool MayUseSharedMemory(const std::string& option);

// 16 lower-case hex digits (engine ids in messages).
std::string Hex(uint64_t v);

}  // namespace swaserve::transfer::internal
