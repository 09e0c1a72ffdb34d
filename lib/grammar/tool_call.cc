#include "lib/grammar/tool_call.h"

#include <string>
#include <vector>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/grammar/json_parts.h"

namespace swaserve::grammar {
namespace {

using Json = nlohmann::ordered_json;

bool AllowsString(const Json& schema) {
  if (!schema.is_object() || !schema.contains("type")) return true;
  const Json& t = schema["type"];
  if (t.is_string()) return t.get<std::string>() == "string";
  if (t.is_array()) {
    for (const Json& x : t) {
      if (x == "string") return true;
    }
  }
  return false;
}

// Raw text that cannot contain "</" or "<<".
ExprId RawText(JsonParts* parts) {
  Grammar& g = parts->g();
  const ExprId plain = parts->Utf8({{0x01, '<' - 1}, {'<' + 1, 0x10FFFF}});
  const ExprId after_lt = parts->Utf8({{0x01, '.'}, {'0', '<' - 1}, {'<' + 1, 0x10FFFF}});
  return g.Star(g.Alt({plain, g.Seq({g.Literal("<"), after_lt})}));
}

absl::StatusOr<ExprId> XmlValue(const Json& schema, JsonParts* parts, const std::string& where) {
  Grammar& g = parts->g();
  if (schema.is_object() && (schema.contains("enum") || schema.contains("const"))) {
    std::vector<Json> values;
    if (schema.contains("const")) values.push_back(schema["const"]);
    if (schema.contains("enum") && schema["enum"].is_array()) {
      for (const Json& v : schema["enum"]) values.push_back(v);
    }
    std::vector<ExprId> alts;
    for (const Json& v : values) {
      const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
      if (text.find("</") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": an enum value contains \"</\""));
      }
      alts.push_back(g.Literal(text));
    }
    if (alts.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty enum"));
    return g.Alt(std::move(alts));
  }
  if (AllowsString(schema)) {
    for (const char* k : {"pattern", "format", "minLength", "maxLength"}) {
      if (schema.is_object() && schema.contains(k)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": '", k, "' on a string parameter is not supported in the XML call format"));
      }
    }
    return RawText(parts);
  }
  absl::StatusOr<ExprId> e = AddJsonSchema(schema, parts);
  if (!e.ok()) return base::Annotate(e.status(), where);
  return *e;
}

absl::StatusOr<ExprId> XmlCall(const model::ToolDefinition& tool, JsonParts* parts) {
  Grammar& g = parts->g();
  if (tool.name.empty() || tool.name.find_first_of(" \t\n<>") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("tool name '", tool.name, "' cannot be written as <function=NAME>"));
  }
  std::vector<ExprId> seq = {g.Literal(absl::StrCat("<tool_call>\n<function=", tool.name, ">\n"))};
  const Json& params = tool.parameters;
  if (params.is_object() && params.contains("properties") && params["properties"].is_object()) {
    std::vector<std::string> required;
    if (params.contains("required") && params["required"].is_array()) {
      for (const Json& r : params["required"]) {
        if (r.is_string()) required.push_back(r.get<std::string>());
      }
    }
    for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it) {
      const std::string where = absl::StrCat("tool ", tool.name, " parameter ", it.key());
      if (it.key().find_first_of("<>\n") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": the name cannot be written as <parameter=P>"));
      }
      ASSIGN_OR_RETURN(ExprId value, XmlValue(it.value(), parts, where));
      const ExprId p = g.Seq({g.Literal(absl::StrCat("<parameter=", it.key(), ">")), value,
                              g.Literal("</parameter>\n")});
      const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
      seq.push_back(req ? p : g.Optional(p));
    }
  }
  seq.push_back(g.Literal("</function>\n</tool_call>"));
  return g.Seq(std::move(seq));
}

