// The Messages API layer: requests become the chat the equivalent OpenAI
// request becomes (so both render the same prompt), field checks with
// Anthropic's errors, the whole message and the event stream.
#include <string>

#include "gtest/gtest.h"
#include "google/protobuf/util/message_differencer.h"
#include "lib/api/anthropic.h"
#include "lib/api/anthropic_response.h"
#include "nlohmann/json.hpp"
#include "tests/unit/api/openai_test_util.h"

namespace swaserve::api {
namespace {

using json = nlohmann::json;
using testing::MustFail;
using testing::MustParse;

constexpr char kSchema[] =
    R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]})";

// An agent turn sequence in both APIs.
TEST(AnthropicRequest, TheSameChatAsTheEquivalentOpenAiRequest) {
  const json anthropic = json::parse(std::string(R"({
    "model": "demo", "max_tokens": 4096, "temperature": 0.5, "top_p": 0.9, "top_k": 20,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
    "tools": [{"name": "add", "description": "Add.", "input_schema": )") + kSchema + R"(}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "stop_sequences": ["END"],
    "messages": [
      {"role": "user", "content": "What is 2 plus 3?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Use add.", "signature": "abc"},
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 2, "b": 3}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "5"},
        {"type": "text", "text": "And now?"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "It is 5."}]}
    ]})");
  const json openai = json::parse(std::string(R"({
    "model": "demo", "max_tokens": 4096, "temperature": 0.5, "top_p": 0.9, "top_k": 20,
    "tools": [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": )") +
                                  kSchema + R"(}}],
    "tool_choice": "required", "parallel_tool_calls": false,
    "chat_template_kwargs": {"enable_thinking": true},
    "stop": ["END"],
    "messages": [
      {"role": "system", "content": "Be brief.\nUse tools."},
      {"role": "user", "content": "What is 2 plus 3?"},
      {"role": "assistant", "content": null, "reasoning_content": "Use add.",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "5"},
      {"role": "user", "content": "And now?"},
      {"role": "assistant", "content": "It is 5."}
    ]})");
  const ParsedRequest a = MustParse(ParseMessagesRequest(anthropic.dump()));
  const ParsedRequest o = MustParse(ParseChatRequest(openai.dump()));
  EXPECT_TRUE(a.messages_api);
  EXPECT_TRUE(a.chat);
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(o.request, a.request)) << diff;
}

TEST(AnthropicRequest, ToolResultsAndImages) {
  const ParsedRequest r = MustParse(ParseMessagesRequest(R"({
    "model": "demo", "max_tokens": 8,
    "messages": [{"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "t1", "is_error": true,
       "content": [{"type": "text", "text": "no such file"}]},
      {"type": "tool_result", "tool_use_id": "t2", "content": "ok"},
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
      {"type": "text", "text": "Look."}]}]})"));
  const v1::ChatMessages& c = r.request.chat();
  ASSERT_EQ(c.messages_size(), 3);
  EXPECT_EQ(c.messages(0).role(), "tool");
  EXPECT_EQ(c.messages(0).tool_call_id(), "t1");
  EXPECT_EQ(c.messages(0).content(), "Error: no such file");
  EXPECT_EQ(c.messages(1).content(), "ok");
  EXPECT_EQ(c.messages(2).role(), "user");
  ASSERT_EQ(r.request.multimodal_size(), 1);
  EXPECT_EQ(r.request.multimodal(0).url(), "data:image/png;base64,iVBORw0K");
  EXPECT_EQ(r.request.multimodal(0).modality(), v1::MODALITY_IMAGE);
}

