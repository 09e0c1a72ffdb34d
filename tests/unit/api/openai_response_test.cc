// lib/api/openai_response.{h,cc}: the exact text (field order included) of
// responses and chunks; openai_format_test.cc checks their contents field by
// field.
#include "lib/api/openai_response.h"

#include <string>

#include "gtest/gtest.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::api {
namespace {

namespace v1 = ::swaserve::v1;

ResponseInput Input() {
  ResponseInput in;
  in.request_id = "r1";
  in.model = "m";
  in.created = 7;
  in.text = "Hi";
  return in;
}

v1::Usage SomeUsage() {
  v1::Usage u;
  u.set_prompt_tokens(3);
  u.set_completion_tokens(2);
  u.set_cached_tokens(1);
  return u;
}

constexpr char kUsage[] =
    R"("usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,)"
    R"("prompt_tokens_details":{"cached_tokens":1}})";

TEST(OpenAiResponseTextTest, Responses) {
  ResponseInput in = Input();
  in.finish_reason = v1::FINISH_REASON_LENGTH;
  in.usage = SomeUsage();
  EXPECT_EQ(CompletionResponseJson(in),
            std::string(R"({"id":"cmpl-r1","object":"text_completion",)"
                        R"("created":7,"model":"m","choices":[{"index":0,)"
                        R"("text":"Hi","logprobs":null,)"
                        R"("finish_reason":"length"}],)") +
                kUsage + "}");
  EXPECT_EQ(ChatResponseJson(in),
            std::string(R"({"id":"chatcmpl-r1","object":"chat.completion",)"
                        R"("created":7,"model":"m","choices":[{"index":0,)"
                        R"("message":{"role":"assistant","content":"Hi"},)"
                        R"("logprobs":null,"finish_reason":"length"}],)") +
                kUsage + "}");
}

TEST(OpenAiResponseTextTest, ChunksCarryNullUsageOnlyWhenUsageFollows) {
  ResponseInput in = Input();
  const std::string completion =
      R"({"id":"cmpl-r1","object":"text_completion","created":7,"model":"m",)"
      R"("choices":[{"index":0,"text":"Hi","logprobs":null,)"
      R"("finish_reason":null}])";
  EXPECT_EQ(CompletionChunkJson(in), completion + "}");
  in.include_usage = true;
  EXPECT_EQ(CompletionChunkJson(in), completion + R"(,"usage":null})");

  in.include_usage = false;
  in.first_chunk = true;
  const std::string first =
      R"({"id":"chatcmpl-r1","object":"chat.completion.chunk","created":7,)"
      R"("model":"m","choices":[{"index":0,)"
      R"("delta":{"role":"assistant","content":"Hi"},"logprobs":null,)"
      R"("finish_reason":null}]})";
  EXPECT_EQ(ChatChunkJson(in), first);
  in.first_chunk = false;
  in.text.clear();
  in.finish_reason = v1::FINISH_REASON_STOP;
  in.include_usage = true;
  EXPECT_EQ(ChatChunkJson(in),
            R"({"id":"chatcmpl-r1","object":"chat.completion.chunk",)"
            R"("created":7,"model":"m","choices":[{"index":0,"delta":{},)"
            R"("logprobs":null,"finish_reason":"stop"}],"usage":null})");
}

TEST(OpenAiResponseTextTest, UsageChunkAndSse) {
  ResponseInput in = Input();
  in.usage = SomeUsage();
  EXPECT_EQ(UsageChunkJson(in, /*chat=*/true),
            std::string(R"({"id":"chatcmpl-r1","object":"chat.completion.)"
                        R"(chunk","created":7,"model":"m","choices":[],)") +
                kUsage + "}");
  EXPECT_EQ(SseFrame("{}"), "data: {}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(WaitingCommentTest, SaysHowLongAndWhereThePrefillStands) {
  EXPECT_EQ(WaitingComment(absl::Seconds(15), nullptr), ": waiting for the first token, 15s\n\n");
  v1::PrefillProgress p;
  EXPECT_EQ(WaitingComment(absl::Seconds(30), &p), ": waiting for the first token, 30s\n\n");  // not found
  p.set_found(true);
  p.set_state(v1::PrefillProgress::STATE_QUEUED);
  p.set_queued_requests(3);
  EXPECT_EQ(WaitingComment(absl::Seconds(45), &p),
            ": waiting for the first token, 45s; queued at the prefill worker (3 requests "
            "waiting)\n\n");
  p.set_state(v1::PrefillProgress::STATE_COMPUTING);
  p.set_prompt_tokens(304044);
  p.set_done_tokens(61440);
  p.set_tokens_per_second(1234.7);
  EXPECT_EQ(WaitingComment(absl::Seconds(60), &p),
            ": waiting for the first token, 1m; prefill 61,440 of 304,044 prompt tokens (20%), "
            "1,234 tokens/s\n\n");
  p.set_cached_tokens(8192);
  p.set_tokens_per_second(0);
  EXPECT_EQ(WaitingComment(absl::Seconds(75), &p),
            ": waiting for the first token, 1m15s; prefill 61,440 of 304,044 prompt tokens (20%; "
            "8,192 cached)\n\n");
  p.set_state(v1::PrefillProgress::STATE_SHIPPING);
  EXPECT_EQ(WaitingComment(absl::Seconds(90), &p),
            ": waiting for the first token, 1m30s; prefill done, its KV is going to the decode "
            "worker\n\n");
  EXPECT_EQ(DescribePrefillProgress(p), "prefill done, its KV is going to the decode worker");
  p.set_state(v1::PrefillProgress::STATE_UNSPECIFIED);
  EXPECT_EQ(DescribePrefillProgress(p), "");  // found, but no state to tell
  EXPECT_EQ(WaitingComment(absl::Seconds(5), &p), ": waiting for the first token, 5s\n\n");
  p.set_state(v1::PrefillProgress::STATE_SHIPPING);
  // An SSE comment is one line: nothing the worker sends can break it.
  const std::string c = WaitingComment(absl::Seconds(1), &p);
  EXPECT_EQ(c.find('\n'), c.size() - 2);
}

}  // namespace
}  // namespace swaserve::api
