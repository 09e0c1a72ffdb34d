// Helpers shared by builtins.cc and methods.cc (internal to the Jinja
// interpreter).
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "lib/model/jinja/value.h"

namespace swaserve::model::jinja {

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
