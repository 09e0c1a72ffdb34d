// The one place where absl::Status and grpc::Status are converted into each
// other (docs/architecture.md#conventions). Modules below the services return absl::Status;
// reactors finish with ToGrpcStatus(status); clients turn a failed call back
// into absl::Status with FromGrpcStatus(status).
//
// Code and message are preserved exactly (the numeric values of
// absl::StatusCode and grpc::StatusCode are the same, 0..16; any other code
// becomes UNKNOWN). Payloads of the absl::Status travel in grpc::Status
// error_details, encoded as a google.rpc.Status whose `details` hold one
// google.protobuf.Any per payload (type_url = the payload's URL), which is the
// layout every gRPC language reads as "rich error details". A
// swaserve.v1.ErrorDetail is one such payload, under kErrorDetailTypeUrl:
//
//   return rpc::WithErrorDetail(absl::ResourceExhaustedError("busy"),
//                               MakeErrorDetail(v1::ERROR_CODE_OVERLOADED,
//                                               "queue full", id, true));
//   ...
//   absl::Status s = rpc::FromGrpcStatus(call_status);
//   if (auto detail = rpc::GetErrorDetail(s); detail && detail->retryable())
//
// Free functions, no state: thread-safe.
#pragma once

#include <grpcpp/support/status.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::rpc {

// The absl::Status payload URL (and Any type_url) of a swaserve.v1.ErrorDetail.
inline constexpr char kErrorDetailTypeUrl[] =
    "type.googleapis.com/swaserve.v1.ErrorDetail";

// absl -> gRPC. OK maps to grpc::Status::OK (message and payloads dropped, as
// gRPC does not carry them for OK).
grpc::Status ToGrpcStatus(const absl::Status& status);

// gRPC -> absl. Restores the payloads found in error_details; error_details
// that do not parse as google.rpc.Status are ignored (code and message are
// still converted).
absl::Status FromGrpcStatus(const grpc::Status& status);

// Code conversions (values outside 0..16 become UNKNOWN).
grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

// Returns `status` with `detail` attached as its kErrorDetailTypeUrl payload
// (replacing an earlier one). OK stays OK without a payload.
absl::Status WithErrorDetail(absl::Status status,
                             const v1::ErrorDetail& detail);

// The ErrorDetail attached to `status`, if any (and if it parses).
std::optional<v1::ErrorDetail> GetErrorDetail(const absl::Status& status);
std::optional<v1::ErrorDetail> GetErrorDetail(const grpc::Status& status);

// Builds an ErrorDetail.
v1::ErrorDetail MakeErrorDetail(v1::ErrorCode code, std::string message,
                                std::string worker_id = "",
                                bool retryable = false);

// Convenience: an absl::Status of `code` and `message` carrying an
// ErrorDetail {error_code, message, worker_id, retryable}.
absl::Status ErrorWithDetail(absl::StatusCode code, v1::ErrorCode error_code,
                             absl::string_view message,
                             absl::string_view worker_id = "",
                             bool retryable = false);

}  // namespace swaserve::rpc
