#include "lib/rpc/status_conversion.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"

namespace swaserve::rpc {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kMaxCode = 16;  // UNAUTHENTICATED, the largest canonical code.

struct Detail {
  std::string type_url;
  std::string value;
};

// google.rpc.Status { int32 code = 1; string message = 2;
//                     repeated google.protobuf.Any details = 3; }
// google.protobuf.Any { string type_url = 1; bytes value = 2; }
// Hand-encoded: Debian ships no google/rpc/status.proto, and generating our
// own copy could clash with a googleapis copy linked into the same binary.
std::string EncodeRpcStatus(int code, absl::string_view message,
                            const std::vector<Detail>& details) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    if (code != 0) WireFormatLite::WriteInt32(1, code, &coded);
    if (!message.empty()) {
      WireFormatLite::WriteString(2, std::string(message), &coded);
    }
    for (const Detail& detail : details) {
      std::string any;
      {
        google::protobuf::io::StringOutputStream any_stream(&any);
        google::protobuf::io::CodedOutputStream any_coded(&any_stream);
        WireFormatLite::WriteString(1, detail.type_url, &any_coded);
        WireFormatLite::WriteBytes(2, detail.value, &any_coded);
      }
      WireFormatLite::WriteBytes(3, any, &coded);
    }
  }
  return out;
}

// Reads one length-delimited field's contents.
bool ReadLengthDelimited(google::protobuf::io::CodedInputStream* input,
                         std::string* out) {
  uint32_t length = 0;
  return input->ReadVarint32(&length) &&
         input->ReadString(out, static_cast<int>(length));
}

bool DecodeAny(const std::string& bytes, Detail* detail) {
  google::protobuf::io::CodedInputStream input(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(bytes.size()));
  while (uint32_t tag = input.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto type = WireFormatLite::GetTagWireType(tag);
    if (field == 1 && type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!ReadLengthDelimited(&input, &detail->type_url)) return false;
    } else if (field == 2 &&
               type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!ReadLengthDelimited(&input, &detail->value)) return false;
    } else if (!WireFormatLite::SkipField(&input, tag)) {
      return false;
    }
  }
  return input.ConsumedEntireMessage();
}

// Decodes the `details` of a google.rpc.Status (code and message are taken
// from the grpc::Status itself, which is authoritative).
bool DecodeRpcStatusDetails(const std::string& bytes,
                            std::vector<Detail>* details) {
  google::protobuf::io::CodedInputStream input(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(bytes.size()));
  while (uint32_t tag = input.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto type = WireFormatLite::GetTagWireType(tag);
    if (field == 3 && type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      std::string any;
      Detail detail;
      if (!ReadLengthDelimited(&input, &any) || !DecodeAny(any, &detail)) {
        return false;
      }
      details->push_back(std::move(detail));
    } else if (!WireFormatLite::SkipField(&input, tag)) {
      return false;
    }
  }
  return input.ConsumedEntireMessage();
}

}  // namespace

grpc::StatusCode ToGrpcCode(absl::StatusCode code) {
  const int value = static_cast<int>(code);
  if (value < 0 || value > kMaxCode) return grpc::StatusCode::UNKNOWN;
  return static_cast<grpc::StatusCode>(value);
}

absl::StatusCode FromGrpcCode(grpc::StatusCode code) {
  const int value = static_cast<int>(code);
  if (value < 0 || value > kMaxCode) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(value);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const grpc::StatusCode code = ToGrpcCode(status.code());
  std::vector<Detail> details;
  status.ForEachPayload(
      [&](absl::string_view type_url, const absl::Cord& value) {
        details.push_back(Detail{std::string(type_url), std::string(value)});
      });
  if (details.empty()) {
    return grpc::Status(code, std::string(status.message()));
  }
  return grpc::Status(
      code, std::string(status.message()),
      EncodeRpcStatus(static_cast<int>(code), status.message(), details));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status result(FromGrpcCode(status.error_code()),
                      status.error_message());
  if (!status.error_details().empty()) {
    std::vector<Detail> details;
    if (DecodeRpcStatusDetails(status.error_details(), &details)) {
      for (Detail& detail : details) {
        result.SetPayload(detail.type_url, absl::Cord(std::move(detail.value)));
      }
    }
  }
  return result;
}

absl::Status WithErrorDetail(absl::Status status,
                             const v1::ErrorDetail& detail) {
  if (status.ok()) return status;
  status.SetPayload(kErrorDetailTypeUrl,
                    absl::Cord(detail.SerializeAsString()));
  return status;
}

std::optional<v1::ErrorDetail> GetErrorDetail(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrorDetailTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::ErrorDetail detail;
  if (!detail.ParseFromString(std::string(*payload))) return std::nullopt;
  return detail;
}

std::optional<v1::ErrorDetail> GetErrorDetail(const grpc::Status& status) {
  return GetErrorDetail(FromGrpcStatus(status));
}

v1::ErrorDetail MakeErrorDetail(v1::ErrorCode code, std::string message,
                                std::string worker_id, bool retryable) {
  v1::ErrorDetail detail;
  detail.set_code(code);
  detail.set_message(std::move(message));
  detail.set_worker_id(std::move(worker_id));
  detail.set_retryable(retryable);
  return detail;
}

absl::Status ErrorWithDetail(absl::StatusCode code, v1::ErrorCode error_code,
                             absl::string_view message,
                             absl::string_view worker_id, bool retryable) {
  return WithErrorDetail(absl::Status(code, message),
                         MakeErrorDetail(error_code, std::string(message),
                                         std::string(worker_id), retryable));
}

}  // namespace swaserve::rpc
