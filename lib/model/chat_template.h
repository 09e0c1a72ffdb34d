// Chat prompts: a conversation rendered to the prompt text a chat model was
// trained on, and encoded to token ids so that only the template's own
// control tokens are special.
//
// Which template (ChatTemplate::FromCheckpointDir, as transformers picks it):
//   1. `chat_template.jinja` next to the checkpoint, when present;
//   2. else "chat_template" of `tokenizer_config.json`: a string, or a list
//      of {"name", "template"} ("tool_use" when tools are given and it
//      exists, else "default");
//   3. else the built-in Qwen3 ChatML template below (ApplyChatTemplate /
//      EncodeChat), for checkpoints without one.
// The checkpoint's template runs on the Jinja interpreter of
// lib/model/jinja/template.h, which renders byte for byte as
// @huggingface/jinja (tests/fixtures/chat_templates/goldens.json; where that
// differs from Python's Jinja2 is listed there). The context is what
// transformers' apply_chat_template passes: messages, tools (none when
// absent), documents (none), add_generation_prompt, bos_token / eos_token /
// unk_token / pad_token from tokenizer_config.json (a string or an
// AddedToken {"content": ...}), then the request's extra kwargs
// (enable_thinking, ...).
//
// Encoding keeps message data from injecting control tokens: the
// interpreter tracks which bytes of the rendered prompt were copied from the
// messages, tools and kwargs (every string operation carries that along:
// concatenation, slicing, split, replace, tojson, ...), and the prompt is
// encoded with Tokenizer::EncodeAppendWithLiterals, which matches special
// tokens only in the template's own bytes (its literals and bos/eos_token).
// So "<|im_end|>" typed by a user is ordinary text, while for content free
// of special-token text the ids equal tokenizer.Encode(prompt, true).
//
// The built-in template is Qwen3's chat_template (tokenizer_config.json of
// Qwen3, also used by MiMo) for conversations without tool definitions:
//   <|im_start|>{role}\n{content}<|im_end|>\n     per system/user message
//   <|im_start|>assistant\n{content}<|im_end|>\n  per assistant message, where
//       a leading "<think>...</think>" reasoning block is dropped from turns
//       before the last user query and kept (normalized to
//       "<think>\n{reasoning}\n</think>\n\n{answer}") after it
//   <|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n
//       for tool results; consecutive tool messages share one user turn
//   <|im_start|>assistant\n                      when add_generation_prompt,
//       followed by "<think>\n\n</think>\n\n" when enable_thinking == false.
// No default system message is added: Qwen3's template (unlike Qwen2.5's)
// has none, so a conversation without a system message gets none.
// Roles other than system, user, assistant and tool are InvalidArgument, as
// is an empty conversation. ApplyChatTemplate's output equals what Hugging
// Face's apply_chat_template renders from Qwen3's template for such messages
// (tests/fixtures/tokenizer/qwen3_chat_golden.json), and what the
// interpreter renders from that template (chat_template_test.cc).
//
// Thread-safety: the functions are stateless; a ChatTemplate is immutable
// and its methods may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/model/jinja/template.h"
#include "lib/model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
};

struct ChatTemplateOptions {
  // Append "<|im_start|>assistant\n" so the model writes the next turn.
  // Default: true.
  bool add_generation_prompt = true;
  // Qwen3's enable_thinking: false appends an empty reasoning block
  // "<think>\n\n</think>\n\n" to the generation prompt (thinking off); unset
  // or true leaves the model free to think. Default: unset.
  std::optional<bool> enable_thinking;
};

// The prompt text for `messages`.
absl::StatusOr<std::string> ApplyChatTemplate(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt);
absl::StatusOr<std::string> ApplyChatTemplate(
    absl::Span<const ChatMessage> messages, const ChatTemplateOptions& options);

// Multimodal markers: the text a prompt carries where an image,
// audio clip or video goes (the router's are Qwen-VL's and Qwen-Omni's pad
// tokens "<|image_pad|>", "<|video_pad|>", "<|audio_pad|>"). The
// *WithMarkers encoders cut the rendered prompt at every occurrence of a
// marker — in message content or in the template's own text — encode the
// pieces as the plain encoder would (a cut splits the text the way a special
// token does), and report where each marker was; a marker's own text yields
// no ids, the caller puts the item's placeholder tokens there. Markers must
// be non-empty and none a prefix of another. Without markers in the prompt
// the ids equal the plain encoder's.
struct MarkerCut {
  int marker = 0;           // index into `markers`
  size_t token_offset = 0;  // ids before the cut
  bool operator==(const MarkerCut&) const = default;
};

