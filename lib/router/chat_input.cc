#include "lib/router/chat_input.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace swaserve::router {

using OJson = nlohmann::ordered_json;

absl::StatusOr<model::ChatInput> ChatInputFromProto(const v1::ChatMessages& chat,
                                                    bool null_content) {
  model::ChatInput input;
  input.add_generation_prompt = chat.add_generation_prompt();
  for (const v1::ChatMessage& m : chat.messages()) {
    OJson j = {{"role", m.role()}};
    if (m.content_null() && null_content) {
      j["content"] = nullptr;
    } else {
      j["content"] = m.content();
    }
    if (!m.name().empty()) j["name"] = m.name();
    if (!m.tool_call_id().empty()) j["tool_call_id"] = m.tool_call_id();
    if (m.has_reasoning_content()) j["reasoning_content"] = m.reasoning_content();
    if (m.tool_calls_size() > 0) {
      OJson calls = OJson::array();
      for (const v1::ToolCall& c : m.tool_calls()) {
        OJson args = OJson::parse(c.arguments(), nullptr, /*allow_exceptions=*/false);
        if (!args.is_object()) args = c.arguments();
        calls.push_back({{"id", c.id()},
                         {"type", "function"},
                         {"function", {{"name", c.name()}, {"arguments", std::move(args)}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
    input.messages.push_back(std::move(j));
  }
  if (!chat.tools_json().empty()) {
    OJson tools = OJson::parse(chat.tools_json(), nullptr, /*allow_exceptions=*/false);
    if (!tools.is_array()) return absl::InvalidArgumentError("tools_json: not a JSON array");
    for (size_t i = 0; i < tools.size(); ++i) {
      if (!tools[i].is_object()) {
        return absl::InvalidArgumentError(absl::StrCat("tools_json[", i, "]: not an object"));
      }
    }
    if (!tools.empty()) input.tools = std::move(tools);
  }
  if (!chat.template_kwargs_json().empty()) {
    OJson kwargs = OJson::parse(chat.template_kwargs_json(), nullptr, false);
    if (!kwargs.is_object()) {
      return absl::InvalidArgumentError("template_kwargs_json: not a JSON object");
    }
    input.kwargs = std::move(kwargs);
  }
  return input;
}

std::vector<model::ToolDefinition> ToolDefinitions(const OJson& tools) {
  std::vector<model::ToolDefinition> out;
  if (!tools.is_array()) return out;
  for (const OJson& t : tools) {
    const OJson* f = &t;
    if (const auto it = t.find("function"); it != t.end() && it->is_object()) f = &*it;
    const auto name = f->find("name");
    if (name == f->end() || !name->is_string()) continue;
    model::ToolDefinition d{.name = name->get<std::string>(), .parameters = nullptr};
    if (const auto p = f->find("parameters"); p != f->end()) d.parameters = *p;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace swaserve::router
