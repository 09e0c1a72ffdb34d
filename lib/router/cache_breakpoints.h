// Where a chat's cache breakpoints (v1::ChatMessages.cache_breakpoints,
// Anthropic's cache_control) fall in its prompt, in tokens.
//
// A breakpoint at message i ends where the template's render of messages
// [0, i] (no generation prompt) stops agreeing with the render of the whole
// chat: the prefix the two share, which is the prompt's text up to and
// including message i for every template that renders messages in order.
// A breakpoint on the tool definitions (message_index -1) ends where the
// first message that is not a leading system message starts: the MiMo,
// Qwen3 and DeepSeek templates render the tools inside (or right after) the
// system turn. The byte offset becomes a token count by the prompt's own
// tokens: the tokens whose bytes lie wholly inside the shared text.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/model/chat_template.h"
#include "lib/model/tokenizer.h"
#include "swaserve/v1/router.pb.h"
#include "swaserve/v1/worker.pb.h"

namespace swaserve::router {

// One pin per breakpoint (tokens > 0 only), for `prompt`, the encoding of
// `input` rendered by `tmpl`. A breakpoint whose index is outside the chat
// is InvalidArgument. When the prompt's token bytes do not spell the whole
// render (a template or tokenizer that changes text), no pins.
absl::StatusOr<std::vector<v1::CachePin>> CachePinsFor(
    const model::ChatTemplate& tmpl, const model::Tokenizer& tokenizer,
    const model::ChatInput& input, const google::protobuf::RepeatedPtrField<v1::CacheBreakpoint>& breakpoints,
    absl::Span<const uint32_t> prompt);

}  // namespace swaserve::router
