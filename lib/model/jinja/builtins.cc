// Filters, tests and global functions, as @huggingface/jinja's applyFilter,
// Environment.TESTS and setupGlobals.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/jinja/builtins_internal.h"
#include "lib/model/jinja/interpreter.h"
#include "lib/model/jinja/js_text.h"

namespace swaserve::model::jinja {
namespace {

// JavaScript truthiness of a value's raw .value (arrays and maps are always
// truthy there).
bool RawTruthy(const Value& v) { return IsObjectLike(v) || v.Truthy(); }

// getAttributeValue: a dotted path of keys and list indices.
Value AttributeValue(const Value& item, absl::string_view path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const absl::string_view part =
        path.substr(start, dot == absl::string_view::npos ? dot : dot - start);
    if (v.has_attrs()) {
      const Value* next = v.dict().Find(part);
      v = next != nullptr ? *next : Value();
    } else if (v.is_list_like()) {
      const double index = JsParseInt(part);
      if (std::isnan(index) || index < 0 ||
          index >= static_cast<double>(v.items().size())) {
        return Value();
      }
      v = v.items()[static_cast<size_t>(index)];
    } else {
      return Value();
    }
    if (dot == absl::string_view::npos) return v;
    start = dot + 1;
  }
}

// compareRuntimeValues' classes: values of one class compare, others do not.
enum class CompareClass { kNone, kUndefined, kNumeric, kString, kOther };
CompareClass ClassOf(const Value& v) {
  if (v.is_none()) return CompareClass::kNone;
  if (v.is_undefined()) return CompareClass::kUndefined;
  if (IsNumericLike(v)) return CompareClass::kNumeric;
  if (v.is_string()) return CompareClass::kString;
  return CompareClass::kOther;
}

int CompareSameClass(const Value& a, const Value& b, bool case_sensitive) {
  switch (ClassOf(a)) {
    case CompareClass::kNumeric: {
      const double x = NumericValue(a);
      const double y = NumericValue(b);
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    case CompareClass::kString:
      if (case_sensitive) return CompareUtf16(a.text().str(), b.text().str());
      return CompareUtf16(JsToLower(a.text().str()), JsToLower(b.text().str()));
    default:
      return 0;
  }
}

// A hashable identity for SameValueZero (unique).
std::string UniqueKey(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:  // both are undefined in the JS runtime
      return "u";
    case Kind::kBool:
      return v.boolean() ? "t" : "f";
    case Kind::kInt:
    case Kind::kFloat: {
      const double d = v.number();
      if (std::isnan(d)) return "#nan";
      return absl::StrCat("#", JsNumberToString(d == 0 ? 0 : d));
    }
    case Kind::kString:
      return absl::StrCat("s", v.text().str());
    default:
      return absl::StrCat("o", reinterpret_cast<uintptr_t>(v.identity()));
  }
}

const Value* Kwarg(const std::shared_ptr<DictData>& kw, absl::string_view key) {
  return kw == nullptr ? nullptr : kw->Find(key);
}

// args[i] ?? kwargs[key] ?? dflt
Value ArgOr(const std::vector<Value>& args, size_t i,
            const std::shared_ptr<DictData>& kw, absl::string_view key,
            Value dflt) {
  if (i < args.size()) return args[i];
  if (const Value* v = Kwarg(kw, key)) return *v;
  return dflt;
}

// The tests of Environment.TESTS; `*known` false for an unknown name.
absl::StatusOr<bool> RunTest(absl::string_view name, const Value& a,
                             const Value& b, bool* known) {
  *known = true;
  if (name == "boolean") return a.kind() == Kind::kBool;
  if (name == "callable") return a.kind() == Kind::kFunction;
  if (name == "odd" || name == "even") {
    if (a.kind() != Kind::kInt) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot test '", name, "' on a ", a.TypeName()));
    }
    const double r = std::fmod(a.number(), 2);
    return name == "odd" ? !(r == 0) : r == 0;
  }
  if (name == "false") return a.kind() == Kind::kBool && !a.boolean();
  if (name == "true") return a.kind() == Kind::kBool && a.boolean();
  if (name == "none") return a.is_none();
  if (name == "string") return a.is_string();
  if (name == "number") return a.is_number();
  if (name == "integer") return a.kind() == Kind::kInt;
  if (name == "iterable") return a.kind() == Kind::kList || a.is_string();
  if (name == "mapping") return a.is_object();
  if (name == "sequence") {
    return a.is_list_like() || a.is_object() || a.is_string();
  }
  if (name == "lower") {
    return a.is_string() && a.text().str() == JsToLower(a.text().str());
  }
  if (name == "upper") {
    return a.is_string() && a.text().str() == JsToUpper(a.text().str());
  }
  if (name == "defined") return !a.is_undefined();
  if (name == "undefined") return a.is_undefined();
  if (name == "equalto" || name == "eq") return StrictEquals(a, b);
  *known = false;
  return false;
}

}  // namespace

