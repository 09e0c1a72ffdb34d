#include "lib/api/openai.h"
#include "tests/unit/api/openai_test_util.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace swaserve::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

using testing::MustFail;
using testing::MustParse;

ParseResult Completion(const json& body, const ParseLimits& limits = {}) {
  return ParseCompletionRequest(body.dump(), limits);
}
ParseResult Chat(const json& body, const ParseLimits& limits = {}) {
  return ParseChatRequest(body.dump(), limits);
}

json BaseCompletion() { return {{"model", "m"}, {"prompt", "hello"}}; }
json BaseChat() {
  return {{"model", "m"},
          {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
}

// Expects a 400 naming `param` for a completion body with `field` = `value`.
void ExpectCompletionParamError(const std::string& field, const json& value,
                                const std::string& param) {
  json body = BaseCompletion();
  body[field] = value;
  ApiError e = MustFail(Completion(body));
  EXPECT_EQ(e.http_status, 400) << body.dump();
  EXPECT_EQ(e.type, "invalid_request_error") << body.dump();
  EXPECT_EQ(e.param, param) << body.dump() << " -> " << e.message;
  EXPECT_FALSE(e.message.empty());
}

void ExpectChatParamError(const std::string& field, const json& value,
                          const std::string& param) {
  json body = BaseChat();
  body[field] = value;
  ApiError e = MustFail(Chat(body));
  EXPECT_EQ(e.http_status, 400) << body.dump();
  EXPECT_EQ(e.param, param) << body.dump() << " -> " << e.message;
}

// --- Completions: happy paths
// -------------------------------------------------

TEST(ParseCompletionTest, AllFields) {
  json body = {{"model", "mimo"},
               {"prompt", "Once upon"},
               {"max_tokens", 16},
               {"temperature", 0.5},
               {"top_p", 0.9},
               {"top_k", 40},
               {"seed", 7},
               {"stop", {"\n", "END"}},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"n", 1},
               {"echo", false},
               {"presence_penalty", 0},
               {"frequency_penalty", 0.0},
               {"user", "alice"},
               {"ignore_eos", true},
               {"speculative_tokens", 2},
               {"stop_token_ids", {1, 2}},
               {"logprobs", 3},
               {"logit_bias", json::object()},
               {"best_of", 1},
               {"suffix", ""}};
  ParsedRequest p = MustParse(Completion(body));
  EXPECT_FALSE(p.chat);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.logprobs_top, 3);
  EXPECT_EQ(p.model, "mimo");
  const v1::GenerateRequest& r = p.request;
  EXPECT_EQ(r.model(), "mimo");
  EXPECT_EQ(r.text(), "Once upon");
  EXPECT_TRUE(r.request_id().empty());
  const v1::SamplingParams& s = r.sampling();
  EXPECT_EQ(s.max_tokens(), 16u);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 40u);
  ASSERT_TRUE(s.has_seed());
  EXPECT_EQ(s.seed(), 7u);
  EXPECT_THAT(s.stop(), ElementsAre("\n", "END"));
  EXPECT_THAT(s.stop_token_ids(), ElementsAre(1u, 2u));
  EXPECT_TRUE(s.ignore_eos());
  ASSERT_TRUE(s.has_speculative_tokens());
  EXPECT_EQ(s.speculative_tokens(), 2u);
  EXPECT_TRUE(s.logprobs());
  EXPECT_EQ(s.top_logprobs(), 3u);
}

TEST(ParseCompletionTest, Defaults) {
  ParsedRequest p = MustParse(Completion(BaseCompletion()));
  const v1::SamplingParams& s = p.request.sampling();
  EXPECT_EQ(s.max_tokens(), 256u);
  EXPECT_FLOAT_EQ(s.temperature(), 1.0f);
  EXPECT_FLOAT_EQ(s.top_p(), 1.0f);
  EXPECT_EQ(s.top_k(), 0u);
  EXPECT_FALSE(s.has_seed());
  EXPECT_FALSE(s.logprobs());
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(p.include_usage);
  EXPECT_FALSE(p.logprobs);
  EXPECT_EQ(p.logprobs_top, -1);
  EXPECT_EQ(p.request.prompt_case(), v1::GenerateRequest::kText);

  ParseLimits limits;
  limits.default_max_tokens = 100;
  limits.max_tokens_limit = 50;
  EXPECT_EQ(MustParse(Completion(BaseCompletion(), limits))
                .request.sampling()
                .max_tokens(),
            50u);
}

