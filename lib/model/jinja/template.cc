#include "lib/model/jinja/template.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/jinja/lexer.h"
#include "lib/model/jinja/parser.h"
#include "lib/model/unicode.h"

namespace swaserve::model::jinja {
namespace {

// JavaScript's array-index keys ("0", "17", < 2^32 - 1), which objects
// enumerate first, in numeric order.
bool IsArrayIndex(absl::string_view key, double* value) {
  if (key.empty() || key.size() > 10) return false;
  if (key.size() > 1 && key[0] == '0') return false;
  double v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v >= 4294967295.0) return false;
  *value = v;
  return true;
}

constexpr absl::string_view kReservedNames[] = {
    "true",        "false", "none",
    "True",        "False", "None",
    "namespace",   "range", "raise_exception",
    "strftime_now"};

}  // namespace

absl::StatusOr<Value> ValueFromJson(const nlohmann::ordered_json& j,
                                    bool untrusted, int max_depth) {
  if (max_depth <= 0) {
    return absl::InvalidArgumentError("the data nests too deeply");
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(static_cast<double>(j.get<int64_t>()));
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::Int(static_cast<double>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = j.get<double>();
      return Value::Number(d, !(std::isfinite(d) && std::floor(d) == d));
    }
    case nlohmann::ordered_json::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      if (!unicode::IsValidUtf8(s)) {
        return absl::InvalidArgumentError("a string is not valid UTF-8");
      }
      return Value::Str(Text(s, untrusted));
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        ASSIGN_OR_RETURN(Value v, ValueFromJson(e, untrusted, max_depth - 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      using Entry = nlohmann::ordered_json::const_iterator;
      std::vector<std::pair<double, Entry>> indices;
      std::vector<Entry> others;
      for (auto it = j.begin(); it != j.end(); ++it) {
        double index;
        if (IsArrayIndex(it.key(), &index)) {
          indices.emplace_back(index, it);
        } else {
          others.push_back(it);
        }
      }
      std::stable_sort(
          indices.begin(), indices.end(),
          [](const auto& a, const auto& b) { return a.first < b.first; });
      auto d = std::make_shared<DictData>();
      auto add = [&](const Entry& e) -> absl::Status {
        if (!unicode::IsValidUtf8(e.key())) {
          return absl::InvalidArgumentError("a key is not valid UTF-8");
        }
        ASSIGN_OR_RETURN(Value v,
                         ValueFromJson(e.value(), untrusted, max_depth - 1));
        d->Set(Text(e.key(), untrusted), std::move(v));
        return absl::OkStatus();
      };
      for (const auto& [index, e] : indices) RETURN_IF_ERROR(add(e));
      for (const Entry& e : others) RETURN_IF_ERROR(add(e));
      return Value::Dict(std::move(d));
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported JSON value: ", j.type_name()));
  }
}

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(std::string source) {
  ASSIGN_OR_RETURN(const std::vector<Token> tokens, Tokenize(source));
  ASSIGN_OR_RETURN(NodePtr program, jinja::Parse(tokens, source));
  return std::unique_ptr<Template>(
      new Template(std::move(source), std::move(program)));
}

absl::StatusOr<Rendered> Template::Render(const nlohmann::ordered_json& context,
                                          const RenderOptions& options) const {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("the template context must be an object");
  }
  const absl::flat_hash_set<std::string> trusted(options.trusted_keys.begin(),
                                                 options.trusted_keys.end());
  Interpreter interpreter(source_, options.limits);
  Env root(nullptr);
  interpreter.AddGlobals(&root);
  for (auto it = context.begin(); it != context.end(); ++it) {
    for (absl::string_view reserved : kReservedNames) {
      if (it.key() == reserved) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", it.key(), "' cannot be a template variable"));
      }
    }
    absl::StatusOr<Value> v =
        ValueFromJson(it.value(), !trusted.contains(it.key()),
                      options.limits.max_value_depth);
    if (!v.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "template variable '", it.key(), "': ", v.status().message()));
    }
    root.Set(it.key(), *std::move(v));
  }
  ASSIGN_OR_RETURN(Text out, interpreter.Run(*program_, &root));
  Rendered r;
  r.untrusted = out.untrusted();
  r.text = out.str();
  return r;
}

}  // namespace swaserve::model::jinja
