// lib/api/openai.h: error bodies (ErrorJson and its constructors) and the
// response and stream-chunk formats, field by field (openai_test.cc: the
// request parsers; openai_response_test.cc: the exact text).
#include "lib/api/openai.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace swaserve::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// --- Errors
// -------------------------------------------------------------------

TEST(ErrorJsonTest, Shape) {
  json j = json::parse(ErrorJson(InvalidRequestError("bad n", "n", "x")));
  EXPECT_EQ(j["error"]["message"], "bad n");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_EQ(j["error"]["code"], "x");
  j = json::parse(ErrorJson(ServerError("boom")));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(j["error"]["type"], "server_error");
  // Invalid UTF-8 in a message is replaced, not thrown on.
  j = json::parse(ErrorJson(InvalidRequestError("bad \xff byte")));
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("bad "));
}

TEST(ErrorJsonTest, Constructors) {
  EXPECT_EQ(ModelNotFoundError("x").http_status, 404);
  EXPECT_EQ(ModelNotFoundError("x").code, "model_not_found");
  EXPECT_EQ(PayloadTooLargeError(10).http_status, 413);
  EXPECT_EQ(AuthenticationError("no").http_status, 401);
  EXPECT_EQ(AuthenticationError("no").type, "authentication_error");
  EXPECT_EQ(RateLimitError("slow").http_status, 429);
  EXPECT_EQ(RateLimitError("slow").type, "rate_limit_error");
  EXPECT_EQ(OverloadedError("busy").http_status, 429);
  EXPECT_EQ(OverloadedError("busy").type, "server_overloaded");
  EXPECT_EQ(ServiceUnavailableError("x").http_status, 503);
  EXPECT_EQ(ServiceUnavailableError("x").type, "service_unavailable");
  EXPECT_EQ(ServerError("x").http_status, 500);
}

TEST(ErrorJsonTest, FromStatusAndDetail) {
  EXPECT_EQ(ApiErrorFromStatus(absl::InvalidArgumentError("a")).http_status,
            400);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnauthenticatedError("a")).http_status,
            401);
  EXPECT_EQ(ApiErrorFromStatus(absl::NotFoundError("a")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(absl::ResourceExhaustedError("a")).http_status,
            429);
  EXPECT_EQ(ApiErrorFromStatus(absl::UnavailableError("a")).http_status, 503);
  ApiError e = ApiErrorFromStatus(absl::InternalError("oops"));
  EXPECT_EQ(e.http_status, 500);
  EXPECT_EQ(e.message, "oops");

  v1::ErrorDetail d;
  d.set_code(v1::ERROR_CODE_PROMPT_TOO_LONG);
  d.set_message("too long");
  e = ApiErrorFromDetail(d);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.message, "too long");
  d.set_code(v1::ERROR_CODE_OVERLOADED);
  EXPECT_EQ(ApiErrorFromDetail(d).http_status, 429);
  EXPECT_EQ(ApiErrorFromDetail(d).retry_after_ms, 0u);
  d.set_retry_after_ms(2500);  // the HTTP layer's Retry-After
  EXPECT_EQ(ApiErrorFromDetail(d).retry_after_ms, 2500u);
  d.set_code(v1::ERROR_CODE_NO_WORKERS);
  EXPECT_EQ(ApiErrorFromDetail(d).http_status, 503);
  d.set_code(v1::ERROR_CODE_UNKNOWN_MODEL);
  EXPECT_EQ(ApiErrorFromDetail(d).http_status, 404);
  d.set_code(v1::ERROR_CODE_WORKER_LOST);
  EXPECT_EQ(ApiErrorFromDetail(d).http_status, 503);
  d.set_code(v1::ERROR_CODE_UNSPECIFIED);
  EXPECT_EQ(ApiErrorFromDetail(d).http_status, 500);
}

// --- Formatting
// ---------------------------------------------------------------

ResponseInput SampleInput() {
  ResponseInput in;
  in.request_id = "abc";
  in.model = "mimo";
  in.created = 1700000000;
  in.text = "Hello world";
  in.token_ids = {10, 11};
  in.finish_reason = v1::FINISH_REASON_LENGTH;
  v1::Usage usage;
  usage.set_prompt_tokens(7);
  usage.set_completion_tokens(2);
  usage.set_cached_tokens(4);
  in.usage = usage;
  return in;
}