TEST(ParseCompletionTest, NullMeansAbsent) {
  json body = BaseCompletion();
  for (const char* f :
       {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
        "stream_options", "n", "echo", "presence_penalty", "frequency_penalty",
        "user", "ignore_eos", "speculative_tokens", "stop_token_ids", "logprobs", "logit_bias",
        "best_of", "suffix"}) {
    body[f] = nullptr;
  }
  ParsedRequest p = MustParse(Completion(body));
  EXPECT_EQ(p.request.sampling().max_tokens(), 256u);
  EXPECT_FALSE(p.request.sampling().has_speculative_tokens());
  EXPECT_EQ(p.logprobs_top, -1);
}

TEST(ParseCompletionTest, PromptForms) {
  json body = BaseCompletion();
  body["prompt"] = {1, 2, 4294967295u};
  ParsedRequest p = MustParse(Completion(body));
  ASSERT_EQ(p.request.prompt_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_THAT(p.request.token_ids().ids(), ElementsAre(1u, 2u, 4294967295u));

  body["prompt"] = {"only one"};
  p = MustParse(Completion(body));
  EXPECT_EQ(p.request.text(), "only one");

  body["prompt"] = json::array({json::array({5, 6})});
  p = MustParse(Completion(body));
  EXPECT_THAT(p.request.token_ids().ids(), ElementsAre(5u, 6u));
}

TEST(ParseCompletionTest, PromptErrors) {
  ExpectCompletionParamError("prompt", json::array({"a", "b"}), "prompt");
  ExpectCompletionParamError("prompt", json::array(), "prompt");
  ExpectCompletionParamError("prompt", "", "prompt");
  ExpectCompletionParamError("prompt", 5, "prompt");
  ExpectCompletionParamError("prompt", json::object(), "prompt");
  ExpectCompletionParamError("prompt", {1, "a"}, "prompt[1]");
  ExpectCompletionParamError("prompt", {-1}, "prompt[0]");
  ExpectCompletionParamError("prompt", {4294967296ull}, "prompt[0]");
  ExpectCompletionParamError("prompt", {1.5}, "prompt");
  ExpectCompletionParamError("prompt", json::array({json::array()}), "prompt");
  ExpectCompletionParamError("prompt", json::array({json::array({1}), 2}),
                             "prompt");
  json body = {{"model", "m"}};
  ApiError e = MustFail(Completion(body));
  EXPECT_EQ(e.param, "prompt");
  body["prompt"] = nullptr;
  EXPECT_EQ(MustFail(Completion(body)).param, "prompt");
}

TEST(ParseCompletionTest, ModelRequiredString) {
  json body = {{"prompt", "x"}};
  ApiError e = MustFail(Completion(body));
  EXPECT_EQ(e.param, "model");
  EXPECT_EQ(e.code, "missing_required_parameter");
  ExpectCompletionParamError("model", 5, "model");
  ExpectCompletionParamError("model", "", "model");
  ExpectCompletionParamError("model", json::array({"m"}), "model");
}

TEST(ParseCompletionTest, MaxTokens) {
  for (const json& bad :
       {json(-1), json(0), json(1048577), json(1.5), json(16.0), json("10"),
        json(true), json(1e30), json(json::array({1})),
        json::parse("18446744073709551616"),
        json::parse("-9223372036854775809"),
        json(std::numeric_limits<uint64_t>::max())}) {
    ExpectCompletionParamError("max_tokens", bad, "max_tokens");
  }
  json body = BaseCompletion();
  body["max_tokens"] = 1048576;
  EXPECT_EQ(MustParse(Completion(body)).request.sampling().max_tokens(),
            1048576u);
  body["max_tokens"] = 1;
  EXPECT_EQ(MustParse(Completion(body)).request.sampling().max_tokens(), 1u);
  body["max_tokens"] = -5;
  ApiError e = MustFail(Completion(body));
  EXPECT_THAT(e.message, HasSubstr("max_tokens"));
  EXPECT_THAT(e.message, HasSubstr("-5"));
}

TEST(ParseCompletionTest, SamplingRanges) {
  ExpectCompletionParamError("temperature", 2.5, "temperature");
  ExpectCompletionParamError("temperature", -0.1, "temperature");
  ExpectCompletionParamError("temperature", "hot", "temperature");
  ApiError overflow = MustFail(ParseCompletionRequest(
      R"({"model":"m","prompt":"x","temperature":1e400})"));
  EXPECT_EQ(overflow.http_status, 400);
  EXPECT_THAT(overflow.message, HasSubstr("1e400"));
  ExpectCompletionParamError("top_p", 0, "top_p");
  ExpectCompletionParamError("top_p", 1.5, "top_p");
  ExpectCompletionParamError("top_p", true, "top_p");
  ExpectCompletionParamError("top_k", -2, "top_k");
  ExpectCompletionParamError("top_k", 1.5, "top_k");
  ExpectCompletionParamError("top_k", 4294967296ull, "top_k");
  ExpectCompletionParamError("seed", 1.5, "seed");
  ExpectCompletionParamError("seed", "7", "seed");
  ExpectCompletionParamError("priority", 1000001, "priority");
  ExpectCompletionParamError("priority", -1000001, "priority");
  ExpectCompletionParamError("priority", 0.5, "priority");
  {
    json body = BaseChat();  // vLLM's extension, on both endpoints
    body["priority"] = -3;
    EXPECT_EQ(MustParse(Chat(body)).request.priority(), -3);
    body = BaseCompletion();
    EXPECT_EQ(MustParse(Completion(body)).request.priority(), 0);
  }

  json body = BaseCompletion();
  body["temperature"] = 0;
  body["top_p"] = 1;
  body["top_k"] = -1;
  body["seed"] = -1;
  ParsedRequest p = MustParse(Completion(body));
  EXPECT_EQ(p.request.sampling().temperature(), 0.0f);
  EXPECT_EQ(p.request.sampling().top_k(), 0u);
  EXPECT_EQ(p.request.sampling().seed(), std::numeric_limits<uint64_t>::max());
  body["temperature"] = 2;
  body["seed"] = std::numeric_limits<uint64_t>::max();
  p = MustParse(Completion(body));
  EXPECT_EQ(p.request.sampling().temperature(), 2.0f);
  EXPECT_EQ(p.request.sampling().seed(), std::numeric_limits<uint64_t>::max());
}

TEST(ParseCompletionTest, Stop) {
  json body = BaseCompletion();
  body["stop"] = "###";
  EXPECT_THAT(MustParse(Completion(body)).request.sampling().stop(),
              ElementsAre("###"));
  body["stop"] = json::array();
  EXPECT_TRUE(MustParse(Completion(body)).request.sampling().stop().empty());

  ExpectCompletionParamError("stop", {"a", "b", "c", "d", "e"}, "stop");
  ExpectCompletionParamError("stop", 3, "stop");
  ExpectCompletionParamError("stop", {""}, "stop");
  ExpectCompletionParamError("stop", "", "stop");
  ExpectCompletionParamError("stop", {"a", 1}, "stop[1]");

  ParseLimits limits;
  limits.max_stop = 1;
  body["stop"] = {"a", "b"};
  EXPECT_EQ(MustFail(Completion(body, limits)).param, "stop");
}

TEST(ParseCompletionTest, StopTokenIds) {
  ExpectCompletionParamError("stop_token_ids", {-1}, "stop_token_ids[0]");
  ExpectCompletionParamError("stop_token_ids", {1, "x"}, "stop_token_ids[1]");
  ExpectCompletionParamError("stop_token_ids", "x", "stop_token_ids");
  ExpectCompletionParamError("stop_token_ids", 5, "stop_token_ids");
  ExpectCompletionParamError("stop_token_ids", std::vector<int>(65, 1),
                             "stop_token_ids");
}

TEST(ParseCompletionTest, Logprobs) {
  json body = BaseCompletion();
  body["logprobs"] = 0;
  ParsedRequest p = MustParse(Completion(body));
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.logprobs_top, 0);
  EXPECT_TRUE(p.request.sampling().logprobs());
  EXPECT_EQ(p.request.sampling().top_logprobs(), 0u);
  body["logprobs"] = 5;
  EXPECT_EQ(MustParse(Completion(body)).logprobs_top, 5);

  ExpectCompletionParamError("logprobs", 6, "logprobs");
  ExpectCompletionParamError("logprobs", -1, "logprobs");
  ExpectCompletionParamError("logprobs", true, "logprobs");
  ExpectCompletionParamError("logprobs", 2.0, "logprobs");
}

