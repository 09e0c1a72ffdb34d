// Splits a chat model's generated text, as it streams, into the answer
// (content), the reasoning block and tool calls, in the model family's own
// markup (chat_format.h says which: DetectChatFormat).
//
// Input: text deltas in order (any split, a tag may straddle two deltas).
// Output per delta: content text, reasoning text and tool-call deltas, each
// possibly empty. Text that may be the start of a tag is held back until the
// next delta decides it, so nothing is emitted twice or in the wrong field.
//
// Reasoning: text between think_open and think_close (ChatFormat), or from
// the start of the output when the prompt left a block open
// (starts_in_reasoning). The tags are not part of either field; the text
// between them is kept exactly (no trimming), so that a template that
// renders "<think>" + reasoning_content + "</think>" + content reproduces the
// output. think_open counts only before any content other than whitespace.
// Markup inside the reasoning is reasoning, never a call.
//
// Tool calls (parse_tool_calls): a "<tool_call>...</tool_call>" block is held
// until it closes, then checked. A well-formed call of a declared tool
// becomes a ParsedToolCall, emitted as one delta with its index, id and name
// and then one delta per argument fragment (the arguments are a JSON object
// written as Python's json.dumps writes it: ", " and ": " separators, UTF-8
// kept). Anything else — malformed markup, an undeclared function, a second
// call when parallel calls are off, a block cut off by the end of the
// output — is returned as content text, unchanged: a call is never
// invented. Whitespace between calls, and after the last one when nothing
// else follows, is dropped.
//   kXmlFunction:  <function=NAME><parameter=P>VALUE</parameter>...</function>
//                  with only whitespace between the elements; a VALUE is
//                  the exact text between its tags, converted to the type
//                  the tool's JSON Schema declares for P (integer, number,
//                  boolean, null, object, array; a string when it declares
//                  string, nothing, or the text does not convert).
//   kJsonToolCall: {"name": NAME, "arguments": {...}} (arguments may be a
//                  JSON string holding an object).
//
// Thread-safety: none; one parser per generated choice.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lib/model/chat_format.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {

// A declared tool: its name and its parameters' JSON Schema (null: none).
struct ToolDefinition {
  std::string name;
  nlohmann::ordered_json parameters;
};

struct ChatOutputOptions {
  // Markup of calls. kUnknown disables call parsing. Default: kUnknown.
  ToolCallFormat tool_format = ToolCallFormat::kUnknown;
  // Parse calls (the request has tools and tool_choice is not "none").
  // Default: false.
  bool parse_tool_calls = false;
  // More than one call per turn. Default: true.
  bool parallel_tool_calls = true;
  // The request's tools; calls of other names are text.
  std::vector<ToolDefinition> tools;
  // Split reasoning from content. Default: true.
  bool parse_reasoning = true;
  // The prompt left a reasoning block open (OpensReasoning). Default: false.
  bool starts_in_reasoning = false;
  std::string think_open = "<think>";
  std::string think_close = "</think>";
  // Call ids are "call_" + this + the call's index. Default: empty.
  std::string call_id_prefix;
};

struct ParsedToolCall {
  std::string id;
  std::string name;
  // JSON object text.
  std::string arguments;
};

// One streamed piece of a call: the first delta of an index carries id and
// name (arguments empty), later ones argument fragments.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatOutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputOptions options);

  // The part of the output that `text` completes.
  ChatOutputDelta Feed(std::string_view text);
  // The end of the output: held text is released (an open call as text).
  ChatOutputDelta Finish();

  // Calls completed so far.
  const std::vector<ParsedToolCall>& calls() const { return calls_; }
  // Call blocks returned as text (malformed, undeclared, cut off, or a
  // second call with parallel calls off).
  int rejected_calls() const { return rejected_calls_; }
  // The parser is inside a reasoning block (what the next text continues).
  bool in_reasoning() const { return state_ == State::kReasoning; }
  // All reasoning and content emitted so far.
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }

 private:
  enum class State { kContent, kReasoning, kCall };

  void Run(bool final, ChatOutputDelta* out);
  // One step; false when it needs more text.
  bool StepContent(bool final, ChatOutputDelta* out);
  bool StepReasoning(bool final, ChatOutputDelta* out);
  bool StepCall(bool final, ChatOutputDelta* out);
  void EmitContent(std::string_view text, ChatOutputDelta* out);
  void EmitCall(std::string_view block, ChatOutputDelta* out);
  bool ParseCall(std::string_view body, ParsedToolCall* call,
                 std::vector<std::string>* fragments) const;
  const ToolDefinition* FindTool(std::string_view name) const;

  ChatOutputOptions o_;
  State state_;
  std::string buf_;
  // kCall: buf_[0, call_scanned_) holds no start of the closing tag.
  size_t call_scanned_ = 0;
  // Content other than whitespace was emitted.
  bool saw_content_ = false;
  bool saw_reasoning_ = false;
  // Text other than whitespace followed the latest call.
  bool content_after_call_ = false;
  std::vector<ParsedToolCall> calls_;
  int rejected_calls_ = 0;
  std::string reasoning_;
  std::string content_;
};

// Converts an XML-format parameter's text to the JSON value its schema
// declares (see the header comment); exposed for tests.
nlohmann::ordered_json ConvertParameter(std::string_view text,
                                        const nlohmann::ordered_json& schema);

}  // namespace swaserve::model
