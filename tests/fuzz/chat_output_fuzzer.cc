// Fuzzes the chat output parser (lib/model/chat_output_parser.h) in both
// tool-call formats, with and without an open reasoning block: the first
// byte picks the options, the second the piece size the rest is fed in.
// Checked: no crash or sanitizer report; the result does not depend on how
// the output is split; every call's arguments are a JSON object; the fields
// never hold more bytes than the output had.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "lib/model/chat_output_parser.h"
#include "nlohmann/json.hpp"

namespace {

using swaserve::model::ChatOutputDelta;
using swaserve::model::ChatOutputOptions;
using swaserve::model::ChatOutputParser;
using swaserve::model::ToolCallFormat;

void Check(bool ok) {
  if (!ok) std::abort();
}

struct Result {
  std::string content, reasoning, args;
  size_t calls = 0;
};

void Add(const ChatOutputDelta& d, Result* r) {
  r->content += d.content;
  r->reasoning += d.reasoning;
  for (const auto& t : d.tool_calls) r->args += t.arguments;
}

Result Run(const ChatOutputOptions& o, std::string_view text, size_t piece) {
  ChatOutputParser p(o);
  Result r;
  for (size_t i = 0; i < text.size(); i += piece) Add(p.Feed(text.substr(i, piece)), &r);
  Add(p.Finish(), &r);
  r.calls = p.calls().size();
  for (const auto& c : p.calls()) {
    const nlohmann::json args = nlohmann::json::parse(c.arguments, nullptr, false);
    Check(args.is_object());
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  const size_t piece = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  ChatOutputOptions o;
  o.tool_format = (flags & 1) ? ToolCallFormat::kJsonToolCall : ToolCallFormat::kXmlFunction;
  o.parse_tool_calls = (flags & 2) == 0;
  o.parallel_tool_calls = (flags & 4) == 0;
  o.starts_in_reasoning = (flags & 8) != 0;
  o.parse_reasoning = (flags & 16) == 0;
  o.tools = {{.name = "f", .parameters = nlohmann::ordered_json::parse(
                               R"({"properties": {"a": {"type": "integer"},
                                   "b": {"type": ["object", "null"]}, "c": {"type": "array"}}})")},
             {.name = "g", .parameters = nullptr}};
  const Result whole = Run(o, text, text.size() + 1);
  const Result split = Run(o, text, piece);
  Check(whole.content == split.content);
  Check(whole.reasoning == split.reasoning);
  Check(whole.args == split.args);
  Check(whole.calls == split.calls);
  if (whole.calls == 0) Check(whole.content.size() + whole.reasoning.size() <= text.size());
  return 0;
}
