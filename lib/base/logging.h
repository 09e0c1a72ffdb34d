// Process logging through spdlog. Call InitLogging once from main(); until
// then spdlog's default logger (info, stderr) is used. Logging from any thread
// is safe (spdlog's default logger is thread-safe).
//
//   SWA_LOG(info, "listening on {}", port);     // fmt-style formatting
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "spdlog/spdlog.h"

// Logs at `lvl` (trace, debug, info, warn, err, critical) with file:line.
#define SWA_LOG(lvl, ...)                                        \
  ::spdlog::default_logger_raw()->log(                           \
      ::spdlog::source_loc{__FILE__, __LINE__, SPDLOG_FUNCTION}, \
      ::spdlog::level::lvl, __VA_ARGS__)

namespace swaserve::base {

// Name of the environment variable read when no level is given.
inline constexpr char kLogLevelEnv[] = "SWASERVE_LOG_LEVEL";

struct LoggingOptions {
  // trace, debug, info, warn, error, critical or off. Empty: $SWASERVE_LOG_LEVEL,
  // else "info".
  std::string level;
  // Name shown in every line (the service: "router", "prefill", ...).
  std::string name = "swaserve";
};

// Configures the default logger: stderr, pattern
// "[2026-11-30 12:00:00.123] [router] [info] [tid] message (file.cc:42)".
// InvalidArgument (naming the value) for an unknown level.
absl::Status InitLogging(const LoggingOptions& options);

// Parses a level name; InvalidArgument naming the value when unknown.
absl::Status ParseLogLevel(absl::string_view name, spdlog::level::level_enum* out);

}  // namespace swaserve::base
