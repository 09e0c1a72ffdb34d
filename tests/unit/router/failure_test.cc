// The router's failure taxonomy (lib/router/failure.h): request errors never
// feed a breaker and are not retried; worker errors are both; overload is
// retried without blame; the router's own cancels are nobody's fault.
#include "lib/router/failure.h"

#include "gtest/gtest.h"

namespace swaserve::router {
namespace {

v1::ErrorDetail Detail(v1::ErrorCode code, bool retryable) {
  v1::ErrorDetail d;
  d.set_code(code);
  d.set_retryable(retryable);
  return d;
}

TEST(Failure, RequestErrorsFailFastWithoutBlame) {
  for (auto code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kOutOfRange,
        absl::StatusCode::kFailedPrecondition}) {
    const FailureKind k = ClassifyFailure(code, std::nullopt, false);
    EXPECT_EQ(k, FailureKind::kRequest) << absl::StatusCodeToString(code);
    EXPECT_FALSE(FeedsBreaker(k));
    EXPECT_FALSE(RetryElsewhere(k));
  }
  // A prompt too large for the worker's pools is RESOURCE_EXHAUSTED, but a
  // request error by its detail, not an overload.
  EXPECT_EQ(ClassifyFailure(absl::StatusCode::kResourceExhausted,
                            Detail(v1::ERROR_CODE_TOO_LARGE_FOR_WORKER, false),
                            false),
            FailureKind::kRequest);
  EXPECT_EQ(
      ClassifyFailure(absl::StatusCode::kOutOfRange,
                      Detail(v1::ERROR_CODE_PROMPT_TOO_LONG, false), false),
      FailureKind::kRequest);
  // Any non-retryable verdict of the worker.
  EXPECT_EQ(ClassifyFailure(absl::StatusCode::kInternal,
                            Detail(v1::ERROR_CODE_UNSPECIFIED, false), false),
            FailureKind::kRequest);
}

TEST(Failure, WorkerErrorsAreRetriedAndFeedTheBreaker) {
  for (auto code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kInternal,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted,
        absl::StatusCode::kUnknown, absl::StatusCode::kCancelled,
        absl::StatusCode::kNotFound}) {
    const FailureKind k = ClassifyFailure(code, std::nullopt, false);
    EXPECT_EQ(k, FailureKind::kWorker) << absl::StatusCodeToString(code);
    EXPECT_TRUE(FeedsBreaker(k));
    EXPECT_TRUE(RetryElsewhere(k));
  }
  EXPECT_EQ(ClassifyFailure(absl::StatusCode::kUnavailable,
                            Detail(v1::ERROR_CODE_DRAINING, true), false),
            FailureKind::kWorker);
  EXPECT_EQ(
      ClassifyFailure(absl::StatusCode::kDeadlineExceeded,
                      Detail(v1::ERROR_CODE_TRANSFER_FAILED, true), false),
      FailureKind::kWorker);
}

TEST(Failure, OverloadIsRetriedWithoutBlame) {
  const FailureKind k =
      ClassifyFailure(absl::StatusCode::kUnavailable,
                      Detail(v1::ERROR_CODE_OVERLOADED, true), false);
  EXPECT_EQ(k, FailureKind::kOverload);
  EXPECT_TRUE(RetryElsewhere(k));
  EXPECT_FALSE(FeedsBreaker(k));
  EXPECT_EQ(ClassifyFailure(absl::StatusCode::kResourceExhausted, std::nullopt,
                            false),
            FailureKind::kOverload);
}

TEST(Failure, OwnCancelIsNobodysFault) {
  const FailureKind k =
      ClassifyFailure(absl::StatusCode::kCancelled, std::nullopt, true);
  EXPECT_EQ(k, FailureKind::kCancelled);
  EXPECT_FALSE(FeedsBreaker(k));
  EXPECT_FALSE(RetryElsewhere(k));
}

}  // namespace
}  // namespace swaserve::router
