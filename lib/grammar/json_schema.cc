#include "lib/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/grammar/json_parts.h"
#include "lib/grammar/regex.h"
#include "nlohmann/json.hpp"

namespace swaserve::grammar {
namespace {

using Json = nlohmann::ordered_json;

// Keywords that constrain nothing.
const std::set<std::string>& Annotations() {
  static const auto* k = new std::set<std::string>{
      "title", "description", "default", "examples", "$schema", "$id", "$comment",
      "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return *k;
}
const std::set<std::string>& Supported() {
  static const auto* k = new std::set<std::string>{
      "type", "properties", "required", "additionalProperties", "items", "minItems",
      "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minLength",
      "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
      "exclusiveMaximum"};
  return *k;
}

constexpr int kMaxSchemaDepth = 64;

class SchemaCompiler {
 public:
  // Adds rules to parts->g(); $refs resolve inside `root`.
  SchemaCompiler(const Json& root, JsonParts* parts) : root_(root), g_(parts->g()), parts_(*parts) {}

  // The expression of root's instances.
  absl::StatusOr<ExprId> Run() { return Schema(root_, "", 0); }

 private:
  static absl::Status Error(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON Schema at ", path.empty() ? "/" : path, ": ", what));
  }

  absl::StatusOr<int> NonNegative(const Json& s, const char* key, const std::string& path,
                                  int absent) {
    if (!s.contains(key)) return absent;
    const Json& v = s[key];
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == static_cast<int64_t>(v.get<double>()))) {
      return Error(path, absl::StrCat(key, " must be a non-negative integer"));
    }
    const double d = v.get<double>();
    if (d < 0) return Error(path, absl::StrCat(key, " must be a non-negative integer"));
    if (d > parts_.options().max_repetition) {
      return Error(path, absl::StrCat(key, " ", d, " is above the supported ",
                                      parts_.options().max_repetition));
    }
    return static_cast<int>(d);
  }

