// Status propagation macros over absl::Status / absl::StatusOr.
//
//   RETURN_IF_ERROR(DoThing());                    // returns the error, if any
//   ASSIGN_OR_RETURN(auto file, OpenFile(path));   // unwraps or returns
//   return base::Annotate(status, "while parsing x");  // adds context
//
// Header-only; thread-compatible (no state).
#pragma once

#include <utility>

#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define SWASERVE_STATUS_CONCAT_INNER_(a, b) a##b
#define SWASERVE_STATUS_CONCAT_(a, b) SWASERVE_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    ::absl::Status swaserve_status_tmp_ = (expr);               \
    if (!swaserve_status_tmp_.ok()) return swaserve_status_tmp_; \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise move-assigns the value to `lhs`, which may
// be a declaration (`auto x`) or an existing variable.
#define ASSIGN_OR_RETURN(lhs, rexpr)                                        \
  SWASERVE_ASSIGN_OR_RETURN_IMPL_(                                          \
      SWASERVE_STATUS_CONCAT_(swaserve_statusor_, __LINE__), lhs, rexpr)

#define SWASERVE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = *std::move(statusor)

namespace swaserve::base {

// Returns `status` with `context` prepended to its message ("context: msg"),
// keeping the code. OK stays OK.
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

}  // namespace swaserve::base
