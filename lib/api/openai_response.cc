#include "lib/api/openai_response.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/api/openai_json.h"
#include "nlohmann/json.hpp"
#include "swaserve/v1/common.pb.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::api {
namespace {

namespace v1 = ::swaserve::v1;
using openai_internal::Cat;
using openai_internal::Dump;
using openai_internal::ojson;

// OpenAI's stand-in for a log-probability of -inf.
constexpr double kMinLogprob = -9999.0;

// A float as the shortest double that prints like it ("-0.1", not
// "-0.10000000149011612"); non-finite values become kMinLogprob.
double LogprobValue(float f) {
  if (!std::isfinite(f)) return kMinLogprob;
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f);
  if (ec != std::errc()) return f;
  double d = f;
  std::from_chars(buf, end, d);
  return d;
}

ojson Bytes(std::string_view s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

ojson FinishReasonJson(v1::FinishReason reason, bool tool_calls = false) {
  if (tool_calls && reason == v1::FINISH_REASON_STOP) return "tool_calls";
  std::string_view s = FinishReasonString(reason);
  if (s.empty()) return nullptr;
  return std::string(s);
}

ojson UsageObject(const std::optional<v1::Usage>& usage,
                  std::optional<uint32_t> reasoning_tokens = std::nullopt) {
  v1::Usage u = usage.value_or(v1::Usage());
  ojson j;
  j["prompt_tokens"] = u.prompt_tokens();
  j["completion_tokens"] = u.completion_tokens();
  j["total_tokens"] = static_cast<uint64_t>(u.prompt_tokens()) +
                      static_cast<uint64_t>(u.completion_tokens());
  j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens()}};
  if (reasoning_tokens.has_value()) {
    j["completion_tokens_details"] = {{"reasoning_tokens", *reasoning_tokens}};
  }
  // Extension, only when MTP drafted (the gRPC Usage's fields, same names):
  // OpenAI's completion_tokens_details prediction tokens mean Predicted
  // Outputs, so these are keys of their own; clients ignore unknown keys.
  if (u.draft_tokens() > 0) {
    j["draft_tokens"] = u.draft_tokens();
    j["accepted_draft_tokens"] = u.accepted_draft_tokens();
  }
  return j;
}

// Completions-style logprobs: {tokens, token_logprobs, top_logprobs,
// text_offset}.
ojson CompletionLogprobs(const ResponseInput& in) {
  if (!in.logprobs) return nullptr;
  ojson tokens = ojson::array();
  ojson token_logprobs = ojson::array();
  ojson top_logprobs = ojson::array();
  ojson text_offset = ojson::array();
  size_t offset = in.text_offset_start;
  for (const TokenLogprobText& t : in.token_logprobs) {
    tokens.push_back(t.token);
    token_logprobs.push_back(LogprobValue(t.logprob.logprob()));
    ojson top = ojson::object();
    for (int i = 0; i < t.logprob.top_size(); ++i) {
      const std::string key = static_cast<size_t>(i) < t.top_tokens.size()
                                  ? t.top_tokens[i]
                                  : std::string();
      top[key] = LogprobValue(t.logprob.top(i).logprob());
    }
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += t.token.size();
  }
  ojson j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(token_logprobs);
  j["top_logprobs"] = std::move(top_logprobs);
  j["text_offset"] = std::move(text_offset);
  return j;
}

