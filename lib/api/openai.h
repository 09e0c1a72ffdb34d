// The OpenAI-compatible HTTP protocol layer of the router: parsing and
// validation of request bodies into the gRPC API's v1::GenerateRequest (so one
// router core serves both APIs), and formatting of responses, streaming
// chunks, errors and the model list as OpenAI's JSON.
//
// No HTTP and no networking here: the router's HTTP server hands bodies in and
// writes the strings these functions return. All functions are pure,
// thread-safe and never throw; any input, however malformed, gives either a
// ParsedRequest or an ApiError with a 4xx status.
//
// Endpoints:
//   POST /v1/completions       ParseCompletionRequest, CompletionResponseJson,
//                              CompletionChunkJson
//   POST /v1/chat/completions  ParseChatRequest, ChatResponseJson,
//                              ChatChunkJson
//   GET  /v1/models            ModelsJson
// Streaming: write SseFrame(chunk) per chunk, then UsageChunkJson (when
// ParsedRequest::include_usage), then kSseDone.
//
// Accepted request fields (anything else at the top level is rejected with
// "Unrecognized request argument supplied: <name>"; `null` counts as absent
// for every optional field):
//   both:  model (string, required), max_tokens, temperature [0,2] (default 1),
//          top_p (0,1] (default 1), top_k (int >= 0, -1 = disabled; vLLM
//          extension), seed (int64; negative values are reinterpreted as
//          uint64), stop (string or array of <= max_stop non-empty strings),
//          stream (bool), stream_options ({include_usage: bool}, only with
//          stream: true), n (1 only), presence_penalty / frequency_penalty
//          (0 only), user (string, ignored), ignore_eos (bool; vLLM),
//          stop_token_ids (array of uint32; vLLM), logit_bias (null or {} only)
//   completions: prompt (string, [string], token ids or [token ids]),
//          logprobs (int 0..5: alternatives per token), echo (false only),
//          best_of (1 only), suffix (null or "" only)
//   chat:  messages (required, non-empty), max_completion_tokens (alias of
//          max_tokens; both may be given only with the same value), logprobs
//          (bool), top_logprobs (0..20, needs logprobs: true),
//          response_format ({"type": "text"} only)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "swaserve/v1/common.pb.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::api {

// An error as the HTTP layer returns it: status code plus OpenAI's error
// object. `param` and `code` are optional (empty: JSON null).
struct ApiError {
  int http_status = 400;
  // "invalid_request_error" (400, 404, 413), "authentication_error" (401),
  // "rate_limit_error" or "server_overloaded" (429), "service_unavailable"
  // (503), "server_error" (500).
  std::string type;
  std::string message;
  // The request field at fault, e.g. "max_tokens" or "messages[2].role".
  std::string param;
  // Machine-readable code, e.g. "model_not_found", "invalid_api_key".
  std::string code;
};

// {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}.
std::string ErrorJson(const ApiError& error);

// Constructors for the common errors.
ApiError InvalidRequestError(std::string message, std::string param = {},
                             std::string code = {});  // 400
ApiError ModelNotFoundError(std::string_view model);  // 404, model_not_found
ApiError PayloadTooLargeError(size_t limit_bytes);    // 413
ApiError AuthenticationError(std::string message);    // 401, invalid_api_key
// 429 rate_limit_error, code rate_limit_exceeded: the key's concurrency limit.
ApiError RateLimitError(std::string message);
// 429 server_overloaded: every worker is at its limit; retry later.
ApiError OverloadedError(std::string message);
ApiError ServiceUnavailableError(std::string message);  // 503
ApiError ServerError(std::string message);              // 500

// Maps an absl::Status (e.g. from the router core or ApiKeyStore::Authorize)
// to an ApiError: InvalidArgument/OutOfRange/FailedPrecondition 400,
// NotFound 404, Unauthenticated 401, PermissionDenied 403,
// ResourceExhausted 429 (server_overloaded), Unavailable/DeadlineExceeded
// 503, everything else 500. `status` must not be OK (OK gives a 500).
ApiError ApiErrorFromStatus(const absl::Status& status);

// Maps the router's ErrorDetail (the cause of a failed Generate) to an
// ApiError: PROMPT_TOO_LONG 400 context_length_exceeded, OVERLOADED 429,
// NO_WORKERS / TRANSFER_FAILED / WORKER_LOST 503, UNKNOWN_MODEL 404,
// INVALID_REQUEST 400, UNSPECIFIED 500.
ApiError ApiErrorFromDetail(const swaserve::v1::ErrorDetail& detail);

// Limits applied while parsing. The defaults suit a public endpoint.
struct ParseLimits {
  // Bodies larger than this are rejected with 413 before parsing.
  size_t max_body_bytes = 8 << 20;
  // Largest max_tokens / max_completion_tokens accepted.
  uint32_t max_tokens_limit = 1u << 20;
  // max_tokens when the request gives none (clamped to max_tokens_limit).
  uint32_t default_max_tokens = 256;
  // Most stop strings.
  size_t max_stop = 4;
  // Most stop_token_ids.
  size_t max_stop_token_ids = 64;
  // Deepest nesting of JSON arrays/objects in a body.
  int max_json_depth = 64;
};

// A validated request. `request` is ready for the router core: model,
// prompt (text, token_ids or chat) and sampling are set; request_id is left
// empty for the router to fill.
struct ParsedRequest {
  swaserve::v1::GenerateRequest request;
  // Respond with server-sent events.
  bool stream = false;
  // stream_options.include_usage: send a usage chunk before [DONE].
  bool include_usage = false;
  // From /v1/chat/completions (chat-style responses).
  bool chat = false;
  // Log-probabilities requested (request.sampling.logprobs).
  bool logprobs = false;
  // Alternatives requested per position (completions `logprobs`, chat
  // `top_logprobs`); -1 when logprobs are not requested.
  int logprobs_top = -1;
  // The model as named by the client (echoed in responses).
  std::string model;
};

using ParseResult = std::variant<ParsedRequest, ApiError>;

// POST /v1/completions.
ParseResult ParseCompletionRequest(std::string_view body,
                                   const ParseLimits& limits = {});
// POST /v1/chat/completions. Roles: system, developer (sent as system), user,
// assistant, tool. Content: a string or an array of {"type":"text","text":..}
// parts, joined with "\n" (as vLLM does); other part types are rejected.
// `name` is accepted and ignored; `tool_call_id` is accepted on tool messages
// and ignored. Assistant messages may have null content.
ParseResult ParseChatRequest(std::string_view body,
                             const ParseLimits& limits = {});

// --- Responses
// ----------------------------------------------------------------

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

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created",
// "owned_by"}...]}.
std::string ModelsJson(const swaserve::v1::ListModelsResponse& models);

// Server-sent events framing: "data: <json>\n\n".
std::string SseFrame(std::string_view json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace swaserve::api
