#include "lib/cluster/hash_ring.h"

#include <cmath>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/hash.h"

namespace swaserve::cluster {
namespace {

constexpr int kKeys = 200'000;

std::vector<uint64_t> Keys() {
  std::vector<uint64_t> keys;
  keys.reserve(kKeys);
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(base::Hash64(absl::StrCat("image-", i)));
  }
  return keys;
}

HashRing Ring(int nodes, int virtual_nodes = 160) {
  HashRing ring({.virtual_nodes = virtual_nodes});
  for (int i = 0; i < nodes; ++i) ring.Add(absl::StrCat("encoder-", i));
  return ring;
}

TEST(HashRing, EmptyRingHasNoOwner) {
  HashRing ring;
  EXPECT_FALSE(ring.NodeFor(123).has_value());
  EXPECT_FALSE(ring.NodeForKey("x").has_value());
  EXPECT_TRUE(ring.NodesFor(123, 3).empty());
  EXPECT_TRUE(ring.empty());
}

TEST(HashRing, AddRemoveAreIdempotent) {
  HashRing ring;
  EXPECT_TRUE(ring.Add("a"));
  EXPECT_FALSE(ring.Add("a"));
  EXPECT_TRUE(ring.Add("b"));
  EXPECT_THAT(ring.nodes(), ::testing::ElementsAre("a", "b"));
  EXPECT_TRUE(ring.Remove("a"));
  EXPECT_FALSE(ring.Remove("a"));
  EXPECT_EQ(ring.size(), 1u);
  EXPECT_EQ(ring.NodeFor(42), "b");
}

// Load per node with 160 virtual nodes: relative standard deviation within
// 10% and no node above 1.3x or below 0.7x of the mean (deterministic: the
// hashes are fixed).
TEST(HashRing, BalancesKeysAcrossNodes) {
  for (int nodes : {4, 10, 32}) {
    HashRing ring = Ring(nodes);
    std::map<std::string, int> load;
    for (uint64_t k : Keys()) ++load[*ring.NodeFor(k)];
    ASSERT_EQ(load.size(), static_cast<size_t>(nodes));
    const double mean = static_cast<double>(kKeys) / nodes;
    double var = 0;
    int max_load = 0, min_load = kKeys;
    for (const auto& [node, n] : load) {
      var += (n - mean) * (n - mean);
      max_load = std::max(max_load, n);
      min_load = std::min(min_load, n);
    }
    const double rel_std = std::sqrt(var / nodes) / mean;
    SCOPED_TRACE(absl::StrCat(nodes, " nodes: relative std ", rel_std,
                              ", max/mean ", max_load / mean, ", min/mean ",
                              min_load / mean));
    EXPECT_LT(rel_std, 0.10);
    EXPECT_LT(max_load / mean, 1.3);
    EXPECT_GT(min_load / mean, 0.7);
  }
}

// Fewer virtual nodes balance worse: the balance comes from them.
TEST(HashRing, MoreVirtualNodesBalanceBetter) {
  auto rel_std = [](const HashRing& ring, int nodes) {
    std::map<std::string, int> load;
    for (uint64_t k : Keys()) ++load[*ring.NodeFor(k)];
    const double mean = static_cast<double>(kKeys) / nodes;
    double var = 0;
    for (const auto& [node, n] : load) var += (n - mean) * (n - mean);
    return std::sqrt(var / nodes) / mean;
  };
  EXPECT_GT(rel_std(Ring(10, 1), 10), 2 * rel_std(Ring(10, 160), 10));
}

// Joining: about 1/(N+1) of the keys move, and every key that moves goes to
// the new node. Leaving: exactly the leaving node's keys move.
TEST(HashRing, MinimalMovementOnJoinAndLeave) {
  const std::vector<uint64_t> keys = Keys();
  for (int nodes : {4, 10}) {
    HashRing before = Ring(nodes);
    HashRing after = Ring(nodes);
    ASSERT_TRUE(after.Add("encoder-new"));
    int moved = 0;
    for (uint64_t k : keys) {
      const std::string a = *before.NodeFor(k);
      const std::string b = *after.NodeFor(k);
      if (a != b) {
        ++moved;
        ASSERT_EQ(b, "encoder-new") << "key moved between old nodes";
      }
    }
    const double expected = static_cast<double>(kKeys) / (nodes + 1);
    EXPECT_GT(moved, 0.7 * expected) << nodes;
    EXPECT_LT(moved, 1.3 * expected) << nodes;

    // Leave: remove encoder-1 from `before`.
    HashRing smaller = Ring(nodes);
    ASSERT_TRUE(smaller.Remove("encoder-1"));
    int moved_on_leave = 0, owned_by_leaver = 0;
    for (uint64_t k : keys) {
      const std::string a = *before.NodeFor(k);
      const std::string b = *smaller.NodeFor(k);
      if (a == "encoder-1") ++owned_by_leaver;
      if (a != b) {
        ++moved_on_leave;
        ASSERT_EQ(a, "encoder-1") << "a key of a staying node moved";
      }
    }
    EXPECT_EQ(moved_on_leave, owned_by_leaver);
  }
}

TEST(HashRing, PlacementDependsOnlyOnTheSetOfNodes) {
  HashRing a, b;
  for (const char* n : {"x", "y", "z", "w"}) a.Add(n);
  for (const char* n : {"w", "z", "y", "x", "q"}) b.Add(n);
  b.Remove("q");
  for (uint64_t k : Keys()) ASSERT_EQ(a.NodeFor(k), b.NodeFor(k));
  EXPECT_EQ(a.NodeForKey("img"), a.NodeFor(base::Hash64("img")));
}

TEST(HashRing, NodesForGivesDistinctFallbacksStartingAtTheOwner) {
  HashRing ring = Ring(5);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t k = rng();
    std::vector<std::string> three = ring.NodesFor(k, 3);
    ASSERT_EQ(three.size(), 3u);
    EXPECT_EQ(three[0], *ring.NodeFor(k));
    EXPECT_NE(three[0], three[1]);
    EXPECT_NE(three[1], three[2]);
    EXPECT_NE(three[0], three[2]);
    // When the owner leaves, its keys go to the first fallback.
    HashRing without = ring;
    without.Remove(three[0]);
    EXPECT_EQ(*without.NodeFor(k), three[1]);
  }
  EXPECT_EQ(ring.NodesFor(7, 99).size(), 5u);
}

}  // namespace
}  // namespace swaserve::cluster
