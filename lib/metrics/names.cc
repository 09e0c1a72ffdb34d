#include "lib/metrics/names.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace swaserve::metrics {
namespace {

bool IsAsciiLetter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

absl::Status ValidateMetricName(absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError("metric name is empty");
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok =
        IsAsciiLetter(c) || c == '_' || c == ':' || (i > 0 && IsAsciiDigit(c));
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric name \"", name,
                       "\" does not match [a-zA-Z_:][a-zA-Z0-9_:]*"));
    }
  }
  if (absl::StartsWith(name, "__")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric name \"", name, "\" starts with the reserved prefix \"__\""));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelName(absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError("label name is empty");
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAsciiLetter(c) || c == '_' || (i > 0 && IsAsciiDigit(c));
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label name \"", name, "\" does not match [a-zA-Z_][a-zA-Z0-9_]*"));
    }
  }
  if (absl::StartsWith(name, "__")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "label name \"", name, "\" starts with the reserved prefix \"__\""));
  }
  return absl::OkStatus();
}

}  // namespace swaserve::metrics
