// Fuzzes the OpenAI request parsers (lib/api/openai.h): any body must give a
// ParsedRequest or a 4xx ApiError, never a crash, hang, exception or sanitizer
// report; whatever parses is formatted back (responses, chunks, errors) and
// the output must be valid JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "lib/api/openai.h"
#include "nlohmann/json.hpp"

namespace {

using swaserve::api::ApiError;
using swaserve::api::ParsedRequest;
using swaserve::api::ParseResult;

void Check(bool ok) {
  if (!ok) std::abort();
}

void Exercise(const ParseResult& result, std::string_view body) {
  if (const ApiError* e = std::get_if<ApiError>(&result)) {
    Check(e->http_status >= 400 && e->http_status < 500);
    Check(!e->message.empty() && !e->type.empty());
    Check(nlohmann::json::accept(swaserve::api::ErrorJson(*e)));
    return;
  }
  const ParsedRequest& p = std::get<ParsedRequest>(result);
  Check(!p.model.empty());
  Check(p.request.sampling().max_tokens() >= 1);
  Check(p.logprobs == (p.logprobs_top >= 0));

  swaserve::api::ResponseInput in;
  in.request_id = "fuzz";
  in.model = p.model;
  in.created = 1;
  in.text = p.chat && p.request.chat().messages_size() > 0
                ? p.request.chat().messages(0).content()
                : p.request.text();
  in.logprobs = p.logprobs;
  in.include_usage = p.include_usage;
  in.first_chunk = true;
  in.finish_reason = swaserve::v1::FINISH_REASON_STOP;
  for (size_t i = 0; i < 3 && i < body.size(); ++i) {
    swaserve::api::TokenLogprobText t;
    t.logprob.set_token_id(static_cast<uint8_t>(body[i]));
    t.logprob.set_logprob(-static_cast<float>(i));
    t.token = std::string(body.substr(i, 2));  // may split UTF-8
    for (int k = 0; k < p.logprobs_top && k < 3; ++k) {
      t.logprob.add_top()->set_logprob(-1.0f * static_cast<float>(k));
      t.top_tokens.push_back(std::string(body.substr(k, 1)));
    }
    in.token_logprobs.push_back(std::move(t));
  }
  const std::string outputs[] = {
      p.chat ? swaserve::api::ChatResponseJson(in)
             : swaserve::api::CompletionResponseJson(in),
      p.chat ? swaserve::api::ChatChunkJson(in)
             : swaserve::api::CompletionChunkJson(in),
      swaserve::api::UsageChunkJson(in, p.chat)};
  for (const std::string& out : outputs) {
    Check(nlohmann::json::accept(out));
    Check(swaserve::api::SseFrame(out).size() == out.size() + 8);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  swaserve::api::ParseLimits limits;
  limits.max_body_bytes = 1 << 16;
  Exercise(swaserve::api::ParseCompletionRequest(body, limits), body);
  Exercise(swaserve::api::ParseChatRequest(body, limits), body);
  return 0;
}