TEST(AnthropicRequest, CacheControlBreakpoints) {
  const ParsedRequest r = MustParse(ParseMessagesRequest(std::string(R"({
    "model": "demo", "max_tokens": 8,
    "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "add", "input_schema": )") + kSchema + R"(,
               "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
    "messages": [{"role": "user", "content": [
      {"type": "text", "text": "Q", "cache_control": {"type": "ephemeral"}}]}]})"));
  const auto& b = r.request.chat().cache_breakpoints();
  ASSERT_EQ(b.size(), 3);
  EXPECT_EQ(b[0].message_index(), -1);  // tools
  EXPECT_EQ(b[0].ttl_seconds(), 3600u);
  EXPECT_EQ(b[1].message_index(), 0);  // system
  EXPECT_EQ(b[1].ttl_seconds(), 300u);
  EXPECT_EQ(b[2].message_index(), 1);  // the user message
  const std::string five = R"({"type":"text","text":"x","cache_control":{"type":"ephemeral"}})";
  const ApiError e = MustFail(ParseMessagesRequest(
      R"({"model":"demo","max_tokens":8,"messages":[{"role":"user","content":[)" + five + "," +
      five + "," + five + "," + five + "," + five + "]}]}"));
  EXPECT_NE(e.message.find("maximum of 4"), std::string::npos) << e.message;
  EXPECT_EQ(MustFail(ParseMessagesRequest(
                R"({"model":"demo","max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral","ttl":"2h"}}]}]})"))
                .param,
            "messages[0].content[0].cache_control.ttl");
}

TEST(AnthropicRequest, Errors) {
  auto param = [](const std::string& body) { return MustFail(ParseMessagesRequest(body)).param; };
  EXPECT_EQ(param(R"({"model":"demo","messages":[{"role":"user","content":"x"}]})"), "max_tokens");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":0,"messages":[{"role":"user","content":"x"}]})"),
            "max_tokens");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":4,"n":2,"messages":[{"role":"user","content":"x"}]})"),
            "n");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":4,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})"),
            "temperature");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":4,"messages":[{"role":"system","content":"x"}]})"),
            "messages[0].role");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":4000,"thinking":{"type":"enabled","budget_tokens":100},"messages":[{"role":"user","content":"x"}]})"),
            "thinking.budget_tokens");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":1500,"thinking":{"type":"enabled","budget_tokens":2000},"messages":[{"role":"user","content":"x"}]})"),
            "thinking.budget_tokens");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":4,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result","tool_use_id":"t","content":"r"}]}]})"),
            "messages[0].content[1]");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":4,"messages":[{"role":"user","content":[{"type":"document"}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(param(R"({"model":"demo","max_tokens":4,"tools":[{"type":"web_search_20250305","name":"w"}],"messages":[{"role":"user","content":"x"}]})"),
            "tools[0].type");
  // Not JSON, not an object.
  EXPECT_EQ(MustFail(ParseMessagesRequest("{")).http_status, 400);
  EXPECT_EQ(MustFail(ParseMessagesRequest("[]")).http_status, 400);
}

