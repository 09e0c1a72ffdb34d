// Fuzzes the Messages API request parsers (lib/api/anthropic.h): any body
// must give a ParsedRequest (or a count_tokens request) or a 4xx ApiError,
// never a crash, hang, exception or sanitizer report; whatever parses is
// formatted back as Anthropic's message, event stream and error, and each
// must be valid JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "lib/api/anthropic.h"
#include "lib/api/anthropic_response.h"
#include "nlohmann/json.hpp"

namespace {

namespace api = swaserve::api;

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckError(const api::ApiError& e) {
  Check(e.http_status >= 400 && e.http_status < 500);
  Check(!e.message.empty());
  Check(nlohmann::json::accept(api::AnthropicErrorJson(e)));
}

// The data lines of an event stream are JSON.
void CheckEvents(const std::string& sse) {
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find('\n', at);
    Check(end != std::string::npos);
    Check(nlohmann::json::accept(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
}

void Exercise(const api::ParseResult& result, std::string_view body) {
  if (const api::ApiError* e = std::get_if<api::ApiError>(&result)) return CheckError(*e);
  const api::ParsedRequest& p = std::get<api::ParsedRequest>(result);
  Check(p.messages_api && p.chat && !p.model.empty());
  Check(p.request.sampling().max_tokens() >= 1);
  Check(p.request.chat().cache_breakpoints_size() <= 4);
  api::ResponseInput in;
  in.request_id = "fuzz";
  in.model = p.model;
  const auto& messages = p.request.chat().messages();
  in.text = messages.empty() ? "" : messages[0].content();  // may be any bytes
  in.reasoning = std::string(body.substr(0, 8));
  in.tool_calls.push_back({.index = 0, .id = "c", .name = "f",
                           .arguments = std::string(body.substr(0, 16))});
  in.finish_reason = swaserve::v1::FINISH_REASON_STOP;
  in.stop_sequence = p.request.sampling().stop().empty() ? "" : p.request.sampling().stop(0);
  swaserve::v1::Usage u;
  u.set_prompt_tokens(static_cast<uint32_t>(body.size()));
  u.set_cached_tokens(static_cast<uint32_t>(body.size() / 2));
  const api::MessagesUsage usage = api::MessagesUsageFrom(u, static_cast<uint32_t>(body.size() / 3));
  Check(usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens ==
        body.size());
  Check(nlohmann::json::accept(api::MessagesResponseJson(in, usage)));
  api::MessagesStream s(in.request_id, in.model);
  std::string sse = s.Ping(3);
  sse += s.Delta(in.reasoning, in.text, in.tool_calls);
  sse += s.Finish(in, usage);
  CheckEvents(sse);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  api::ParseLimits limits;
  limits.max_body_bytes = 1 << 16;
  Exercise(api::ParseMessagesRequest(body, limits), body);
  auto count = api::ParseCountTokensRequest(body, limits);
  if (const api::ApiError* e = std::get_if<api::ApiError>(&count)) CheckError(*e);
  return 0;
}
