#include "lib/api/openai_errors.h"

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "lib/api/openai_json.h"
#include "nlohmann/json.hpp"
#include "swaserve/v1/common.pb.h"

namespace swaserve::api {

namespace v1 = ::swaserve::v1;
using openai_internal::Cat;
using openai_internal::Dump;
using openai_internal::ojson;
using openai_internal::Shorten;

std::string ErrorJson(const ApiError& error) {
  ojson e;
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? ojson(nullptr) : ojson(error.param);
  e["code"] = error.code.empty() ? ojson(nullptr) : ojson(error.code);
  ojson j;
  j["error"] = std::move(e);
  return Dump(j);
}

ApiError InvalidRequestError(std::string message, std::string param,
                             std::string code) {
  return ApiError{400, "invalid_request_error", std::move(message),
                  std::move(param), std::move(code)};
}

ApiError ModelNotFoundError(std::string_view model) {
  return ApiError{404, "invalid_request_error",
                  Cat({"The model '", Shorten(model, 256),
                       "' does not exist or is not served here."}),
                  "model", "model_not_found"};
}

ApiError PayloadTooLargeError(size_t limit_bytes) {
  return ApiError{413, "invalid_request_error",
                  limit_bytes == 0
                      ? std::string("The request body is too large.")
                      : Cat({"The request body is larger than ",
                             std::to_string(limit_bytes), " bytes."}),
                  "", "request_too_large"};
}

ApiError AuthenticationError(std::string message) {
  return ApiError{401, "authentication_error", std::move(message), "",
                  "invalid_api_key"};
}

ApiError RateLimitError(std::string message) {
  return ApiError{429, "rate_limit_error", std::move(message), "",
                  "rate_limit_exceeded"};
}

ApiError OverloadedError(std::string message) {
  return ApiError{429, "server_overloaded", std::move(message), "",
                  "server_overloaded"};
}

ApiError ServiceUnavailableError(std::string message) {
  return ApiError{503, "service_unavailable", std::move(message), "", ""};
}

ApiError ServerError(std::string message) {
  return ApiError{500, "server_error", std::move(message), "", ""};
}

ApiError ApiErrorFromStatus(const absl::Status& status) {
  std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return InvalidRequestError(std::move(message));
    case absl::StatusCode::kNotFound:
      return ApiError{404, "invalid_request_error", std::move(message), "",
                      "not_found"};
    case absl::StatusCode::kUnauthenticated:
      return AuthenticationError(std::move(message));
    case absl::StatusCode::kPermissionDenied:
      return ApiError{403, "permission_error", std::move(message), "", ""};
    case absl::StatusCode::kResourceExhausted:
      return OverloadedError(std::move(message));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return ServiceUnavailableError(std::move(message));
    default:
      if (message.empty()) message = "Internal server error.";
      return ServerError(std::move(message));
  }
}

ApiError ApiErrorFromDetail(const v1::ErrorDetail& detail) {
  std::string message = detail.message();
  switch (detail.code()) {
    case v1::ERROR_CODE_PROMPT_TOO_LONG:
      return InvalidRequestError(std::move(message), "",
                                 "context_length_exceeded");
    case v1::ERROR_CODE_OVERLOADED: {
      ApiError e = OverloadedError(std::move(message));
      e.retry_after_ms = detail.retry_after_ms();
      return e;
    }
    case v1::ERROR_CODE_NO_WORKERS:
    case v1::ERROR_CODE_TRANSFER_FAILED:
    case v1::ERROR_CODE_WORKER_LOST:
      return ServiceUnavailableError(std::move(message));
    case v1::ERROR_CODE_UNKNOWN_MODEL:
      return ApiError{404, "invalid_request_error", std::move(message), "model",
                      "model_not_found"};
    case v1::ERROR_CODE_INVALID_REQUEST:
      return InvalidRequestError(std::move(message));
    default:
      if (message.empty()) message = "Internal server error.";
      return ServerError(std::move(message));
  }
}

}  // namespace swaserve::api