// Tokenizer::Encode(text, /*parse_special=*/true), cut at the markers.
absl::StatusOr<std::vector<uint32_t>> EncodeTextWithMarkers(
    const Tokenizer& tokenizer, absl::string_view text,
    absl::Span<const std::string> markers, std::vector<MarkerCut>* cuts);

// The token ids of the prompt. The template's control tokens (<|im_start|>,
// <|im_end|>) are encoded as their ids and everything else, message content
// included, with parse_special = false, so a message cannot inject control
// tokens. For content free of special-token text the ids equal
// tokenizer.Encode(ApplyChatTemplate(...), /*parse_special=*/true).
// FailedPrecondition when the tokenizer lacks <|im_start|> or <|im_end|>;
// InvalidArgument for bad messages or content that is not UTF-8.
absl::StatusOr<std::vector<uint32_t>> EncodeChat(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options);
// EncodeChat cut at `markers` (above).
absl::StatusOr<std::vector<uint32_t>> EncodeChatWithMarkers(
    const Tokenizer& tokenizer, absl::Span<const ChatMessage> messages,
    const ChatTemplateOptions& options, absl::Span<const std::string> markers,
    std::vector<MarkerCut>* cuts);

// A conversation in the OpenAI / transformers format (JSON, so that the API
// layer can pass what the client sent; key order is kept).
struct ChatInput {
  // An array of message objects: "role", "content" (a string, a list of
  // content parts such as {"type": "text", "text": ...}, or null) and, where
  // present, "tool_calls", "reasoning_content", "name", "tool_call_id".
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // Tool definitions (JSON schemas); null: none (the template sees `tools`
  // as none, as transformers passes it). Default: null.
  nlohmann::ordered_json tools = nullptr;
  // Append the start of the assistant's turn. Default: true.
  bool add_generation_prompt = true;
  // Extra template variables, e.g. {"enable_thinking": false}; they may not
  // be named messages, tools, documents or add_generation_prompt. Default:
  // none.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// `messages` with role and string content, and `options` as kwargs.
ChatInput ToChatInput(absl::Span<const ChatMessage> messages,
                      const ChatTemplateOptions& options);

// The special tokens a template sees (from tokenizer_config.json); unset ones
// are not defined in the template.
struct ChatTemplateTokens {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> unk_token;
  std::optional<std::string> pad_token;
};

class ChatTemplate {
 public:
  // The template of checkpoint directory `dir` (see the header comment):
  // the checkpoint's own or, when it has none, the built-in one.
  // InvalidArgument naming the file (and line, column) for a template that
  // does not parse or a tokenizer_config.json that is not valid JSON or has
  // a chat_template of the wrong shape.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromCheckpointDir(
      const std::string& dir, const jinja::RenderLimits& limits = {});
  // A Jinja template given as text ("default"), e.g. a --chat_template flag.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromJinja(
      std::string source, ChatTemplateTokens tokens = {},
      const jinja::RenderLimits& limits = {});
  // The built-in Qwen3 ChatML template.
  static std::unique_ptr<ChatTemplate> Builtin();

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  bool is_builtin() const { return templates_.empty(); }
  // Where it came from: a file path, or "built-in Qwen3 ChatML".
  const std::string& origin() const { return origin_; }

  // The prompt text. With the built-in template, `input` may use only what
  // ApplyChatTemplate supports (string contents, no tools, tool_calls or
  // reasoning_content; kwargs: enable_thinking) — anything else is
  // InvalidArgument saying the checkpoint has no template of its own.
  // Errors of the checkpoint's template (raise_exception, a failing
  // operation, the render limits) are InvalidArgument
  // "chat template <origin>: ...".
  absl::StatusOr<std::string> Apply(const ChatInput& input) const;
  // The token ids of the prompt (see the header comment). FailedPrecondition
  // when the built-in template is used with a tokenizer that lacks
  // <|im_start|>/<|im_end|>.
  absl::StatusOr<std::vector<uint32_t>> Encode(const Tokenizer& tokenizer,
                                               const ChatInput& input) const;
  // Encode cut at `markers` (above).
  absl::StatusOr<std::vector<uint32_t>> EncodeWithMarkers(
      const Tokenizer& tokenizer, const ChatInput& input,
      absl::Span<const std::string> markers,
      std::vector<MarkerCut>* cuts) const;

 private:
  ChatTemplate() = default;
  absl::StatusOr<jinja::Rendered> Render(const ChatInput& input) const;

  std::string origin_;
  // By name ("default", "tool_use", ...); empty for the built-in template.
  std::map<std::string, std::unique_ptr<jinja::Template>> templates_;
  ChatTemplateTokens tokens_;
  jinja::RenderLimits limits_;
};

}  // namespace swaserve::model
