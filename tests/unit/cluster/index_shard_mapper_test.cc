// Property test of IndexShardMapper (lib/cluster/index_shard_mapper.h): a
// simulated worker cache (a radix forest of chained pages) emits random
// events the way kv::PrefixCache does (stores under existing pages, removals
// of leaf runs, SWA drops and heals, tier moves); the mapper's ops are
// applied to simulated index shards with the semantics of PrefixIndex's
// apply script. After every event:
//   - each shard is closed under prefixes and holds exactly the cached
//     chains whose anchor maps to it plus their heads, with their true SWA
//     and tier state (so a match in the prompt's shard is exact);
//   - the ops marked `stream` rebuild the worker's cache exactly (the event
//     stream gets every event once).
#include "lib/cluster/index_shard_mapper.h"

#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace swaserve::cluster {
namespace {

using Kind = CacheEventOp::Kind;

struct Page {
  uint64_t parent = 0;
  int depth = 0;
  int children = 0;
  bool gone = false;
  bool lower = false;
};

struct SetTrio {
  absl::flat_hash_set<uint64_t> pages, gone, lower;

  void Apply(const CacheEventOp& op) {
    for (uint64_t h : op.hashes) {
      switch (op.kind) {
        case Kind::kStored: pages.insert(h); gone.erase(h); lower.erase(h); break;
        case Kind::kRemoved: pages.erase(h); gone.erase(h); lower.erase(h); break;
        case Kind::kSwaRemoved: gone.insert(h); break;
        case Kind::kSwaStored: gone.erase(h); break;
        case Kind::kTierDown: lower.insert(h); break;
        case Kind::kTierUp: lower.erase(h); break;
        case Kind::kCleared: break;
      }
    }
  }
};

class MapperProperty {
 public:
  MapperProperty(uint64_t seed, int shards, int anchor, bool forgets)
      : rng_(seed), keys_(*KeySchema::Create("t", shards)), anchor_(anchor), forgets_(forgets),
        mapper_(keys_, anchor), shards_(shards) {}

