#include "lib/base/logging.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::base {
namespace {

TEST(Logging, ParsesLevels) {
  spdlog::level::level_enum level;
  ASSERT_TRUE(ParseLogLevel("debug", &level).ok());
  EXPECT_EQ(level, spdlog::level::debug);
  ASSERT_TRUE(ParseLogLevel("warn", &level).ok());
  EXPECT_EQ(level, spdlog::level::warn);
  absl::Status s = ParseLogLevel("loud", &level);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("'loud'"));
}

TEST(Logging, LevelFromOptionThenEnvironment) {
  ASSERT_TRUE(InitLogging({.level = "error", .name = "t"}).ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::err);
  setenv(kLogLevelEnv, "debug", 1);
  ASSERT_TRUE(InitLogging({.level = "", .name = "t"}).ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  setenv(kLogLevelEnv, "bogus", 1);
  EXPECT_FALSE(InitLogging({.level = "", .name = "t"}).ok());
  unsetenv(kLogLevelEnv);
  ASSERT_TRUE(InitLogging({.level = "", .name = "t"}).ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::info);
}

TEST(Logging, MacroWritesWithSourceLocation) {
  ASSERT_TRUE(InitLogging({.level = "info", .name = "logtest"}).ok());
  testing::internal::CaptureStderr();
  SWA_LOG(info, "hello {}", 42);
  SWA_LOG(debug, "hidden");
  spdlog::default_logger()->flush();
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_THAT(out, ::testing::HasSubstr("[logtest]"));
  EXPECT_THAT(out, ::testing::HasSubstr("hello 42"));
  EXPECT_THAT(out, ::testing::HasSubstr("logging_test.cc:"));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("hidden")));
}

}  // namespace
}  // namespace swaserve::base
