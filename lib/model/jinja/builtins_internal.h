// Helpers shared by builtins.cc and methods.cc (internal to the Jinja
// interpreter).
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "lib/model/jinja/value.h"

namespace swaserve::model::jinja {

// Numbers and booleans (booleans count as 0 / 1 in arithmetic).
inline bool IsNumericLike(const Value& v) {
  return v.is_number() || v.kind() == Kind::kBool;
}
inline double NumericValue(const Value& v) {
  return v.kind() == Kind::kBool ? (v.boolean() ? 1 : 0) : v.number();
}
// Values whose raw JavaScript value is an object (list, dict, function...).
bool IsObjectLike(const Value& v);
// JavaScript's === on the values' raw .value: numbers by value, strings by
// content, lists/dicts/functions by identity; none's raw value is undefined
// there, so none === undefined. (`in`, equalto.)
bool StrictEquals(const Value& a, const Value& b);

// `fn` applied to each run of bytes of one provenance (case mappings are
// per character, so this equals mapping the whole text).
Text MapRuns(const Text& t, std::string (*fn)(absl::string_view));
// JavaScript trimStart / trimEnd / trim.
Text TrimText(const Text& t, bool start, bool end);
// charAt(0).toUpperCase() + slice(1).
Text CapitalizeText(const Text& t);
// @huggingface/jinja's strftime_now: %Y %m %d %b %B %H %M %% of the local
// time (English month names).
std::string StrftimeNow(absl::string_view format);

}  // namespace swaserve::model::jinja
