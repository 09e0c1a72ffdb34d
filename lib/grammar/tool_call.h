// Grammars for a forced tool call in the model's own markup (what
// tool_choice "required" or a named function constrains the output to),
// with each tool's arguments constrained by its parameters' JSON Schema.
//
// Formats (lib/model/chat_format.h, as the chat templates render a call and
// lib/model/chat_output_parser.h reads it back):
//   kXmlFunction (MiMo, Qwen3-Coder):
//     <tool_call>\n<function=NAME>\n
//     <parameter=P>VALUE</parameter>\n      (one per parameter)
//     </function>\n</tool_call>
//   Parameters in the schema's property order, required ones always,
//   optional ones may be left out. VALUE: for a parameter whose schema
//   allows "string" (or has no type), raw text in which "<" is never
//   followed by "/" or "<" (so it cannot close the tag early), or one of its
//   enum/const strings verbatim; a string with pattern, format, minLength or
//   maxLength is InvalidArgument (not expressible in raw text here yet).
//   Other types: the JSON value per the schema (the parser converts it).
//   kJsonToolCall (Qwen3, Hermes):
//     <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//   ARGS: the parameters' schema as JSON (json_schema.h, whitespace policy
//   included); a tool without parameters gets any JSON object. A "<" inside
//   a string is written \u003C (JsonGrammarOptions::escape_angle_bracket),
//   so that no argument can close the call's tag ("</tool_call>") early.
// Several tools: the call names any of them. parallel_calls: one or more
// calls, each after an optional "\n" (Qwen3's template renders one, MiMo's
// none). The grammar starts at "<tool_call>": a reasoning
// block before it (<think>...</think>) is outside the constraint — the
// sampler applies the matcher once the reasoning ends.
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/grammar/compiled_grammar.h"
#include "lib/grammar/grammar.h"
#include "lib/grammar/json_schema.h"
#include "lib/model/chat_format.h"
#include "lib/model/chat_output_parser.h"

namespace swaserve::grammar {

struct ToolCallGrammarOptions {
  // The model's markup; kUnknown is InvalidArgument. Default kJsonToolCall.
  model::ToolCallFormat format = model::ToolCallFormat::kJsonToolCall;
  // Allow more than one call. Default false.
  bool parallel_calls = false;
  // tool_choice "auto" with strict tools: any text (EOS allowed) until
  // "<tool_call>" appears; from there the call(s) are constrained and
  // nothing but calls follows. Default false: the output starts with a call.
  bool text_before_calls = false;
  JsonGrammarOptions json;
};

// InvalidArgument: no tools, a tool name with characters the markup cannot
// carry (kXmlFunction: whitespace, '<', '>'), an unsupported schema (named
// as in JsonSchemaToGrammar, prefixed with the tool's name).
absl::StatusOr<Grammar> ToolCallGrammar(const std::vector<model::ToolDefinition>& tools,
                                        const ToolCallGrammarOptions& options = {});
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileToolCall(
    const std::vector<model::ToolDefinition>& tools, std::shared_ptr<const TokenVocabulary> vocab,
    const ToolCallGrammarOptions& options = {});

}  // namespace swaserve::grammar