absl::Status Interpreter::SortBy(const std::vector<Value>& keys,
                                 bool case_sensitive, bool reverse,
                                 std::vector<Value>* items) {
  if (keys.size() >= 2) {
    const CompareClass c = ClassOf(keys[0]);
    for (const Value& k : keys) {
      if (ClassOf(k) != c || c == CompareClass::kOther) {
        return Error(pos_, absl::StrCat("cannot compare ", keys[0].TypeName(),
                                        " with ", k.TypeName()));
      }
    }
  }
  std::vector<size_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int c = CompareSameClass(keys[a], keys[b], case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  std::vector<Value> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back((*items)[i]);
  *items = std::move(sorted);
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::ApplyTest(const Node& n,
                                             const Value& operand) {
  bool known;
  absl::StatusOr<bool> r = RunTest(n.str, operand, Value(), &known);
  if (!known) return Error(n, absl::StrCat("unknown test '", n.str, "'"));
  if (!r.ok()) return Error(n, r.status().message());
  return Value::Bool(n.flag ? !*r : *r);
}

absl::StatusOr<Value> Interpreter::ApplyFilter(const Value& operand,
                                               const Node& filter, Env* env) {
  if (operand.is_missing()) {
    // Only safe and default(...) pass JavaScript's undefined along.
    const bool passes =
        (filter.kind == NodeKind::kIdentifier && filter.str == "safe") ||
        (filter.kind == NodeKind::kCall && filter.x->str == "default");
    if (passes) return operand;
    return CheckNotMissing(filter, operand);
  }
  if (filter.kind == NodeKind::kIdentifier) {
    return IdentifierFilter(operand, filter, env);
  }
  if (filter.kind != NodeKind::kCall ||
      filter.x->kind != NodeKind::kIdentifier) {
    return Error(filter, "a filter must be a name");
  }
  return CallFilter(operand, filter, env);
}

absl::StatusOr<Value> Interpreter::IdentifierFilter(const Value& operand,
                                                    const Node& filter,
                                                    Env* env) {
  const std::string& name = filter.str;
  if (name == "safe") return operand;
  if (name == "tojson") {
    ASSIGN_OR_RETURN(Text t, ToJson(operand, JsonOptions(), true));
    return Value::Str(std::move(t));
  }
  auto unknown = [&] {
    return Error(filter, absl::StrCat("unknown filter '", name, "' for a ",
                                      operand.TypeName()));
  };
  if (operand.is_list_like()) {
    const auto& items = operand.items();
    if (name == "list") return operand;
    if (name == "first" || name == "last") {
      if (items.empty()) return Value::Missing();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "length") return Value::Int(static_cast<double>(items.size()));
    if (name == "reverse") {
      return MakeList(filter.pos,
                      std::vector<Value>(items.rbegin(), items.rend()));
    }
    if (name == "sort") {
      std::vector<Value> sorted = items;
      RETURN_IF_ERROR(SortBy(items, false, false, &sorted));
      return MakeList(filter.pos, std::move(sorted));
    }
    if (name == "join") return Join(operand, Text());
    if (name == "string") {
      ASSIGN_OR_RETURN(Text t, ToJson(operand, JsonOptions(), false));
      return Value::Str(std::move(t));
    }
    if (name == "unique") return Unique(operand);
    return unknown();
  }
  if (operand.is_string()) {
    const Text& t = operand.text();
    if (name == "length" || name == "upper" || name == "lower" ||
        name == "title" || name == "capitalize") {
      ASSIGN_OR_RETURN(const Value member, StringMethod(operand, name));
      if (member.kind() != Kind::kFunction) return member;
      std::vector<Value> none;
      return member.function().fn(none, env);
    }
    if (name == "trim") return Value::Str(TrimText(t, true, true));
    if (name == "indent") {
      return Indent(t, Value::Int(4), Value::Bool(false), Value::Bool(false));
    }
    if (name == "join" || name == "string") return operand;
    if (name == "int") {
      const double v = JsParseInt(t.str());
      return Value::Int(std::isnan(v) ? 0 : v);
    }
    if (name == "float") {
      const double v = JsParseFloat(t.str());
      return Value::Float(std::isnan(v) ? 0 : v);
    }
    return unknown();
  }
  if (operand.is_number()) {
    const double v = operand.number();
    if (name == "abs")
      return Value::Number(std::fabs(v), operand.kind() == Kind::kFloat);
    if (name == "int") return Value::Int(std::floor(v));
    if (name == "float") return Value::Float(v);
    if (name == "string") {
      ASSIGN_OR_RETURN(Text t, Print(operand));
      return Value::Str(std::move(t));
    }
    return unknown();
  }
  if (operand.is_object()) {
    if (name == "items") return DictView(operand, "items");
    if (name == "length") {
      return Value::Int(static_cast<double>(operand.dict().size()));
    }
    ASSIGN_OR_RETURN(const Value member, DictMethod(operand, name));
    if (member.kind() == Kind::kFunction) {
      std::vector<Value> none;
      return member.function().fn(none, env);
    }
    return unknown();
  }
  if (operand.kind() == Kind::kBool) {
    const bool b = operand.boolean();
    if (name == "bool") return operand;
    if (name == "int") return Value::Int(b ? 1 : 0);
    if (name == "float") return Value::Float(b ? 1 : 0);
    if (name == "string") return Value::Str(b ? "true" : "false");
    return unknown();
  }
  return Error(filter, absl::StrCat("cannot apply the filter '", name,
                                    "' to a ", operand.TypeName()));
}

absl::StatusOr<Value> Interpreter::CallFilter(const Value& operand,
                                              const Node& filter, Env* env) {
  const std::string& name = filter.x->str;
  std::vector<Value> args;
  std::shared_ptr<DictData> kw;
  if (name == "tojson") {
    RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
    JsonOptions options;
    const Value indent = ArgOr({}, 0, kw, "indent", Value::None());
    const Value ascii = ArgOr({}, 0, kw, "ensure_ascii", Value::Bool(false));
    const Value sort = ArgOr({}, 0, kw, "sort_keys", Value::Bool(false));
    const Value seps = ArgOr({}, 0, kw, "separators", Value::None());
    if (indent.kind() != Kind::kInt && !indent.is_none()) {
      return Error(filter, "tojson: indent must be an integer");
    }
    if (ascii.kind() != Kind::kBool || sort.kind() != Kind::kBool) {
      return Error(filter,
                   "tojson: ensure_ascii and sort_keys must be booleans");
    }
    if (indent.kind() == Kind::kInt) {
      const double i = indent.number();
      options.indent = std::isfinite(i) && std::fabs(i) < 1e6
                           ? static_cast<int>(i)
                           : std::numeric_limits<int>::max();
    }
    options.ensure_ascii = ascii.boolean();
    options.sort_keys = sort.boolean();
    if (seps.is_list_like()) {
      if (seps.items().size() != 2 || !seps.items()[0].is_string() ||
          !seps.items()[1].is_string()) {
        return Error(filter, "tojson: separators must be two strings");
      }
      options.separators.emplace(seps.items()[0].text().str(),
                                 seps.items()[1].text().str());
    } else if (!seps.is_none()) {
      return Error(filter, "tojson: separators must be two strings");
    }
    ASSIGN_OR_RETURN(Text t, ToJson(operand, options, true));
    return Value::Str(std::move(t));
  }
  if (name == "join") {
    if (!operand.is_string() && !operand.is_list_like()) {
      return Error(filter, absl::StrCat("cannot join a ", operand.TypeName()));
    }
    RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
    const Value sep = ArgOr(args, 0, kw, "separator", Value::Str(""));
    if (!sep.is_string())
      return Error(filter, "join: the separator must be a string");
    return Join(operand, sep.text());
  }
  if (name == "int" || name == "float") {
    RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
    const bool to_int = name == "int";
    const Value dflt =
        ArgOr(args, 0, kw, "default", to_int ? Value::Int(0) : Value::Float(0));
    if (operand.is_string()) {
      const double v = to_int ? JsParseInt(operand.text().str())
                              : JsParseFloat(operand.text().str());
      if (std::isnan(v)) return dflt;
      return Value::Number(v, !to_int);
    }
    if (operand.is_number()) return operand;
    if (operand.kind() == Kind::kBool) {
      return Value::Number(operand.boolean() ? 1 : 0, !to_int);
    }
    return Error(filter, absl::StrCat("cannot apply '", name, "' to a ",
                                      operand.TypeName()));
  }
  if (name == "default") {
    RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
    const Value dflt = args.size() > 0 ? args[0] : Value::Str("");
    const Value boolean = ArgOr(args, 1, kw, "boolean", Value::Bool(false));
    if (boolean.kind() != Kind::kBool) {
      return Error(filter, "default: the flag must be a boolean");
    }
    if (operand.is_undefined() || (boolean.boolean() && !operand.Truthy())) {
      return dflt;
    }
    return operand;
  }
  if (operand.is_list_like()) return ListCallFilter(operand, filter, env);
  if (operand.is_string()) {
    RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
    if (name == "indent") {
      return Indent(operand.text(), ArgOr(args, 0, kw, "width", Value::Int(4)),
                    ArgOr(args, 1, kw, "first", Value::Bool(false)),
                    ArgOr(args, 2, kw, "blank", Value::Bool(false)));
    }
    if (name == "replace") {
      if (kw == nullptr) kw = std::make_shared<DictData>();
      ASSIGN_OR_RETURN(Value kwv, MakeDict(filter.pos, kw, Kind::kKwargs));
      args.push_back(std::move(kwv));
      return Replace(operand.text(), args);
    }
    return Error(filter,
                 absl::StrCat("unknown filter '", name, "' for a string"));
  }
  if (operand.is_object()) {
    ASSIGN_OR_RETURN(const Value member, DictMethod(operand, name));
    if (member.kind() == Kind::kFunction) {
      RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
      if (kw != nullptr && kw->size() > 0) {
        ASSIGN_OR_RETURN(Value kwv, MakeDict(filter.pos, kw, Kind::kKwargs));
        args.push_back(std::move(kwv));
      }
      return member.function().fn(args, env);
    }
    return Error(filter,
                 absl::StrCat("unknown filter '", name, "' for a dict"));
  }
  return Error(filter, absl::StrCat("cannot apply the filter '", name,
                                    "' to a ", operand.TypeName()));
}

absl::StatusOr<Value> Interpreter::ListCallFilter(const Value& operand,
                                                  const Node& filter,
                                                  Env* env) {
  const std::string& name = filter.x->str;
  std::vector<Value> args;
  std::shared_ptr<DictData> kw;
  if (name == "sort") {
    RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
    const Value reverse = ArgOr(args, 0, kw, "reverse", Value::Bool(false));
    const Value cs = ArgOr(args, 1, kw, "case_sensitive", Value::Bool(false));
    const Value attr = ArgOr(args, 2, kw, "attribute", Value::None());
    if (reverse.kind() != Kind::kBool || cs.kind() != Kind::kBool) {
      return Error(filter, "sort: reverse and case_sensitive must be booleans");
    }
    if (!attr.is_string() && attr.kind() != Kind::kInt && !attr.is_none()) {
      return Error(filter,
                   "sort: attribute must be a string, an integer or none");
    }
    std::vector<Value> keys;
    for (const Value& item : operand.items()) {
      if (attr.is_none()) {
        keys.push_back(item);
      } else {
        const std::string path = attr.is_string()
                                     ? attr.text().str()
                                     : JsNumberToString(attr.number());
        keys.push_back(AttributeValue(item, path));
      }
    }
    std::vector<Value> sorted = operand.items();
    RETURN_IF_ERROR(SortBy(keys, cs.boolean(), reverse.boolean(), &sorted));
    return MakeList(filter.pos, std::move(sorted));
  }
  if (name == "selectattr" || name == "rejectattr") {
    return SelectAttr(operand, filter, env);
  }
  if (name == "map") {
    RETURN_IF_ERROR(EvalArguments(filter.a, env, &args, &kw));
    const Value* attr = Kwarg(kw, "attribute");
    if (attr == nullptr) {
      return Error(filter, "map is supported only with attribute=...");
    }
    if (!attr->is_string())
      return Error(filter, "map: attribute must be a string");
    const Value* dflt = Kwarg(kw, "default");
    std::vector<Value> out;
    for (const Value& item : operand.items()) {
      if (!item.has_attrs())
        return Error(filter, "map: the items must be dicts");
      Value v = AttributeValue(item, attr->text().str());
      if (v.is_undefined() && dflt != nullptr) v = *dflt;
      out.push_back(std::move(v));
    }
    return MakeList(filter.pos, std::move(out));
  }
  return Error(filter, absl::StrCat("unknown filter '", name, "' for a list"));
}

absl::StatusOr<Value> Interpreter::SelectAttr(const Value& operand,
                                              const Node& filter, Env* env) {
  const std::string& name = filter.x->str;
  const bool select = name == "selectattr";
  for (const Value& item : operand.items()) {
    if (!item.has_attrs()) {
      return Error(filter, absl::StrCat(name, " needs a list of dicts"));
    }
  }
  std::vector<Value> args;
  for (const NodePtr& a : filter.a) {
    if (a->kind != NodeKind::kStringLiteral) {
      return Error(*a, absl::StrCat("the arguments of ", name,
                                    " must be string literals"));
    }
    ASSIGN_OR_RETURN(Value v, Eval(*a, env));
    args.push_back(std::move(v));
  }
  if (args.empty())
    return Error(filter, absl::StrCat(name, " needs an attribute"));
  const std::string attr = args[0].text().str();
  const Value value = args.size() > 2 ? args[2] : Value();
  std::vector<Value> out;
  for (const Value& item : operand.items()) {
    const Value* a = item.dict().Find(attr);
    bool result = false;
    if (a != nullptr) {
      if (args.size() > 1) {
        bool known;
        absl::StatusOr<bool> r =
            RunTest(args[1].text().str(), *a, value, &known);
        if (!known) {
          return Error(filter, absl::StrCat("unknown test '",
                                            args[1].text().str(), "'"));
        }
        if (!r.ok()) return Error(filter, r.status().message());
        result = *r;
      } else {
        result = a->Truthy();
      }
    }
    if (result == select) out.push_back(item);
  }
  return MakeList(filter.pos, std::move(out));
}

absl::StatusOr<Value> Interpreter::Indent(const Text& t, const Value& width,
                                          const Value& first,
                                          const Value& blank) {
  if (width.kind() != Kind::kInt)
    return Error(pos_, "indent: width must be an integer");
  const double w = width.number();
  if (w < 0 || w > 1024)
    return Error(pos_, "indent: width out of range [0, 1024]");
  const std::string pad(static_cast<size_t>(w), ' ');
  const std::string& s = t.str();
  Text out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t nl = s.find('\n', start);
    const size_t end = nl == std::string::npos ? s.size() : nl;
    const bool skip =
        (!RawTruthy(first) && line == 0) || (!RawTruthy(blank) && end == start);
    if (!skip) out.Append(pad);
    out.AppendRange(t, start, end);
    RETURN_IF_ERROR(CheckSize(pos_, out.size()));
    if (nl == std::string::npos) break;
    out.AppendRange(t, nl, nl + 1);
    start = nl + 1;
  }
  return MakeString(pos_, std::move(out));
}

absl::StatusOr<Value> Interpreter::Join(const Value& operand,
                                        const Text& separator) {
  Text out;
  bool first = true;
  auto add_sep = [&] {
    if (!first) out.Append(separator);
    first = false;
  };
  if (operand.is_string()) {
    const Text& t = operand.text();
    const std::string& s = t.str();
    for (size_t i = 0; i < s.size();) {
      int len;
      DecodeAt(s, i, &len);
      add_sep();
      out.AppendRange(t, i, i + len);
      i += len;
      RETURN_IF_ERROR(CheckSize(pos_, out.size()));
    }
    return MakeString(pos_, std::move(out));
  }
  for (const Value& item : operand.items()) {
    add_sep();
    if (!item.is_none() && !item.is_undefined()) {
      ASSIGN_OR_RETURN(const Text t, RawString(item));
      out.Append(t);
    }
    RETURN_IF_ERROR(CheckSize(pos_, out.size()));
  }
  return MakeString(pos_, std::move(out));
}

absl::StatusOr<Value> Interpreter::Unique(const Value& operand) {
  absl::flat_hash_set<std::string> seen;
  std::vector<Value> out;
  for (const Value& item : operand.items()) {
    if (seen.insert(UniqueKey(item)).second) out.push_back(item);
  }
  return MakeList(pos_, std::move(out));
}

absl::StatusOr<Value> Interpreter::Namespace(std::vector<Value>& args) {
  std::vector<Value> positional = args;
  const DictData* kwargs = nullptr;
  if (!positional.empty() && positional.back().kind() == Kind::kKwargs) {
    kwargs = &positional.back().dict();
  }
  const size_t n = positional.size() - (kwargs != nullptr ? 1 : 0);
  if (n > 1) {
    return Error(pos_,
                 absl::StrCat("namespace() takes at most 1 argument, got ", n));
  }
  auto d = std::make_shared<DictData>();
  if (n == 1) {
    const Value& source = positional[0];
    if (source.is_object()) {
      for (const auto& [k, v] : source.dict().entries) d->Set(k, v);
    } else if (source.is_list_like()) {
      for (const Value& pair : source.items()) {
        std::vector<Value> kv;
        if (pair.is_list_like()) {
          kv = pair.items();
        } else if (pair.is_string()) {
          const std::string& s = pair.text().str();
          for (size_t i = 0; i < s.size();) {
            int len;
            DecodeAt(s, i, &len);
            kv.push_back(Value::Str(pair.text().Substr(i, i + len)));
            i += len;
          }
        }
        if (kv.size() != 2 || !kv[0].is_string()) {
          return Error(pos_, "namespace() takes a dict or [key, value] pairs");
        }
        d->Set(kv[0].text(), kv[1]);
      }
    } else {
      return Error(pos_, absl::StrCat("namespace(): a ", source.TypeName(),
                                      " is not iterable"));
    }
  }
  if (kwargs != nullptr) {
    for (const auto& [k, v] : kwargs->entries) d->Set(k, v);
  }
  return MakeDict(pos_, std::move(d), Kind::kNamespace);
}

absl::StatusOr<Value> Interpreter::Range(std::vector<Value>& args) {
  if (args.empty() || args.size() > 3) {
    return Error(pos_, "range() takes 1 to 3 numbers");
  }
  for (const Value& a : args) {
    if (!a.is_number()) {
      return Error(pos_,
                   absl::StrCat("range() takes numbers, not a ", a.TypeName()));
    }
  }
  double start = 0;
  double stop = args[0].number();
  double step = 1;
  if (args.size() > 1) {
    start = args[0].number();
    stop = args[1].number();
  }
  if (args.size() > 2) step = args[2].number();
  if (step == 0 || std::isnan(step))
    return Error(pos_, "range() step must not be zero");
  const double count = std::ceil((stop - start) / step);
  if (count > static_cast<double>(limits_.max_list_items)) {
    return Error(pos_, absl::StrCat("range() of ", JsNumberToString(count),
                                    " numbers is over the limit"));
  }
  std::vector<Value> out;
  for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.push_back(Value::Number(i, i != std::floor(i)));
    if (out.size() > limits_.max_list_items) break;
  }
  return MakeList(pos_, std::move(out));
}