absl::StatusOr<ExprId> JsonCall(const model::ToolDefinition& tool, JsonParts* parts) {
  Grammar& g = parts->g();
  ExprId args;
  if (tool.parameters.is_object() && !tool.parameters.empty()) {
    absl::StatusOr<ExprId> a = AddJsonSchema(tool.parameters, parts);
    if (!a.ok()) return base::Annotate(a.status(), absl::StrCat("tool ", tool.name));
    args = *a;
  } else {
    args = g.Ref(parts->AnyObject());
  }
  const std::string name = Json(tool.name).dump(-1, ' ', false, Json::error_handler_t::replace);
  return g.Seq({g.Literal(absl::StrCat("<tool_call>\n{\"name\": ", name, ", \"arguments\": ")), args,
                g.Literal("}\n</tool_call>")});
}

// Any text that does not contain `word`, as one rule per state of the
// Knuth-Morris-Pratt automaton of `word` (how much of it the text ends in).
// Returns the rule of state 0.
RuleId TextWithout(Grammar& g, const std::string& word) {
  const int n = static_cast<int>(word.size());
  std::vector<int> fail(n + 1, 0);
  for (int i = 1, k = 0; i < n; ++i) {
    while (k > 0 && word[i] != word[k]) k = fail[k];
    if (word[i] == word[k]) ++k;
    fail[i + 1] = k;
  }
  auto step = [&](int s, uint8_t b) {
    while (s > 0 && static_cast<uint8_t>(word[s]) != b) s = fail[s];
    return static_cast<uint8_t>(word[s]) == b ? s + 1 : 0;
  };
  std::vector<RuleId> rules(n);
  for (int s = 0; s < n; ++s) rules[s] = g.AddRule(absl::StrCat("text", g.rules().size()));
  for (int s = 0; s < n; ++s) {
    std::vector<ByteSet> to(n);
    for (int b = 0; b < 256; ++b) {
      const int t = step(s, static_cast<uint8_t>(b));
      if (t < n) to[t].Add(static_cast<uint8_t>(b));
    }
    std::vector<ExprId> alts = {g.Empty()};
    for (int t = 0; t < n; ++t) {
      if (!to[t].Empty()) alts.push_back(g.Seq({g.Bytes(to[t]), g.Ref(rules[t])}));
    }
    g.SetRule(rules[s], g.Alt(std::move(alts)));
  }
  return rules[0];
}

}  // namespace

absl::StatusOr<Grammar> ToolCallGrammar(const std::vector<model::ToolDefinition>& tools,
                                        const ToolCallGrammarOptions& options) {
  if (tools.empty()) return absl::InvalidArgumentError("no tools to call");
  if (options.format == model::ToolCallFormat::kUnknown) {
    return absl::InvalidArgumentError("the model's tool-call format is unknown");
  }
  Grammar g;
  const RuleId start = g.AddRule("root");
  const RuleId call = g.AddRule("call");
  JsonGrammarOptions json = options.json;
  // A string argument must not close the markup early ("</tool_call>").
  if (options.format == model::ToolCallFormat::kJsonToolCall) json.escape_angle_bracket = true;
  JsonParts parts(&g, json);
  std::vector<ExprId> alts;
  for (const model::ToolDefinition& tool : tools) {
    ASSIGN_OR_RETURN(ExprId e, options.format == model::ToolCallFormat::kXmlFunction
                                   ? XmlCall(tool, &parts)
                                   : JsonCall(tool, &parts));
    alts.push_back(e);
  }
  g.SetRule(call, g.Alt(std::move(alts)));
  ExprId calls = g.Ref(call);
  if (options.parallel_calls) {
    // Qwen3's template puts "\n" between calls, MiMo's nothing.
    calls = g.Seq({calls, g.Star(g.Seq({g.Optional(g.Literal("\n")), g.Ref(call)}))});
  }
  if (options.text_before_calls) {
    const RuleId text = TextWithout(g, "<tool_call>");
    calls = g.Seq({g.Ref(text), g.Optional(calls)});
  }
  g.SetRule(start, calls);
  return g;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileToolCall(
    const std::vector<model::ToolDefinition>& tools, std::shared_ptr<const TokenVocabulary> vocab,
    const ToolCallGrammarOptions& options) {
  ASSIGN_OR_RETURN(Grammar g, ToolCallGrammar(tools, options));
  return CompiledGrammar::Compile(g, std::move(vocab), options.json.compile);
}

}  // namespace swaserve::grammar
