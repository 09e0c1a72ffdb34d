#include "lib/rpc/status_conversion.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/any.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"

namespace swaserve::rpc {
namespace {

constexpr int kFirstErrorCode = 1;  // CANCELLED
constexpr int kLastErrorCode = 16;  // UNAUTHENTICATED

TEST(StatusConversionTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(StatusConversionTest, EveryCodeRoundTripsWithMessage) {
  for (int code = kFirstErrorCode; code <= kLastErrorCode; ++code) {
    SCOPED_TRACE(code);
    const std::string message = absl::StrCat("failure #", code, " ü\n:");
    const absl::Status original(static_cast<absl::StatusCode>(code), message);

    const grpc::Status wire = ToGrpcStatus(original);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), message);
    EXPECT_TRUE(wire.error_details().empty());

    const absl::Status back = FromGrpcStatus(wire);
    EXPECT_EQ(back, original);
  }
}

TEST(StatusConversionTest, EveryGrpcCodeRoundTrips) {
  for (int code = kFirstErrorCode; code <= kLastErrorCode; ++code) {
    SCOPED_TRACE(code);
    const grpc::Status original(static_cast<grpc::StatusCode>(code), "m");
    const grpc::Status back = ToGrpcStatus(FromGrpcStatus(original));
    EXPECT_EQ(back.error_code(), original.error_code());
    EXPECT_EQ(back.error_message(), "m");
  }
}

TEST(StatusConversionTest, CodeMappingsAgreeWithNames) {
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kDeadlineExceeded),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kUnavailable),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kResourceExhausted),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpcCode(grpc::StatusCode::CANCELLED),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(FromGrpcCode(grpc::StatusCode::UNAUTHENTICATED),
            absl::StatusCode::kUnauthenticated);
}

TEST(StatusConversionTest, OutOfRangeCodesBecomeUnknown) {
  EXPECT_EQ(ToGrpcCode(static_cast<absl::StatusCode>(42)),
            grpc::StatusCode::UNKNOWN);
  // 20: past the last code (16) yet a value grpc::StatusCode can hold (its
  // enumerators span -1..16, so 6 bits); 99 would be undefined behaviour
  // (clang's -fsanitize=enum rejects it), not something a peer can send.
  EXPECT_EQ(FromGrpcCode(static_cast<grpc::StatusCode>(20)),
            absl::StatusCode::kUnknown);
  const grpc::Status wire =
      ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "odd"));
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(wire.error_message(), "odd");
}

v1::ErrorDetail SampleDetail(int i) {
  return MakeErrorDetail(static_cast<v1::ErrorCode>(1 + i % 7),
                         absl::StrCat("detail ", i), absl::StrCat("w", i),
                         /*retryable=*/i % 2 == 0);
}

TEST(StatusConversionTest, ErrorDetailRoundTripsForEveryCode) {
  for (int code = kFirstErrorCode; code <= kLastErrorCode; ++code) {
    SCOPED_TRACE(code);
    const v1::ErrorDetail detail = SampleDetail(code);
    const absl::Status original = WithErrorDetail(
        absl::Status(static_cast<absl::StatusCode>(code), "with detail"),
        detail);

    const grpc::Status wire = ToGrpcStatus(original);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), "with detail");
    ASSERT_FALSE(wire.error_details().empty());

    const std::optional<v1::ErrorDetail> from_grpc = GetErrorDetail(wire);
    ASSERT_TRUE(from_grpc.has_value());
    EXPECT_EQ(from_grpc->SerializeAsString(), detail.SerializeAsString());

    const absl::Status back = FromGrpcStatus(wire);
    EXPECT_EQ(back.code(), original.code());
    EXPECT_EQ(back.message(), original.message());
    const std::optional<v1::ErrorDetail> from_absl = GetErrorDetail(back);
    ASSERT_TRUE(from_absl.has_value());
    EXPECT_EQ(from_absl->code(), detail.code());
    EXPECT_EQ(from_absl->message(), detail.message());
    EXPECT_EQ(from_absl->worker_id(), detail.worker_id());
    EXPECT_EQ(from_absl->retryable(), detail.retryable());
    EXPECT_EQ(back, original);  // payloads included
  }
}