  void Run(int steps) {
    // Check is O(cache x depth): after every step while the cache is small
    // (where most corner cases are), then every 8th step.
    for (int step = 0; step < steps; ++step) {
      Step();
      if (step < 100 || step % 8 == 0 || step + 1 == steps) Check();
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GT(copies_checked_, 0);
  }

 private:
  uint64_t Anchor(uint64_t h) const {
    while (cache_.at(h).depth > anchor_) h = cache_.at(h).parent;
    return h;
  }

  void Emit(Kind kind, const std::vector<uint64_t>& hashes) {
    if (hashes.empty()) return;
    const Page& first = cache_.at(hashes[0]);
    PathEvent e{.kind = kind, .hashes = hashes, .depth = first.depth, .parent = first.parent};
    if (first.depth + static_cast<int>(hashes.size()) > anchor_) e.anchor = Anchor(hashes.back());
    std::vector<CacheEventOp> ops;
    mapper_.Map(e, &ops);
    for (const CacheEventOp& op : ops) {
      if (op.stream) stream_.Apply(op);
      if (op.index) shard_sets_[op.shard].Apply(op);
    }
  }

  // A run of up to `max` pages ending at a random cached page, in prefix
  // order.
  std::vector<uint64_t> RandomRun(int max) {
    std::vector<uint64_t> run;
    if (cache_.empty()) return run;
    auto it = cache_.begin();
    std::advance(it, rng_() % cache_.size());
    for (uint64_t h = it->first; h != 0 && static_cast<int>(run.size()) < max;
         h = cache_.at(h).parent) {
      run.push_back(h);
    }
    std::reverse(run.begin(), run.end());
    return run;
  }

  void Step() {
    const int r = static_cast<int>(rng_() % 100);
    if (r < 40 || cache_.size() < 5) {  // store a run under a cached page or the root
      uint64_t parent = 0;
      int depth = 0;
      if (!cache_.empty() && rng_() % 4 != 0) {
        std::vector<uint64_t> at = RandomRun(1);
        parent = at[0];
        depth = cache_.at(parent).depth + 1;
      } else if (!roots_.empty() && rng_() % 3 != 0) {
        // Shared first pages, like a chat template: under a root's page.
        parent = roots_[rng_() % roots_.size()];
        if (!cache_.contains(parent)) parent = 0;
        depth = parent == 0 ? 0 : cache_.at(parent).depth + 1;
      }
      std::vector<uint64_t> run;
      const int n = 1 + static_cast<int>(rng_() % (2 * anchor_ + 2));
      uint64_t p = parent;
      for (int i = 0; i < n; ++i) {
        const uint64_t h = rng_() | 1;
        cache_[h] = Page{.parent = p, .depth = depth + i};
        if (p != 0) ++cache_[p].children;
        if (depth + i == 0) roots_.push_back(h);
        run.push_back(h);
        p = h;
      }
      Emit(Kind::kStored, run);
      if (rng_() % 5 == 0) {  // stored without SWA KV
        for (uint64_t h : run) cache_[h].gone = true;
        Emit(Kind::kSwaRemoved, run);
      }
    } else if (r < 70) {  // evict a leaf run
      std::vector<uint64_t> leaves;
      for (const auto& [h, page] : cache_) {
        if (page.children == 0) leaves.push_back(h);
      }
      std::sort(leaves.begin(), leaves.end());
      uint64_t h = leaves[rng_() % leaves.size()];
      std::vector<uint64_t> run = {h};
      const int extra = static_cast<int>(rng_() % 4);
      for (int i = 0; i < extra; ++i) {
        const uint64_t up = cache_.at(run.back()).parent;
        if (up == 0 || cache_.at(up).children != 1) break;
        run.push_back(up);
      }
      std::reverse(run.begin(), run.end());
      Emit(Kind::kRemoved, run);
      for (auto it = run.rbegin(); it != run.rend(); ++it) {
        const uint64_t up = cache_.at(*it).parent;
        if (up != 0) --cache_.at(up).children;
        cache_.erase(*it);
      }
    } else if (r < 97) {  // SWA and tier changes on a run
      std::vector<uint64_t> run = RandomRun(1 + static_cast<int>(rng_() % 5));
      const Kind kind = std::vector<Kind>{Kind::kSwaRemoved, Kind::kSwaStored, Kind::kTierDown,
                                          Kind::kTierUp}[rng_() % 4];
      for (uint64_t h : run) {
        Page& page = cache_.at(h);
        if (kind == Kind::kSwaRemoved) page.gone = true;
        if (kind == Kind::kSwaStored) page.gone = false;
        if (kind == Kind::kTierDown) page.lower = true;
        if (kind == Kind::kTierUp) page.lower = false;
      }
      Emit(kind, run);
    } else if (forgets_) {  // the queue dropped events: the index was cleared
      mapper_.ForgetCopies();
      for (auto& [s, trio] : shard_sets_) trio = SetTrio{};
      forgot_ = true;
    }
  }

  void Check() {
    // The stream rebuilds the cache.
    ASSERT_EQ(stream_.pages.size(), cache_.size());
    for (const auto& [h, page] : cache_) {
      ASSERT_TRUE(stream_.pages.contains(h));
      ASSERT_EQ(stream_.gone.contains(h), page.gone);
      ASSERT_EQ(stream_.lower.contains(h), page.lower);
    }
    for (const auto& [s, trio] : shard_sets_) {
      ASSERT_GE(s, 0);
      ASSERT_LT(s, shards_);
      for (uint64_t h : trio.pages) {
        auto it = cache_.find(h);
        ASSERT_NE(it, cache_.end()) << "shard " << s << " holds an evicted page";
        ASSERT_EQ(trio.gone.contains(h), it->second.gone) << "SWA state in shard " << s;
        ASSERT_EQ(trio.lower.contains(h), it->second.lower) << "tier in shard " << s;
        if (it->second.depth >= anchor_) {
          ASSERT_EQ(keys_.ShardOf(Anchor(h)), s) << "a tail page outside its anchor's shard";
        } else {
          ++copies_checked_;
        }
        if (!forgot_ && it->second.parent != 0) {
          ASSERT_TRUE(trio.pages.contains(it->second.parent))
              << "shard " << s << " is not closed under prefixes";
        }
      }
    }
    if (forgot_) return;
    for (const auto& [h, page] : cache_) {
      if (page.depth < anchor_) {
        auto home = shard_sets_.find(IndexShardMapper::kHomeShard);
        ASSERT_TRUE(home != shard_sets_.end() && home->second.pages.contains(h))
            << "a cached head page is missing from the home shard";
        continue;
      }
      const int s = keys_.ShardOf(Anchor(h));
      auto it = shard_sets_.find(s);
      ASSERT_TRUE(it != shard_sets_.end() && it->second.pages.contains(h))
          << "a cached chain page is missing from its shard";
    }
  }

  std::mt19937_64 rng_;
  KeySchema keys_;
  int anchor_;
  bool forgets_;
  IndexShardMapper mapper_;
  int shards_;
  absl::flat_hash_map<uint64_t, Page> cache_;
  std::vector<uint64_t> roots_;
  SetTrio stream_;
  std::map<int, SetTrio> shard_sets_;
  bool forgot_ = false;
  int64_t copies_checked_ = 0;
};

TEST(IndexShardMapperTest, ShardsAreExactRestrictionsOfTheCache) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    const int shards = std::vector<int>{2, 3, 8, 64}[seed % 4];
    MapperProperty(seed, shards, 1 + static_cast<int>(seed % 6), /*forgets=*/false).Run(600);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(IndexShardMapperTest, AfterDroppedEventsShardsHoldNothingStale) {
  for (uint64_t seed = 100; seed < 106; ++seed) {
    SCOPED_TRACE(seed);
    MapperProperty(seed, 8, 1 + static_cast<int>(seed % 5), /*forgets=*/true).Run(600);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(IndexShardMapperTest, HeadPagesAreCopiedOncePerShard) {
  const KeySchema keys = *KeySchema::Create("t", 8);
  IndexShardMapper mapper(keys, 2);
  const std::vector<uint64_t> head = {11, 12};
  std::vector<CacheEventOp> ops;
  mapper.Map({.kind = Kind::kStored, .hashes = head, .depth = 0}, &ops);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_TRUE(ops[0].index);
  EXPECT_EQ(ops[0].shard, IndexShardMapper::kHomeShard);
  EXPECT_TRUE(ops[0].stream);
  // Two chains under the head with anchors in the same shard (not the home
  // shard, which has the head already): one copy.
  uint64_t a1 = 1000;
  while (keys.ShardOf(a1) == IndexShardMapper::kHomeShard) ++a1;
  uint64_t a2 = a1 + 1;
  while (keys.ShardOf(a2) != keys.ShardOf(a1)) ++a2;
  ops.clear();
  const std::vector<uint64_t> t1 = {a1, 13}, t2 = {a2};
  mapper.Map({.kind = Kind::kStored, .hashes = t1, .depth = 2, .parent = 12, .anchor = a1}, &ops);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].hashes, head);
  EXPECT_FALSE(ops[0].stream);
  EXPECT_EQ(ops[1].hashes, t1);
  EXPECT_EQ(ops[1].shard, keys.ShardOf(a1));
  ops.clear();
  mapper.Map({.kind = Kind::kStored, .hashes = t2, .depth = 2, .parent = 12, .anchor = a2}, &ops);
  ASSERT_EQ(ops.size(), 1u) << "the head is in that shard already";
  EXPECT_EQ(mapper.head_pages(), 2u);
  EXPECT_EQ(mapper.touched_shards(),
            (uint64_t{1} << keys.ShardOf(a1)) | (uint64_t{1} << IndexShardMapper::kHomeShard));
  // A chain anchored in the home shard needs no copy.
  uint64_t a3 = 2000;
  while (keys.ShardOf(a3) != IndexShardMapper::kHomeShard) ++a3;
  ops.clear();
  const std::vector<uint64_t> t3 = {a3};
  mapper.Map({.kind = Kind::kStored, .hashes = t3, .depth = 2, .parent = 12, .anchor = a3}, &ops);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].shard, IndexShardMapper::kHomeShard);
  // Removing a head page reaches both shards holding it, and the stream once.
  ops.clear();
  const std::vector<uint64_t> last = {12};
  mapper.Map({.kind = Kind::kSwaRemoved, .hashes = last, .depth = 1, .parent = 11}, &ops);
  int streamed = 0, indexed = 0;
  for (const CacheEventOp& op : ops) {
    streamed += op.stream;
    indexed += op.index;
  }
  EXPECT_EQ(streamed, 1);
  EXPECT_EQ(indexed, 2);
}

}  // namespace
}  // namespace swaserve::cluster
