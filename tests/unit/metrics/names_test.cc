#include "lib/metrics/names.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ValidateMetricNameTest, AcceptsValidNames) {
  for (const char* name :
       {"swaserve_requests_total", "a", "_x", "job:rate5m", "A9_b:c", ":x"}) {
    EXPECT_TRUE(ValidateMetricName(name).ok()) << name;
  }
}

TEST(ValidateMetricNameTest, RejectsInvalidNames) {
  for (const char* name :
       {"", "9abc", "a-b", "a b", "a.b", "caf\xc3\xa9", "a{b}", "a\"b"}) {
    const absl::Status status = ValidateMetricName(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST(ValidateMetricNameTest, RejectsReservedPrefix) {
  const absl::Status status = ValidateMetricName("__name");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("reserved"));
  EXPECT_TRUE(ValidateMetricName("_single").ok());
}

TEST(ValidateLabelNameTest, AcceptsValidNames) {
  for (const char* name : {"model", "_x", "le", "A9_b"}) {
    EXPECT_TRUE(ValidateLabelName(name).ok()) << name;
  }
}

TEST(ValidateLabelNameTest, RejectsInvalidNames) {
  for (const char* name : {"", "9a", "a:b", "a-b", "a b", "__reserved"}) {
    EXPECT_EQ(ValidateLabelName(name).code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

}  // namespace
}  // namespace swaserve::metrics
