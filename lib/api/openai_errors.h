// OpenAI's error objects for the router's HTTP API: the ApiError the HTTP
// layer returns (status code + OpenAI's error JSON), the constructors of the
// common ones, and the mapping of absl::Status and the router's ErrorDetail
// to them. Part of swaserve::api; openai.h includes this header.
//
// All functions are pure, thread-safe and never throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::api {

// An error as the HTTP layer returns it: status code plus OpenAI's error
// object. `param` and `code` are optional (empty: JSON null).
struct ApiError {
  int http_status = 400;
  // "invalid_request_error" (400, 404, 413), "authentication_error" (401),
  // "rate_limit_error" or "server_overloaded" (429), "service_unavailable"
  // (503), "server_error" (500).
  std::string type;
  std::string message;
  // The request field at fault, e.g. "max_tokens" or "messages[2].role".
  std::string param;
  // Machine-readable code, e.g. "model_not_found", "invalid_api_key".
  std::string code;
  // 429: when to retry, in milliseconds (the HTTP layer sends Retry-After in
  // whole seconds, rounded up, and retry-after-ms, which OpenAI's clients
  // read first); 0: no header.
  uint32_t retry_after_ms = 0;
};

// {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}.
std::string ErrorJson(const ApiError& error);

// Constructors for the common errors.
ApiError InvalidRequestError(std::string message, std::string param = {},
                             std::string code = {});  // 400
ApiError ModelNotFoundError(std::string_view model);  // 404, model_not_found
ApiError PayloadTooLargeError(size_t limit_bytes);    // 413
ApiError AuthenticationError(std::string message);    // 401, invalid_api_key
// 429 rate_limit_error, code rate_limit_exceeded: the key's concurrency limit.
ApiError RateLimitError(std::string message);
// 429 server_overloaded: every worker is at its limit; retry later.
ApiError OverloadedError(std::string message);
ApiError ServiceUnavailableError(std::string message);  // 503
ApiError ServerError(std::string message);              // 500

// Maps an absl::Status (e.g. from the router core or ApiKeyStore::Authorize)
// to an ApiError: InvalidArgument/OutOfRange/FailedPrecondition 400,
// NotFound 404, Unauthenticated 401, PermissionDenied 403,
// ResourceExhausted 429 (server_overloaded), Unavailable/DeadlineExceeded
// 503, everything else 500. `status` must not be OK (OK gives a 500).
ApiError ApiErrorFromStatus(const absl::Status& status);

// Maps the router's ErrorDetail (the cause of a failed Generate) to an
// ApiError: PROMPT_TOO_LONG 400 context_length_exceeded, OVERLOADED 429
// (with the detail's retry_after_ms),
// NO_WORKERS / TRANSFER_FAILED / WORKER_LOST 503, UNKNOWN_MODEL 404,
// INVALID_REQUEST 400, UNSPECIFIED 500.
ApiError ApiErrorFromDetail(const swaserve::v1::ErrorDetail& detail);

}  // namespace swaserve::api
