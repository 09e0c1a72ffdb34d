#include "lib/base/logging.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace swaserve::base {

absl::Status ParseLogLevel(absl::string_view name,
                           spdlog::level::level_enum* out) {
  static constexpr std::pair<absl::string_view, spdlog::level::level_enum>
      kLevels[] = {{"trace", spdlog::level::trace},
                   {"debug", spdlog::level::debug},
                   {"info", spdlog::level::info},
                   {"warn", spdlog::level::warn},
                   {"warning", spdlog::level::warn},
                   {"error", spdlog::level::err},
                   {"critical", spdlog::level::critical},
                   {"off", spdlog::level::off}};
  for (const auto& [n, level] : kLevels) {
    if (n == name) {
      *out = level;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown log level '", name,
      "' (expected trace, debug, info, warn, error, critical or off)"));
}

absl::Status InitLogging(const LoggingOptions& options) {
  std::string level_name = options.level;
  if (level_name.empty()) {
    const char* env = std::getenv(kLogLevelEnv);
    level_name = env != nullptr && *env != '\0' ? env : "info";
  }
  spdlog::level::level_enum level;
  absl::Status status = ParseLogLevel(level_name, &level);
  if (!status.ok()) return status;
  // Not registered by name, so InitLogging may be called more than once.
  auto logger = std::make_shared<spdlog::logger>(
      options.name, std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + options.name +
                      "] [%^%l%$] [%t] %v (%s:%#)");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace swaserve::base
