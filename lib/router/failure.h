// The router's failure taxonomy: one
// classification of a failed worker call, shared by every leg, so that
// request errors fail fast and never count against a worker, and worker
// errors are retried elsewhere and feed the circuit breakers.
//
//   kRequest   the request itself cannot succeed anywhere: invalid input,
//              prompt beyond the bucket or larger than the worker's KV
//              memory (ErrorDetail with retryable = false, or a request
//              status code such as INVALID_ARGUMENT / OUT_OF_RANGE). The
//              client gets the error (HTTP 400/413, gRPC INVALID_ARGUMENT /
//              RESOURCE_EXHAUSTED naming the limit); no breaker moves.
//   kOverload  the worker is healthy but full (ERROR_CODE_OVERLOADED, e.g.
//              its KV staging budget): retried on another worker; no
//              breaker moves.
//   kWorker    the worker is unreachable, crashed, timed out, cancelled the
//              call itself or is draining: retried elsewhere (or, mid-
//              stream, the request migrates); the failure feeds the
//              worker's breaker.
//   kCancelled this router cancelled the call (client gone, or the other
//              leg failed): nobody's fault.
//
// Pure functions of the status code and the worker's ErrorDetail, so they
// are tested without gRPC (tests/unit/router/failure_test.cc).
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::router {

enum class FailureKind { kRequest, kOverload, kWorker, kCancelled };

std::string_view FailureKindName(FailureKind kind);

// `self_cancelled`: this router had cancelled the call before it ended.
FailureKind ClassifyFailure(absl::StatusCode code,
                            const std::optional<v1::ErrorDetail>& detail,
                            bool self_cancelled);

// Whether the failure counts against the worker's circuit breaker.
inline bool FeedsBreaker(FailureKind k) { return k == FailureKind::kWorker; }
// Whether another worker may succeed where this one failed.
inline bool RetryElsewhere(FailureKind k) {
  return k == FailureKind::kWorker || k == FailureKind::kOverload;
}

}  // namespace swaserve::router
