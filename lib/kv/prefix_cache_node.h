// Internal to lib/kv: the prefix cache's radix-tree node, shared by
// prefix_cache.cc and prefix_cache_tiers.cc. Not part of the API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"

namespace swaserve::kv {

// A radix-tree node: a span of whole pages. See prefix_cache.h.
struct CacheNode {
  CacheNode* parent = nullptr;
  // Keyed by the child's first page hash.
  absl::flat_hash_map<uint64_t, std::unique_ptr<CacheNode>> children;
  std::vector<uint64_t> hashes;
  std::vector<PageId> full;
  std::vector<PageId> swa;  // empty: tombstone (the root has none either)
  int start_page = 0;       // pages from the root to this node's start
  uint8_t tier = 0;         // 0: L1 (pools_), 1: L2 (l2_); see "Tiers"
  int l1_children = 0;      // children in L1
  // L3: full pages written; SWA pages (its window part) written; hits on
  // this node's paths (for write-through).
  bool l3_full = false;
  bool l3_swa = false;
  uint32_t hits = 0;
  // Asynchronous load-back that moved this node into L1 (0: none); its
  // pages are valid once that generation is no longer in PrefixCache's
  // loading_ set.
  uint64_t load_generation = 0;
  int full_lock = 0;
  int swa_lock = 0;
  uint64_t full_tick = 0;
  uint64_t swa_tick = 0;
  uint64_t id = 0;
  // Current keys in the LRU sets (valid when the flag is set).
  bool in_full_lru = false;
  bool in_swa_lru = false;
  uint64_t full_key_tick = 0;
  uint64_t swa_key_tick = 0;
  int key_depth = 0;
  uint8_t key_tier = 0;

  int pages() const { return static_cast<int>(hashes.size()); }
  int end_page() const { return start_page + pages(); }
  bool tombstone() const { return swa.empty(); }
  bool leaf() const { return children.empty(); }
};


// Length of the common prefix of a node's hashes and hashes[pos..].
inline int CommonPages(const CacheNode* node, absl::Span<const uint64_t> hashes,
                size_t pos) {
  const size_t n = std::min<size_t>(node->hashes.size(), hashes.size() - pos);
  size_t k = 0;
  while (k < n && node->hashes[k] == hashes[pos + k]) ++k;
  return static_cast<int>(k);
}


}  // namespace swaserve::kv
