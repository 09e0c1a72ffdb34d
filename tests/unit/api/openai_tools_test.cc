// The agent-facing parts of the OpenAI API layer: tools, tool_choice,
// assistant tool_calls and tool messages, reasoning, template kwargs, the
// fields agent SDKs send alongside, /tokenize and /detokenize, and the
// response shapes of tool calls and reasoning.
#include <string>
#include <variant>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/api/openai.h"
#include "tests/unit/api/openai_test_util.h"
#include "nlohmann/json.hpp"

namespace swaserve::api {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

using testing::MustFail;
using testing::MustParse;

json Tool(const std::string& name) {
  return {{"type", "function"},
          {"function",
           {{"name", name},
            {"description", "adds"},
            {"parameters",
             {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}}},
            {"strict", true}}}};
}

json AgentTurn() {
  return {{"model", "m"},
          {"messages",
           json::array({{{"role", "system"}, {"content", "be brief"}},
                        {{"role", "user"}, {"content", "add 1"}},
                        {{"role", "assistant"},
                         {"content", nullptr},
                         {"reasoning_content", "need add"},
                         {"tool_calls",
                          json::array({{{"id", "call_1"},
                                        {"type", "function"},
                                        {"function", {{"name", "add"}, {"arguments", "{\"a\": 1}"}}}}})}},
                        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "2"}}})},
          {"tools", json::array({Tool("add"), Tool("lookup")})},
          {"tool_choice", "auto"},
          {"parallel_tool_calls", false}};
}

TEST(ParseToolsTest, AgentTurnIsCarriedWhole) {
  const ParsedRequest p = MustParse(ParseChatRequest(AgentTurn().dump()));
  const v1::ChatMessages& chat = p.request.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  const v1::ChatMessage& a = chat.messages(2);
  EXPECT_TRUE(a.content_null());
  EXPECT_EQ(a.reasoning_content(), "need add");
  ASSERT_EQ(a.tool_calls_size(), 1);
  EXPECT_EQ(a.tool_calls(0).id(), "call_1");
  EXPECT_EQ(a.tool_calls(0).name(), "add");
  EXPECT_EQ(a.tool_calls(0).arguments(), "{\"a\": 1}");
  EXPECT_EQ(chat.messages(3).tool_call_id(), "call_1");
  EXPECT_EQ(json::parse(chat.tools_json()), AgentTurn()["tools"]);
  EXPECT_EQ(p.request.tool_choice().mode(), v1::ToolChoice::MODE_AUTO);
  ASSERT_TRUE(p.request.has_parallel_tool_calls());
  EXPECT_FALSE(p.request.parallel_tool_calls());
}

TEST(ParseToolsTest, ToolChoiceForms) {
  json body = AgentTurn();
  body["tool_choice"] = "required";
  EXPECT_EQ(MustParse(ParseChatRequest(body.dump())).request.tool_choice().mode(),
            v1::ToolChoice::MODE_REQUIRED);
  body["tool_choice"] = "none";
  EXPECT_EQ(MustParse(ParseChatRequest(body.dump())).request.tool_choice().mode(),
            v1::ToolChoice::MODE_NONE);
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "lookup"}}}};
  const ParsedRequest p = MustParse(ParseChatRequest(body.dump()));
  EXPECT_EQ(p.request.tool_choice().mode(), v1::ToolChoice::MODE_FUNCTION);
  EXPECT_EQ(p.request.tool_choice().function_name(), "lookup");

  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nosuch"}}}};
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "tool_choice");
  body["tool_choice"] = "sometimes";
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "tool_choice");
  body.erase("tools");
  body["tool_choice"] = "required";
  EXPECT_THAT(MustFail(ParseChatRequest(body.dump())).message, HasSubstr("requires 'tools'"));
}

TEST(ParseToolsTest, BadToolsAreNamed) {
  struct Case {
    json tools;
    std::string param;
  };
  const std::vector<Case> cases = {
      {json::object(), "tools"},
      {json::array({json::array()}), "tools[0]"},
      {json::array({{{"type", "custom"}, {"function", {{"name", "f"}}}}}), "tools[0].type"},
      {json::array({{{"type", "function"}}}), "tools[0].function"},
      {json::array({{{"type", "function"}, {"function", {{"name", "has space"}}}}}),
       "tools[0].function.name"},
      {json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", 3}}}}}),
       "tools[0].function.parameters"},
      {json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"color", "red"}}}}}),
       "tools[0].function.color"},
      {json::array({Tool("f"), Tool("f")}), "tools[1].function.name"},
  };
  for (const Case& c : cases) {
    json body = AgentTurn();
    body.erase("tool_choice");
    body["tools"] = c.tools;
    const ApiError e = MustFail(ParseChatRequest(body.dump()));
    EXPECT_EQ(e.http_status, 400) << c.tools.dump();
    EXPECT_EQ(e.param, c.param) << c.tools.dump() << ": " << e.message;
  }
}

