// lib/model/tokenizer_rep.h: the added-token trie and the per-thread word
// cache behind Tokenizer (internal to model_text).
#include "lib/model/tokenizer_rep.h"

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::model::tokenizer_internal {
namespace {

using ::testing::ElementsAre;

TEST(AddedTrieTest, LeftmostThenLongestEligibleMatch) {
  AddedTrie trie;
  EXPECT_TRUE(trie.empty());
  trie.Insert("<a>", 0);
  trie.Insert("<a><b>", 1);
  trie.Insert("b>", 2);
  trie.Insert("", 3);  // ignored
  EXPECT_FALSE(trie.empty());
  auto any = [](int, size_t, size_t) { return true; };
  size_t start = 0, end = 0;
  int token = -1;
  ASSERT_TRUE(trie.Find("xx<a><b>yy", 0, any, &start, &end, &token));
  EXPECT_EQ(token, 1);
  EXPECT_EQ(start, 2u);
  EXPECT_EQ(end, 8u);
  // The longest token not eligible: the next longest at the same start.
  auto not_one = [](int t, size_t, size_t) { return t != 1; };
  ASSERT_TRUE(trie.Find("xx<a><b>yy", 0, not_one, &start, &end, &token));
  EXPECT_EQ(token, 0);
  EXPECT_EQ(end, 5u);
  // Searching from later positions.
  ASSERT_TRUE(trie.Find("xx<a><b>yy", 3, any, &start, &end, &token));
  EXPECT_EQ(token, 2);
  EXPECT_EQ(start, 6u);
  EXPECT_FALSE(trie.Find("xx<a><b>yy", 8, any, &start, &end, &token));
  EXPECT_FALSE(trie.Find("<a", 0, any, &start, &end, &token));
}

TEST(WordCacheTest, LookupAfterInsertAndClearAtCapacity) {
  const WordCache cache(2);
  ASSERT_TRUE(cache.enabled());
  std::vector<uint32_t> out = {9};
  EXPECT_FALSE(cache.Lookup("ab", &out));
  const uint32_t ab[] = {1, 2};
  cache.Insert("ab", ab);
  EXPECT_TRUE(cache.Lookup("ab", &out));
  EXPECT_THAT(out, ElementsAre(9, 1, 2));  // appended
  const uint32_t c[] = {3};
  cache.Insert("c", c);
  cache.Insert("d", c);  // at capacity: cleared first
  out.clear();
  EXPECT_FALSE(cache.Lookup("ab", &out));
  EXPECT_TRUE(cache.Lookup("d", &out));
  EXPECT_FALSE(WordCache(0).enabled());
}

TEST(WordCacheTest, CachesAreSeparatePerInstanceAndPerThread) {
  const WordCache a(16);
  const WordCache b(16);
  const uint32_t one[] = {1};
  a.Insert("w", one);
  std::vector<uint32_t> out;
  EXPECT_FALSE(b.Lookup("w", &out));
  bool seen_elsewhere = true;
  std::thread([&] { seen_elsewhere = a.Lookup("w", &out); }).join();
  EXPECT_FALSE(seen_elsewhere);
  EXPECT_TRUE(a.Lookup("w", &out));
  EXPECT_THAT(out, ElementsAre(1));
}

}  // namespace
}  // namespace swaserve::model::tokenizer_internal
