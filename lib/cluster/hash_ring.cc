#include "lib/cluster/hash_ring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"

namespace swaserve::cluster {

HashRing::HashRing(HashRingOptions options) : options_(options) {
  if (options_.virtual_nodes < 1) options_.virtual_nodes = 1;
}

bool HashRing::Add(absl::string_view node) {
  auto it = std::lower_bound(nodes_.begin(), nodes_.end(), node);
  if (it != nodes_.end() && *it == node) return false;
  nodes_.insert(it, std::string(node));
  Rebuild();
  return true;
}

bool HashRing::Remove(absl::string_view node) {
  auto it = std::lower_bound(nodes_.begin(), nodes_.end(), node);
  if (it == nodes_.end() || *it != node) return false;
  nodes_.erase(it);
  Rebuild();
  return true;
}

void HashRing::Rebuild() {
  points_.clear();
  points_.reserve(nodes_.size() * static_cast<size_t>(options_.virtual_nodes));
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    for (int i = 0; i < options_.virtual_nodes; ++i) {
      points_.emplace_back(base::Hash64(absl::StrCat(nodes_[n], "#", i)), n);
    }
  }
  // nodes_ is sorted, so ties in position resolve by node name: placement
  // depends only on the set of names.
  std::sort(points_.begin(), points_.end());
}

size_t HashRing::PointIndex(uint64_t key_hash) const {
  auto it = std::lower_bound(points_.begin(), points_.end(), key_hash,
                             [](const std::pair<uint64_t, uint32_t>& p,
                                uint64_t h) { return p.first < h; });
  if (it == points_.end()) return 0;  // wrap around
  return static_cast<size_t>(it - points_.begin());
}

std::optional<std::string> HashRing::NodeFor(uint64_t key_hash) const {
  if (points_.empty()) return std::nullopt;
  return nodes_[points_[PointIndex(key_hash)].second];
}

std::optional<std::string> HashRing::NodeForKey(absl::string_view key) const {
  return NodeFor(base::Hash64(key));
}

std::vector<std::string> HashRing::NodesFor(uint64_t key_hash, size_t n) const {
  std::vector<std::string> out;
  if (points_.empty()) return out;
  n = std::min(n, nodes_.size());
  std::vector<bool> seen(nodes_.size(), false);
  size_t i = PointIndex(key_hash);
  for (size_t steps = 0; steps < points_.size() && out.size() < n; ++steps) {
    const uint32_t node = points_[i].second;
    if (!seen[node]) {
      seen[node] = true;
      out.push_back(nodes_[node]);
    }
    i = (i + 1) % points_.size();
  }
  return out;
}

std::vector<std::string> HashRing::nodes() const { return nodes_; }

}  // namespace swaserve::cluster