TEST(ParseToolsTest, BadToolCallsAreNamed) {
  json body = AgentTurn();
  body["messages"][2]["tool_calls"][0]["function"].erase("arguments");
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param,
            "messages[2].tool_calls[0].function.arguments");
  body = AgentTurn();
  body["messages"][2]["tool_calls"][0].erase("id");
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "messages[2].tool_calls[0].id");
  body = AgentTurn();
  body["messages"][1]["tool_calls"] = json::array();  // only assistants call
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "messages[1].tool_calls");
  body = AgentTurn();  // arguments given as an object are written as JSON
  body["messages"][2]["tool_calls"][0]["function"]["arguments"] = {{"a", 1}};
  EXPECT_EQ(json::parse(MustParse(ParseChatRequest(body.dump()))
                            .request.chat()
                            .messages(2)
                            .tool_calls(0)
                            .arguments()),
            json({{"a", 1}}));
  body = AgentTurn();  // a call as a stream's deltas join it: its index is ignored
  body["messages"][2]["tool_calls"][0]["index"] = 0;
  EXPECT_EQ(MustParse(ParseChatRequest(body.dump())).request.chat().messages(2).tool_calls_size(), 1);
  body["messages"][2]["tool_calls"][0]["indices"] = 0;  // anything else is still named
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "messages[2].tool_calls[0].indices");
}

TEST(ParseToolsTest, ReasoningAndTemplateKwargs) {
  json body = AgentTurn();
  body["chat_template_kwargs"] = {{"enable_thinking", false}, {"custom", "x"}};
  ParsedRequest p = MustParse(ParseChatRequest(body.dump()));
  EXPECT_EQ(json::parse(p.request.chat().template_kwargs_json()),
            json({{"enable_thinking", false}, {"custom", "x"}}));

  for (const auto& [effort, thinking] :
       std::vector<std::pair<std::string, bool>>{{"none", false}, {"minimal", false},
                                                 {"low", true}, {"high", true}}) {
    json b = AgentTurn();
    b["reasoning_effort"] = effort;
    p = MustParse(ParseChatRequest(b.dump()));
    EXPECT_EQ(json::parse(p.request.chat().template_kwargs_json())["enable_thinking"], thinking)
        << effort;
  }
  body["reasoning_effort"] = "none";  // explicit kwargs win
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  p = MustParse(ParseChatRequest(body.dump()));
  EXPECT_EQ(json::parse(p.request.chat().template_kwargs_json())["enable_thinking"], true);

  body["reasoning_effort"] = "extreme";
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "reasoning_effort");
  body.erase("reasoning_effort");
  body["chat_template_kwargs"] = {{"messages", json::array()}};
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "chat_template_kwargs");
}

TEST(ParseToolsTest, FieldsAgentClientsSendAlongside) {
  json body = AgentTurn();
  body["store"] = false;
  body["metadata"] = {{"run", "7"}};
  body["service_tier"] = "priority";
  body["safety_identifier"] = "user-hash";
  body["prompt_cache_key"] = "session-42";
  body["user"] = "u";
  body["max_completion_tokens"] = 20;
  ParsedRequest p = MustParse(ParseChatRequest(body.dump()));
  EXPECT_EQ(p.request.cache_key(), "session-42");
  EXPECT_EQ(p.request.priority(), -1);
  EXPECT_EQ(p.request.sampling().max_tokens(), 20u);
  body["service_tier"] = "flex";
  EXPECT_EQ(MustParse(ParseChatRequest(body.dump())).request.priority(), 1);
  body["priority"] = 5;  // an explicit priority wins
  EXPECT_EQ(MustParse(ParseChatRequest(body.dump())).request.priority(), 5);

  body = AgentTurn();
  body["metadata"] = {{"n", 1}};
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "metadata.n");
  body = AgentTurn();
  body["service_tier"] = "gold";
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "service_tier");
  // A field that would change the output and is not implemented is named.
  body = AgentTurn();
  body = AgentTurn();
  body["web_search_options"] = json::object();
  EXPECT_EQ(MustFail(ParseChatRequest(body.dump())).param, "web_search_options");
}

