// Printing values and tojson, as @huggingface/jinja's toString() and
// toJSON() do.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/jinja/interpreter.h"
#include "lib/model/jinja/js_text.h"

namespace swaserve::model::jinja {
namespace {

// tojson recursion bound: values nest at most max_value_depth when built, so
// only a namespace that contains itself gets here.
constexpr int kMaxJsonDepth = 512;
constexpr int kMaxIndent = 1024;

// A JSON string literal of `t`, untrusted when `t` has untrusted bytes.
void AppendJsonText(const Text& t, bool ensure_ascii, Text* out) {
  std::string s;
  AppendJsonString(t.str(), ensure_ascii, &s);
  if (t.any_untrusted()) {
    out->AppendUntrusted(s);
  } else {
    out->Append(s);
  }
}

// Approximates String.prototype.localeCompare (sort_keys): case-insensitive
// order first, then lowercase before uppercase.
bool LocaleLess(const Text& a, const Text& b) {
  const int c = CompareUtf16(JsToLower(a.str()), JsToLower(b.str()));
  if (c != 0) return c < 0;
  return CompareUtf16(a.str(), b.str()) > 0;
}

}  // namespace

absl::StatusOr<Text> Interpreter::Print(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
      return v.text();
    case Kind::kInt:
      return Text(JsNumberToString(v.number()));
    case Kind::kFloat:
      return Text(JsFloatToString(v.number()));
    case Kind::kBool:
      return Text(v.boolean() ? "true" : "false");
    case Kind::kNone:  // NullValue's .value is undefined in the JS runtime
    case Kind::kUndefined:
      return Text("undefined");
    case Kind::kFunction:
      return Error(pos_, "cannot print a function");
    default:
      return ToJson(v, JsonOptions(), /*undefined_as_null=*/false);
  }
}

absl::StatusOr<Text> Interpreter::RawString(const Value& v) {
  switch (v.kind()) {
    case Kind::kInt:
    case Kind::kFloat:
      return Text(JsNumberToString(v.number()));
    case Kind::kList:
    case Kind::kTuple: {
      Text out;
      bool first = true;
      for (const Value& item : v.items()) {
        if (!first) out.Append(",");
        first = false;
        ASSIGN_OR_RETURN(const Text t, Print(item));
        RETURN_IF_ERROR(CheckSize(pos_, out.size() + t.size()));
        out.Append(t);
      }
      return out;
    }
    case Kind::kDict:
    case Kind::kKwargs:
    case Kind::kNamespace:
      return Text("[object Map]");
    default:
      return Print(v);
  }
}

absl::StatusOr<Text> Interpreter::ToJson(const Value& v,
                                         const JsonOptions& options,
                                         bool undefined_as_null) {
  if (options.indent < 0 || options.indent > kMaxIndent) {
    return Error(pos_, absl::StrCat("tojson indent ", options.indent,
                                    " is out of range [0, ", kMaxIndent, "]"));
  }
  Text out;
  RETURN_IF_ERROR(AppendJson(v, options, 0, undefined_as_null, &out));
  RETURN_IF_ERROR(Produced(pos_, out.size(), out.size()));
  return out;
}

absl::Status Interpreter::AppendJson(const Value& v, const JsonOptions& options,
                                     int depth, bool undefined_as_null,
                                     Text* out) {
  if (depth > kMaxJsonDepth) {
    return Error(pos_, "tojson: the value contains itself");
  }
  if (out->size() > limits_.max_string_bytes) {
    return Error(pos_, "tojson: the result is over the string size limit");
  }
  switch (v.kind()) {
    case Kind::kNone:
      out->Append("null");
      return absl::OkStatus();
    case Kind::kUndefined:
      out->Append(undefined_as_null ? "null" : "undefined");
      return absl::OkStatus();
    case Kind::kInt:
    case Kind::kFloat:
      out->Append(JsNumberToJson(v.number()));
      return absl::OkStatus();
    case Kind::kBool:
      out->Append(v.boolean() ? "true" : "false");
      return absl::OkStatus();
    case Kind::kString:
      AppendJsonText(v.text(), options.ensure_ascii, out);
      return absl::OkStatus();
    case Kind::kList:
    case Kind::kDict:
    case Kind::kNamespace:
      break;
    default:
      return Error(pos_,
                   absl::StrCat("cannot convert a ", v.TypeName(), " to JSON"));
  }
  const int indent = options.indent;
  std::string item_sep = indent > 0 ? "," : ", ";
  std::string key_sep = ": ";
  if (options.separators.has_value()) {
    item_sep = options.separators->first;
    key_sep = options.separators->second;
  }
  const std::string unit(indent, ' ');
  std::string base = "\n";
  for (int i = 0; i < depth; ++i) base += unit;
  const std::string child = base + unit;
  if (v.kind() == Kind::kList) {
    const auto& items = v.items();
    out->Append("[");
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out->Append(item_sep);
      if (indent > 0) out->Append(child);
      RETURN_IF_ERROR(
          AppendJson(items[i], options, depth + 1, undefined_as_null, out));
    }
    if (indent > 0 && !items.empty()) out->Append(base);
    out->Append("]");
    return absl::OkStatus();
  }
  std::vector<const std::pair<Text, Value>*> entries;
  for (const auto& e : v.dict().entries) entries.push_back(&e);
  if (options.sort_keys) {
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto* a, const auto* b) {
                       return LocaleLess(a->first, b->first);
                     });
  }
  out->Append("{");
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) out->Append(item_sep);
    if (indent > 0) out->Append(child);
    AppendJsonText(entries[i]->first, options.ensure_ascii, out);
    out->Append(key_sep);
    RETURN_IF_ERROR(AppendJson(entries[i]->second, options, depth + 1,
                               undefined_as_null, out));
  }
  if (indent > 0 && !entries.empty()) out->Append(base);
  out->Append("}");
  return absl::OkStatus();
}

}  // namespace swaserve::model::jinja