  absl::StatusOr<ExprId> Schema(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) return Error(path, "schema nested too deeply");
    if (s.is_boolean()) {
      if (s.get<bool>()) return g_.Ref(parts_.AnyValue());
      return Error(path, "the schema false has no instance");
    }
    if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
    std::vector<std::string> constraining;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (Annotations().count(it.key())) continue;
      if (!Supported().count(it.key())) {
        return Error(path, absl::StrCat("unsupported JSON Schema keyword '", it.key(), "'"));
      }
      constraining.push_back(it.key());
    }
    auto only = [&](const char* key) -> absl::Status {
      if (constraining.size() > 1) {
        return Error(path, absl::StrCat("'", key, "' beside other constraining keywords is not "
                                        "supported"));
      }
      return absl::OkStatus();
    };
    if (s.contains("$ref")) {
      RETURN_IF_ERROR(only("$ref"));
      ASSIGN_OR_RETURN(RuleId rule, Ref(s["$ref"], path, depth));
      return g_.Ref(rule);
    }
    if (s.contains("allOf")) {
      RETURN_IF_ERROR(only("allOf"));
      if (!s["allOf"].is_array() || s["allOf"].size() != 1) {
        return Error(path, "allOf is supported with exactly one schema");
      }
      return Schema(s["allOf"][0], path + "/allOf/0", depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      RETURN_IF_ERROR(only(key));
      const Json& list = s[key];
      if (!list.is_array() || list.empty()) return Error(path, absl::StrCat(key, " must be a non-empty array"));
      std::vector<ExprId> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        ASSIGN_OR_RETURN(ExprId e, Schema(list[i], absl::StrCat(path, "/", key, "/", i), depth + 1));
        alts.push_back(e);
      }
      return g_.Alt(std::move(alts));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> types, Types(s, path));
    if (s.contains("enum") || s.contains("const")) return Enum(s, types, path);
    if (types.empty()) return g_.Ref(parts_.AnyValue());
    std::vector<ExprId> alts;
    for (const std::string& t : types) {
      ASSIGN_OR_RETURN(ExprId e, Typed(t, s, path, depth));
      alts.push_back(e);
    }
    return g_.Alt(std::move(alts));
  }

  // The types the schema allows: its "type", or those its keywords imply;
  // empty for any value.
  absl::StatusOr<std::vector<std::string>> Types(const Json& s, const std::string& path) {
    static const std::set<std::string> kTypes = {"object", "array",   "string", "number",
                                                 "integer", "boolean", "null"};
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      std::vector<Json> list = t.is_array() ? std::vector<Json>(t.begin(), t.end())
                                            : std::vector<Json>{t};
      for (const Json& v : list) {
        if (!v.is_string() || !kTypes.count(v.get<std::string>())) {
          return Error(path, absl::StrCat("unsupported type ", v.dump()));
        }
        types.push_back(v.get<std::string>());
      }
      if (types.empty()) return Error(path, "type must name at least one type");
      return types;
    }
    if (s.contains("enum") || s.contains("const")) return types;
    auto has = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys) {
        if (s.contains(k)) return true;
      }
      return false;
    };
    if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (has({"items", "minItems", "maxItems"})) types.push_back("array");
    if (has({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
    if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
    return types;
  }

  // Compact JSON text of a value (an enum value, a property name).
  std::string Dump(const Json& v) const {
    std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
    if (parts_.options().escape_angle_bracket) {
      // "<" only occurs inside strings in JSON text.
      for (size_t at = text.find('<'); at != std::string::npos; at = text.find('<', at)) {
        text.replace(at, 1, "\\u003C");
      }
    }
    return text;
  }

  static bool OfType(const Json& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "string") return v.is_string();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "number") return v.is_number();
    if (t == "integer") {
      return v.is_number_integer() ||
             (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
    }
    return false;
  }

  absl::StatusOr<ExprId> Enum(const Json& s, const std::vector<std::string>& types,
                              const std::string& path) {
    std::vector<Json> values;
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) return Error(path, "enum must be an array");
      for (const Json& v : s["enum"]) {
        if (!s.contains("const") || v == s["const"]) values.push_back(v);
      }
    }
    std::vector<ExprId> alts;
    for (const Json& v : values) {
      bool ok = types.empty();
      for (const std::string& t : types) ok |= OfType(v, t);
      if (ok) alts.push_back(g_.Literal(Dump(v)));
    }
    if (alts.empty()) return Error(path, "enum/const leaves no value of the allowed types");
    return g_.Alt(std::move(alts));
  }

  absl::StatusOr<RuleId> Ref(const Json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return Error(path, "$ref must be a string");
    const std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#') {
      return Error(path, absl::StrCat("$ref '", r, "': only references inside the schema (#...) "
                                      "are supported"));
    }
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    const Json* target = nullptr;
    try {
      target = &root_.at(Json::json_pointer(r.substr(1)));
    } catch (const std::exception&) {
      return Error(path, absl::StrCat("$ref '", r, "' does not resolve"));
    }
    const RuleId rule = g_.AddRule(absl::StrCat("ref", g_.rules().size()));
    refs_.emplace(r, rule);
    ASSIGN_OR_RETURN(ExprId body, Schema(*target, r.substr(1), depth + 1));
    g_.SetRule(rule, body);
    return rule;
  }

  absl::StatusOr<ExprId> Typed(const std::string& t, const Json& s, const std::string& path,
                               int depth) {
    if (t == "null") return parts_.Null();
    if (t == "boolean") return parts_.Boolean();
    if (t == "integer" || t == "number") return Numeric(t, s, path);
    if (t == "string") return String(s, path);
    if (t == "array") return Array(s, path, depth);
    return Object(s, path, depth);
  }

  // An integer or number; with bounds, the integers within them.
  absl::StatusOr<ExprId> Numeric(const std::string& t, const Json& s, const std::string& path) {
    std::optional<double> lo, hi;
    for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_number()) return Error(path, absl::StrCat(key, " must be a number"));
      const double v = s[key].get<double>();
      const std::string k = key;
      if (k == "minimum") lo = std::max(lo.value_or(v), std::ceil(v));
      if (k == "exclusiveMinimum") lo = std::max(lo.value_or(v), std::floor(v) + 1);
      if (k == "maximum") hi = std::min(hi.value_or(v), std::floor(v));
      if (k == "exclusiveMaximum") hi = std::min(hi.value_or(v), std::ceil(v) - 1);
    }
    if (!lo && !hi) return t == "integer" ? parts_.Integer() : parts_.Number();
    constexpr double kLimit = 9999999999999999.0;  // JsonParts' 16 digits
    if ((lo && *lo > kLimit) || (hi && *hi < -kLimit) || (lo && hi && *lo > *hi)) {
      return Error(path, "the bounds leave no integer of at most 16 digits");
    }
    auto clamp = [&](std::optional<double> v) -> std::optional<int64_t> {
      if (!v) return std::nullopt;
      return static_cast<int64_t>(std::clamp(*v, -kLimit, kLimit));
    };
    return parts_.IntegerRange(clamp(lo), clamp(hi));
  }

  absl::StatusOr<ExprId> String(const Json& s, const std::string& path) {
    ASSIGN_OR_RETURN(int min, NonNegative(s, "minLength", path, 0));
    ASSIGN_OR_RETURN(int max, NonNegative(s, "maxLength", path, Grammar::kUnbounded));
    if (max != Grammar::kUnbounded && max < min) return Error(path, "maxLength < minLength");
    const bool bounded = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
      if (bounded || s.contains("pattern")) {
        return Error(path, "format together with pattern, minLength or maxLength is not supported");
      }
      if (!s["format"].is_string()) return Error(path, "format must be a string");
      return Format(s["format"].get<std::string>(), path);
    }
    if (s.contains("pattern")) {
      if (bounded) return Error(path, "pattern together with minLength/maxLength is not supported");
      if (!s["pattern"].is_string()) return Error(path, "pattern must be a string");
      absl::StatusOr<ExprId> body = PatternToStringBody(s["pattern"].get<std::string>(), &parts_);
      if (!body.ok()) return Error(path, std::string(body.status().message()));
      return g_.Seq({g_.Literal("\""), *body, g_.Literal("\"")});
    }
    return parts_.String(min, max);
  }

  absl::StatusOr<ExprId> Format(const std::string& format, const std::string& path) {
    const ExprId d = g_.Bytes(ByteSet::Range('0', '9'));
    auto lit = [&](const char* x) { return g_.Literal(x); };
    auto range = [&](char a, char b) { return g_.Bytes(ByteSet::Range(a, b)); };
    auto date = [&] {
      const ExprId day28 = g_.Alt({g_.Seq({lit("0"), range('1', '9')}), g_.Seq({lit("1"), d}),
                                   g_.Seq({lit("2"), range('0', '8')})});
      const ExprId day30 = g_.Alt({day28, lit("29"), lit("30")});
      const ExprId day31 = g_.Alt({day30, lit("31")});
      const ExprId month_day = g_.Alt(
          {g_.Seq({g_.Alt({lit("01"), lit("03"), lit("05"), lit("07"), lit("08"), lit("10"),
                           lit("12")}),
                   lit("-"), day31}),
           g_.Seq({g_.Alt({lit("04"), lit("06"), lit("09"), lit("11")}), lit("-"), day30}),
           g_.Seq({lit("02-"), day28})});
      return g_.Seq({d, d, d, d, lit("-"), month_day});
    };
    auto time = [&] {
      const ExprId hour = g_.Alt({g_.Seq({range('0', '1'), d}), g_.Seq({lit("2"), range('0', '3')})});
      const ExprId minute = g_.Seq({range('0', '5'), d});
      const ExprId offset = g_.Alt(
          {lit("Z"), g_.Seq({g_.Alt({lit("+"), lit("-")}), hour, lit(":"), minute})});
      return g_.Seq({hour, lit(":"), minute, lit(":"), minute,
                     g_.Optional(g_.Seq({lit("."), g_.Repeat(d, 1, 9)})), offset});
    };
    ExprId body;
    if (format == "date") {
      body = date();
    } else if (format == "time") {
      body = time();
    } else if (format == "date-time") {
      body = g_.Seq({date(), lit("T"), time()});
    } else if (format == "uuid") {
      ByteSet hex = ByteSet::Range('0', '9');
      hex.AddRange('a', 'f');
      hex.AddRange('A', 'F');
      const ExprId h = g_.Bytes(hex);
      body = g_.Seq({g_.Repeat(h, 8, 8), lit("-"), g_.Repeat(h, 4, 4), lit("-"),
                     g_.Repeat(h, 4, 4), lit("-"), g_.Repeat(h, 4, 4), lit("-"),
                     g_.Repeat(h, 12, 12)});
    } else {
      return Error(path, absl::StrCat("unsupported format '", format,
                                      "' (supported: date-time, date, time, uuid)"));
    }
    return g_.Seq({lit("\""), body, lit("\"")});
  }

  absl::StatusOr<ExprId> Array(const Json& s, const std::string& path, int depth) {
    ASSIGN_OR_RETURN(int min, NonNegative(s, "minItems", path, 0));
    ASSIGN_OR_RETURN(int max, NonNegative(s, "maxItems", path, Grammar::kUnbounded));
    if (max != Grammar::kUnbounded && max < min) return Error(path, "maxItems < minItems");
    RuleId item;
    if (s.contains("items")) {
      if (s["items"].is_array()) return Error(path, "items as an array (tuples) is not supported");
      item = g_.AddRule(absl::StrCat("items", g_.rules().size()));
      ASSIGN_OR_RETURN(ExprId body, Schema(s["items"], path + "/items", depth + 1));
      g_.SetRule(item, body);
    } else {
      item = parts_.AnyValue();
    }
    const ExprId comma = g_.Seq({parts_.Ws(), g_.Literal(","), parts_.Ws()});
    const ExprId more = g_.Repeat(g_.Seq({comma, g_.Ref(item)}), min > 0 ? min - 1 : 0,
                                  max == Grammar::kUnbounded ? max : std::max(0, max - 1));
    const ExprId list = g_.Seq({g_.Ref(item), more, parts_.Ws()});
    if (max == 0) return g_.Seq({g_.Literal("["), parts_.Ws(), g_.Literal("]")});
    return g_.Seq({g_.Literal("["), parts_.Ws(), min > 0 ? list : g_.Optional(list),
                   g_.Literal("]")});
  }

  absl::StatusOr<ExprId> Object(const Json& s, const std::string& path, int depth);

  const Json& root_;
  Grammar& g_;
  JsonParts& parts_;
  absl::flat_hash_map<std::string, RuleId> refs_;
};

