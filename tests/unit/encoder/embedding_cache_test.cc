// EmbeddingCache: hits and misses, least-recently-used eviction
// under the byte budget, replacement, values larger than the budget, values
// outliving eviction, and a random-operation property test against a simple
// model (same hits, same contents, bytes within budget after every step).
#include "lib/encoder/embedding_cache.h"

#include <list>
#include <random>

#include "gtest/gtest.h"

namespace swaserve::encoder {
namespace {

base::Hash128 Key(uint64_t i) { return base::Hash128{.low = i, .high = i * 0x9e3779b97f4a7c15ull}; }

std::shared_ptr<const ItemEmbedding> Value(int tokens, float fill = 1.0f) {
  auto e = std::make_shared<ItemEmbedding>();
  e->num_tokens = tokens;
  e->hidden = 4;
  e->values.assign(static_cast<size_t>(tokens) * 4, fill);
  return e;
}

std::unique_ptr<EmbeddingCache> Make(int64_t max_bytes, metrics::Registry* reg = nullptr) {
  auto c = EmbeddingCache::Create({.max_bytes = max_bytes, .registry = reg});
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

TEST(EmbeddingCache, HitsMissesAndLeastRecentlyUsedEviction) {
  metrics::Registry reg;
  auto c = Make(3 * 64, &reg);  // three 4-token values (64 bytes each)
  EXPECT_EQ(c->Get(Key(1)), nullptr);
  ASSERT_TRUE(c->Put(Key(1), Value(4, 1)));
  ASSERT_TRUE(c->Put(Key(2), Value(4, 2)));
  ASSERT_TRUE(c->Put(Key(3), Value(4, 3)));
  ASSERT_NE(c->Get(Key(1)), nullptr);  // 1 is now the most recent
  std::shared_ptr<const ItemEmbedding> two = c->Get(Key(2));
  ASSERT_TRUE(c->Put(Key(4), Value(4, 4)));  // evicts 3, the least recent
  EXPECT_EQ(c->Get(Key(3)), nullptr);
  EXPECT_NE(c->Get(Key(1)), nullptr);
  EXPECT_NE(c->Get(Key(4)), nullptr);
  EmbeddingCacheStats s = c->stats();
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.bytes, 3 * 64);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.hits, 4);
  EXPECT_EQ(s.misses, 2);
  // Handed-out values outlive eviction.
  ASSERT_TRUE(c->Put(Key(5), Value(12)));  // 192 bytes: evicts everything else
  EXPECT_EQ(c->stats().entries, 1);
  EXPECT_EQ(two->values[0], 2.0f);
  // Too large for the budget: not cached, nothing evicted.
  EXPECT_FALSE(c->Put(Key(6), Value(13)));
  EXPECT_NE(c->Get(Key(5)), nullptr);
  // Replacement keeps one entry per key.
  ASSERT_TRUE(c->Put(Key(5), Value(2, 9)));
  EXPECT_EQ(c->stats().entries, 1);
  EXPECT_EQ(c->stats().bytes, 32);
  EXPECT_EQ(c->Get(Key(5))->values[0], 9.0f);
  const std::string text = reg.RenderText();
  EXPECT_NE(text.find("swaserve_encoder_cache_lookups_total{result=\"hit\"}"), std::string::npos);
  EXPECT_NE(text.find("swaserve_encoder_cache_bytes 32"), std::string::npos);
  EXPECT_FALSE(EmbeddingCache::Create({.max_bytes = -1}).ok());
  // Budget 0: a cache that keeps nothing (--cache_mib=0 turns caching off).
  auto off = EmbeddingCache::Create({.max_bytes = 0});
  ASSERT_TRUE(off.ok());
  const base::Hash128 key{.low = 1, .high = 2};
  auto e = std::make_shared<ItemEmbedding>();
  e->num_tokens = 1;
  e->hidden = 2;
  e->values = {1, 2};
  (*off)->Put(key, e);
  EXPECT_EQ((*off)->Get(key), nullptr);
}

TEST(EmbeddingCache, RandomOperationsMatchAModel) {
  std::mt19937_64 rng(23);
  constexpr int64_t kBudget = 4096;
  auto c = Make(kBudget);
  // The model: most recent first, (key, bytes).
  std::list<std::pair<uint64_t, int64_t>> model;
  auto find = [&](uint64_t k) {
    for (auto it = model.begin(); it != model.end(); ++it) {
      if (it->first == k) return it;
    }
    return model.end();
  };
  for (int step = 0; step < 20000; ++step) {
    const uint64_t k = rng() % 64;
    if (rng() % 2 == 0) {
      auto it = find(k);
      const bool hit = c->Get(Key(k)) != nullptr;
      ASSERT_EQ(hit, it != model.end()) << step;
      if (hit) model.splice(model.begin(), model, it);
    } else {
      const int tokens = 1 + static_cast<int>(rng() % 80);  // up to 1280 bytes
      const int64_t bytes = tokens * 16;
      if (auto it = find(k); it != model.end()) model.erase(it);
      const bool cached = c->Put(Key(k), Value(tokens));
      ASSERT_EQ(cached, bytes <= kBudget);
      if (cached) {
        model.emplace_front(k, bytes);
        int64_t total = 0;
        for (const auto& [key, b] : model) total += b;
        while (total > kBudget) {
          total -= model.back().second;
          model.pop_back();
        }
      }
    }
    const EmbeddingCacheStats s = c->stats();
    int64_t total = 0;
    for (const auto& [key, b] : model) total += b;
    ASSERT_EQ(s.bytes, total) << step;
    ASSERT_EQ(s.entries, static_cast<int64_t>(model.size())) << step;
    ASSERT_LE(s.bytes, kBudget);
  }
}

}  // namespace
}  // namespace swaserve::encoder
