#include "lib/base/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace swaserve::base {
namespace {

// A value read from a file or a flag, before conversion to the option's type.
struct RawValue {
  enum Kind { kText, kString, kNumber, kBool, kNull, kSequence, kMapping };
  // kText: untyped text (a YAML plain scalar or a flag value), convertible to
  // any scalar type; kString: explicitly a string (JSON string, quoted YAML).
  Kind kind = kText;
  std::string text;
  std::vector<RawValue> items;
};

absl::string_view KindName(RawValue::Kind kind) {
  switch (kind) {
    case RawValue::kText:
    case RawValue::kString:
      return "a string";
    case RawValue::kNumber:
      return "a number";
    case RawValue::kBool:
      return "a boolean";
    case RawValue::kNull:
      return "null";
    case RawValue::kSequence:
      return "a list";
    case RawValue::kMapping:
      return "a mapping";
  }
  return "a value";
}

std::string Describe(const RawValue& v) {
  if (v.kind == RawValue::kSequence || v.kind == RawValue::kMapping ||
      v.kind == RawValue::kNull) {
    return std::string(KindName(v.kind));
  }
  return absl::StrCat("'", v.text, "'");
}

absl::Status TypeError(absl::string_view key, absl::string_view expected,
                       const RawValue& v) {
  return absl::InvalidArgumentError(absl::StrCat(
      "key '", key, "': expected ", expected, ", got ", Describe(v)));
}

bool IsScalarText(const RawValue& v) {
  return v.kind == RawValue::kText || v.kind == RawValue::kNumber;
}

absl::Status ParseBool(absl::string_view key, const RawValue& v, bool* out) {
  if (v.kind == RawValue::kBool || v.kind == RawValue::kText) {
    std::string t = absl::AsciiStrToLower(v.text);
    if (t == "true" || t == "yes" || t == "on" || t == "1") {
      *out = true;
      return absl::OkStatus();
    }
    if (t == "false" || t == "no" || t == "off" || t == "0") {
      *out = false;
      return absl::OkStatus();
    }
  }
  return TypeError(key, "a boolean (true/false)", v);
}

template <typename Int>
absl::Status ParseInt(absl::string_view key, const RawValue& v, Int* out) {
  if (IsScalarText(v)) {
    if constexpr (std::is_signed_v<Int>) {
      int64_t x;
      if (absl::SimpleAtoi(v.text, &x)) {
        if (x < std::numeric_limits<Int>::min() ||
            x > std::numeric_limits<Int>::max()) {
          return absl::OutOfRangeError(absl::StrCat(
              "key '", key, "': ", x, " is out of range [",
              std::numeric_limits<Int>::min(), ", ",
              std::numeric_limits<Int>::max(), "]"));
        }
        *out = static_cast<Int>(x);
        return absl::OkStatus();
      }
    } else {
      uint64_t x;
      if (!absl::StartsWith(absl::StripAsciiWhitespace(v.text), "-") &&
          absl::SimpleAtoi(v.text, &x)) {
        if (x > std::numeric_limits<Int>::max()) {
          return absl::OutOfRangeError(
              absl::StrCat("key '", key, "': ", x, " is out of range [0, ",
                           std::numeric_limits<Int>::max(), "]"));
        }
        *out = static_cast<Int>(x);
        return absl::OkStatus();
      }
      return TypeError(key, "a non-negative integer", v);
    }
  }
  return TypeError(key, "an integer", v);
}

absl::Status ParseDouble(absl::string_view key, const RawValue& v, double* out) {
  if (IsScalarText(v) && absl::SimpleAtod(v.text, out)) return absl::OkStatus();
  return TypeError(key, "a number", v);
}

absl::Status ParseString(absl::string_view key, const RawValue& v,
                         std::string* out) {
  if (v.kind == RawValue::kText || v.kind == RawValue::kString) {
    *out = v.text;
    return absl::OkStatus();
  }
  return TypeError(key, "a string", v);
}

// Lists come as a sequence (files) or comma-separated text (flags).
std::vector<RawValue> ListItems(const RawValue& v) {
  if (v.kind == RawValue::kSequence) return v.items;
  std::vector<RawValue> items;
  if (v.text.empty()) return items;
  for (absl::string_view part : absl::StrSplit(v.text, ',')) {
    items.push_back(RawValue{RawValue::kText,
                             std::string(absl::StripAsciiWhitespace(part)), {}});
  }
  return items;
}

absl::Status Convert(absl::string_view key, const RawValue& v,
                     const Config::Target& target) {
  if (v.kind == RawValue::kNull) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "': has no value"));
  }
  return std::visit(
      [&](auto* out) -> absl::Status {
        using T = std::remove_pointer_t<decltype(out)>;
        if constexpr (std::is_same_v<T, bool>) {
          return ParseBool(key, v, out);
        } else if constexpr (std::is_integral_v<T>) {
          return ParseInt(key, v, out);
        } else if constexpr (std::is_same_v<T, double>) {
          return ParseDouble(key, v, out);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return ParseString(key, v, out);
        } else if constexpr (std::is_same_v<T, absl::Duration>) {
          if ((v.kind == RawValue::kText || v.kind == RawValue::kString) &&
              absl::ParseDuration(v.text, out)) {
            return absl::OkStatus();
          }
          return TypeError(key, "a duration like \"250ms\", \"5s\" or \"2m\"",
                           v);
        } else {
          if (v.kind != RawValue::kSequence && !IsScalarText(v) &&
              v.kind != RawValue::kString) {
            return TypeError(key, "a list", v);
          }
          T parsed;
          for (const RawValue& item : ListItems(v)) {
            typename T::value_type x{};
            absl::Status s;
            if constexpr (std::is_same_v<typename T::value_type, std::string>) {
              s = ParseString(key, item, &x);
            } else {
              s = ParseInt(key, item, &x);
            }
            if (!s.ok()) {
              return absl::InvalidArgumentError(
                  absl::StrCat(s.message(), " (in a list)"));
            }
            parsed.push_back(std::move(x));
          }
          *out = std::move(parsed);
          return absl::OkStatus();
        }
      },
      target);
}