absl::StatusOr<ExprId> SchemaCompiler::Object(const Json& s, const std::string& path, int depth) {
  bool closed = false;
  if (s.contains("additionalProperties")) {
    const Json& a = s["additionalProperties"];
    if (!a.is_boolean()) {
      return Error(path, "additionalProperties as a schema is not supported (true or false only)");
    }
    closed = !a.get<bool>();
  }
  struct Prop {
    std::string name;
    const Json* schema;  // null: any value
    bool required;
  };
  std::vector<Prop> props;
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return Error(path, "required must be an array");
    for (const Json& r : s["required"]) {
      if (!r.is_string()) return Error(path, "required must list strings");
      required.insert(r.get<std::string>());
    }
  }
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) return Error(path, "properties must be an object");
    for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
      props.push_back(Prop{.name = it.key(), .schema = &it.value(),
                           .required = required.count(it.key()) > 0});
    }
  } else if (!closed && required.empty()) {
    return g_.Ref(parts_.AnyObject());
  }
  for (const std::string& r : required) {
    bool declared = false;
    for (const Prop& p : props) declared |= p.name == r;
    if (declared) continue;
    if (closed) return Error(path, absl::StrCat("required property '", r, "' is not allowed"));
    props.push_back(Prop{.name = r, .schema = nullptr, .required = true});
  }
  const ExprId open = g_.Seq({g_.Literal("{"), parts_.Ws()});
  const ExprId close = g_.Literal("}");
  if (props.empty()) return g_.Seq({open, close});
  const size_t n = props.size();
  // member[k]: "name" ws : ws value, one rule per property.
  std::vector<RuleId> member(n);
  for (size_t k = 0; k < n; ++k) {
    member[k] = g_.AddRule(absl::StrCat("prop", g_.rules().size()));
    ExprId value;
    if (props[k].schema == nullptr) {
      value = g_.Ref(parts_.AnyValue());
    } else {
      ASSIGN_OR_RETURN(value, Schema(*props[k].schema, path + "/properties/" + props[k].name,
                                     depth + 1));
    }
    g_.SetRule(member[k], g_.Seq({g_.Literal(Dump(Json(props[k].name))),
                                  parts_.Ws(), g_.Literal(":"), parts_.Ws(), value}));
  }
  // after[k]: properties k.. when one was written before (each after a comma).
  std::vector<RuleId> after(n + 1);
  for (size_t k = 0; k <= n; ++k) after[k] = g_.AddRule(absl::StrCat("after", g_.rules().size()));
  g_.SetRule(after[n], g_.Empty());
  for (size_t k = n; k-- > 0;) {
    const ExprId item = g_.Seq({parts_.Ws(), g_.Literal(","), parts_.Ws(), g_.Ref(member[k])});
    g_.SetRule(after[k], g_.Seq({props[k].required ? item : g_.Optional(item), g_.Ref(after[k + 1])}));
  }
  // The first property written: any k up to the first required one.
  std::vector<ExprId> firsts;
  bool any_required = false;
  for (size_t k = 0; k < n; ++k) {
    firsts.push_back(g_.Seq({g_.Ref(member[k]), g_.Ref(after[k + 1])}));
    if (props[k].required) {
      any_required = true;
      break;
    }
  }
  const ExprId body = g_.Seq({g_.Alt(std::move(firsts)), parts_.Ws()});
  return g_.Seq({open, any_required ? body : g_.Optional(body), close});
}

