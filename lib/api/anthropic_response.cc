#include "lib/api/anthropic_response.h"

#include <algorithm>
#include <utility>

#include "absl/time/time.h"
#include "lib/api/anthropic.h"
#include "lib/api/openai_json.h"

namespace swaserve::api {
namespace {

using openai_internal::Cat;
using openai_internal::Dump;
using openai_internal::json;
using openai_internal::ojson;

ojson UsageObject(const MessagesUsage& u) {
  return ojson{{"input_tokens", u.input_tokens},
               {"output_tokens", u.output_tokens},
               {"cache_creation_input_tokens", u.cache_creation_input_tokens},
               {"cache_read_input_tokens", u.cache_read_input_tokens}};
}

ojson StopSequence(const ResponseInput& in) {
  if (StopReasonString(in) == "stop_sequence") return in.stop_sequence;
  return nullptr;
}

// A tool call's arguments as an object ({} if they are not one: the output
// parser only passes objects on).
ojson InputObject(const std::string& arguments) {
  ojson input = ojson::parse(arguments, nullptr, /*allow_exceptions=*/false);
  if (!input.is_object()) return ojson::object();
  return input;
}

std::string MessageId(const std::string& request_id) { return Cat({"msg_", request_id}); }

}  // namespace

MessagesUsage MessagesUsageFrom(const v1::Usage& usage, uint32_t breakpoint_tokens) {
  MessagesUsage u;
  const uint32_t prompt = usage.prompt_tokens();
  u.cache_read_input_tokens = std::min(usage.cached_tokens(), prompt);
  const uint32_t kept = std::min(breakpoint_tokens, prompt);
  u.cache_creation_input_tokens = kept > u.cache_read_input_tokens ? kept - u.cache_read_input_tokens : 0;
  u.input_tokens = prompt - u.cache_read_input_tokens - u.cache_creation_input_tokens;
  u.output_tokens = usage.completion_tokens();
  return u;
}

std::string_view StopReasonString(const ResponseInput& in) {
  if (in.finish_reason == v1::FINISH_REASON_LENGTH) return "max_tokens";
  if (in.finished_in_tool_calls) return "tool_use";
  if (!in.stop_sequence.empty()) return "stop_sequence";
  return "end_turn";
}

std::string MessagesResponseJson(const ResponseInput& in, const MessagesUsage& usage) {
  ojson content = ojson::array();
  if (!in.reasoning.empty()) {
    content.push_back(ojson{{"type", "thinking"}, {"thinking", in.reasoning}, {"signature", ""}});
  }
  if (!in.text.empty()) content.push_back(ojson{{"type", "text"}, {"text", in.text}});
  for (const ToolCallOut& c : in.tool_calls) {
    content.push_back(ojson{{"type", "tool_use"},
                            {"id", c.id},
                            {"name", c.name},
                            {"input", InputObject(c.arguments)}});
  }
  ojson j = {{"id", MessageId(in.request_id)},
             {"type", "message"},
             {"role", "assistant"},
             {"model", in.model},
             {"content", std::move(content)},
             {"stop_reason", StopReasonString(in)},
             {"stop_sequence", StopSequence(in)},
             {"usage", UsageObject(usage)}};
  return Dump(j);
}

std::string SseEvent(std::string_view type, std::string_view json_text) {
  return Cat({"event: ", type, "\ndata: ", json_text, "\n\n"});
}

MessagesStream::MessagesStream(std::string request_id, std::string model)
    : id_(MessageId(request_id)), model_(std::move(model)) {}

std::string MessagesStream::Start(uint32_t prompt_tokens) {
  if (started_) return "";
  started_ = true;
  MessagesUsage u;
  u.input_tokens = prompt_tokens;
  ojson message = {{"id", id_},          {"type", "message"},      {"role", "assistant"},
                   {"model", model_},    {"content", ojson::array()},
                   {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                   {"usage", UsageObject(u)}};
  return SseEvent("message_start", Dump(ojson{{"type", "message_start"}, {"message", message}}));
}

std::string MessagesStream::Ping(uint32_t prompt_tokens) {
  return Start(prompt_tokens) + SseEvent("ping", R"({"type":"ping"})");
}

std::string MessagesStream::Close() {
  if (open_ == Block::kNone) return "";
  open_ = Block::kNone;
  return SseEvent("content_block_stop",
                  Dump(ojson{{"type", "content_block_stop"}, {"index", index_}}));
}

std::string MessagesStream::Open(Block kind, std::string_view start_block) {
  if (open_ == kind && kind != Block::kToolUse) return "";
  std::string out = Close();
  open_ = kind;
  ++index_;
  out += SseEvent("content_block_start",
                  Cat({R"({"type":"content_block_start","index":)", std::to_string(index_),
                       R"(,"content_block":)", start_block, "}"}));
  return out;
}

std::string MessagesStream::Delta(std::string_view reasoning, std::string_view text,
                                  const std::vector<ToolCallOut>& calls) {
  std::string out;
  auto delta = [&](const ojson& d) {
    out += SseEvent("content_block_delta",
                    Dump(ojson{{"type", "content_block_delta"}, {"index", index_}, {"delta", d}}));
  };
  if (!reasoning.empty()) {
    out += Open(Block::kThinking, R"({"type":"thinking","thinking":"","signature":""})");
    delta(ojson{{"type", "thinking_delta"}, {"thinking", reasoning}});
  }
  if (!text.empty()) {
    out += Open(Block::kText, R"({"type":"text","text":""})");
    delta(ojson{{"type", "text_delta"}, {"text", text}});
  }
  for (const ToolCallOut& c : calls) {
    if (!c.id.empty() || open_ != Block::kToolUse) {
      out += Open(Block::kToolUse,
                  Dump(ojson{{"type", "tool_use"}, {"id", c.id}, {"name", c.name},
                             {"input", ojson::object()}}));
    }
    if (!c.arguments.empty()) delta(ojson{{"type", "input_json_delta"}, {"partial_json", c.arguments}});
  }
  return out;
}

std::string MessagesStream::Finish(const ResponseInput& last, const MessagesUsage& usage) {
  finished_ = true;
  std::string out = Start(usage.input_tokens + usage.cache_read_input_tokens +
                          usage.cache_creation_input_tokens);
  out += Close();
  ojson d = {{"type", "message_delta"},
             {"delta", {{"stop_reason", StopReasonString(last)}, {"stop_sequence", StopSequence(last)}}},
             {"usage", UsageObject(usage)}};
  out += SseEvent("message_delta", Dump(d));
  out += SseEvent("message_stop", R"({"type":"message_stop"})");
  return out;
}

std::string MessagesStream::Error(const ApiError& error) {
  return SseEvent("error", AnthropicErrorJson(error));
}

// ---- Errors and models (anthropic.h) ----

int AnthropicStatus(const ApiError& error) {
  // No capacity (no workers, or every worker at its limit) is Anthropic's
  // 529; a key's own limit stays 429.
  if (error.http_status == 503 || error.type == "server_overloaded") return 529;
  return error.http_status;
}

std::string AnthropicErrorJson(const ApiError& error, std::string_view request_id) {
  const int status = AnthropicStatus(error);
  std::string_view type = "api_error";
  switch (status) {
    case 400:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 529:
      type = "overloaded_error";
      break;
    default:
      type = status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
  }
  ojson j = {{"type", "error"}, {"error", {{"type", type}, {"message", error.message}}}};
  if (!request_id.empty()) j["request_id"] = request_id;
  return Dump(j);
}

std::string AnthropicModelsJson(const v1::ListModelsResponse& models) {
  ojson data = ojson::array();
  for (const v1::ModelInfo& m : models.models()) {
    data.push_back(ojson{{"type", "model"},
                         {"id", m.id()},
                         {"display_name", m.id()},
                         {"created_at", absl::FormatTime("%Y-%m-%d%ET%H:%M:%SZ",
                                                         absl::FromUnixSeconds(m.created()),
                                                         absl::UTCTimeZone())}});
  }
  ojson j = {{"data", data}, {"has_more", false}};
  j["first_id"] = data.empty() ? ojson(nullptr) : data.front()["id"];
  j["last_id"] = data.empty() ? ojson(nullptr) : data.back()["id"];
  return Dump(j);
}

}  // namespace swaserve::api
