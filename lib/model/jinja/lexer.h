// The Jinja lexer: a port of @huggingface/jinja's tokenize() with the options
// transformers uses (lstrip_blocks and trim_blocks on), so that whitespace is
// handled byte for byte as there:
//   - one trailing newline of the template is dropped;
//   - lstrip_blocks: spaces and tabs from the start of a line up to `{%`,
//     `{#` (or `{-`) are removed;
//   - trim_blocks: the newline right after `%}`, `#}` (or `-}`) is removed;
//   - transformers' `{% generation %}` / `{% endgeneration %}` tags are
//     removed (with the whitespace around them unless `-` is given);
//   - `{%-`, `{{-`, `{#-` strip the whitespace before the tag, `-%}`, `-}}`,
//     `-#}` the whitespace after it.
// Every token keeps the byte offset in the original template of its first
// character, for error messages. Internal to swaserve::model_text;
// stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swaserve::model::jinja {

enum class TokenType : uint8_t {
  kText,
  kNumeric,
  kString,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquare,
  kCloseSquare,
  kOpenCurly,
  kCloseCurly,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kExponent,        // **
  kComparison,      // < > <= >= == !=
  kUnary,           // a lone + or - before an operand
  kComment,
};

const char* TokenTypeName(TokenType t);

struct Token {
  TokenType type = TokenType::kText;
  std::string value;
  uint32_t pos = 0;  // byte offset in the original template
};

// Templates larger than this are rejected (InvalidArgument).
inline constexpr size_t kMaxTemplateBytes = 4 << 20;

// The tokens of `source` (valid UTF-8); InvalidArgument "line L, column C:
// ..." for what the lexer cannot read.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

// "line L, column C" (1-based; the column counts characters) of byte `pos`.
std::string DescribePosition(absl::string_view source, uint32_t pos);

}  // namespace swaserve::model::jinja