absl::StatusOr<Json> ParseSchema(absl::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the JSON Schema is not valid JSON");
  return j;
}

}  // namespace

absl::StatusOr<ExprId> AddJsonSchema(const nlohmann::ordered_json& schema, JsonParts* parts) {
  return SchemaCompiler(schema, parts).Run();
}

absl::StatusOr<Grammar> JsonSchemaToGrammar(absl::string_view schema_json,
                                            const JsonGrammarOptions& options) {
  ASSIGN_OR_RETURN(Json schema, ParseSchema(schema_json));
  Grammar g;
  const RuleId start = g.AddRule("root");
  JsonParts parts(&g, options);
  ASSIGN_OR_RETURN(ExprId body, AddJsonSchema(schema, &parts));
  g.SetRule(start, body);
  return g;
}

Grammar JsonObjectGrammar(const JsonGrammarOptions& options) {
  Grammar g;
  const RuleId start = g.AddRule("root");
  JsonParts parts(&g, options);
  g.SetRule(start, g.Ref(parts.AnyObject()));
  return g;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonSchema(
    absl::string_view schema_json, std::shared_ptr<const TokenVocabulary> vocab,
    const JsonGrammarOptions& options) {
  ASSIGN_OR_RETURN(Grammar g, JsonSchemaToGrammar(schema_json, options));
  return CompiledGrammar::Compile(g, std::move(vocab), options.compile);
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonObject(
    std::shared_ptr<const TokenVocabulary> vocab, const JsonGrammarOptions& options) {
  return CompiledGrammar::Compile(JsonObjectGrammar(options), std::move(vocab), options.compile);
}

}  // namespace swaserve::grammar
