// GrammarMatcher and CompiledGrammar on hand-built grammars and small
// vocabularies: masks against a token-by-token check, EOS, termination,
// Rollback, ResetTo, AcceptBytes, recursion, the depth bound, and the
// lazy tables' reset.
#include "lib/grammar/matcher.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lib/grammar/grammar.h"
#include "lib/grammar/grammar_cache.h"
#include "lib/grammar/json_schema.h"
#include "tests/unit/grammar/grammar_test_util.h"

namespace swaserve::grammar {
namespace {

using testing::ByteVocabulary;
using testing::kByteEos;
using testing::Matches;
using testing::MaskHas;

// Ids 0..255 bytes, 256 EOS, then multi-byte tokens.
const std::vector<std::string> kExtra = {"ab", "abc", "\"a", "a\"", "{\"", "\"}", "[[", "]]", "true",
                                         "tr", "ue", "  ", "\n", "12", "3,", "\"a\":1"};

std::shared_ptr<const CompiledGrammar> Compile(const Grammar& g,
                                               std::shared_ptr<const TokenVocabulary> v,
                                               CompiledGrammarOptions o = {}) {
  auto c = CompiledGrammar::Compile(g, std::move(v), o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Balanced brackets: S ::= ("[" S "]")*
Grammar Brackets() {
  Grammar g;
  const RuleId s = g.AddRule("S");
  g.SetRule(s, g.Star(g.Seq({g.Literal("["), g.Ref(s), g.Literal("]")})));
  return g;
}

TEST(Matcher, MaskEqualsTokenByTokenCheck) {
  auto vocab = ByteVocabulary(kExtra);
  auto g = *CompileJsonSchema(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "array", "items": {"type": "boolean"}}}, "required": ["a"]})", vocab);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(vocab->BitmaskWords());
  const std::string text = "{\"a\":12, \"b\": [true,false]}";
  for (size_t i = 0; i <= text.size(); ++i) {
    m.FillNextTokenMask(mask.data());
    for (uint32_t id = 0; id < static_cast<uint32_t>(vocab->size()); ++id) {
      ASSERT_EQ(MaskHas(mask, id), m.IsTokenAllowed(id)) << "id " << id << " after " << text.substr(0, i);
    }
    if (i < text.size()) {
      ASSERT_TRUE(m.AcceptToken(static_cast<uint8_t>(text[i])));
    }
  }
  EXPECT_TRUE(MaskHas(mask, kByteEos));
  EXPECT_TRUE(m.IsAccepting());
  EXPECT_TRUE(m.IsTerminated());  // nothing may follow the closing brace
  EXPECT_TRUE(m.AcceptToken(kByteEos));
  m.FillNextTokenMask(mask.data());
  for (uint32_t w : mask) EXPECT_EQ(w, 0u);
}

TEST(Matcher, MultiByteTokensCrossRuleBoundaries) {
  auto vocab = ByteVocabulary(kExtra);
  auto g = *CompileJsonSchema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "required": ["a"], "additionalProperties": false})", vocab);
  GrammarMatcher m(g);
  const uint32_t open = 257 + 4;    // {"
  const uint32_t a_one = 257 + 15;  // "a":1 — not allowed after {" (the quote is written)
  EXPECT_TRUE(m.AcceptToken(open));
  EXPECT_FALSE(m.AcceptToken(a_one));
  EXPECT_TRUE(m.AcceptToken('a'));
  EXPECT_FALSE(m.IsAccepting());
  m.Rollback(2);
  EXPECT_TRUE(m.AcceptToken('{'));
  EXPECT_TRUE(m.AcceptToken(a_one));
  EXPECT_FALSE(m.IsTerminated());
  EXPECT_TRUE(m.AcceptToken('}'));
  EXPECT_TRUE(m.IsTerminated());
}

TEST(Matcher, RecursionAndTheDepthBound) {
  auto vocab = ByteVocabulary(kExtra);
  auto g = Compile(Brackets(), vocab);
  EXPECT_TRUE(Matches(g, ""));
  EXPECT_TRUE(Matches(g, "[][[]]"));
  EXPECT_TRUE(Matches(g, std::string(300, '[') + std::string(300, ']')));
  EXPECT_FALSE(Matches(g, "[[]"));
  EXPECT_FALSE(Matches(g, "]"));
  CompiledGrammarOptions shallow;
  shallow.max_stack_depth = 8;
  auto s = Compile(Brackets(), vocab, shallow);
  EXPECT_TRUE(Matches(s, "[[[]]]"));
  EXPECT_FALSE(Matches(s, std::string(20, '[') + std::string(20, ']')));
  // At the bound the mask still closes: no dead end.
  GrammarMatcher m(s);
  int depth = 0;
  while (m.AcceptToken('[')) ++depth;
  EXPECT_GT(depth, 0);
  std::vector<uint32_t> mask(vocab->BitmaskWords());
  m.FillNextTokenMask(mask.data());
  EXPECT_TRUE(MaskHas(mask, ']'));
  EXPECT_FALSE(MaskHas(mask, '['));
}

TEST(Matcher, LeftRecursionIsCutNotLooped) {
  Grammar g;
  const RuleId s = g.AddRule("S");
  g.SetRule(s, g.Alt({g.Seq({g.Ref(s), g.Literal("a")}), g.Literal("b")}));
  CompiledGrammarOptions o;
  o.max_stack_depth = 16;
  auto c = Compile(g, ByteVocabulary(), o);
  EXPECT_TRUE(Matches(c, "b"));
  EXPECT_TRUE(Matches(c, "baaa"));
  EXPECT_FALSE(Matches(c, "a"));
}