std::vector<TokenLogprobText> SampleLogprobs() {
  std::vector<TokenLogprobText> out(2);
  out[0].logprob.set_token_id(10);
  out[0].logprob.set_logprob(-0.1f);
  auto* alt = out[0].logprob.add_top();
  alt->set_token_id(10);
  alt->set_logprob(-0.1f);
  alt = out[0].logprob.add_top();
  alt->set_token_id(12);
  alt->set_logprob(-2.5f);
  out[0].token = "Hello";
  out[0].top_tokens = {"Hello", "Hi"};
  out[1].logprob.set_token_id(11);
  out[1].logprob.set_logprob(-std::numeric_limits<float>::infinity());
  out[1].token = " world";
  return out;
}

void ExpectUsage(const json& u) {
  EXPECT_EQ(u["prompt_tokens"], 7);
  EXPECT_EQ(u["completion_tokens"], 2);
  EXPECT_EQ(u["total_tokens"], 9);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(FormatTest, CompletionResponse) {
  ResponseInput in = SampleInput();
  json j = json::parse(CompletionResponseJson(in));
  EXPECT_EQ(j["id"], "cmpl-abc");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "mimo");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "Hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  ExpectUsage(j["usage"]);

  in.logprobs = true;
  in.token_logprobs = SampleLogprobs();
  const std::string text = CompletionResponseJson(in);
  EXPECT_THAT(text, HasSubstr("-0.1,"));  // shortest float form
  j = json::parse(text);
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"Hello", " world"}));
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][0].get<double>(), -0.1);
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][1].get<double>(), -9999.0);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][0]["Hi"].get<double>(), -2.5);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][0]["Hello"].get<double>(), -0.1);
  EXPECT_TRUE(lp["top_logprobs"][1].empty());
  EXPECT_EQ(lp["text_offset"], json({0, 5}));

  in.text_offset_start = 100;
  j = json::parse(CompletionChunkJson(in));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json({100, 105}));
}

TEST(FormatTest, ChatResponse) {
  ResponseInput in = SampleInput();
  in.finish_reason = v1::FINISH_REASON_STOP;
  in.logprobs = true;
  in.token_logprobs = SampleLogprobs();
  json j = json::parse(ChatResponseJson(in));
  EXPECT_EQ(j["id"], "chatcmpl-abc");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  ExpectUsage(j["usage"]);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Hello");
  EXPECT_DOUBLE_EQ(content[0]["logprob"].get<double>(), -0.1);
  EXPECT_EQ(content[0]["bytes"], json({72, 101, 108, 108, 111}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "Hi");
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], json({72, 105}));
  EXPECT_DOUBLE_EQ(content[1]["logprob"].get<double>(), -9999.0);
  EXPECT_TRUE(content[1]["top_logprobs"].empty());

  in.logprobs = false;
  in.usage.reset();
  j = json::parse(ChatResponseJson(in));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["total_tokens"], 0);
}

TEST(FormatTest, PartialUtf8TokenBytes) {
  ResponseInput in = SampleInput();
  in.logprobs = true;
  in.token_logprobs.resize(1);
  in.token_logprobs[0].token = "\xe4\xbd";  // first two bytes of U+4F60
  const std::string text = ChatChunkJson(in);
  json j = json::parse(text);  // valid JSON despite the broken token text
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["bytes"],
            json({0xe4, 0xbd}));
  j = json::parse(CompletionChunkJson(in));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({0}));
}

TEST(FormatTest, CompletionChunks) {
  ResponseInput in = SampleInput();
  in.text = "Hel";
  in.finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  json j = json::parse(CompletionChunkJson(in));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Hel");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(j.contains("usage"));
  in.include_usage = true;
  j = json::parse(CompletionChunkJson(in));
  ASSERT_TRUE(j.contains("usage"));
  EXPECT_TRUE(j["usage"].is_null());

  j = json::parse(UsageChunkJson(in, /*chat=*/false));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(j["choices"].is_array());
  EXPECT_TRUE(j["choices"].empty());
  ExpectUsage(j["usage"]);
}

