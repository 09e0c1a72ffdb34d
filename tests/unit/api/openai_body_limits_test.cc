// The default body limit admits what the API advertises: a prompt at the top
// of the largest length bucket (1M tokens) and inline media at the decoders'
// own limits. Beyond the limit a body gets 413 before it is parsed.
#include <string>
#include <variant>

#include "gtest/gtest.h"
#include "lib/api/openai.h"

namespace swaserve::api {
namespace {

constexpr size_t kTopBucketTokens = size_t{1} << 20;  // 256K-1M bucket's top

// {"model": "m", "prompt": [151643, 151643, ...]} as Python's json.dumps
// writes it: 8 bytes per token id.
std::string TokenIdPrompt(size_t tokens) {
  std::string body = R"({"model": "m", "max_tokens": 4, "prompt": [)";
  body.reserve(body.size() + tokens * 8 + 2);
  for (size_t i = 0; i < tokens; ++i) {
    body += i == 0 ? "151643" : ", 151643";
  }
  body += "]}";
  return body;
}

TEST(ParseBodyLimitsTest, APromptAtTheTopOfTheLargestBucketIsAccepted) {
  std::string body = TokenIdPrompt(kTopBucketTokens);
  ASSERT_GT(body.size(), size_t{8} << 20);  // more than the old default
  ParseResult r = ParseCompletionRequest(body);
  const ApiError* e = std::get_if<ApiError>(&r);
  ASSERT_EQ(e, nullptr) << e->http_status << ": " << e->message;
  const ParsedRequest& p = std::get<ParsedRequest>(r);
  ASSERT_EQ(static_cast<size_t>(p.request.token_ids().ids_size()),
            kTopBucketTokens);
  EXPECT_EQ(p.request.token_ids().ids(kTopBucketTokens - 1), 151643u);
}

TEST(ParseBodyLimitsTest, ATwentyMegabyteInlineImageIsAccepted) {
  // A data: URL with the base64 of a 15 MiB image (the image decoder takes 32 MiB):
  // the parser hands it on; decoding is the media layer's business.
  std::string body =
      R"({"model":"m","messages":[{"role":"user","content":[)"
      R"({"type":"text","text":"what is this?"},)"
      R"({"type":"image_url","image_url":{"url":"data:image/png;base64,)" +
      std::string(20 << 20, 'A') + R"("}}]}]})";
  ParseResult r = ParseChatRequest(body);
  const ApiError* e = std::get_if<ApiError>(&r);
  EXPECT_EQ(e, nullptr) << e->http_status << ": " << e->message;
}

TEST(ParseBodyLimitsTest, ABodyOverTheLimitGets413BeforeParsing) {
  ParseLimits limits;
  std::string body(limits.max_body_bytes + 1, '{');  // not JSON: never parsed
  ParseResult r = ParseCompletionRequest(body, limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).http_status, 413);
}

}  // namespace
}  // namespace swaserve::api
