// The OpenAI-compatible HTTP protocol layer of the router: parsing and
// validation of request bodies into the gRPC API's v1::GenerateRequest (so one
// router core serves both APIs), and formatting of responses, streaming
// chunks, errors and the model list as OpenAI's JSON.
//
// The declarations live in three headers, all included here:
// openai_errors.h (ApiError, error JSON, status mapping), this file (request
// parsing, openai.cc) and openai_response.h (responses, chunks, SSE).
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
//          response_format ({"type": "text"}, {"type": "json_object"}, {"type":
//          "json_schema", "json_schema": {name, description, schema, strict}}:
//          the output is constrained to it, sampling.constraint)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lib/base/request_defaults.h"
#include "lib/api/openai_errors.h"
#include "lib/api/openai_response.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::api {

// Limits applied while parsing. The defaults suit a public endpoint.
struct ParseLimits {
  // Bodies larger than this are rejected with 413 before parsing. 64 MiB, the
  // gRPC API's message limit: a prompt at the top of the 256K-1M bucket is
  // 8.4 MB as token ids as Python's json.dumps writes them ("151643, "), and
  // images and audio travel inline as base64 data: URLs (8 MiB, the old
  // default, refused both).
  size_t max_body_bytes = 64 << 20;
  // Largest max_tokens / max_completion_tokens accepted.
  uint32_t max_tokens_limit = 1u << 20;
  // max_tokens when the request gives none (clamped to max_tokens_limit).
  uint32_t default_max_tokens = base::kDefaultMaxTokens;
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
  // From /v1/messages (anthropic.h): responses, events and errors in
  // Anthropic's shape.
  bool messages_api = false;
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

// POST /tokenize (the shape vLLM and SGLang serve): {"model"?, "prompt":
// string} or {"model"?, "messages": [...], "add_generation_prompt"? (default
// true), "tools"?, "chat_template_kwargs"?}, and "return_token_strs"?.
// Other fields are rejected as for the generate endpoints.
struct TokenizeRequest {
  // A prompt (text or chat) ready for router::Router::Tokenize.
  swaserve::v1::GenerateRequest request;
  bool return_token_strs = false;
};
std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(std::string_view body,
                                                             const ParseLimits& limits = {});
// {"count", "max_model_len", "tokens", "token_strs" (null unless given)}.
std::string TokenizeResponseJson(const std::vector<uint32_t>& tokens, uint32_t max_model_len,
                                 const std::vector<std::string>* token_strs);

// POST /detokenize: {"model"?, "tokens": [ids]}.
std::variant<std::vector<uint32_t>, ApiError> ParseDetokenizeRequest(
    std::string_view body, const ParseLimits& limits = {});
// {"prompt": text}.
std::string DetokenizeResponseJson(std::string_view text);

}  // namespace swaserve::api
