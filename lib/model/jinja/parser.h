// The Jinja parser: a port of @huggingface/jinja's parse() (same grammar,
// precedence and quirks), from lexer.h's tokens to ast.h's tree. Statements:
// {% if/elif/else %}, {% for x[, y] in expr [if cond] %}...{% else %},
// {% set x = ... %} / {% set a, b = ... %} / {% set ns.attr = ... %} /
// {% set x %}...{% endset %}, {% macro %}, {% call %}, {% filter %},
// {% break %}, {% continue %}. Expressions: literals (numbers, strings,
// lists, tuples, dicts), member access and slices, calls with keyword and
// * / ** arguments, filters, tests, `x if c else y`, not/and/or, in/not in,
// comparisons, + - ~ * / // % **.
// Internal to swaserve::model_text; stateless and thread-safe.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/model/jinja/ast.h"
#include "lib/model/jinja/lexer.h"

namespace swaserve::model::jinja {

// Nesting deeper than this (statements in statements, parentheses,
// operators) is rejected, bounding the recursion of parser and interpreter.
inline constexpr int kMaxParseDepth = 200;

// The program of `tokens` (from Tokenize(source)); InvalidArgument
// "line L, column C: ..." for a template the grammar does not accept.
absl::StatusOr<NodePtr> Parse(const std::vector<Token>& tokens,
                              absl::string_view source);

}  // namespace swaserve::model::jinja
