#include "lib/model/chat_format.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace swaserve::model {
namespace {

using OJson = nlohmann::ordered_json;

constexpr char kProbeTool[] = "swaserve_probe_fn";
constexpr char kProbeArg[] = "swaserve_probe_arg";

OJson ProbeTools() {
  OJson params = {{"type", "object"},
                  {"properties", {{kProbeArg, {{"type", "string"}}}}},
                  {"required", OJson::array({kProbeArg})}};
  return OJson::array({{{"type", "function"},
                        {"function",
                         {{"name", kProbeTool},
                          {"description", "probe"},
                          {"parameters", std::move(params)}}}}});
}

OJson UserMessage() { return {{"role", "user"}, {"content", "probe question"}}; }

std::optional<std::string> Render(const ChatTemplate& t, ChatInput input) {
  absl::StatusOr<std::string> r = t.Apply(input);
  if (!r.ok()) return std::nullopt;
  return *std::move(r);
}

bool ToolsChangeThePrompt(const ChatTemplate& t) {
  ChatInput plain;
  plain.messages.push_back(UserMessage());
  ChatInput with_tools = plain;
  with_tools.tools = ProbeTools();
  const std::optional<std::string> a = Render(t, plain);
  const std::optional<std::string> b = Render(t, with_tools);
  return a && b && *a != *b && absl::StrContains(*b, kProbeTool);
}

ChatInput CallProbe(const OJson& content) {
  ChatInput input;
  input.tools = ProbeTools();
  input.add_generation_prompt = false;
  input.messages.push_back(UserMessage());
  OJson call = {{"id", "call_probe"},
                {"type", "function"},
                {"function", {{"name", kProbeTool}, {"arguments", {{kProbeArg, "probe_value"}}}}}};
  input.messages.push_back(
      {{"role", "assistant"}, {"content", content}, {"tool_calls", OJson::array({call})}});
  return input;
}

ToolCallFormat CallFormat(const ChatTemplate& t) {
  const std::optional<std::string> r = Render(t, CallProbe(""));
  if (!r) return ToolCallFormat::kUnknown;
  if (absl::StrContains(*r, absl::StrCat("<function=", kProbeTool, ">")) &&
      absl::StrContains(*r, absl::StrCat("<parameter=", kProbeArg, ">"))) {
    return ToolCallFormat::kXmlFunction;
  }
  if (absl::StrContains(*r, "<tool_call>") &&
      absl::StrContains(*r, absl::StrCat("\"name\": \"", kProbeTool, "\""))) {
    return ToolCallFormat::kJsonToolCall;
  }
  return ToolCallFormat::kUnknown;
}

bool ThinkingSwitch(const ChatTemplate& t) {
  ChatInput on;
  on.messages.push_back(UserMessage());
  ChatInput off = on;
  on.kwargs["enable_thinking"] = true;
  off.kwargs["enable_thinking"] = false;
  const std::optional<std::string> a = Render(t, on);
  const std::optional<std::string> b = Render(t, off);
  return a && b && *a != *b;
}

}  // namespace

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kXmlFunction:
      return "xml-function";
    case ToolCallFormat::kJsonToolCall:
      return "json-tool-call";
    case ToolCallFormat::kUnknown:
      break;
  }
  return "unknown";
}

ChatFormat DetectChatFormat(const ChatTemplate& chat_template) {
  ChatFormat f;
  f.tools_supported = ToolsChangeThePrompt(chat_template);
  if (f.tools_supported) f.tool_format = CallFormat(chat_template);
  f.null_content = Render(chat_template, CallProbe(nullptr)).has_value();
  f.thinking_switch = ThinkingSwitch(chat_template);
  return f;
}

bool OpensReasoning(std::string_view prompt_tail, const ChatFormat& format) {
  const size_t open = prompt_tail.rfind(format.think_open);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt_tail.rfind(format.think_close);
  return close == std::string_view::npos || close < open;
}

}  // namespace swaserve::model