TEST(Matcher, ResetToRollbackAndAcceptBytes) {
  auto vocab = ByteVocabulary(kExtra);
  auto g = *CompileJsonObject(vocab);
  GrammarMatcher m(g);
  const std::string text = R"({"k": [1, {"x": "y"}], "z": null})";
  std::vector<uint32_t> ids;
  for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  ASSERT_TRUE(m.ResetTo(ids));
  EXPECT_TRUE(m.IsAccepting());
  m.Rollback(5);
  EXPECT_FALSE(m.IsAccepting());
  EXPECT_EQ(m.tokens().size(), ids.size() - 5);
  for (size_t i = ids.size() - 5; i < ids.size(); ++i) ASSERT_TRUE(m.AcceptToken(ids[i]));
  EXPECT_TRUE(m.AcceptToken(kByteEos));
  m.Rollback(1);  // the EOS
  EXPECT_FALSE(m.IsTerminated() && m.tokens().back() == kByteEos);
  EXPECT_TRUE(m.IsAccepting());
  ids.insert(ids.begin() + 4, '}');  // {"k"}: refused at the brace
  EXPECT_FALSE(m.ResetTo(ids));
  EXPECT_EQ(m.tokens().size(), 4u);
  GrammarMatcher p(g);
  EXPECT_TRUE(p.AcceptBytes("{\"k\""));
  EXPECT_FALSE(p.AcceptBytes("}"));
  EXPECT_TRUE(p.AcceptToken(':'));
  EXPECT_FALSE(p.AcceptBytes("1"));  // only before the first token
  p.Rollback(1);
  EXPECT_TRUE(p.AcceptToken(':'));
}

TEST(Matcher, ACopyContinuesOnItsOwn) {
  auto g = *CompileJsonSchema(R"({"enum": ["ab", "ac"]})", ByteVocabulary());
  GrammarMatcher m(g);
  ASSERT_TRUE(m.AcceptToken('"'));
  ASSERT_TRUE(m.AcceptToken('a'));
  GrammarMatcher copy = m;
  EXPECT_TRUE(m.AcceptToken('b'));
  EXPECT_FALSE(copy.IsTokenAllowed('d'));
  EXPECT_TRUE(copy.AcceptToken('c'));
  EXPECT_EQ(m.tokens().back(), 'b');
  EXPECT_EQ(copy.tokens().back(), 'c');
}

TEST(Matcher, TablesResetWhenTheyOutgrowTheirBound) {
  auto vocab = ByteVocabulary(kExtra);
  JsonGrammarOptions o;
  o.compile.max_configurations = 16;
  o.compile.max_mask_cache_bytes = 2 * 4 * vocab->BitmaskWords();  // two masks
  auto g = *CompileJsonSchema(R"({"type": "array", "items": {"type": "string", "maxLength": 30}})",
                              vocab, o);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(vocab->BitmaskWords());
  const std::string text = R"(["abcdefghijklmnopqrstuvwxyz", "0123456789"])";
  for (char c : text) {
    m.FillNextTokenMask(mask.data());
    ASSERT_TRUE(MaskHas(mask, static_cast<uint8_t>(c)));
    ASSERT_TRUE(m.AcceptToken(static_cast<uint8_t>(c)));
  }
  EXPECT_TRUE(m.IsAccepting());
  EXPECT_GT(g->stats().table_resets, 0);
  m.Rollback(3);
  EXPECT_FALSE(m.IsAccepting());
}

TEST(Matcher, MatchersOfOneGrammarOnManyThreads) {
  auto vocab = ByteVocabulary(kExtra);
  auto g = *CompileJsonObject(vocab);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int round = 0; round < 20; ++round) {
        GrammarMatcher m(g);
        std::vector<uint32_t> mask(vocab->BitmaskWords());
        for (int step = 0; step < 200 && !m.IsTerminated(); ++step) {
          m.FillNextTokenMask(mask.data());
          std::vector<uint32_t> allowed;
          for (uint32_t id = 0; id < static_cast<uint32_t>(vocab->size()); ++id) {
            if (MaskHas(mask, id)) allowed.push_back(id);
          }
          if (allowed.empty() || !m.AcceptToken(allowed[rng() % allowed.size()])) return;
        }
      }
      ok[t] = 1;
    });
  }
  for (auto& th : threads) th.join();
  for (int v : ok) EXPECT_EQ(v, 1);
}

TEST(GrammarCache, SharesCompiledGrammarsAndStaysBounded) {
  GrammarCache cache(GrammarCacheOptions{.max_entries = 2});
  auto vocab = ByteVocabulary();
  const std::string a = R"({"type": "string"})", b = R"({"type": "integer"})", c = R"({"type": "null"})";
  auto g1 = *cache.JsonSchema(a, vocab);
  auto g2 = *cache.JsonSchema(a, vocab);
  EXPECT_EQ(g1.get(), g2.get());
  EXPECT_EQ(cache.hits(), 1);
  (void)*cache.JsonSchema(b, vocab);
  (void)*cache.JsonSchema(c, vocab);
  EXPECT_EQ(cache.size(), 2);
  EXPECT_NE(cache.JsonSchema(a, vocab)->get(), g1.get());  // dropped, compiled again
  EXPECT_FALSE(cache.JsonSchema(R"({"type": "date"})", vocab).ok());
  EXPECT_EQ(cache.JsonObject(vocab)->get(), cache.JsonObject(vocab)->get());
}

}  // namespace
}  // namespace swaserve::grammar
