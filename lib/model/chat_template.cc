#include "lib/model/chat_template.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/base/status.h"

namespace swaserve::model {
namespace {

constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";

// The rendered prompt as alternating control tokens and text.
struct Segment {
  bool control;
  std::string text;
};

class PromptBuilder {
 public:
  void Control(absl::string_view token) {
    segments_.push_back({true, std::string(token)});
  }
  template <typename... Parts>
  void Text(const Parts&... parts) {
    if (segments_.empty() || segments_.back().control) {
      segments_.push_back({false, std::string()});
    }
    absl::StrAppend(&segments_.back().text, parts...);
  }
  std::vector<Segment> Release() { return std::move(segments_); }

 private:
  std::vector<Segment> segments_;
};

absl::string_view StripLeft(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
absl::string_view StripRight(absl::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
absl::string_view BeforeFirst(absl::string_view s, absl::string_view sep) {
  const size_t p = s.find(sep);
  return p == absl::string_view::npos ? s : s.substr(0, p);
}
absl::string_view AfterLast(absl::string_view s, absl::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == absl::string_view::npos ? s : s.substr(p + sep.size());
}

// Qwen3's chat_template, statement by statement (see the header).
absl::StatusOr<std::vector<Segment>> Render(
    absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  if (messages.empty()) {
    return absl::InvalidArgumentError("chat template: no messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" &&
        role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template: messages[", i, "] has unknown role \"",
                       role, "\" (expected system, user, assistant or tool)"));
    }
  }
  // The last user message that is not a wrapped tool response.
  size_t last_query = messages.size() - 1;
  for (size_t k = messages.size(); k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (m.role == "user" && !(absl::StartsWith(m.content, "<tool_response>") &&
                              absl::EndsWith(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }

  PromptBuilder out;
  const size_t n = messages.size();
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" || m.role == "user") {
      out.Control(kImStart);
      out.Text(m.role, "\n", m.content);
      out.Control(kImEnd);
      out.Text("\n");
    } else if (m.role == "assistant") {
      absl::string_view content = m.content;
      absl::string_view reasoning;
      if (absl::StrContains(m.content, "</think>")) {
        content = StripLeft(AfterLast(m.content, "</think>"));
        reasoning = StripLeft(AfterLast(
            StripRight(BeforeFirst(m.content, "</think>")), "<think>"));
      }
      out.Control(kImStart);
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out.Text("assistant\n<think>\n", StripRight(StripLeft(reasoning)),
                 "\n</think>\n\n", StripLeft(content));
      } else {
        out.Text("assistant\n", content);
      }
      out.Control(kImEnd);
      out.Text("\n");
    } else {  // tool
      if (i == 0 || messages[i - 1].role != "tool") {
        out.Control(kImStart);
        out.Text("user");
      }
      out.Text("\n<tool_response>\n", m.content, "\n</tool_response>");
      if (i + 1 == n || messages[i + 1].role != "tool") {
        out.Control(kImEnd);
        out.Text("\n");
      }
    }
  }
  if (options.add_generation_prompt) {
    out.Control(kImStart);
    out.Text("assistant\n");
    if (options.enable_thinking.has_value() && !*options.enable_thinking) {
      out.Text("<think>\n\n</think>\n\n");
    }
  }
  return out.Release();
}

}  // namespace

absl::StatusOr<std::string> ApplyChatTemplate(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) {
  ChatTemplateOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return ApplyChatTemplate(messages, options);
}

absl::StatusOr<std::string> ApplyChatTemplate(
    absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  ASSIGN_OR_RETURN(const std::vector<Segment> segments,
                   Render(messages, options));
  std::string prompt;
  for (const Segment& s : segments) prompt += s.text;
  return prompt;
}

absl::StatusOr<std::vector<uint32_t>> EncodeChat(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options) {
  const std::optional<uint32_t> im_start = tokenizer.TokenId(kImStart);
  const std::optional<uint32_t> im_end = tokenizer.TokenId(kImEnd);
  if (!im_start || !im_end) {
    return absl::FailedPreconditionError(
        "chat template: the tokenizer has no <|im_start|>/<|im_end|> tokens");
  }
  ASSIGN_OR_RETURN(const std::vector<Segment> segments,
                   Render(messages, options));
  std::vector<uint32_t> ids;
  for (const Segment& s : segments) {
    if (s.control) {
      ids.push_back(s.text == kImStart ? *im_start : *im_end);
    } else {
      RETURN_IF_ERROR(
          tokenizer.EncodeAppend(s.text, /*parse_special=*/false, &ids));
    }
  }
  return ids;
}

}  // namespace swaserve::model
