// Chat prompts in the Qwen3/MiMo ChatML format: renders a conversation to the
// prompt text a chat model was trained on, and encodes it to token ids so that
// only the template's own control tokens are special.
//
// The format is Qwen3's chat_template (tokenizer_config.json of Qwen3, also
// used by MiMo) for conversations without tool definitions:
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
// (tests/fixtures/tokenizer/qwen3_chat_golden.json).
//
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/model/tokenizer.h"

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

}  // namespace swaserve::model