std::string TypeName(const Config::Target& target) {
  return std::visit(
      [](auto* out) -> std::string {
        using T = std::remove_pointer_t<decltype(out)>;
        if constexpr (std::is_same_v<T, bool>) return "bool";
        if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>)
          return "int";
        if constexpr (std::is_same_v<T, uint32_t> ||
                      std::is_same_v<T, uint64_t>)
          return "uint";
        if constexpr (std::is_same_v<T, double>) return "number";
        if constexpr (std::is_same_v<T, std::string>) return "string";
        if constexpr (std::is_same_v<T, absl::Duration>) return "duration";
        if constexpr (std::is_same_v<T, std::vector<std::string>>)
          return "list of strings";
        return "list of ints";
      },
      target);
}

std::string ValueText(const Config::Target& target) {
  return std::visit(
      [](auto* out) -> std::string {
        using T = std::remove_pointer_t<decltype(out)>;
        if constexpr (std::is_same_v<T, bool>) return *out ? "true" : "false";
        if constexpr (std::is_arithmetic_v<T>) return absl::StrCat(*out);
        if constexpr (std::is_same_v<T, std::string>) return "\"" + *out + "\"";
        if constexpr (std::is_same_v<T, absl::Duration>)
          return absl::FormatDuration(*out);
        if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                      std::is_same_v<T, std::vector<int64_t>>)
          return "[" + absl::StrJoin(*out, ",") + "]";
        return "";
      },
      target);
}

RawValue FromYaml(const YAML::Node& node) {
  RawValue v;
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      v.kind = RawValue::kNull;
      break;
    case YAML::NodeType::Scalar:
      v.kind = node.Tag() == "!" ? RawValue::kString : RawValue::kText;
      v.text = node.Scalar();
      break;
    case YAML::NodeType::Sequence:
      v.kind = RawValue::kSequence;
      for (const YAML::Node& item : node) v.items.push_back(FromYaml(item));
      break;
    case YAML::NodeType::Map:
      v.kind = RawValue::kMapping;
      break;
  }
  return v;
}

RawValue FromJson(const nlohmann::json& j) {
  RawValue v;
  if (j.is_null()) {
    v.kind = RawValue::kNull;
  } else if (j.is_boolean()) {
    v.kind = RawValue::kBool;
    v.text = j.get<bool>() ? "true" : "false";
  } else if (j.is_number()) {
    v.kind = RawValue::kNumber;
    v.text = j.dump();
  } else if (j.is_string()) {
    v.kind = RawValue::kString;
    v.text = j.get<std::string>();
  } else if (j.is_array()) {
    v.kind = RawValue::kSequence;
    for (const auto& item : j) v.items.push_back(FromJson(item));
  } else {
    v.kind = RawValue::kMapping;
  }
  return v;
}

