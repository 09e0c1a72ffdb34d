// lib/model/streaming_decoder.{h,cc} on the demo model's tokenizer (byte-level
// BPE with every byte symbol in its vocabulary).
#include "lib/model/streaming_decoder.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/model/tokenizer.h"
#include "lib/model/unicode.h"

namespace swaserve::model {
namespace {

class StreamingDecoderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Tokenizer::Load(SWASERVE_SOURCE_DIR "/models/demo/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = t->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  // The token of one raw byte (its byte-level symbol).
  static uint32_t ByteToken(uint8_t b) {
    std::string spelling;
    unicode::AppendUtf8(unicode::ByteToUnicode(b), &spelling);
    const std::optional<uint32_t> id = tokenizer_->TokenId(spelling);
    EXPECT_TRUE(id.has_value()) << "no token for byte " << int{b};
    return id.value_or(0);
  }

  static Tokenizer* tokenizer_;
};

Tokenizer* StreamingDecoderTest::tokenizer_ = nullptr;

TEST_F(StreamingDecoderTest, HoldsBackAnIncompleteCharacter) {
  StreamingDecoder d(*tokenizer_);
  // U+00E9 "é" is C3 A9.
  EXPECT_EQ(d.Add(ByteToken(0xC3)), "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  EXPECT_EQ(d.Add(ByteToken(0xA9)), "\xC3\xA9");
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_EQ(d.Flush(), "");
}

TEST_F(StreamingDecoderTest, FlushRepairsAndResets) {
  StreamingDecoder d(*tokenizer_);
  // The first two bytes of U+20AC "€" (E2 82 AC), then the stream ends.
  EXPECT_EQ(d.Add(ByteToken(0xE2)), "");
  EXPECT_EQ(d.Add(ByteToken(0x82)), "");
  EXPECT_EQ(d.pending_bytes(), 2u);
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");  // one U+FFFD
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_EQ(d.Add(ByteToken('a')), "a");
}

TEST_F(StreamingDecoderTest, ConcatenationEqualsDecode) {
  const std::string text =
      "In the beginning \xC3\xA9t\xC3\xA9 \xE2\x82\xAC 42.";
  auto ids = tokenizer_->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  StreamingDecoder d(*tokenizer_);
  std::string streamed;
  for (uint32_t id : *ids) streamed += d.Add(id);
  streamed += d.Flush();
  EXPECT_EQ(streamed, tokenizer_->Decode(*ids));
  EXPECT_EQ(streamed, text);
}

TEST_F(StreamingDecoderTest, SkipsSpecialTokensWhenAskedAndUnknownIds) {
  const std::optional<uint32_t> im_end = tokenizer_->im_end_id();
  ASSERT_TRUE(im_end.has_value());
  StreamingDecoder keep(*tokenizer_);
  EXPECT_EQ(keep.Add(*im_end), "<|im_end|>");
  StreamingDecoder skip(*tokenizer_, /*skip_special_tokens=*/true);
  EXPECT_EQ(skip.Add(*im_end), "");
  EXPECT_EQ(skip.Add(static_cast<uint32_t>(tokenizer_->vocab_size()) + 5), "");
  EXPECT_EQ(skip.pending_bytes(), 0u);
}

}  // namespace
}  // namespace swaserve::model
