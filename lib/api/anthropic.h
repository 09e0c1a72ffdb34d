// The Anthropic Messages API of the router's HTTP layer, without HTTP:
// request bodies of POST /v1/messages and /v1/messages/count_tokens into the
// gRPC API's v1::GenerateRequest, and Anthropic's error and model-list
// shapes. Responses and streamed events are in anthropic_response.h.
//
// A Messages request becomes the same chat (v1::ChatMessages) the
// equivalent OpenAI chat request becomes, so the checkpoint's template
// renders both to the same prompt and they share prefix-cache entries:
//   system (string or text blocks, joined with "\n")   -> a system message
//   user text / image blocks (joined with "\n")        -> a user message
//   user tool_result blocks                            -> one tool message each
//                                                         (tool_call_id =
//                                                         tool_use_id), before
//                                                         the user message of
//                                                         the same turn
//   assistant text blocks                              -> content
//   assistant thinking blocks                          -> reasoning_content
//   assistant redacted_thinking blocks                 -> dropped (opaque)
//   assistant tool_use blocks                          -> tool_calls (arguments
//                                                         = the input as JSON)
//   tools [{name, description, input_schema}]          -> function tools
//   tool_choice auto / any / tool / none               -> auto / required /
//                                                         the function / none
//   tool_choice.disable_parallel_tool_use              -> parallel_tool_calls
//   thinking enabled / disabled                        -> enable_thinking
// A tool_result with is_error: true has "Error: " before its text.
//
// cache_control breakpoints ({"type": "ephemeral", "ttl": "5m" | "1h"}; at
// most 4) on system blocks, tools and message content blocks are recorded in
// chat.cache_breakpoints: the router keeps the prompt up to each one
// preferentially for its TTL.
//
// Accepted top-level fields: model (required), messages (required),
// max_tokens (required, >= 1), system, metadata ({user_id}), stop_sequences
// (<= ParseLimits::max_stop non-empty strings), stream, temperature [0, 1],
// top_p (0, 1], top_k (>= 0), tools, tool_choice, thinking ({type:
// "enabled", budget_tokens >= 1024 and < max_tokens} or {type: "disabled"}),
// service_tier ("auto" or "standard_only"; there is one tier). Anything else
// is a 400 naming it. budget_tokens is checked but not enforced beyond
// max_tokens: the model ends its reasoning when it does.
//
// All functions are pure, thread-safe and never throw; any input gives a
// ParsedRequest or an ApiError with a 4xx status.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include "lib/api/openai.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::api {

// POST /v1/messages. The result has chat = true and messages_api = true.
ParseResult ParseMessagesRequest(std::string_view body, const ParseLimits& limits = {});

// POST /v1/messages/count_tokens: the same fields less max_tokens, stream,
// stop_sequences, temperature, top_p, top_k and metadata. The request is
// ready for router::Router::Tokenize.
std::variant<TokenizeRequest, ApiError> ParseCountTokensRequest(std::string_view body,
                                                                const ParseLimits& limits = {});
// {"input_tokens": n}.
std::string CountTokensResponseJson(size_t input_tokens);

// {"type":"error","error":{"type":...,"message":...},"request_id":...|absent}.
// The error type follows the status: 400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 529 overloaded_error, other 5xx
// api_error.
std::string AnthropicErrorJson(const ApiError& error, std::string_view request_id = {});
// The status code Anthropic uses for `error`: no capacity (503, and 429
// server_overloaded: every worker at its limit) is 529 (overloaded_error),
// the rest unchanged.
int AnthropicStatus(const ApiError& error);

// GET /v1/models with an anthropic-version header: {"data": [{"type":
// "model", "id", "display_name", "created_at" (RFC 3339)}], "has_more":
// false, "first_id", "last_id"}.
std::string AnthropicModelsJson(const swaserve::v1::ListModelsResponse& models);

}  // namespace swaserve::api
