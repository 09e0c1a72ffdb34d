// Members of strings, lists and dicts (`s.split(...)`, `d.items()`, ...), as
// @huggingface/jinja's StringValue / ArrayValue / ObjectValue builtins.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/jinja/builtins_internal.h"
#include "lib/model/jinja/interpreter.h"
#include "lib/model/jinja/js_text.h"

namespace swaserve::model::jinja {

Text MapRuns(const Text& t, std::string (*fn)(absl::string_view)) {
  Text out;
  const std::string& s = t.str();
  size_t pos = 0;
  for (const ByteRange& r : t.untrusted()) {
    if (r.begin > pos)
      out.Append(fn(absl::string_view(s).substr(pos, r.begin - pos)));
    out.AppendUntrusted(
        fn(absl::string_view(s).substr(r.begin, r.end - r.begin)));
    pos = r.end;
  }
  if (pos < s.size()) out.Append(fn(absl::string_view(s).substr(pos)));
  return out;
}

Text TrimText(const Text& t, bool start, bool end) {
  const auto [b, e] = JsTrimRange(t.str(), start, end);
  return t.Substr(b, e);
}

Text CapitalizeText(const Text& t) {
  if (t.empty()) return t;
  int len;
  if (DecodeAt(t.str(), 0, &len) >= 0x10000) return t;
  Text out = MapRuns(t.Substr(0, len), &JsToUpper);
  out.AppendRange(t, len, t.size());
  return out;
}

namespace {

bool Matches(const Text& t, const Value& pattern, bool prefix) {
  const std::string& s = t.str();
  const std::string& p = pattern.text().str();
  if (p.size() > s.size()) return false;
  return prefix ? s.compare(0, p.size(), p) == 0
                : s.compare(s.size() - p.size(), p.size(), p) == 0;
}

}  // namespace

absl::StatusOr<Value> Interpreter::StringMethod(const Value& self,
                                                absl::string_view name) {
  const Text& t = self.text();
  if (name == "length") {
    return Value::Int(static_cast<double>(Utf16Length(t.str())));
  }
  auto make = [&](auto body) {
    return Value::Fn(
        std::string(name),
        [self, body](std::vector<Value>& args, Env*) -> absl::StatusOr<Value> {
          return body(self.text(), args);
        });
  };
  using Args = std::vector<Value>;
  if (name == "upper" || name == "lower") {
    const bool upper = name == "upper";
    return make([this, upper](const Text& s, Args&) {
      return MakeString(pos_, MapRuns(s, upper ? &JsToUpper : &JsToLower));
    });
  }
  if (name == "title") {
    return make([this](const Text& s, Args&) {
      return MakeString(pos_, s.SameSpans(JsTitle(s.str())));
    });
  }
  if (name == "capitalize") {
    return make([this](const Text& s, Args&) {
      return MakeString(pos_, CapitalizeText(s));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    // As in @huggingface/jinja, the argument (characters to strip) is
    // ignored: JavaScript whitespace is stripped.
    const bool start = name != "rstrip";
    const bool end = name != "lstrip";
    return make([start, end](const Text& s, Args&) -> absl::StatusOr<Value> {
      return Value::Str(TrimText(s, start, end));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    const std::string fname(name);
    return make([this, prefix, fname](const Text& s,
                                      Args& args) -> absl::StatusOr<Value> {
      if (args.empty()) {
        return Error(pos_, absl::StrCat(fname, "() needs an argument"));
      }
      const Value& p = args[0];
      if (p.is_string()) return Value::Bool(Matches(s, p, prefix));
      if (p.is_list_like()) {
        for (const Value& item : p.items()) {
          if (!item.is_string()) {
            return Error(pos_, absl::StrCat(fname,
                                            "(): the tuple must hold "
                                            "strings"));
          }
          if (Matches(s, item, prefix)) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      return Error(pos_, absl::StrCat(fname,
                                      "() takes a string or a tuple of "
                                      "strings, not a ",
                                      p.TypeName()));
    });
  }
  if (name == "split") {
    return make([this](const Text& s, Args& args) { return Split(s, args); });
  }
  if (name == "replace") {
    return make([this](const Text& s, Args& args) { return Replace(s, args); });
  }
  return Value();
}

absl::StatusOr<Value> Interpreter::Split(const Text& t,
                                         std::vector<Value>& args) {
  const Value sep = args.size() > 0 ? args[0] : Value::None();
  if (!sep.is_string() && !sep.is_none()) {
    return Error(pos_, "split(): the separator must be a string or none");
  }
  const Value maxsplit_v = args.size() > 1 ? args[1] : Value::Int(-1);
  if (maxsplit_v.kind() != Kind::kInt) {
    return Error(pos_, "split(): maxsplit must be an integer");
  }
  const double maxsplit = maxsplit_v.number();
  const std::string& s = t.str();
  std::vector<Value> parts;
  if (sep.is_none()) {
    size_t i = JsTrimRange(s, true, false).first;
    while (i < s.size()) {
      const size_t start = i;
      while (i < s.size()) {
        int len;
        if (IsJsWhitespace(DecodeAt(s, i, &len))) break;
        i += len;
      }
      if (maxsplit != -1 && static_cast<double>(parts.size()) >= maxsplit) {
        parts.push_back(Value::Str(t.Substr(start, s.size())));
        break;
      }
      parts.push_back(Value::Str(t.Substr(start, i)));
      while (i < s.size()) {
        int len;
        if (!IsJsWhitespace(DecodeAt(s, i, &len))) break;
        i += len;
      }
    }
  } else {
    const std::string& p = sep.text().str();
    if (p.empty()) return Error(pos_, "split(): empty separator");
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t start = 0;
    while (true) {
      const size_t at = s.find(p, start);
      if (at == std::string::npos) break;
      ranges.emplace_back(start, at);
      start = at + p.size();
      if (ranges.size() > limits_.max_list_items) break;
    }
    ranges.emplace_back(start, s.size());
    if (maxsplit != -1 && static_cast<double>(ranges.size()) > maxsplit) {
      // result.push(result.splice(maxsplit).join(sep)), splice's negative
      // start counting from the end.
      const double n = static_cast<double>(ranges.size());
      double from = maxsplit < 0 ? std::max(n + maxsplit, 0.0) : maxsplit;
      const size_t k = static_cast<size_t>(from);
      const size_t joined_begin = ranges[k].first;
      ranges.resize(k);
      ranges.emplace_back(joined_begin, s.size());
    }
    for (const auto& [b, e] : ranges)
      parts.push_back(Value::Str(t.Substr(b, e)));
  }
  return MakeList(pos_, std::move(parts));
}

absl::StatusOr<Value> Interpreter::Replace(const Text& t,
                                           std::vector<Value>& args) {
  if (args.size() < 2) return Error(pos_, "replace() needs two arguments");
  const Value& from = args[0];
  const Value& to = args[1];
  if (!from.is_string() || !to.is_string()) {
    return Error(pos_, "replace(): the arguments must be strings");
  }
  Value count = Value::None();
  if (args.size() > 2) {
    if (args[2].kind() == Kind::kKwargs) {
      const Value* c = args[2].dict().Find("count");
      count = c != nullptr ? *c : Value::None();
    } else {
      count = args[2];
    }
  }
  if (count.kind() != Kind::kInt && !count.is_none()) {
    return Error(pos_, "replace(): count must be an integer or none");
  }
  if (count.kind() == Kind::kInt && count.number() == 0) return Value::Str(t);
  double remaining = count.is_none() || count.number() < 0
                         ? std::numeric_limits<double>::infinity()
                         : count.number();
  const std::string& s = t.str();
  const std::string& p = from.text().str();
  const Text& with = to.text();
  Text out;
  size_t pos = 0;
  if (p.empty()) {
    // /(?=)/gu: before every character and at the end.
    size_t i = 0;
    while (true) {
      if (remaining > 0) {
        out.Append(with);
        --remaining;
      }
      if (i >= s.size()) break;
      int len;
      DecodeAt(s, i, &len);
      out.AppendRange(t, i, i + len);
      i += len;
      RETURN_IF_ERROR(CheckSize(pos_, out.size()));
    }
    return MakeString(pos_, std::move(out));
  }
  while (remaining > 0) {
    const size_t at = s.find(p, pos);
    if (at == std::string::npos) break;
    out.AppendRange(t, pos, at);
    out.Append(with);
    RETURN_IF_ERROR(CheckSize(pos_, out.size()));
    pos = at + p.size();
    --remaining;
  }
  out.AppendRange(t, pos, s.size());
  return MakeString(pos_, std::move(out));
}

absl::StatusOr<Value> Interpreter::DictMethod(const Value& self,
                                              absl::string_view name) {
  if (name == "get") {
    return Value::Fn(
        "get",
        [this, self](std::vector<Value>& args, Env*) -> absl::StatusOr<Value> {
          if (args.empty() || !args[0].is_string()) {
            return Error(
                pos_,
                absl::StrCat("get(): the key must be a string, got ",
                             args.empty() ? "nothing" : args[0].TypeName()));
          }
          if (const Value* v = self.dict().Find(args[0].text().str()))
            return *v;
          return args.size() > 1 ? args[1] : Value::None();
        });
  }
  if (name == "items" || name == "keys" || name == "values") {
    const std::string what(name);
    return Value::Fn(
        what,
        [this, self, what](std::vector<Value>&, Env*) -> absl::StatusOr<Value> {
          return DictView(self, what);
        });
  }
  if (name == "dictsort") {
    return Value::Fn("dictsort", [this, self](std::vector<Value>& args, Env*) {
      return DictSort(self, args);
    });
  }
  return Value();
}

absl::StatusOr<Value> Interpreter::DictView(const Value& self,
                                            absl::string_view what) {
  std::vector<Value> out;
  out.reserve(self.dict().size());
  for (const auto& [key, value] : self.dict().entries) {
    if (what == "keys") {
      out.push_back(Value::Str(key));
    } else if (what == "values") {
      out.push_back(value);
    } else {
      ASSIGN_OR_RETURN(Value pair, MakeList(pos_, {Value::Str(key), value}));
      out.push_back(std::move(pair));
    }
  }
  return MakeList(pos_, std::move(out));
}

absl::StatusOr<Value> Interpreter::DictSort(const Value& self,
                                            std::vector<Value>& args) {
  std::vector<Value> positional;
  const DictData* kwargs = nullptr;
  for (const Value& a : args) {
    if (a.kind() == Kind::kKwargs) {
      kwargs = &a.dict();
    } else {
      positional.push_back(a);
    }
  }
  auto arg = [&](size_t i, absl::string_view key, Value dflt) {
    if (i < positional.size()) return positional[i];
    if (kwargs != nullptr) {
      if (const Value* v = kwargs->Find(key)) return *v;
    }
    return dflt;
  };
  const Value case_sensitive = arg(0, "case_sensitive", Value::Bool(false));
  const Value by = arg(1, "by", Value::Str("key"));
  const Value reverse = arg(2, "reverse", Value::Bool(false));
  if (case_sensitive.kind() != Kind::kBool || reverse.kind() != Kind::kBool) {
    return Error(pos_,
                 "dictsort(): case_sensitive and reverse must be booleans");
  }
  if (!by.is_string() ||
      (by.text().str() != "key" && by.text().str() != "value")) {
    return Error(pos_, "dictsort(): by must be 'key' or 'value'");
  }
  std::vector<Value> keys;
  std::vector<Value> items;
  const bool by_key = by.text().str() == "key";
  for (const auto& [key, value] : self.dict().entries) {
    keys.push_back(by_key ? Value::Str(key) : value);
    ASSIGN_OR_RETURN(Value pair, MakeList(pos_, {Value::Str(key), value}));
    items.push_back(std::move(pair));
  }
  RETURN_IF_ERROR(
      SortBy(keys, case_sensitive.boolean(), reverse.boolean(), &items));
  return MakeList(pos_, std::move(items));
}

absl::StatusOr<Value> Interpreter::Builtin(const Value& object,
                                           absl::string_view name) {
  if (object.is_string()) return StringMethod(object, name);
  if (object.is_list_like()) {
    if (name == "length") {
      return Value::Int(static_cast<double>(object.items().size()));
    }
    return Value();
  }
  if (object.is_object()) return DictMethod(object, name);
  return Value();
}

}  // namespace swaserve::model::jinja
