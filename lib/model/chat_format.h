// What a checkpoint's chat template does with tools and reasoning, found by
// rendering probe conversations through it, so that the output parsers
// (chat_output_parser.h) follow the checkpoint instead of a flag the user
// must know.
//
// DetectChatFormat renders, with the template itself:
//   - one user message with and without a probe tool definition: equal
//     renders mean the template ignores `tools` (tools_supported = false);
//   - an assistant turn calling the probe tool with one argument, and reads
//     the call's markup out of the render:
//       "<function=NAME>" and "<parameter=ARG>"  -> kXmlFunction (MiMo-V2,
//                                                   Qwen3-Coder)
//       "<tool_call>" and "\"name\": \"NAME\""   -> kJsonToolCall (Qwen3,
//                                                   Hermes)
//       anything else                           -> kUnknown (tools refused:
//                                                   no parser reads it)
//   - the same turn with content null instead of "" (null_content);
//   - the generation prompt with enable_thinking false and true: a template
//     whose renders differ there takes the kwarg (thinking_switch).
// A template that fails on a probe (raise_exception, say) gets the
// conservative answer for that probe (tools unsupported, no switch).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "lib/model/chat_template.h"

namespace swaserve::model {

enum class ToolCallFormat {
  kUnknown = 0,
  // <tool_call>\n<function=NAME>\n<parameter=P>V</parameter>\n</function>\n</tool_call>
  kXmlFunction = 1,
  // <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
  kJsonToolCall = 2,
};

std::string_view ToolCallFormatName(ToolCallFormat format);

struct ChatFormat {
  // The template renders `tools` (a definition changes the prompt).
  bool tools_supported = false;
  // How the model writes a call; kUnknown when tools_supported is false or
  // the call markup is not one the parsers read.
  ToolCallFormat tool_format = ToolCallFormat::kUnknown;
  // enable_thinking changes the generation prompt.
  bool thinking_switch = false;
  // The template renders an assistant message whose content is null beside
  // its tool calls (DeepSeek-V3's expects null there; Qwen3's and MiMo's
  // fail on it and get "" instead, as vLLM passes it).
  bool null_content = false;
  // Reasoning block delimiters the output parser looks for.
  std::string think_open = "<think>";
  std::string think_close = "</think>";
};

ChatFormat DetectChatFormat(const ChatTemplate& chat_template);

// True when `prompt_tail` (the end of a rendered prompt) leaves a reasoning
// block open: its last think_open comes after its last think_close, so the
// model's output starts inside the reasoning (MiMo's generation prompt ends
// in "<think>" when thinking is on).
bool OpensReasoning(std::string_view prompt_tail, const ChatFormat& format);

}  // namespace swaserve::model
