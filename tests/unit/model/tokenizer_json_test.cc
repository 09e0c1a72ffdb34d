// lib/model/tokenizer_json.{h,cc}: the SAX reader of tokenizer.json, the
// typed field accessors and Sequence handling (internal to model_text).
#include "lib/model/tokenizer_json.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace swaserve::model::tokenizer_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

absl::Status Parse(const std::string& text, TokenizerJsonReader* reader) {
  return ParseTokenizerJson(text, reader);
}

TEST(TokenizerJsonReaderTest, StreamsVocabAndMergesAndKeepsTheRest) {
  TokenizerJsonReader r;
  ASSERT_TRUE(Parse(R"({"version": "1.0",
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                "merges": ["a b"], "unk_token": null},
      "added_tokens": [{"id": 3, "content": "<s>"}]})",
                    &r)
                  .ok())
      << r.error;
  EXPECT_TRUE(r.has_vocab);
  EXPECT_THAT(r.vocab, ElementsAre(Pair("a", 0), Pair("b", 1), Pair("ab", 2)));
  EXPECT_TRUE(r.has_merges);
  EXPECT_THAT(r.merges, ElementsAre(Pair("a", "b")));
  // The DOM keeps everything but model.vocab and model.merges.
  EXPECT_EQ(r.root["version"], "1.0");
  EXPECT_EQ(r.root["model"]["type"], "BPE");
  EXPECT_TRUE(r.root["model"]["unk_token"].is_null());
  EXPECT_FALSE(r.root["model"].contains("vocab"));
  EXPECT_FALSE(r.root["model"].contains("merges"));
  EXPECT_EQ(r.root["added_tokens"][0]["content"], "<s>");
}

TEST(TokenizerJsonReaderTest, MergesAsPairs) {
  TokenizerJsonReader r;
  ASSERT_TRUE(
      Parse(R"({"model": {"merges": [["a", "b"], ["ab", "c"]]}})", &r).ok());
  EXPECT_THAT(r.merges, ElementsAre(Pair("a", "b"), Pair("ab", "c")));
  EXPECT_FALSE(r.has_vocab);
}

TEST(TokenizerJsonReaderTest, OnlyRootModelFieldsAreStreamed) {
  TokenizerJsonReader r;
  ASSERT_TRUE(
      Parse(R"({"other": {"vocab": {"x": 1}, "merges": ["x y"]}})", &r).ok());
  EXPECT_FALSE(r.has_vocab);
  EXPECT_FALSE(r.has_merges);
  EXPECT_EQ(r.root["other"]["vocab"]["x"], 1);
  EXPECT_EQ(r.root["other"]["merges"][0], "x y");
}

TEST(TokenizerJsonReaderTest, ErrorsNameTheEntry) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"{not json", "not valid JSON"},
           Case{"[1, 2]", "tokenizer.json is not a JSON object"},
           Case{R"({"model": {"vocab": {"a": "zero"}}})",
                R"(model.vocab["a"] is not a token id)"},
           Case{R"({"model": {"merges": ["a b c"]}})",
                R"(model.merges[0] = "a b c" is not two tokens)"},
           Case{R"({"model": {"merges": ["a b", ["x"]]}})",
                R"(model.merges[1] is neither "a b" nor ["a", "b"])"},
       }) {
    TokenizerJsonReader r;
    const absl::Status s = Parse(c.text, &r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.text;
  }
}

TEST(TokenizerJsonFieldsTest, TypedAccessorsNameTheField) {
  const Json obj = Json::parse(
      R"({"flag": true, "name": "x", "num": 7, "null": null, "neg": -1})");
  EXPECT_EQ(Field(obj, "null"), nullptr);
  EXPECT_EQ(Field(obj, "absent"), nullptr);
  EXPECT_EQ(Field(Json::array(), "flag"), nullptr);
  ASSERT_NE(Field(obj, "num"), nullptr);

  EXPECT_EQ(*BoolField(obj, "flag", false, "w"), true);
  EXPECT_EQ(*BoolField(obj, "absent", true, "w"), true);
  const absl::Status not_bool = BoolField(obj, "name", false, "w").status();
  EXPECT_EQ(not_bool.message(), "tokenizer.json: w.name is not a boolean");

  EXPECT_EQ(*StringField(obj, "name", "w"), "x");
  EXPECT_THAT(std::string(StringField(obj, "num", "w").status().message()),
              HasSubstr("w.num is missing or not a string"));

  EXPECT_EQ(*IdValue(obj["num"], "w.num"), 7u);
  EXPECT_FALSE(IdValue(obj["neg"], "w.neg").ok());
  EXPECT_FALSE(IdValue(Json(kMaxId), "big").ok());
  EXPECT_FALSE(IdValue(Json(1.5), "float").ok());
}

TEST(TokenizerJsonFieldsTest, SequenceSteps) {
  const Json single = Json::parse(R"({"type": "NFC"})");
  auto steps = SequenceSteps(single, "normalizers", "normalizer");
  ASSERT_TRUE(steps.ok());
  EXPECT_THAT(*steps, ElementsAre(&single));

  const Json seq = Json::parse(
      R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "X"}]})");
  steps = SequenceSteps(seq, "normalizers", "normalizer");
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*(*steps)[1])["type"], "X");

  const Json bad = Json::parse(R"({"type": "Sequence", "decoders": {}})");
  EXPECT_EQ(SequenceSteps(bad, "decoders", "decoder").status().message(),
            "tokenizer.json: decoder.decoders is not an array");
}

}  // namespace
}  // namespace swaserve::model::tokenizer_internal