TEST(TokenizeTest, PromptAndMessages) {
  auto t = ParseTokenizeRequest(R"({"model": "m", "prompt": "hello"})");
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t));
  EXPECT_EQ(std::get<TokenizeRequest>(t).request.text(), "hello");

  json body = AgentTurn();
  body.erase("tool_choice");
  body.erase("parallel_tool_calls");
  body["add_generation_prompt"] = false;
  body["return_token_strs"] = true;
  t = ParseTokenizeRequest(body.dump());
  ASSERT_TRUE(std::holds_alternative<TokenizeRequest>(t)) << std::get<ApiError>(t).message;
  const TokenizeRequest& r = std::get<TokenizeRequest>(t);
  EXPECT_TRUE(r.return_token_strs);
  EXPECT_EQ(r.request.chat().messages_size(), 4);
  EXPECT_FALSE(r.request.chat().add_generation_prompt());
  EXPECT_FALSE(r.request.chat().tools_json().empty());

  for (const char* bad : {R"({"prompt": "a", "messages": []})", R"({})",
                          R"({"prompt": "a", "tools": []})", R"({"prompt": 3})",
                          R"({"prompt": "a", "temperature": 1})"}) {
    EXPECT_TRUE(std::holds_alternative<ApiError>(ParseTokenizeRequest(bad))) << bad;
  }
  EXPECT_EQ(json::parse(TokenizeResponseJson({5, 6}, 100, nullptr)),
            json::parse(R"({"count": 2, "max_model_len": 100, "tokens": [5, 6],
                            "token_strs": null})"));
}

TEST(TokenizeTest, Detokenize) {
  auto d = ParseDetokenizeRequest(R"({"model": "m", "tokens": [1, 2, 3]})");
  ASSERT_TRUE(std::holds_alternative<std::vector<uint32_t>>(d));
  EXPECT_EQ(std::get<std::vector<uint32_t>>(d), (std::vector<uint32_t>{1, 2, 3}));
  for (const char* bad : {R"({"tokens": [-1]})", R"({"tokens": "1"})", R"({})",
                          R"({"tokens": [1], "x": 1})"}) {
    EXPECT_TRUE(std::holds_alternative<ApiError>(ParseDetokenizeRequest(bad))) << bad;
  }
  EXPECT_EQ(json::parse(DetokenizeResponseJson("hi")), json({{"prompt", "hi"}}));
}

TEST(ToolResponseTest, MessageWithCallsAndReasoning) {
  ResponseInput in;
  in.request_id = "r";
  in.model = "m";
  in.reasoning = "think";
  in.tool_calls = {{.index = 0, .id = "call_a", .name = "add", .arguments = "{\"a\": 1}"}};
  in.finished_in_tool_calls = true;
  in.finish_reason = v1::FINISH_REASON_STOP;
  in.reasoning_tokens = 3;
  v1::Usage u;
  u.set_prompt_tokens(10);
  u.set_completion_tokens(7);
  in.usage = u;
  const json j = json::parse(ChatResponseJson(in));
  const json& m = j["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["reasoning_content"], "think");
  EXPECT_EQ(m["tool_calls"][0]["id"], "call_a");
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "add");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
  EXPECT_FALSE(m["tool_calls"][0].contains("index"));  // only a chunk's deltas have one
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], 3);

  in.finish_reason = v1::FINISH_REASON_LENGTH;  // cut off: "length" stays
  EXPECT_EQ(json::parse(ChatResponseJson(in))["choices"][0]["finish_reason"], "length");
}

TEST(ToolResponseTest, ChunkDeltas) {
  ResponseInput in;
  in.request_id = "r";
  in.tool_calls = {{.index = 1, .id = "call_b", .name = "lookup", .arguments = ""}};
  json d = json::parse(ChatChunkJson(in))["choices"][0]["delta"];
  EXPECT_EQ(d["tool_calls"][0]["index"], 1);
  EXPECT_EQ(d["tool_calls"][0]["id"], "call_b");
  EXPECT_EQ(d["tool_calls"][0]["function"]["name"], "lookup");
  in.tool_calls = {{.index = 1, .id = "", .name = "", .arguments = "{\"w\""}};
  d = json::parse(ChatChunkJson(in))["choices"][0]["delta"];
  EXPECT_FALSE(d["tool_calls"][0].contains("id"));
  EXPECT_EQ(d["tool_calls"][0]["function"]["arguments"], "{\"w\"");
  in.tool_calls.clear();
  in.reasoning = "hm";
  d = json::parse(ChatChunkJson(in))["choices"][0]["delta"];
  EXPECT_EQ(d["reasoning_content"], "hm");
  EXPECT_FALSE(d.contains("content"));
}

}  // namespace
}  // namespace swaserve::api
