#include "lib/base/status.h"

#include <memory>

#include "gtest/gtest.h"

namespace swaserve::base {
namespace {

absl::Status Fails() { return absl::NotFoundError("gone"); }
absl::StatusOr<std::unique_ptr<int>> Value(bool ok) {
  if (!ok) return absl::InvalidArgumentError("bad");
  return std::make_unique<int>(7);
}

absl::Status UsesReturnIfError(bool fail, int* reached) {
  RETURN_IF_ERROR(fail ? Fails() : absl::OkStatus());
  *reached = 1;
  return absl::OkStatus();
}

absl::StatusOr<int> UsesAssignOrReturn(bool ok) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> v, Value(ok));  // move-only type
  int x = 0;
  ASSIGN_OR_RETURN(auto w, Value(ok));  // two in one scope
  x = *v + *w;
  return x;
}

TEST(StatusMacros, ReturnIfErrorPropagates) {
  int reached = 0;
  EXPECT_EQ(UsesReturnIfError(true, &reached).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(UsesReturnIfError(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacros, AssignOrReturnUnwrapsOrReturns) {
  EXPECT_EQ(*UsesAssignOrReturn(true), 14);
  absl::StatusOr<int> r = UsesAssignOrReturn(false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "bad");
}

TEST(StatusMacros, AnnotateKeepsCodeAndPrependsContext) {
  absl::Status s = Annotate(absl::NotFoundError("x"), "loading y");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "loading y: x");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ctx").ok());
}

}  // namespace
}  // namespace swaserve::base
