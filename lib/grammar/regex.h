// Internal to lib/grammar: a JSON Schema `pattern` (the subset listed in
// json_schema.h) as the content of a JSON string — the expression matches
// the JSON-escaped text of exactly the strings the pattern accepts (an
// unanchored side gets "any characters"). Not part of the module's
// interface.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/grammar/json_parts.h"

namespace swaserve::grammar {

// InvalidArgument naming the construct and its offset when the pattern is
// malformed or outside the subset, or a repetition bound exceeds
// parts->options().max_repetition.
absl::StatusOr<ExprId> PatternToStringBody(absl::string_view pattern, JsonParts* parts);

}  // namespace swaserve::grammar
