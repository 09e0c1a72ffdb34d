// JSON Schema and json_object as grammars (grammar.h), and the one-call
// compilers the serving path uses.
//
// Supported keywords (anything else that constrains is InvalidArgument naming
// the keyword and where it is, e.g. "JSON Schema at /properties/age:
// unsupported JSON Schema keyword 'minimum'" — never silently ignored):
//   type             "object" "array" "string" "number" "integer" "boolean"
//                    "null", or a list of them
//   properties, required, additionalProperties (false, true or absent)
//                    Properties are written in the schema's order; required
//                    ones always, optional ones may be left out. Declared
//                    properties only: extra keys are never generated (every
//                    output still validates). An object without
//                    `properties` is any JSON object.
//   items, minItems, maxItems      (an array without `items`: any values)
//   enum, const      any JSON values, written compactly (with `type`: only
//                    the values of those types)
//   anyOf, oneOf     alternatives. oneOf is generated as anyOf: when two
//                    branches accept the same instance the output can match
//                    both (keep oneOf branches disjoint, e.g. by type)
//   allOf            with exactly one schema
//   $ref, $defs, definitions       "#", "#/$defs/NAME", "#/definitions/NAME"
//                    (JSON Pointer, ~0 ~1 escapes); recursion is allowed.
//                    $ref, anyOf/oneOf and allOf stand alone: beside another
//                    constraining keyword they are InvalidArgument
//   minLength, maxLength           in code points (each \uXXXX escape is one:
//                    surrogate escapes are not generated)
//   pattern          a regular-expression subset, found anywhere in the
//                    value unless anchored with ^ and $ (as JSON Schema
//                    does; "^a|b$" is taken as ^(a|b)$, a subset of what it
//                    accepts). Constructs:
//                    literals, ., [...] and [^...] with ranges, \d \w \s \D
//                    \W \S, escapes \. \\ \/ \- \n \t \r \f \v \uXXXX,
//                    groups ( ) and (?: ), |, * + ? {n} {n,} {n,m} (lazy
//                    forms allowed: same language), ^ only at the start and
//                    $ only at the end. No backreferences, lookaround, \b,
//                    named groups or flags. Not with minLength/maxLength.
//   format           "date-time", "date", "time", "uuid" (RFC 3339 as ajv-formats
//                    checks it; dates up to day 28 in February)
//   minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers)
//                    on integers; a bounded "number" is generated as an
//                    integer within its bounds
//   Annotations ignored as they constrain nothing: title, description,
//   default, examples, $schema, $id, $comment, deprecated, readOnly,
//   writeOnly. Not supported (an error), among others: multipleOf,
//   prefixItems, uniqueItems,
//   contains, patternProperties, propertyNames, min/maxProperties,
//   dependentRequired, if/then/else, not, additionalProperties as a schema,
//   $ref outside the document.
//
// Numbers: integers up to 16 digits; numbers -?int(.frac{1,16})?(e[+-]?d{1,2})?
// so that every value is a finite double. Strings: valid UTF-8, control
// characters escaped, escapes \" \\ \/ \b \f \n \r \t \uXXXX (not a
// surrogate).
//
// Whitespace policy (JsonGrammarOptions::max_whitespace): between JSON
// tokens — after { [ , : and before } ] , : — at most max_whitespace
// characters of [ \t\n\r]; 0 gives compact JSON; none before or after the
// whole value. Bounded so a model cannot stall in whitespace forever, large
// enough for pretty-printed output.
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/grammar/compiled_grammar.h"
#include "lib/grammar/grammar.h"

namespace swaserve::grammar {

struct JsonGrammarOptions {
  // Whitespace characters allowed at each place JSON allows them. Default 16.
  int max_whitespace = 16;
  // maxLength / maxItems / repetition bounds above this are InvalidArgument
  // (each unit unrolls into automaton states). Default 4,096.
  int max_repetition = 4096;
  // Strings never contain "<" unescaped: it is written as \u003C. For JSON
  // inside markup (a tool call's arguments) that must not close the call's
  // tag early. Default false.
  bool escape_angle_bracket = false;
  CompiledGrammarOptions compile;
};

// The grammar of the instances of `schema_json` (JSON text). InvalidArgument
// for malformed JSON, unsupported keywords or values, and unresolvable $ref.
absl::StatusOr<Grammar> JsonSchemaToGrammar(absl::string_view schema_json,
                                            const JsonGrammarOptions& options = {});
// The grammar of any JSON object (response_format json_object).
Grammar JsonObjectGrammar(const JsonGrammarOptions& options = {});

// JsonSchemaToGrammar + CompiledGrammar::Compile.
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonSchema(
    absl::string_view schema_json, std::shared_ptr<const TokenVocabulary> vocab,
    const JsonGrammarOptions& options = {});
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonObject(
    std::shared_ptr<const TokenVocabulary> vocab, const JsonGrammarOptions& options = {});

}  // namespace swaserve::grammar