TEST(ParseCompletionTest, ChoicesCount) {
  json body = BaseCompletion();
  body["n"] = 3;
  EXPECT_EQ(MustParse(Completion(body)).request.n(), 3u);
  body["n"] = 128;
  EXPECT_EQ(MustParse(Completion(body)).request.n(), 128u);
  ExpectCompletionParamError("n", 129, "n");
}

TEST(ParseCompletionTest, UnsupportedOptions) {
  ExpectCompletionParamError("n", 0, "n");
  ExpectCompletionParamError("n", "1", "n");
  ExpectCompletionParamError("echo", true, "echo");
  ExpectCompletionParamError("echo", 0, "echo");
  ExpectCompletionParamError("presence_penalty", 0.5, "presence_penalty");
  ExpectCompletionParamError("frequency_penalty", -1, "frequency_penalty");
  ExpectCompletionParamError("frequency_penalty", "a", "frequency_penalty");
  ExpectCompletionParamError("logit_bias", {{"x", 5}}, "logit_bias.x");
  ExpectCompletionParamError("logit_bias", {{"1", 500}}, "logit_bias.1");
  ExpectCompletionParamError("logit_bias", 5, "logit_bias");
  ExpectCompletionParamError("best_of", 2, "best_of");
  ExpectCompletionParamError("suffix", "tail", "suffix");
  ExpectCompletionParamError("user", 5, "user");
  ExpectCompletionParamError("ignore_eos", "yes", "ignore_eos");
  ExpectCompletionParamError("stream", 1, "stream");

  json body = BaseCompletion();
  body["presence_penalty"] = 0.5;
  EXPECT_THAT(MustFail(Completion(body)).message, HasSubstr("not supported"));
}