// Chat-style logprobs: {content: [{token, logprob, bytes, top_logprobs}]}.
ojson ChatLogprobs(const ResponseInput& in) {
  if (!in.logprobs) return nullptr;
  ojson content = ojson::array();
  for (const TokenLogprobText& t : in.token_logprobs) {
    ojson entry;
    entry["token"] = t.token;
    entry["logprob"] = LogprobValue(t.logprob.logprob());
    entry["bytes"] = Bytes(t.token);
    ojson top = ojson::array();
    for (int i = 0; i < t.logprob.top_size(); ++i) {
      const std::string token = static_cast<size_t>(i) < t.top_tokens.size()
                                    ? t.top_tokens[i]
                                    : std::string();
      ojson alt;
      alt["token"] = token;
      alt["logprob"] = LogprobValue(t.logprob.top(i).logprob());
      alt["bytes"] = Bytes(token);
      top.push_back(std::move(alt));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  ojson j;
  j["content"] = std::move(content);
  return j;
}

ojson Header(const ResponseInput& in, std::string_view prefix,
             std::string_view object) {
  ojson j;
  j["id"] = Cat({prefix, in.request_id});
  j["object"] = std::string(object);
  j["created"] = in.created;
  j["model"] = in.model;
  return j;
}

// A response or chunk with one choice: the header, then "choices":
// [{index: 0, <content_key>: content, logprobs, finish_reason}], then for a
// response its usage (zeros when absent) and for a chunk "usage": null when
// the stream ends with a usage chunk.
ojson ChoiceObject(const ResponseInput& in, const char* content_key, ojson content,
                   ojson logprobs) {
  ojson choice;
  choice["index"] = in.choice_index;
  choice[content_key] = std::move(content);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = FinishReasonJson(in.finish_reason, in.finished_in_tool_calls);
  return choice;
}

std::string SingleChoiceJson(const ResponseInput& in, std::string_view prefix,
                             std::string_view object, const char* content_key,
                             ojson content, ojson logprobs, bool is_response) {
  ojson j = Header(in, prefix, object);
  j["choices"] = ojson::array({ChoiceObject(in, content_key, std::move(content),
                                            std::move(logprobs))});
  if (is_response) {
    j["usage"] = UsageObject(in.usage, in.reasoning_tokens);
  } else if (in.include_usage) {
    j["usage"] = nullptr;
  }
  return Dump(j);
}

}  // namespace

std::vector<TokenLogprobText> MakeTokenLogprobs(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs,
    const std::function<std::string(uint32_t)>& token_text) {
  std::vector<TokenLogprobText> out;
  out.reserve(logprobs.size());
  for (const v1::TokenLogprob& lp : logprobs) {
    TokenLogprobText t;
    t.logprob = lp;
    t.token = token_text(lp.token_id());
    for (const auto& alt : lp.top()) {
      t.top_tokens.push_back(token_text(alt.token_id()));
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string_view FinishReasonString(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    default:
      return "";
  }
}

std::string CompletionResponseJson(const ResponseInput& in) {
  return SingleChoiceJson(in, "cmpl-", "text_completion", "text", in.text,
                          CompletionLogprobs(in), /*is_response=*/true);
}

namespace {

ojson ToolCallsJson(const std::vector<ToolCallOut>& calls, bool whole) {
  ojson a = ojson::array();
  for (const ToolCallOut& c : calls) {
    ojson j;
    // A chunk's deltas carry the call's index; a whole message's calls do
    // not (OpenAI's shape), so a client can send the message back as it came.
    if (!whole) j["index"] = c.index;
    if (whole || !c.id.empty()) {
      j["id"] = c.id;
      j["type"] = "function";
      j["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    } else {
      j["function"] = {{"arguments", c.arguments}};
    }
    a.push_back(std::move(j));
  }
  return a;
}

ojson ChatMessage(const ResponseInput& in) {
  ojson m = {{"role", "assistant"}};
  if (in.text.empty() && !in.tool_calls.empty()) {
    m["content"] = nullptr;
  } else {
    m["content"] = in.text;
  }
  // Both names clients read: reasoning_content (vLLM, SGLang, DeepSeek) and
  // reasoning (newer vLLM, the OpenAI Agents SDK).
  if (!in.reasoning.empty()) {
    m["reasoning_content"] = in.reasoning;
    m["reasoning"] = in.reasoning;
  }
  if (!in.tool_calls.empty()) m["tool_calls"] = ToolCallsJson(in.tool_calls, /*whole=*/true);
  return m;
}

}  // namespace

std::string ChatResponseJson(const ResponseInput& in) {
  return SingleChoiceJson(in, "chatcmpl-", "chat.completion", "message", ChatMessage(in),
                          ChatLogprobs(in), /*is_response=*/true);
}

namespace {

std::string MultiResponseJson(const std::vector<ResponseInput>& choices,
                              const ResponseInput& usage_from, bool chat) {
  ojson j = chat ? Header(usage_from, "chatcmpl-", "chat.completion")
                 : Header(usage_from, "cmpl-", "text_completion");
  ojson a = ojson::array();
  for (const ResponseInput& c : choices) {
    a.push_back(chat ? ChoiceObject(c, "message", ChatMessage(c), ChatLogprobs(c))
                     : ChoiceObject(c, "text", c.text, CompletionLogprobs(c)));
  }
  j["choices"] = std::move(a);
  j["usage"] = UsageObject(usage_from.usage, usage_from.reasoning_tokens);
  return Dump(j);
}

}  // namespace

std::string ChatMultiResponseJson(const std::vector<ResponseInput>& choices,
                                  const ResponseInput& usage_from) {
  return MultiResponseJson(choices, usage_from, /*chat=*/true);
}

std::string CompletionMultiResponseJson(const std::vector<ResponseInput>& choices,
                                        const ResponseInput& usage_from) {
  return MultiResponseJson(choices, usage_from, /*chat=*/false);
}

std::string CompletionChunkJson(const ResponseInput& in) {
  return SingleChoiceJson(in, "cmpl-", "text_completion", "text", in.text,
                          CompletionLogprobs(in), /*is_response=*/false);
}

std::string ChatChunkJson(const ResponseInput& in) {
  ojson delta = ojson::object();
  if (in.first_chunk) delta["role"] = "assistant";
  if (in.first_chunk || !in.text.empty()) delta["content"] = in.text;
  if (!in.reasoning.empty()) {
    delta["reasoning_content"] = in.reasoning;
    delta["reasoning"] = in.reasoning;
  }
  if (!in.tool_calls.empty()) delta["tool_calls"] = ToolCallsJson(in.tool_calls, /*whole=*/false);
  return SingleChoiceJson(in, "chatcmpl-", "chat.completion.chunk", "delta",
                          std::move(delta), ChatLogprobs(in),
                          /*is_response=*/false);
}

std::string UsageChunkJson(const ResponseInput& in, bool chat) {
  ojson j = chat ? Header(in, "chatcmpl-", "chat.completion.chunk")
                 : Header(in, "cmpl-", "text_completion");
  j["choices"] = ojson::array();
  j["usage"] = UsageObject(in.usage, in.reasoning_tokens);
  return Dump(j);
}

std::string UsageJson(const v1::Usage& usage) {
  return Dump(UsageObject(usage));
}

std::string ModelsJson(const v1::ListModelsResponse& models) {
  ojson data = ojson::array();
  for (const v1::ModelInfo& m : models.models()) {
    ojson entry;
    entry["id"] = m.id();
    entry["object"] = "model";
    entry["created"] = m.created();
    entry["owned_by"] =
        m.owned_by().empty() ? std::string("swaserve") : m.owned_by();
    data.push_back(std::move(entry));
  }
  ojson j;
  j["object"] = "list";
  j["data"] = std::move(data);
  return Dump(j);
}

std::string SseFrame(std::string_view json_text) {
  return Cat({"data: ", json_text, "\n\n"});
}

namespace {

// 304044 -> "304,044".
std::string Thousands(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

std::string DescribePrefillProgress(const v1::PrefillProgress& progress) {
  if (!progress.found()) return "";
  switch (progress.state()) {
    case v1::PrefillProgress::STATE_QUEUED:
      return Cat({"queued at the prefill worker (", std::to_string(progress.queued_requests()),
                  progress.queued_requests() == 1 ? " request" : " requests", " waiting)"});
    case v1::PrefillProgress::STATE_COMPUTING: {
      const uint64_t total = progress.prompt_tokens();
      const uint64_t done = std::min<uint64_t>(progress.done_tokens(), total);
      std::string out = Cat({"prefill ", Thousands(done), " of ", Thousands(total),
                             " prompt tokens (", std::to_string(total > 0 ? done * 100 / total : 0),
                             "%"});
      if (progress.cached_tokens() > 0) {
        out += Cat({"; ", Thousands(progress.cached_tokens()), " cached"});
      }
      out += ")";
      if (progress.tokens_per_second() >= 1) {
        out += Cat({", ", Thousands(static_cast<uint64_t>(progress.tokens_per_second())),
                    " tokens/s"});
      }
      return out;
    }
    case v1::PrefillProgress::STATE_SHIPPING:
      return "prefill done, its KV is going to the decode worker";
    default:
      return "";
  }
}

std::string WaitingComment(absl::Duration waited, const v1::PrefillProgress* progress) {
  std::string out = Cat({": waiting for the first token, ", absl::FormatDuration(waited)});
  const std::string where = progress != nullptr ? DescribePrefillProgress(*progress) : "";
  if (!where.empty()) out += Cat({"; ", where});
  return out + "\n\n";
}

}  // namespace swaserve::api