TEST(AnthropicRequest, CountTokens) {
  auto r = ParseCountTokensRequest(R"({"model":"demo","system":"s","messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(r));
  EXPECT_EQ(std::get<TokenizeRequest>(r).request.chat().messages_size(), 2);
  auto bad = ParseCountTokensRequest(R"({"model":"demo","max_tokens":4,"messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(CountTokensResponseJson(12), R"({"input_tokens":12})");
}

TEST(AnthropicErrors, ShapeAndStatus) {
  ApiError e = ServiceUnavailableError("no workers");
  EXPECT_EQ(AnthropicStatus(e), 529);
  json j = json::parse(AnthropicErrorJson(e, "req-1"));
  EXPECT_EQ(j["type"], "error");
  EXPECT_EQ(j["error"]["type"], "overloaded_error");
  EXPECT_EQ(j["error"]["message"], "no workers");
  EXPECT_EQ(j["request_id"], "req-1");
  EXPECT_EQ(json::parse(AnthropicErrorJson(AuthenticationError("x")))["error"]["type"],
            "authentication_error");
  EXPECT_EQ(json::parse(AnthropicErrorJson(PayloadTooLargeError(10)))["error"]["type"],
            "request_too_large");
  EXPECT_EQ(json::parse(AnthropicErrorJson(RateLimitError("x")))["error"]["type"],
            "rate_limit_error");
  EXPECT_EQ(json::parse(AnthropicErrorJson(ModelNotFoundError("m")))["error"]["type"],
            "not_found_error");
  EXPECT_EQ(json::parse(AnthropicErrorJson(ServerError("x")))["error"]["type"], "api_error");
}

TEST(AnthropicResponse, WholeMessage) {
  ResponseInput in;
  in.request_id = "r1";
  in.model = "demo";
  in.reasoning = "think";
  in.text = "Calling.";
  in.tool_calls.push_back({.index = 0, .id = "r1_0", .name = "add", .arguments = R"({"a":1,"b":2})"});
  in.finished_in_tool_calls = true;
  in.finish_reason = v1::FINISH_REASON_STOP;
  v1::Usage u;
  u.set_prompt_tokens(100);
  u.set_cached_tokens(64);
  u.set_completion_tokens(9);
  const MessagesUsage mu = MessagesUsageFrom(u, /*breakpoint_tokens=*/80);
  EXPECT_EQ(mu.cache_read_input_tokens, 64u);
  EXPECT_EQ(mu.cache_creation_input_tokens, 16u);
  EXPECT_EQ(mu.input_tokens, 20u);
  const json j = json::parse(MessagesResponseJson(in, mu));
  EXPECT_EQ(j["id"], "msg_r1");
  ASSERT_EQ(j["content"].size(), 3u);
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][1]["text"], "Calling.");
  EXPECT_EQ(j["content"][2]["input"], json::parse(R"({"a":1,"b":2})"));
  EXPECT_EQ(j["stop_reason"], "tool_use");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  EXPECT_EQ(j["usage"]["output_tokens"], 9);

  ResponseInput stop;
  stop.finish_reason = v1::FINISH_REASON_STOP;
  stop.stop_sequence = "END";
  EXPECT_EQ(StopReasonString(stop), "stop_sequence");
  stop.finish_reason = v1::FINISH_REASON_LENGTH;
  EXPECT_EQ(StopReasonString(stop), "max_tokens");
  EXPECT_EQ(StopReasonString(ResponseInput{.finish_reason = v1::FINISH_REASON_STOP}), "end_turn");
}

// The events of a stream, as the JSON objects of its data lines.
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find('\n', at);
    out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}

TEST(AnthropicResponse, EventStream) {
  MessagesStream s("r2", "demo");
  std::string sse = s.Ping(50);
  sse += s.Ping(50);  // message_start only once
  sse += s.Delta("hmm", "", {});
  sse += s.Delta(" ok", "", {});
  sse += s.Delta("", "Hi", {});
  sse += s.Delta("", "", {{.index = 0, .id = "c0", .name = "add", .arguments = R"({"a":)"},
                          {.index = 0, .arguments = "1}"}});
  sse += s.Delta("", "", {{.index = 1, .id = "c1", .name = "add", .arguments = "{}"}});
  ResponseInput last;
  last.finish_reason = v1::FINISH_REASON_STOP;
  last.finished_in_tool_calls = true;
  v1::Usage u;
  u.set_prompt_tokens(50);
  u.set_completion_tokens(7);
  sse += s.Finish(last, MessagesUsageFrom(u, 0));
  EXPECT_TRUE(s.finished());
  std::vector<std::string> types;
  for (const json& e : Events(sse)) types.push_back(e["type"]);
  const std::vector<std::string> want = {
      "message_start", "ping", "ping", "content_block_start", "content_block_delta",
      "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
      "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta",
      "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
      "message_delta", "message_stop"};
  EXPECT_EQ(types, want) << sse;
  const std::vector<json> ev = Events(sse);
  EXPECT_EQ(ev[0]["message"]["usage"]["input_tokens"], 50);
  EXPECT_EQ(ev[3]["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[4]["delta"]["thinking"], "hmm");
  EXPECT_EQ(ev[10]["index"], 2);
  EXPECT_EQ(ev[10]["content_block"]["id"], "c0");
  EXPECT_EQ(ev[11]["delta"]["partial_json"], R"({"a":)");
  EXPECT_EQ(ev[14]["index"], 3);
  EXPECT_EQ(ev[17]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[17]["usage"]["output_tokens"], 7);
  EXPECT_NE(sse.find("event: content_block_delta\ndata: "), std::string::npos);
  EXPECT_EQ(json::parse(MessagesStream::Error(OverloadedError("busy")).substr(
                MessagesStream::Error(OverloadedError("busy")).find("data: ") + 6))["error"]["type"],
            "overloaded_error");
}

}  // namespace
}  // namespace swaserve::api