void Interpreter::AddGlobals(Env* root) {
  root->Set("false", Value::Bool(false));
  root->Set("true", Value::Bool(true));
  root->Set("none", Value::None());
  root->Set("False", Value::Bool(false));
  root->Set("True", Value::Bool(true));
  root->Set("None", Value::None());
  root->Set("namespace",
            Value::Fn("namespace", [this](std::vector<Value>& args, Env*) {
              return Namespace(args);
            }));
  root->Set("range", Value::Fn("range", [this](std::vector<Value>& args, Env*) {
              return Range(args);
            }));
  root->Set("raise_exception",
            Value::Fn("raise_exception",
                      [this](std::vector<Value>& args,
                             Env*) -> absl::StatusOr<Value> {
                        std::string msg;  // new Error(undefined): ""
                        if (!args.empty() && !args[0].is_none() &&
                            !args[0].is_undefined()) {
                          ASSIGN_OR_RETURN(const Text t, RawString(args[0]));
                          msg = t.str();
                        }
                        absl::Status st = absl::InvalidArgumentError(msg);
                        st.SetPayload(kRaisedPayload, absl::Cord("1"));
                        return st;
                      }));
  root->Set(
      "strftime_now",
      Value::Fn(
          "strftime_now",
          [this](std::vector<Value>& args, Env*) -> absl::StatusOr<Value> {
            if (args.empty() || !args[0].is_string()) {
              return Error(pos_, "strftime_now() takes a format string");
            }
            return Value::Str(StrftimeNow(args[0].text().str()));
          }));
}

std::string StrftimeNow(absl::string_view format) {
  static constexpr const char* kMonths[] = {
      "January", "February", "March",     "April",   "May",      "June",
      "July",    "August",   "September", "October", "November", "December"};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  auto pad2 = [](int n) {
    return n < 10 ? absl::StrCat("0", n) : absl::StrCat(n);
  };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char c = format[i + 1];
    switch (c) {
      case 'Y':
        out += absl::StrCat(tm.tm_year + 1900);
        break;
      case 'm':
        out += pad2(tm.tm_mon + 1);
        break;
      case 'd':
        out += pad2(tm.tm_mday);
        break;
      case 'b':
        out += std::string(kMonths[tm.tm_mon]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[tm.tm_mon];
        break;
      case 'H':
        out += pad2(tm.tm_hour);
        break;
      case 'M':
        out += pad2(tm.tm_min);
        break;
      case '%':
        out += "%";
        break;
      default:
        out.push_back('%');
        out.push_back(c);
    }
    ++i;
  }
  return out;
}

}  // namespace swaserve::model::jinja
