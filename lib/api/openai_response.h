// OpenAI's response JSON for the router's HTTP API: non-streaming
// responses, streaming chunks, the usage chunk and object, the model list and
// the server-sent events framing. Part of swaserve::api; openai.h includes
// this header (its top comment says which endpoint uses which function).
//
// All functions are pure, thread-safe and never throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "swaserve/v1/common.pb.h"
#include "swaserve/v1/router.pb.h"
#include "swaserve/v1/worker.pb.h"

namespace swaserve::api {

// Log-probability of one generated token with its text, as the caller
// decoded it (the token's own text, not the text of a whole character).
struct TokenLogprobText {
  swaserve::v1::TokenLogprob logprob;
  // Text of logprob.token_id.
  std::string token;
  // Text of logprob.top(i), same order; missing entries are empty strings.
  std::vector<std::string> top_tokens;
};

// Builds TokenLogprobText entries from a GenerateResponse's logprobs, using
// `token_text` to decode each token id (e.g. the tokenizer's single-token
// decode).
std::vector<TokenLogprobText> MakeTokenLogprobs(
    const google::protobuf::RepeatedPtrField<swaserve::v1::TokenLogprob>&
        logprobs,
    const std::function<std::string(uint32_t)>& token_text);

// A tool call in a chat response (whole) or chunk (a delta: the first for
// an index carries id and name, later ones argument fragments).
struct ToolCallOut {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

// What the router knows about one response or chunk. For a non-streaming
// response it describes the whole generation; for a chunk, what is new since
// the previous one.
struct ResponseInput {
  // The request's id; the response id is "cmpl-<id>" or "chatcmpl-<id>".
  std::string request_id;
  // The model as the client named it.
  std::string model;
  // Unix seconds when the request was received (the same for every chunk).
  int64_t created = 0;
  // Generated text (non-streaming: all of it; chunk: the delta).
  std::string text;
  // Generated token ids (informational; not in OpenAI's format).
  std::vector<uint32_t> token_ids;
  // With logprobs: one entry per generated token in `text`.
  bool logprobs = false;
  std::vector<TokenLogprobText> token_logprobs;
  // Completions logprobs' text_offset of the first token here: bytes of
  // completion text already sent in earlier chunks (0 when not streaming).
  size_t text_offset_start = 0;
  // UNSPECIFIED: not finished (chunks), finish_reason null.
  swaserve::v1::FinishReason finish_reason =
      swaserve::v1::FINISH_REASON_UNSPECIFIED;
  // Token accounting; non-streaming responses always carry usage (zeros when
  // absent).
  std::optional<swaserve::v1::Usage> usage;
  // Chat streaming: the first chunk carries delta.role = "assistant".
  bool first_chunk = false;
  // Chat: reasoning text (message and delta carry it as reasoning_content
  // and as reasoning, the two names clients read; omitted when empty).
  std::string reasoning;
  // Chat: tool calls (message.tool_calls / delta.tool_calls). A response
  // with calls and no text has content null.
  std::vector<ToolCallOut> tool_calls;
  // finish_reason "tool_calls" in place of "stop" (the turn ended in calls).
  bool finished_in_tool_calls = false;
  // Chat: usage.completion_tokens_details.reasoning_tokens when set.
  std::optional<uint32_t> reasoning_tokens;
  // The stop string that ended the output (GenerateResponse.stop_sequence).
  std::string stop_sequence;
  // The choice's index (n > 1).
  int choice_index = 0;
  // Streaming with stream_options.include_usage: chunks carry "usage": null
  // (as OpenAI's do) before the final usage chunk.
  bool include_usage = false;
};

// "stop", "length", "abort" (cancelled, as vLLM), or "" for UNSPECIFIED
// (written as null).
std::string_view FinishReasonString(swaserve::v1::FinishReason reason);

// Non-streaming /v1/completions response (object "text_completion").
std::string CompletionResponseJson(const ResponseInput& in);
// Non-streaming /v1/chat/completions response (object "chat.completion").
std::string ChatResponseJson(const ResponseInput& in);
// One streaming /v1/completions chunk (object "text_completion").
std::string CompletionChunkJson(const ResponseInput& in);
// One streaming /v1/chat/completions chunk (object "chat.completion.chunk").
std::string ChatChunkJson(const ResponseInput& in);
// The usage chunk sent last when stream_options.include_usage: "choices": []
// and `usage` (in.usage, zeros when absent).
std::string UsageChunkJson(const ResponseInput& in, bool chat);

// OpenAI's usage object as JSON text: {prompt_tokens, completion_tokens,
// total_tokens, prompt_tokens_details: {cached_tokens}}.
std::string UsageJson(const swaserve::v1::Usage& usage);

// A chat response with several choices (n > 1): `choices` in order, each
// with its choice_index; header fields and usage from `usage_from`.
std::string ChatMultiResponseJson(const std::vector<ResponseInput>& choices,
                                  const ResponseInput& usage_from);
std::string CompletionMultiResponseJson(const std::vector<ResponseInput>& choices,
                                        const ResponseInput& usage_from);

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created",
// "owned_by"}...]}.
std::string ModelsJson(const swaserve::v1::ListModelsResponse& models);

// Server-sent events framing: "data: <json>\n\n".
std::string SseFrame(std::string_view json);

// The SSE comment a streamed request gets while it waits for its first
// token (clients ignore comments; they keep its connection alive):
// ": waiting for the first token, 45s\n\n", and where its prefill stands
// when the prefill worker reported it (`progress` may be null): queued (with
// the worker's queue), "prefill 61,440 of 304,044 prompt tokens (20%; 8,192
// cached), 1,234 tokens/s", or shipping its KV to the decode worker.
std::string WaitingComment(absl::Duration waited, const swaserve::v1::PrefillProgress* progress);
// Where a prefill stands, in words (the part of WaitingComment after
// "; "): "queued at the prefill worker (2 requests waiting)", "prefill
// 61,440 of ...", "prefill done, its KV is going to the decode worker"; empty
// when the worker could not say (not found, no state).
std::string DescribePrefillProgress(const swaserve::v1::PrefillProgress& progress);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace swaserve::api