TEST(FormatTest, ChatChunks) {
  ResponseInput in = SampleInput();
  in.finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  in.first_chunk = true;
  in.text = "";
  json j = json::parse(ChatChunkJson(in));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["id"], "chatcmpl-abc");
  EXPECT_EQ(j["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());

  in.first_chunk = false;
  in.text = "lo";
  j = json::parse(ChatChunkJson(in));
  EXPECT_FALSE(j["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "lo");

  in.text = "";
  in.finish_reason = v1::FINISH_REASON_STOP;
  j = json::parse(ChatChunkJson(in));
  EXPECT_TRUE(j["choices"][0]["delta"].is_object());
  EXPECT_TRUE(j["choices"][0]["delta"].empty());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  j = json::parse(UsageChunkJson(in, /*chat=*/true));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_TRUE(j["choices"].empty());
  ExpectUsage(j["usage"]);
}

TEST(FormatTest, FinishReasons) {
  EXPECT_EQ(FinishReasonString(v1::FINISH_REASON_STOP), "stop");
  EXPECT_EQ(FinishReasonString(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_EQ(FinishReasonString(v1::FINISH_REASON_CANCELLED), "abort");
  EXPECT_EQ(FinishReasonString(v1::FINISH_REASON_UNSPECIFIED), "");
  EXPECT_EQ(FinishReasonString(static_cast<v1::FinishReason>(99)), "");
}

TEST(FormatTest, SseAndUsage) {
  EXPECT_EQ(SseFrame("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // Newlines in text never break SSE framing: JSON escapes them.
  ResponseInput in = SampleInput();
  in.text = "line\n\nnext";
  const std::string frame = SseFrame(CompletionChunkJson(in));
  EXPECT_EQ(frame.find("\n"), frame.size() - 2);
  v1::Usage u;
  u.set_prompt_tokens(1);
  u.set_completion_tokens(2);
  json j = json::parse(UsageJson(u));
  EXPECT_EQ(j["total_tokens"], 3);
  EXPECT_EQ(j["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_FALSE(j.contains("draft_tokens")) << "no MTP, no draft keys";
  // With MTP drafting: the proposed and accepted draft tokens.
  u.set_draft_tokens(12);
  u.set_accepted_draft_tokens(9);
  j = json::parse(UsageJson(u));
  EXPECT_EQ(j["draft_tokens"], 12);
  EXPECT_EQ(j["accepted_draft_tokens"], 9);
  EXPECT_EQ(j["total_tokens"], 3);
}

TEST(FormatTest, InvalidUtf8TextIsReplaced) {
  ResponseInput in = SampleInput();
  in.text = "ok \xff\xfe end";
  in.model = "m\xc0";
  for (const std::string& s : {CompletionResponseJson(in), ChatResponseJson(in),
                               CompletionChunkJson(in), ChatChunkJson(in)}) {
    EXPECT_TRUE(json::accept(s)) << s;
  }
}

TEST(FormatTest, Models) {
  v1::ListModelsResponse models;
  auto* m = models.add_models();
  m->set_id("mimo-v2");
  m->set_created(1700000000);
  m->set_owned_by("acme");
  m = models.add_models();
  m->set_id("tiny");
  json j = json::parse(ModelsJson(models));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "mimo-v2");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["created"], 1700000000);
  EXPECT_EQ(j["data"][0]["owned_by"], "acme");
  EXPECT_EQ(j["data"][1]["owned_by"], "swaserve");
  j = json::parse(ModelsJson(v1::ListModelsResponse()));
  EXPECT_TRUE(j["data"].is_array());
  EXPECT_TRUE(j["data"].empty());
}

TEST(FormatTest, MakeTokenLogprobs) {
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> lps;
  v1::TokenLogprob* lp = lps.Add();
  lp->set_token_id(3);
  lp->set_logprob(-1.0f);
  lp->add_top()->set_token_id(4);
  std::vector<TokenLogprobText> out = MakeTokenLogprobs(
      lps, [](uint32_t id) { return "t" + std::to_string(id); });
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].token, "t3");
  EXPECT_THAT(out[0].top_tokens, ElementsAre("t4"));
  EXPECT_EQ(out[0].logprob.token_id(), 3u);
}

}  // namespace
}  // namespace swaserve::api