TEST(StatusConversionTest, ErrorDetailsAreAStandardGoogleRpcStatus) {
  const v1::ErrorDetail detail = MakeErrorDetail(
      v1::ERROR_CODE_NO_WORKERS, "no prefill worker", "", /*retryable=*/true);
  const grpc::Status wire = ToGrpcStatus(WithErrorDetail(
      absl::UnavailableError("no workers for bucket 0"), detail));

  google::rpc::Status rich;
  ASSERT_TRUE(rich.ParseFromString(wire.error_details()));
  EXPECT_EQ(rich.code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(rich.message(), "no workers for bucket 0");
  ASSERT_EQ(rich.details_size(), 1);
  EXPECT_EQ(rich.details(0).type_url(), kErrorDetailTypeUrl);
  v1::ErrorDetail unpacked;
  ASSERT_TRUE(rich.details(0).UnpackTo(&unpacked));
  EXPECT_EQ(unpacked.code(), v1::ERROR_CODE_NO_WORKERS);
  EXPECT_TRUE(unpacked.retryable());
}

TEST(StatusConversionTest, ReadsRichStatusBuiltByOtherClients) {
  google::rpc::Status rich;
  rich.set_code(static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  rich.set_message("busy");
  rich.add_details()->PackFrom(
      MakeErrorDetail(v1::ERROR_CODE_OVERLOADED, "queue full", "prefill-3"));
  const grpc::Status wire(grpc::StatusCode::RESOURCE_EXHAUSTED, "busy",
                          rich.SerializeAsString());
  const std::optional<v1::ErrorDetail> detail = GetErrorDetail(wire);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_OVERLOADED);
  EXPECT_EQ(detail->worker_id(), "prefill-3");
}

TEST(StatusConversionTest, OtherPayloadsTravelToo) {
  absl::Status original = absl::AbortedError("conflict");
  original.SetPayload("type.googleapis.com/test.Custom",
                      absl::Cord("\x01\x02"));
  original = WithErrorDetail(original, SampleDetail(3));
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(original));
  EXPECT_EQ(back, original);
  ASSERT_TRUE(back.GetPayload("type.googleapis.com/test.Custom").has_value());
  EXPECT_EQ(*back.GetPayload("type.googleapis.com/test.Custom"), "\x01\x02");
}

TEST(StatusConversionTest, GarbageErrorDetailsAreIgnored) {
  const grpc::Status wire(grpc::StatusCode::INTERNAL, "broken",
                          std::string("\xff\xff\xff\xff", 4));
  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back, absl::InternalError("broken"));
  EXPECT_FALSE(GetErrorDetail(wire).has_value());
}

TEST(StatusConversionTest, NoDetailGivesNullopt) {
  EXPECT_FALSE(GetErrorDetail(absl::InternalError("x")).has_value());
  EXPECT_FALSE(GetErrorDetail(absl::OkStatus()).has_value());
  EXPECT_FALSE(GetErrorDetail(grpc::Status(grpc::StatusCode::INTERNAL, "x"))
                   .has_value());
}

TEST(StatusConversionTest, WithErrorDetailKeepsOkAndReplaces) {
  EXPECT_TRUE(WithErrorDetail(absl::OkStatus(), SampleDetail(1)).ok());
  absl::Status s = WithErrorDetail(absl::InternalError("x"), SampleDetail(1));
  s = WithErrorDetail(s, SampleDetail(2));
  EXPECT_EQ(GetErrorDetail(s)->message(), "detail 2");
}

TEST(StatusConversionTest, ErrorWithDetailFillsEverything) {
  const absl::Status s = ErrorWithDetail(
      absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_PROMPT_TOO_LONG,
      "prompt too long", "router-0", /*retryable=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "prompt too long");
  const auto detail = GetErrorDetail(ToGrpcStatus(s));
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_PROMPT_TOO_LONG);
  EXPECT_EQ(detail->message(), "prompt too long");
  EXPECT_EQ(detail->worker_id(), "router-0");
  EXPECT_FALSE(detail->retryable());
}

}  // namespace
}  // namespace swaserve::rpc