TEST(ParseCompletionTest, StreamOptions) {
  json body = BaseCompletion();
  body["stream_options"] = {{"include_usage", true}};
  ApiError e = MustFail(Completion(body));
  EXPECT_EQ(e.param, "stream_options");
  body["stream"] = false;
  EXPECT_EQ(MustFail(Completion(body)).param, "stream_options");

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", false}};
  ParsedRequest p = MustParse(Completion(body));
  EXPECT_TRUE(p.stream);
  EXPECT_FALSE(p.include_usage);

  body["stream_options"] = {{"bogus", true}};
  EXPECT_EQ(MustFail(Completion(body)).param, "stream_options.bogus");
  body["stream_options"] = {{"include_usage", "yes"}};
  EXPECT_EQ(MustFail(Completion(body)).param, "stream_options.include_usage");
  body["stream_options"] = 1;
  EXPECT_EQ(MustFail(Completion(body)).param, "stream_options");
}

TEST(ParseCompletionTest, UnknownField) {
  json body = BaseCompletion();
  body["frobnicate"] = 1;
  ApiError e = MustFail(Completion(body));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message, "Unrecognized request argument supplied: frobnicate");
  EXPECT_EQ(e.param, "frobnicate");

  // Chat-only fields are unknown to completions and vice versa.
  body = BaseCompletion();
  body["messages"] = json::array();
  EXPECT_EQ(MustFail(Completion(body)).param, "messages");
  body = BaseChat();
  body["echo"] = false;
  EXPECT_EQ(MustFail(Chat(body)).param, "echo");
  body = BaseChat();
  body["prompt"] = "x";
  EXPECT_EQ(MustFail(Chat(body)).param, "prompt");

  // Very long names are shortened in the message.
  body = BaseCompletion();
  body[std::string(5000, 'x')] = 1;
  e = MustFail(Completion(body));
  EXPECT_LT(e.message.size(), 200u);
}

TEST(ParseCompletionTest, MalformedBodies) {
  for (const char* bad :
       {"", "{", "{\"model\":", "nul", "{\"model\" \"m\"}", "{'model':'m'}",
        "{\"model\":\"m\",}", "{\"model\":\"m\"} x", "\x01", "[]", "42",
        "\"str\"", "null", "true", "[{\"model\":\"m\"}]"}) {
    for (bool chat : {false, true}) {
      ParseResult r =
          chat ? ParseChatRequest(bad) : ParseCompletionRequest(bad);
      ApiError e = MustFail(r);
      EXPECT_EQ(e.http_status, 400) << bad;
      EXPECT_EQ(e.type, "invalid_request_error") << bad;
      EXPECT_FALSE(e.message.empty()) << bad;
      EXPECT_LT(e.message.size(), 400u) << bad;
    }
  }
  EXPECT_THAT(MustFail(ParseCompletionRequest("[]")).message,
              HasSubstr("JSON object"));
  EXPECT_THAT(MustFail(ParseCompletionRequest("{")).message,
              HasSubstr("could not parse"));
}

TEST(ParseCompletionTest, InvalidUtf8) {
  const std::vector<std::string> bodies = {
      "{\"model\":\"m\",\"prompt\":\"a\xff"
      "b\"}",
      "{\"model\":\"m\",\"prompt\":\"\xc0\xaf\"}",      // overlong
      "{\"model\":\"m\",\"prompt\":\"\xed\xa0\x80\"}",  // UTF-8 surrogate
      "{\"model\":\"m\",\"prompt\":\"\xe2\x82\"}",      // truncated
      "{\"model\":\"m\",\"prompt\":\"\\ud800\"}",       // lone surrogate
      "{\"model\":\"m\",\"prompt\":\"\\udc00x\"}",
      "{\"model\":\"m\xff\",\"prompt\":\"x\"}",
      "{\"mo\xfe\":\"m\",\"prompt\":\"x\"}",
      "{\"model\":\"m\",\"prompt\":\"x\"}\xff",
  };
  for (const std::string& body : bodies) {
    ApiError e = MustFail(ParseCompletionRequest(body));
    EXPECT_EQ(e.http_status, 400) << body;
    // The error JSON is valid UTF-8 even when the message quotes bad bytes.
    EXPECT_TRUE(json::accept(ErrorJson(e))) << body;
  }
  // Valid multi-byte UTF-8 and escapes pass.
  ParsedRequest p = MustParse(ParseCompletionRequest(
      "{\"model\":\"m\",\"prompt\":\"h\xc3\xa9 \\u00e9 \\ud83d\\ude00\"}"));
  EXPECT_EQ(p.request.text(), "h\xc3\xa9 \xc3\xa9 \xf0\x9f\x98\x80");
}