std::string Join(absl::string_view prefix, absl::string_view key) {
  return prefix.empty() ? std::string(key) : absl::StrCat(prefix, ".", key);
}

}  // namespace

// Walks a parsed document and applies its leaves; collects every error.
class ConfigApplier {
 public:
  explicit ConfigApplier(Config* config) : config_(config) {}

  void Leaf(const std::string& key, const RawValue& v) {
    const Config::Option* opt = config_->Find(key);
    if (opt == nullptr) {
      if (config_->IsPrefix(key)) {
        errors_.push_back(absl::StrCat("key '", key,
                                       "': is a section; expected a mapping, "
                                       "got ",
                                       Describe(v)));
      } else {
        errors_.push_back(absl::StrCat("unknown key '", key, "'"));
      }
      return;
    }
    absl::Status s = Convert(key, v, opt->target);
    if (!s.ok()) errors_.push_back(std::string(s.message()));
  }

  // True when `key` may hold a mapping (the root or a section).
  bool Section(const std::string& key) {
    if (key.empty() || config_->IsPrefix(key)) return true;
    if (config_->Find(key) != nullptr) {
      errors_.push_back(absl::StrCat("key '", key,
                                     "': expected a value, got a mapping"));
    } else {
      errors_.push_back(absl::StrCat("unknown key '", key, "'"));
    }
    return false;
  }

  void Yaml(const YAML::Node& node, const std::string& prefix) {
    if (node.IsMap()) {
      if (!Section(prefix)) return;
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          errors_.push_back(absl::StrCat(
              "a key under '", prefix.empty() ? "(top level)" : prefix,
              "' is not a plain name (complex YAML keys are not allowed)"));
          continue;
        }
        Yaml(kv.second, Join(prefix, kv.first.Scalar()));
      }
    } else if (prefix.empty()) {
      if (!node.IsNull()) {
        errors_.push_back("the top level must be a mapping of keys to values");
      }
    } else {
      Leaf(prefix, FromYaml(node));
    }
  }

  void Json(const nlohmann::json& j, const std::string& prefix) {
    if (j.is_object()) {
      if (!Section(prefix)) return;
      for (const auto& [k, child] : j.items()) Json(child, Join(prefix, k));
    } else if (prefix.empty()) {
      errors_.push_back("the top level must be an object of keys to values");
    } else {
      Leaf(prefix, FromJson(j));
    }
  }

  absl::Status Result(absl::string_view source) const {
    if (errors_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", absl::StrJoin(errors_, "; ")));
  }

 private:
  Config* config_;
  std::vector<std::string> errors_;
};

Config::Config(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void Config::AddTarget(absl::string_view key, Target target,
                       absl::string_view help) {
  for (const Option& o : options_) {
    if (o.key == key || absl::StartsWith(o.key, absl::StrCat(key, ".")) ||
        absl::StartsWith(key, absl::StrCat(o.key, "."))) {
      std::fprintf(stderr, "Config: option '%.*s' clashes with '%s'\n",
                   static_cast<int>(key.size()), key.data(), o.key.c_str());
      std::abort();
    }
  }
  options_.push_back(
      Option{std::string(key), target, std::string(help), ValueText(target)});
}

const Config::Option* Config::Find(absl::string_view key) const {
  for (const Option& o : options_) {
    if (o.key == key) return &o;
  }
  return nullptr;
}

bool Config::IsPrefix(absl::string_view key) const {
  const std::string dotted = absl::StrCat(key, ".");
  for (const Option& o : options_) {
    if (absl::StartsWith(o.key, dotted)) return true;
  }
  return false;
}

absl::Status Config::LoadString(absl::string_view text, absl::string_view source) {
  ConfigApplier applier(this);
  const bool json = absl::EndsWith(source, ".json");
  if (json) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr,
                                             /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      // Re-parse with exceptions for the position of the error.
      try {
        nlohmann::json unused = nlohmann::json::parse(text);
        (void)unused;
      } catch (const nlohmann::json::exception& e) {  // parse_error, out_of_range (number overflow), ...
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": invalid JSON: ", e.what()));
      }
      return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON"));
    }
    applier.Json(j, "");
  } else {
    YAML::Node root;
    try {
      root = YAML::Load(std::string(text));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                       ": invalid YAML: ", e.msg));
    }
    applier.Yaml(root, "");
  }
  return applier.Result(source);
}

absl::Status Config::LoadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read config file '", path, "': ",
                     std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return LoadString(ss.str(), path);
}

