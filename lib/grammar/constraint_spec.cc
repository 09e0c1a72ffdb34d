#include "lib/grammar/constraint_spec.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/model/chat_output_parser.h"
#include "nlohmann/json.hpp"

namespace swaserve::grammar {

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileConstraint(
    const v1::OutputConstraint& spec, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarCache* cache) {
  switch (spec.kind()) {
    case v1::OutputConstraint::KIND_JSON_SCHEMA:
      return cache->JsonSchema(spec.json_schema(), vocab);
    case v1::OutputConstraint::KIND_JSON_OBJECT:
      return cache->JsonObject(vocab);
    case v1::OutputConstraint::KIND_TOOL_CALL: {
      const auto tools_json =
          nlohmann::ordered_json::parse(spec.tools_json(), nullptr, /*allow_exceptions=*/false);
      if (!tools_json.is_array() || tools_json.empty()) {
        return absl::InvalidArgumentError("constraint: a tool call needs tools");
      }
      std::vector<model::ToolDefinition> tools;
      for (const auto& t : tools_json) {
        const nlohmann::ordered_json* f = t.contains("function") ? &t["function"] : &t;
        if (!f->is_object() || !f->contains("name") || !(*f)["name"].is_string()) {
          return absl::InvalidArgumentError("constraint: a tool without a name");
        }
        tools.push_back({.name = (*f)["name"].get<std::string>(),
                         .parameters = f->contains("parameters") ? (*f)["parameters"]
                                                                 : nlohmann::ordered_json()});
      }
      ToolCallGrammarOptions o;
      switch (spec.tool_format()) {
        case v1::OutputConstraint::TOOL_FORMAT_XML_FUNCTION:
          o.format = model::ToolCallFormat::kXmlFunction;
          break;
        case v1::OutputConstraint::TOOL_FORMAT_JSON:
          o.format = model::ToolCallFormat::kJsonToolCall;
          break;
        default:
          return absl::InvalidArgumentError(
              "constraint: the model's tool-call format is unknown, so a call cannot be forced");
      }
      o.parallel_calls = spec.parallel_calls();
      return cache->ToolCall(spec.tools_json(), tools, vocab, o);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("constraint: unknown kind ", spec.kind()));
  }
}

}  // namespace swaserve::grammar