TEST(ParseCompletionTest, SizeAndDepthLimits) {
  ParseLimits limits;
  limits.max_body_bytes = 64;
  json body = BaseCompletion();
  body["prompt"] = std::string(100, 'a');
  ApiError e = MustFail(Completion(body, limits));
  EXPECT_EQ(e.http_status, 413);
  EXPECT_EQ(e.type, "invalid_request_error");

  std::string deep = "{\"model\":\"m\",\"prompt\":" + std::string(100, '[') +
                     std::string(100, ']') + "}";
  e = MustFail(ParseCompletionRequest(deep));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_THAT(e.message, HasSubstr("deeper"));
  // Brackets inside strings do not count.
  body = BaseCompletion();
  body["prompt"] = std::string(100, '[') + "\\\"{";
  EXPECT_EQ(MustParse(Completion(body)).request.text(),
            std::string(100, '[') + "\\\"{");
  // 10^6 nested arrays: rejected quickly, no stack overflow.
  std::string very_deep(1'000'000, '[');
  EXPECT_EQ(MustFail(ParseChatRequest(very_deep)).http_status, 400);
}

// --- Chat
// ---------------------------------------------------------------------

TEST(ParseChatTest, HappyPath) {
  json body = {
      {"model", "mimo"},
      {"messages",
       json::array(
           {{{"role", "developer"}, {"content", "be brief"}},
            {{"role", "system"}, {"content", "sys"}, {"name", "s"}},
            {{"role", "user"},
             {"content",
              json::array({{{"type", "text"}, {"text", "part one"}},
                           {{"type", "text"}, {"text", "part two"}}})}},
            {{"role", "assistant"}, {"content", nullptr}},
            {{"role", "tool"}, {"content", "42"}, {"tool_call_id", "c1"}},
            {{"role", "user"}, {"content", ""}}})},
      {"max_completion_tokens", 32},
      {"logprobs", true},
      {"top_logprobs", 5},
      {"temperature", 0},
      {"stream", true},
      {"response_format", {{"type", "text"}}}};
  ParsedRequest p = MustParse(Chat(body));
  EXPECT_TRUE(p.chat);
  EXPECT_TRUE(p.stream);
  EXPECT_FALSE(p.include_usage);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.logprobs_top, 5);
  ASSERT_EQ(p.request.prompt_case(), v1::GenerateRequest::kChat);
  const v1::ChatMessages& chat = p.request.chat();
  EXPECT_TRUE(chat.add_generation_prompt());
  ASSERT_EQ(chat.messages_size(), 6);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "be brief");
  EXPECT_EQ(chat.messages(1).role(), "system");
  EXPECT_EQ(chat.messages(2).role(), "user");
  EXPECT_EQ(chat.messages(2).content(), "part one\npart two");
  EXPECT_EQ(chat.messages(3).role(), "assistant");
  EXPECT_EQ(chat.messages(3).content(), "");
  EXPECT_EQ(chat.messages(4).role(), "tool");
  EXPECT_EQ(chat.messages(4).content(), "42");
  EXPECT_EQ(chat.messages(5).content(), "");
  EXPECT_EQ(p.request.sampling().max_tokens(), 32u);
  EXPECT_TRUE(p.request.sampling().logprobs());
  EXPECT_EQ(p.request.sampling().top_logprobs(), 5u);
  EXPECT_EQ(p.request.sampling().temperature(), 0.0f);
}

TEST(ParseChatTest, Defaults) {
  ParsedRequest p = MustParse(Chat(BaseChat()));
  EXPECT_EQ(p.request.sampling().max_tokens(), 256u);
  EXPECT_FALSE(p.logprobs);
  EXPECT_EQ(p.logprobs_top, -1);
  EXPECT_FALSE(p.request.sampling().logprobs());
  json body = BaseChat();
  body["logprobs"] = true;
  p = MustParse(Chat(body));
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.logprobs_top, 0);
}