absl::Status Config::Set(absl::string_view key, absl::string_view value) {
  const Option* opt = Find(key);
  if (opt == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "'"));
  }
  return Convert(key, RawValue{RawValue::kText, std::string(value), {}},
                 opt->target);
}

absl::Status Config::ParseArgs(int argc, const char* const* argv,
                               std::vector<std::string>* positional) {
  struct Flag {
    std::string key;
    std::string value;
    bool has_value;
  };
  std::vector<Flag> flags;
  std::string config_file;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (flags_done || !absl::StartsWith(arg, "-") || arg == "-") {
      if (positional == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected argument '", arg, "'"));
      }
      positional->emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      help_requested_ = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag '", arg, "' (flags are written --name=value)"));
    }
    arg.remove_prefix(2);
    Flag flag;
    size_t eq = arg.find('=');
    flag.key = std::string(arg.substr(0, eq));
    absl::StrReplaceAll({{"-", "_"}}, &flag.key);
    flag.has_value = eq != absl::string_view::npos;
    if (flag.has_value) flag.value = std::string(arg.substr(eq + 1));
    if (flag.key == "config") {
      if (!flag.has_value) {
        if (i + 1 >= argc) {
          return absl::InvalidArgumentError("flag --config needs a file name");
        }
        flag.value = argv[++i];
      }
      config_file = flag.value;
      continue;
    }
    const Option* opt = Find(flag.key);
    bool negated = false;
    if (opt == nullptr && absl::StartsWith(flag.key, "no_")) {
      opt = Find(flag.key.substr(3));
      negated = opt != nullptr && std::holds_alternative<bool*>(opt->target) &&
                !flag.has_value;
      if (negated) flag.key = flag.key.substr(3);
      else opt = nullptr;
    }
    if (opt == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '--", arg.substr(0, eq), "'"));
    }
    if (!flag.has_value) {
      if (std::holds_alternative<bool*>(opt->target)) {
        flag.value = negated ? "false" : "true";
      } else if (i + 1 < argc) {
        flag.value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("flag '--", flag.key, "' needs a value"));
      }
    }
    flags.push_back(std::move(flag));
  }
  if (!config_file.empty()) {
    absl::Status s = LoadFile(config_file);
    if (!s.ok()) return s;
  }
  for (const Flag& f : flags) {
    absl::Status s = Set(f.key, f.value);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("flag --", f.key, ": ",
                                                 s.message()));
    }
  }
  return absl::OkStatus();
}

std::string Config::Usage() const {
  std::string out = absl::StrCat("Usage: ", program_, " [--config FILE] [--key=value ...]\n\n",
                                 description_, "\n\nOptions (file key or --flag):\n");
  for (const Option& o : options_) {
    absl::StrAppend(&out, "  --", o.key, " (", TypeName(o.target),
                    ", default ", o.default_text, ")\n      ", o.help, "\n");
  }
  absl::StrAppend(&out,
                  "  --config FILE\n      YAML or JSON file with the same keys "
                  "(dots are nesting); flags override it.\n");
  return out;
}

std::string Config::Dump() const {
  std::string out;
  for (const Option& o : options_) {
    absl::StrAppend(&out, o.key, " = ", ValueText(o.target), "\n");
  }
  return out;
}

std::vector<std::string> Config::ChangedFlags() const {
  std::vector<std::string> out;
  for (const Option& o : options_) {
    if (ValueText(o.target) == o.default_text) continue;
    // As a flag: strings raw, lists comma-separated (what Set parses).
    const std::string value = std::visit(
        [&o](auto* v) -> std::string {
          using T = std::remove_pointer_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) return *v;
          if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                        std::is_same_v<T, std::vector<int64_t>>) {
            return absl::StrJoin(*v, ",");
          }
          return ValueText(o.target);
        },
        o.target);
    out.push_back(absl::StrCat("--", o.key, "=", value));
  }
  return out;
}

void ParseConfigOrExit(Config& config, int argc, const char* const* argv,
                       std::vector<std::string>* positional) {
  absl::Status s = config.ParseArgs(argc, argv, positional);
  if (config.help_requested()) {
    std::fputs(config.Usage().c_str(), stdout);
    std::exit(0);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n%s: try --help for the list of options\n",
                 config.program_name().c_str(), std::string(s.message()).c_str(),
                 config.program_name().c_str());
    std::exit(2);
  }
}

}  // namespace swaserve::base
