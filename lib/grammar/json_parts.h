// Internal to lib/grammar: the JSON building blocks the schema compiler,
// the pattern compiler and the tool-call grammars share — whitespace,
// strings (UTF-8, JSON escapes), numbers, any JSON value — as expressions of
// one Grammar. Not part of the module's interface.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/grammar/grammar.h"
#include "lib/grammar/json_schema.h"
#include "nlohmann/json.hpp"

namespace swaserve::grammar {

// Inclusive code point ranges.
using CodePointSet = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorted, merged, surrogates (U+D800..U+DFFF) removed.
CodePointSet Normalize(CodePointSet set);
// [0, 0x10FFFF] minus `set` (and minus surrogates).
CodePointSet Complement(const CodePointSet& set);

class JsonParts {
 public:
  JsonParts(Grammar* g, const JsonGrammarOptions& options) : g_(g), options_(options) {}

  Grammar& g() { return *g_; }
  const JsonGrammarOptions& options() const { return options_; }

  // Up to max_whitespace of [ \t\n\r].
  ExprId Ws();
  // The UTF-8 encodings of the code points in `set`.
  ExprId Utf8(const CodePointSet& set);
  // One code point of `set` as it is written inside a JSON string: itself,
  // or its escape for " \ and control characters.
  ExprId JsonChars(const CodePointSet& set);
  // Any one code point inside a JSON string (plain, or any escape).
  ExprId StringChar();
  // A JSON string of min..max code points (max: Grammar::kUnbounded).
  ExprId String(int min, int max);
  ExprId Integer();
  // The integers in [lo, hi] (an absent bound: the 16-digit limit of
  // Integer()), in canonical decimal. Requires lo <= hi when both are given.
  ExprId IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi);
  ExprId Number();
  ExprId Boolean();
  ExprId Null();
  // Rules matching any JSON value / object / array (created on first use).
  RuleId AnyValue();
  RuleId AnyObject();
  RuleId AnyArray();

 private:
  // Same-length decimal strings from lo to hi (lo <= hi).
  ExprId DigitsRange(const std::string& lo, const std::string& hi);
  // Non-negative magnitudes in [lo, hi], canonical (no leading zeros).
  ExprId MagnitudeRange(int64_t lo, int64_t hi);
  // Code points written as themselves inside a JSON string.
  CodePointSet PlainRanges() const;
  void MakeAnyRules();

  Grammar* g_;
  JsonGrammarOptions options_;
  ExprId string_char_ = -1;
  ExprId plain_string_ = -1;
  RuleId any_value_ = -1;
  RuleId any_object_ = -1;
  RuleId any_array_ = -1;
};

// The instances of a JSON Schema (the subset json_schema.h lists) as an
// expression of parts->g(); $refs resolve inside `schema`. InvalidArgument as
// JsonSchemaToGrammar.
absl::StatusOr<ExprId> AddJsonSchema(const nlohmann::ordered_json& schema, JsonParts* parts);

}  // namespace swaserve::grammar