TEST(ParseChatTest, MaxTokensAliases) {
  json body = BaseChat();
  body["max_tokens"] = 10;
  EXPECT_EQ(MustParse(Chat(body)).request.sampling().max_tokens(), 10u);
  body["max_completion_tokens"] = 10;
  EXPECT_EQ(MustParse(Chat(body)).request.sampling().max_tokens(), 10u);
  body["max_completion_tokens"] = 11;
  EXPECT_EQ(MustFail(Chat(body)).param, "max_completion_tokens");
  ExpectChatParamError("max_tokens", -3, "max_tokens");
  ExpectChatParamError("max_completion_tokens", 0, "max_completion_tokens");
  ExpectChatParamError("max_completion_tokens", 2.5, "max_completion_tokens");
  ExpectChatParamError("max_completion_tokens", 1 << 21,
                       "max_completion_tokens");
}

TEST(ParseChatTest, MessagesErrors) {
  ExpectChatParamError("messages", json::array(), "messages");
  ExpectChatParamError("messages", "hi", "messages");
  ExpectChatParamError("messages", json::object(), "messages");
  ExpectChatParamError("messages", {5}, "messages[0]");
  ExpectChatParamError("messages", {{{"role", "wizard"}, {"content", "x"}}},
                       "messages[0].role");
  ExpectChatParamError("messages", {{{"role", "User"}, {"content", "x"}}},
                       "messages[0].role");
  ExpectChatParamError("messages", {{{"content", "x"}}}, "messages[0].role");
  ExpectChatParamError("messages", {{{"role", 5}, {"content", "x"}}},
                       "messages[0].role");
  ExpectChatParamError("messages", {{{"role", "user"}}}, "messages[0].content");
  ExpectChatParamError("messages", {{{"role", "user"}, {"content", nullptr}}},
                       "messages[0].content");
  ExpectChatParamError("messages", {{{"role", "user"}, {"content", 5}}},
                       "messages[0].content");
  ExpectChatParamError("messages",
                       {{{"role", "user"}, {"content", "x"}},
                        {{"role", "assistant"},
                         {"content", "y"},
                         {"tool_calls", 5}}},
                       "messages[1].tool_calls");
  ExpectChatParamError(
      "messages", {{{"role", "user"}, {"content", "x"}, {"tool_call_id", "c"}}},
      "messages[0].tool_call_id");
  ExpectChatParamError("messages",
                       {{{"role", "user"}, {"content", "x"}, {"name", 3}}},
                       "messages[0].name");
  json body = {{"model", "m"}};
  EXPECT_EQ(MustFail(Chat(body)).param, "messages");
}

TEST(ParseChatTest, ContentParts) {
  json image = {{"type", "image_url"},
                {"image_url", {{"url", "data:image/png;base64,AAAA"}}}};
  json audio = {{"type", "input_audio"},
                {"input_audio", {{"data", "UklGRg=="}, {"format", "wav"}}}};
  json video = {{"type", "video_url"},
                {"video_url", {{"url", "https://example.com/v.mp4"}}}};
  json body = BaseChat();
  body["messages"][0]["content"] = json::array(
      {{{"type", "text"}, {"text", "what is this"}}, image, audio, video});
  ParsedRequest p = MustParse(Chat(body));
  // One marker per item, in order; parts joined by newlines.
  EXPECT_EQ(p.request.chat().messages(0).content(),
            "what is this\n<|image_pad|>\n<|audio_pad|>\n<|video_pad|>");
  ASSERT_EQ(p.request.multimodal_size(), 3);
  EXPECT_EQ(p.request.multimodal(0).modality(), v1::MODALITY_IMAGE);
  EXPECT_EQ(p.request.multimodal(0).url(), "data:image/png;base64,AAAA");
  EXPECT_EQ(p.request.multimodal(1).modality(), v1::MODALITY_AUDIO);
  EXPECT_EQ(p.request.multimodal(1).data(), "RIFF");  // base64 decoded
  EXPECT_EQ(p.request.multimodal(1).mime_type(), "audio/wav");
  EXPECT_EQ(p.request.multimodal(2).modality(), v1::MODALITY_VIDEO);
  EXPECT_EQ(p.request.multimodal(2).url(), "https://example.com/v.mp4");

  // Bad media parts name the parameter.
  body["messages"][0]["content"] = json::array({{{"type", "image_url"}}});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[0].content[0].image_url");
  body["messages"][0]["content"] =
      json::array({{{"type", "image_url"}, {"image_url", {{"url", ""}}}}});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[0].content[0].image_url.url");
  body["messages"][0]["content"] = json::array(
      {{{"type", "input_audio"}, {"input_audio", {{"data", "AAAA"}, {"format", "mp3"}}}}});
  ApiError e = MustFail(Chat(body));
  EXPECT_EQ(e.param, "messages[0].content[0].input_audio.format");
  EXPECT_THAT(e.message, HasSubstr("only 'wav'"));
  body["messages"][0]["content"] = json::array(
      {{{"type", "input_audio"}, {"input_audio", {{"data", "!!"}, {"format", "wav"}}}}});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[0].content[0].input_audio.data");
  body["messages"][0]["content"] = json::array({{{"type", "file"}, {"file", {}}}});
  e = MustFail(Chat(body));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_THAT(e.message, HasSubstr("'file' is not supported"));
  EXPECT_EQ(e.param, "messages[0].content[0].type");
  // An assistant turn cannot carry media.
  body["messages"] = json::array(
      {{{"role", "user"}, {"content", "hi"}},
       {{"role", "assistant"}, {"content", json::array({image})}}});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[1].content[0].type");
  body = BaseChat();

  body["messages"][0]["content"] = json::array({{{"type", "text"}}});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[0].content[0].text");
  body["messages"][0]["content"] =
      json::array({{{"type", "text"}, {"text", 1}}});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[0].content[0].text");
  body["messages"][0]["content"] = json::array({{{"text", "x"}}});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[0].content[0].type");
  body["messages"][0]["content"] = json::array({"x"});
  EXPECT_EQ(MustFail(Chat(body)).param, "messages[0].content[0]");
  body["messages"][0]["content"] = json::array();
  EXPECT_EQ(MustParse(Chat(body)).request.chat().messages(0).content(), "");
}

