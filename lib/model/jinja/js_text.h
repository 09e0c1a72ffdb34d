// JavaScript string and number semantics over UTF-8, for the Jinja
// interpreter (lib/model/jinja/): chat templates are rendered byte for byte
// as @huggingface/jinja renders them, and that package works on JavaScript
// strings (UTF-16) and numbers (IEEE doubles). Internal to
// swaserve::model_text.
//
// All strings are valid UTF-8 (the interpreter checks its inputs). Known
// differences from JavaScript, all outside what chat templates do:
//   - case mapping uses Unicode's simple mappings (utf8proc) plus the common
//     special cases (ß, the Latin ligatures, ŉ -> uppercase; İ and a final Σ
//     -> lowercase); other multi-character mappings stay one character;
//   - a lone surrogate (from `s[i]` landing inside a non-BMP character, or a
//     `\uD83D` escape without its pair) becomes U+FFFD.
//
// Stateless functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace swaserve::model::jinja {

// JavaScript's \s and String.prototype.trim() set: U+0009..U+000D, U+0020,
// U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000,
// U+FEFF.
bool IsJsWhitespace(char32_t cp);

// The code point starting at byte `i` of `s` (valid UTF-8) and its length.
char32_t DecodeAt(absl::string_view s, size_t i, int* len);

// Byte range [begin, end) of `s` without leading (`start`) and/or trailing
// (`end`) JavaScript whitespace.
std::pair<size_t, size_t> JsTrimRange(absl::string_view s, bool start,
                                      bool end);

// Length in UTF-16 code units (JavaScript's .length).
size_t Utf16Length(absl::string_view s);

// Byte range of the character at UTF-16 index `index` (negative counts from
// the end, as String.prototype.at); false when out of range. An index that
// falls on the second half of a surrogate pair yields the whole character
// with *lone = true (JavaScript would return a lone surrogate).
bool Utf16At(absl::string_view s, int64_t index, size_t* begin, size_t* end,
             bool* lone);

// String.prototype.toUpperCase / toLowerCase (see the header comment).
std::string JsToUpper(absl::string_view s);
std::string JsToLower(absl::string_view s);
// The first UTF-16 unit upper-cased, the rest unchanged (charAt(0)
// .toUpperCase() + slice(1)); a non-BMP first character stays as it is.
std::string JsCapitalize(absl::string_view s);
// @huggingface/jinja's titleCase: /\b\w/g upper-cased (ASCII word
// characters only).
std::string JsTitle(absl::string_view s);

// Compares as JavaScript's < on strings does (UTF-16 code units): -1, 0, 1.
int CompareUtf16(absl::string_view a, absl::string_view b);

// String(number): shortest round-trip digits, exponent form below 1e-6 and
// from 1e21, "NaN", "Infinity", "-Infinity"; -0 prints as "0".
std::string JsNumberToString(double v);
// JSON.stringify(number): as JsNumberToString, with NaN and ±Infinity "null".
std::string JsNumberToJson(double v);
// @huggingface/jinja's FloatValue.toString(): "-0.0" for -0, integral values
// with one decimal ("3.0", via toFixed(1)), others as JsNumberToString.
std::string JsFloatToString(double v);

// parseInt(s, 10) and parseFloat(s): NaN when no number starts the string.
double JsParseInt(absl::string_view s);
double JsParseFloat(absl::string_view s);
// Number(s) (the abstract ToNumber of a string), for loose equality: NaN
// when `s` is not a numeric literal.
double JsStringToNumber(absl::string_view s);

// JSON.stringify(string), with `ensure_ascii` escaping every UTF-16 unit
// from U+007F as \uXXXX, as @huggingface/jinja's ensure_ascii does.
void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out);

}  // namespace swaserve::model::jinja
