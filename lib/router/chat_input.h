// A gRPC chat prompt (v1::ChatMessages) as the chat template's input: the
// messages, tools and template kwargs in the OpenAI / transformers shape
// that checkpoints' templates read (model::ChatInput).
//
// Messages become {"role", "content", and where set "name", "tool_call_id",
// "reasoning_content", "tool_calls"}; content is null when content_null is
// set and the template takes null (`null_content`), "" otherwise; a tool call becomes {"id", "type": "function", "function": {"name",
// "arguments"}} with arguments parsed into an object when its text is a
// JSON object (as vLLM passes them: templates such as MiMo's iterate over
// them), the text otherwise. tools_json must be a JSON array of objects,
// template_kwargs_json a JSON object; errors are InvalidArgument naming the
// field.
//
// Thread-safety: pure functions.
#pragma once

#include "absl/status/statusor.h"
#include "lib/model/chat_output_parser.h"
#include "lib/model/chat_template.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::router {

absl::StatusOr<model::ChatInput> ChatInputFromProto(const v1::ChatMessages& chat,
                                                    bool null_content);

// The tools of a tools JSON array (as ChatInputFromProto checked it): name
// and parameters of each {"type": "function", "function": {...}}.
std::vector<model::ToolDefinition> ToolDefinitions(const nlohmann::ordered_json& tools);

}  // namespace swaserve::router