TEST(ParseChatTest, Logprobs) {
  ExpectChatParamError("top_logprobs", 3, "top_logprobs");
  json body = BaseChat();
  body["logprobs"] = false;
  body["top_logprobs"] = 3;
  EXPECT_EQ(MustFail(Chat(body)).param, "top_logprobs");
  body["logprobs"] = true;
  body["top_logprobs"] = 21;
  EXPECT_EQ(MustFail(Chat(body)).param, "top_logprobs");
  body["top_logprobs"] = -1;
  EXPECT_EQ(MustFail(Chat(body)).param, "top_logprobs");
  body["top_logprobs"] = 20;
  EXPECT_EQ(MustParse(Chat(body)).logprobs_top, 20);
  ExpectChatParamError("logprobs", 3, "logprobs");
}

TEST(ParseChatTest, ResponseFormatBecomesTheConstraint) {
  json body = BaseChat();
  body["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(MustParse(Chat(body)).request.sampling().constraint().kind(),
            v1::OutputConstraint::KIND_JSON_OBJECT);
  body["response_format"] = json::parse(
      R"({"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}}}}})");
  const v1::OutputConstraint c = MustParse(Chat(body)).request.sampling().constraint();
  EXPECT_EQ(c.kind(), v1::OutputConstraint::KIND_JSON_SCHEMA);
  EXPECT_EQ(json::parse(c.json_schema()), body["response_format"]["json_schema"]["schema"]);
  body["response_format"] = {{"type", "text"}};
  EXPECT_FALSE(MustParse(Chat(body)).request.sampling().has_constraint());
  body["response_format"] = json::parse(R"({"type":"json_schema","json_schema":{"schema":{}}})");
  EXPECT_EQ(MustFail(Chat(body)).param, "response_format.json_schema.name");
}

TEST(ParseChatTest, CommonParamsAndUnsupported) {
  ExpectChatParamError("n", 0, "n");
  ExpectChatParamError("n", 1000, "n");
  ExpectChatParamError("stop", {"a", "b", "c", "d", "e"}, "stop");
  ExpectChatParamError("presence_penalty", 1, "presence_penalty");
  ExpectChatParamError("response_format", {{"type", "xml"}}, "response_format.type");
  ExpectChatParamError("response_format", {{"type", "json_schema"}}, "response_format.json_schema");
  ExpectChatParamError("tools", json::object(), "tools");
  ExpectChatParamError("temperature", 3, "temperature");
  json body = BaseChat();
  body["stop"] = "x";
  body["seed"] = 3;
  body["top_k"] = 5;
  body["stop_token_ids"] = {9};
  body["ignore_eos"] = true;
  body["user"] = "u";
  ParsedRequest p = MustParse(Chat(body));
  EXPECT_THAT(p.request.sampling().stop(), ElementsAre("x"));
  EXPECT_EQ(p.request.sampling().seed(), 3u);
  EXPECT_EQ(p.request.sampling().top_k(), 5u);
  EXPECT_THAT(p.request.sampling().stop_token_ids(), ElementsAre(9u));
  EXPECT_TRUE(p.request.sampling().ignore_eos());
}

