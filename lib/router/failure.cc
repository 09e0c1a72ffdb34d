#include "lib/router/failure.h"

namespace swaserve::router {

std::string_view FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kRequest:
      return "request";
    case FailureKind::kOverload:
      return "overload";
    case FailureKind::kWorker:
      return "worker";
    case FailureKind::kCancelled:
      return "cancelled";
  }
  return "worker";
}

FailureKind ClassifyFailure(absl::StatusCode code,
                            const std::optional<v1::ErrorDetail>& detail,
                            bool self_cancelled) {
  if (self_cancelled) return FailureKind::kCancelled;
  if (code == absl::StatusCode::kOk)
    return FailureKind::kWorker;  // ended without an answer
  if (detail.has_value()) {
    switch (detail->code()) {
      case v1::ERROR_CODE_OVERLOADED:
      case v1::ERROR_CODE_EMBEDDINGS_UNAVAILABLE:  // the router re-encodes inline
        return FailureKind::kOverload;
      case v1::ERROR_CODE_PROMPT_TOO_LONG:
      case v1::ERROR_CODE_TOO_LARGE_FOR_WORKER:
      case v1::ERROR_CODE_INVALID_REQUEST:
      case v1::ERROR_CODE_UNKNOWN_MODEL:
        return FailureKind::kRequest;
      case v1::ERROR_CODE_DRAINING:
      case v1::ERROR_CODE_WORKER_LOST:
      case v1::ERROR_CODE_TRANSFER_FAILED:
      case v1::ERROR_CODE_NO_WORKERS:
        return FailureKind::kWorker;
      default:
        if (!detail->retryable()) return FailureKind::kRequest;
        break;
    }
  }
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kUnimplemented:
      return FailureKind::kRequest;
    case absl::StatusCode::kResourceExhausted:
      return FailureKind::kOverload;
    default:
      // Unavailable, Internal, Unknown, Aborted, DeadlineExceeded, DataLoss,
      // NotFound (a pending transfer the worker lost) and a Cancelled that
      // this router did not ask for (the server shut the call down).
      return FailureKind::kWorker;
  }
}

}  // namespace swaserve::router
