#include "lib/base/hash.h"

#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace swaserve::base {
namespace {

std::vector<uint32_t> Iota(int n, uint32_t start = 0) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(Hash, KnownXxh3Values) {
  // Reference values of XXH3_64bits / XXH3_128bits for the empty input
  // (xxHash's published test vectors).
  EXPECT_EQ(Hash64("", 0), 0x2D06800538D394C2ull);
  Hash128 h = Hash128Of("", 0);
  EXPECT_EQ(h.high, 0x99AA06D3014798D8ull);
  EXPECT_EQ(h.low, 0x6001C324468D497Full);
  EXPECT_NE(Hash64("a"), Hash64("b"));
  EXPECT_NE(Hash64("a", 1), Hash64("a", 2));
}

TEST(Hash128, BytesAndHexRoundTrip) {
  Hash128 h = Hash128Of("an image");
  std::string bytes = h.ToBytes();
  ASSERT_EQ(bytes.size(), 16u);
  Hash128 back;
  ASSERT_TRUE(Hash128::FromBytes(bytes, &back));
  EXPECT_EQ(back, h);
  EXPECT_FALSE(Hash128::FromBytes("short", &back));
  EXPECT_EQ(h.ToHex().size(), 32u);
  absl::flat_hash_set<Hash128> set = {h, Hash128Of("other")};
  EXPECT_EQ(set.size(), 2u);
}

TEST(ChainedPageHashes, OnlyCompletePagesAndChained) {
  std::vector<uint32_t> tokens = Iota(50);
  std::vector<uint64_t> h = ChainedPageHashes(tokens, 16);
  ASSERT_EQ(h.size(), 3u);  // 50 / 16, the partial page is not hashed
  // Page i's hash depends on the whole prefix: recompute by hand.
  uint64_t parent = DefaultPageHashSeed();
  for (size_t i = 0; i < h.size(); ++i) {
    parent = NextPageHash(parent, absl::MakeConstSpan(tokens).subspan(i * 16, 16));
    EXPECT_EQ(h[i], parent) << i;
  }
  EXPECT_TRUE(ChainedPageHashes(tokens, 0).empty());
  EXPECT_TRUE(ChainedPageHashes({}, 16).empty());
}

TEST(ChainedPageHashes, PrefixPropertyRandomized) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    const int page = 1 + rng() % 32;
    std::vector<uint32_t> a(rng() % 400);
    for (auto& t : a) t = rng() % 50;  // small vocab: many equal pages
    std::vector<uint32_t> b = a;
    const size_t cut = b.empty() ? 0 : rng() % b.size();
    if (!b.empty()) b[cut] ^= 1;  // differ from token `cut` on
    auto ha = ChainedPageHashes(a, page);
    auto hb = ChainedPageHashes(b, page);
    ASSERT_EQ(ha.size(), hb.size());
    for (size_t i = 0; i < ha.size(); ++i) {
      const bool page_before_cut = (i + 1) * page <= cut || b.empty();
      if (page_before_cut) {
        EXPECT_EQ(ha[i], hb[i]);
      } else {
        EXPECT_NE(ha[i], hb[i]) << "page " << i << " after a change must differ";
      }
    }
  }
}

TEST(ChainedPageHashes, EqualPagesAtDifferentDepthsDiffer) {
  std::vector<uint32_t> tokens(64, 5);  // four identical pages
  auto h = ChainedPageHashes(tokens, 16);
  absl::flat_hash_set<uint64_t> distinct(h.begin(), h.end());
  EXPECT_EQ(distinct.size(), 4u);
}