// --- Property: random mutations never crash or escape
// -------------------------

json RandomValue(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return static_cast<int64_t>(rng()) >> (rng() % 64);
    case 3:
      return rng();
    case 4:
      return std::ldexp(static_cast<double>(rng() % 1000) - 500,
                        rng() % 20 - 10);
    case 5:
      return std::string(rng() % 5, static_cast<char>('a' + rng() % 26));
    case 6:
      return json::array({static_cast<int>(rng() % 100), "x"});
    case 7:
      return json::array({static_cast<int>(rng() % 100)});
    case 8:
      return json::object({{"role", "user"}, {"content", "x"}});
    default:
      return json::array({json::object({{"type", "text"}, {"text", "x"}})});
  }
}

void CheckResult(const ParseResult& r, const std::string& body) {
  if (const ApiError* e = std::get_if<ApiError>(&r)) {
    ASSERT_GE(e->http_status, 400) << body;
    ASSERT_LT(e->http_status, 500) << body;
    ASSERT_FALSE(e->type.empty()) << body;
    ASSERT_FALSE(e->message.empty()) << body;
    ASSERT_TRUE(json::accept(ErrorJson(*e))) << body;
    return;
  }
  const ParsedRequest& p = std::get<ParsedRequest>(r);
  ASSERT_FALSE(p.model.empty());
  ASSERT_GE(p.request.sampling().max_tokens(), 1u);
  ResponseInput in;
  in.model = p.model;
  in.text = p.request.text();
  ASSERT_TRUE(
      json::accept(p.chat ? ChatResponseJson(in) : CompletionResponseJson(in)));
}

TEST(ParsePropertyTest, RandomMutationsGiveParsedOrClientError) {
  const std::vector<std::pair<bool, std::string>> seeds = {
      {false, R"({"model":"m","prompt":"hello","max_tokens":5,"stop":["x"]})"},
      {false, R"({"model":"m","prompt":[1,2,3],"logprobs":2,"stream":true,)"
              R"("stream_options":{"include_usage":true},"seed":-4})"},
      {false, R"({"model":"m","prompt":["one"],"temperature":0.2,"top_p":0.5,)"
              R"("top_k":3,"stop_token_ids":[7],"ignore_eos":false})"},
      {true, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})"},
      {true, R"({"model":"m","messages":[{"role":"system","content":"s"},)"
             R"({"role":"user","content":[{"type":"text","text":"a"},)"
             R"({"type":"text","text":"b"}]}],"logprobs":true,)"
             R"("top_logprobs":2,"max_completion_tokens":9,"n":1})"},
  };
  std::mt19937_64 rng(12345);
  const std::string kJsonBytes = "{}[]\":,0123456789-.eE\\tfnul \x80\xff";
  int parsed = 0;
  int errors = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const auto& [chat, seed] = seeds[rng() % seeds.size()];
    std::string body = seed;
    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 6) {
        case 0:  // flip a byte
          if (!body.empty()) body[rng() % body.size()] ^= 1 << (rng() % 8);
          break;
        case 1:  // truncate
          body.resize(rng() % (body.size() + 1));
          break;
        case 2:  // insert a JSON-ish byte
          body.insert(body.begin() + rng() % (body.size() + 1),
                      kJsonBytes[rng() % kJsonBytes.size()]);
          break;
        case 3:  // delete a range
          if (!body.empty()) {
            const size_t at = rng() % body.size();
            body.erase(at, rng() % 8);
          }
          break;
        default: {  // change a field's type or value
          json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
          if (j.is_discarded() || !j.is_object() || j.empty()) break;
          auto it = j.begin();
          std::advance(it, rng() % j.size());
          if (rng() % 8 == 0) {
            j["x" + std::to_string(rng() % 3)] = RandomValue(rng);
          } else if (rng() % 8 == 0) {
            j.erase(it);
          } else {
            *it = RandomValue(rng);
          }
          body = j.dump();
        }
      }
    }
    ParseResult r = ParseCompletionRequest("");
    ASSERT_NO_THROW(r = chat ? ParseChatRequest(body)
                             : ParseCompletionRequest(body));
    CheckResult(r, body);
    if (std::holds_alternative<ParsedRequest>(r)) {
      ++parsed;
    } else {
      ++errors;
    }
    // The other endpoint must cope with the same body.
    ASSERT_NO_THROW(r = chat ? ParseCompletionRequest(body)
                             : ParseChatRequest(body));
    CheckResult(r, body);
  }
  // Both outcomes are exercised.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(errors, 1000);
}

}  // namespace
}  // namespace swaserve::api
