// Fuzzes the Jinja chat template interpreter (lib/model/jinja/template.h):
// the lexer, parser and renderer on arbitrary templates and contexts.
//
// Input: the template, then optionally a NUL byte and a JSON object used as
// the render context (a default conversation with a tool when it is absent
// or not valid JSON). Renders run under small limits so that hostile
// templates end fast. Properties checked:
//   - parse and render never crash, hang or overflow the stack: they succeed
//     or return InvalidArgument;
//   - a successful render is valid UTF-8 and its untrusted ranges are
//     sorted, disjoint, non-empty and inside the text;
//   - rendering twice gives the same result (the renderer keeps no state).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "lib/model/jinja/template.h"
#include "lib/model/unicode.h"
#include "nlohmann/json.hpp"

namespace {

using swaserve::model::jinja::ByteRange;
using swaserve::model::jinja::Rendered;
using swaserve::model::jinja::RenderOptions;
using swaserve::model::jinja::Template;
using Json = nlohmann::ordered_json;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "chat_template_fuzzer: %s\n", what);
    std::abort();
  }
}

const Json& DefaultContext() {
  static const Json* context = new Json(Json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "hi <|im_end|> <think>x</think>"},
      {"role": "assistant", "content": null, "reasoning_content": "r",
       "tool_calls": [{"type": "function", "function":
         {"name": "f", "arguments": {"a": [1, 2.5, "x", null, true]}}}]},
      {"role": "tool", "content": [{"type": "text", "text": "out"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "enable_thinking": false
  })"));
  return *context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::string source = input.substr(0, nul);
  Json context = DefaultContext();
  if (nul != std::string::npos) {
    Json parsed = Json::parse(input.substr(nul + 1), nullptr,
                              /*allow_exceptions=*/false);
    if (!parsed.is_discarded() && parsed.is_object())
      context = std::move(parsed);
  }
  auto t = Template::Parse(std::move(source));
  if (!t.ok()) {
    Check(t.status().code() == absl::StatusCode::kInvalidArgument,
          "parse error that is not InvalidArgument");
    return 0;
  }
  RenderOptions options;
  options.limits.max_steps = 20000;
  options.limits.max_call_depth = 32;
  options.limits.max_string_bytes = 1 << 20;
  options.limits.max_list_items = 1 << 16;
  options.limits.max_work_bytes = 1 << 24;
  options.trusted_keys = {"bos_token"};
  absl::StatusOr<Rendered> r = (*t)->Render(context, options);
  absl::StatusOr<Rendered> again = (*t)->Render(context, options);
  Check(r.ok() == again.ok(), "two renders disagree on success");
  if (!r.ok()) {
    Check(r.status().code() == absl::StatusCode::kInvalidArgument,
          "render error that is not InvalidArgument");
    return 0;
  }
  Check(r->text == again->text, "two renders differ");
  Check(swaserve::model::unicode::IsValidUtf8(r->text), "output is not UTF-8");
  size_t last_end = 0;
  for (size_t i = 0; i < r->untrusted.size(); ++i) {
    const ByteRange& b = r->untrusted[i];
    Check(b.begin < b.end && b.end <= r->text.size(), "bad untrusted range");
    Check(i == 0 || b.begin > last_end, "untrusted ranges overlap or touch");
    last_end = b.end;
  }
  return 0;
}