TEST(ChainedPageHashes, MultimodalContentMixedIntoOverlappingPagesOnly) {
  std::vector<uint32_t> tokens(64, 9);  // placeholders look identical
  HashedSpan cat{.token_offset = 20, .num_tokens = 8, .content = Hash128Of("cat.png")};
  HashedSpan dog{.token_offset = 20, .num_tokens = 8, .content = Hash128Of("dog.png")};
  auto plain = ChainedPageHashes(tokens, 16);
  auto with_cat = ChainedPageHashes(tokens, 16, {&cat, 1});
  auto with_dog = ChainedPageHashes(tokens, 16, {&dog, 1});
  EXPECT_EQ(with_cat[0], plain[0]);  // page 0 ends before the image
  EXPECT_NE(with_cat[1], with_dog[1]);  // page 1 holds the image
  EXPECT_NE(with_cat[1], plain[1]);
  EXPECT_NE(with_cat[3], with_dog[3]);  // and the chain carries it on
  // An item spanning pages is mixed into each page it overlaps.
  HashedSpan wide{.token_offset = 10, .num_tokens = 30, .content = Hash128Of("x")};
  HashedSpan later{.token_offset = 12, .num_tokens = 2, .content = Hash128Of("y")};
  HashedSpan items[] = {wide, later};
  auto h = ChainedPageHashes(tokens, 16, items);
  uint64_t p = DefaultPageHashSeed();
  auto span = absl::MakeConstSpan(tokens);
  Hash128 page0[] = {wide.content, later.content};
  Hash128 page1[] = {wide.content};
  Hash128 page2[] = {wide.content};
  p = NextPageHash(p, span.subspan(0, 16), page0);
  EXPECT_EQ(h[0], p);
  p = NextPageHash(p, span.subspan(16, 16), page1);
  EXPECT_EQ(h[1], p);
  p = NextPageHash(p, span.subspan(32, 16), page2);
  EXPECT_EQ(h[2], p);
  p = NextPageHash(p, span.subspan(48, 16));
  EXPECT_EQ(h[3], p);
}

TEST(ChainedPageHashes, LongPagesUseTheSameRecipe) {
  // Pages too large for the one-shot buffer are streamed: same bytes, same
  // value as hashing the concatenation directly.
  std::vector<uint32_t> tokens = Iota(300, 5);
  std::string bytes(8, '\0');
  const uint64_t seed = DefaultPageHashSeed();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((seed >> (8 * i)) & 0xff);
  for (uint32_t t : tokens) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((t >> (8 * i)) & 0xff));
  }
  EXPECT_EQ(ChainedPageHashes(tokens, 300)[0], Hash64(bytes));
  std::vector<uint32_t> small(tokens.begin(), tokens.begin() + 16);
  EXPECT_EQ(ChainedPageHashes(small, 16)[0], Hash64(bytes.substr(0, 8 + 64)));
}

TEST(ChainedPageHashes, StableAcrossReleases) {
  // These values are stored in Redis by running clusters. If this test fails
  // the recipe changed: bump kPageHashVersion and update the values.
  std::vector<uint32_t> tokens = Iota(32, 1);
  auto h = ChainedPageHashes(tokens, 16);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], 0x566b91798a378d3dull);
  EXPECT_EQ(h[1], 0xcb06cc7f635c9b29ull);
  EXPECT_EQ(DefaultPageHashSeed(), Hash64("swaserve-page-hash-v1"));
}

}  // namespace
}  // namespace swaserve::base

namespace swaserve::base {
namespace {

TEST(PageHashSeedForTest, DomainsAndSaltsSeedChainsApart) {
  EXPECT_EQ(PageHashSeedFor("", ""), DefaultPageHashSeed());
  const std::vector<uint32_t> tokens(64, 7);
  std::set<uint64_t> first_pages;
  for (const auto& [domain, salt] : std::vector<std::pair<std::string, std::string>>{
           {"", ""}, {"tenant:a", ""}, {"tenant:b", ""}, {"tenant:a", "s"}, {"tenant:as", ""},
           {"", "tenant:a"}, {"tenant:", "a"}}) {
    const uint64_t seed = PageHashSeedFor(domain, salt);
    EXPECT_NE(seed, 0u);
    EXPECT_EQ(seed, PageHashSeedFor(domain, salt));  // stable
    first_pages.insert(ChainedPageHashes(tokens, 16, {}, seed)[0]);
  }
  EXPECT_EQ(first_pages.size(), 7u);  // every pair its own chain
}

}  // namespace
}  // namespace swaserve::base
