// Internal to swaserve::api (included only by lib/api/openai*.cc): reading
// request bodies — the JSON body with its limits, typed fields with OpenAI's
// error messages — and the chat-specific parts of a request (messages,
// tools, tool_choice, template kwargs; openai_chat.cc). Stateless;
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/api/openai.h"
#include "lib/api/openai_json.h"

namespace swaserve::api::openai_internal {

namespace v1 = ::swaserve::v1;

// Longest JSON parser message passed on.
inline constexpr size_t kMaxParseMessageBytes = 200;

// An error, or none.
using Error = std::optional<ApiError>;

// "name[i]".
std::string IndexedParam(std::string_view name, size_t i);
// "a string", "an integer", ... for type errors.
std::string_view TypeWord(const json& j);
ApiError TypeError(std::string_view param, std::string_view expected, const json& got);
ApiError ValueError(std::string_view param, std::string_view what);
ApiError NotSupported(std::string_view param, std::string_view what);
ApiError MissingParam(const std::string& param);
// The value of `key` in `obj`, or nullptr when absent or null.
const json* Find(const json& obj, const char* key);
// An integer in [lo, hi] (floats, booleans and strings are type errors).
Error ReadInt(const json& v, std::string_view param, int64_t lo, uint64_t hi,
              uint64_t* out_unsigned, int64_t* out_signed = nullptr);
Error ReadNumber(const json& v, std::string_view param, double* out);
Error ReadBool(const json& v, std::string_view param, bool* out);
Error ReadString(const json& v, std::string_view param, std::string* out);
// Depth of array/object nesting, scanning bytes (strings skipped), so that a
// hostile body is rejected before the parser builds it.
bool DepthWithin(std::string_view body, int max_depth);
// Parses `body` into a JSON object, or an error.
Error ParseBody(std::string_view body, const ParseLimits& limits, json* out);

// Chat requests (openai_chat.cc).
// "messages" into req->chat (and its media into req->multimodal).
Error ParseMessages(const json& body, v1::GenerateRequest* req);
// "tools": [{"type": "function", "function": {"name", "description",
// "parameters", "strict"}}], kept as the client wrote them in
// chat.tools_json (the template renders what it finds); `names` gets the
// function names.
Error ParseTools(const json& v, v1::GenerateRequest* req, std::vector<std::string>* names);
// "tool_choice": "auto", "none", "required" or {"type": "function",
// "function": {"name"}} naming one of `names`.
Error ParseToolChoice(const json& v, const std::vector<std::string>& names,
                      v1::GenerateRequest* req);
// "chat_template_kwargs" (an object passed to the template) and
// "reasoning_effort" (enable_thinking: false for "none" and "minimal", true
// otherwise, unless chat_template_kwargs sets it).
Error ParseTemplateKwargs(const json& body, v1::GenerateRequest* req);
// "response_format": {"type": "text"}, {"type": "json_object"} or {"type":
// "json_schema", "json_schema": {"name", "description"?, "schema",
// "strict"?}} into req->sampling.constraint.
Error ParseResponseFormat(const json& v, v1::GenerateRequest* req);

}  // namespace swaserve::api::openai_internal
