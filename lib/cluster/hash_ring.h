// HashRing: consistent hashing with virtual nodes (Karger et al.), used to
// place keys — e.g. the content hash of a multimodal item — on one of a set
// of replicas (encoder replicas: docs/architecture.md#parts, #request-path), so that the same item
// always goes to the same replica (its embedding cache) and a replica
// joining or leaving moves only about 1/N of the keys.
//
// Each node owns `virtual_nodes` points on a 64-bit ring at
// Hash64("<node>#<i>"); a key belongs to the first point clockwise from
// Hash64 of the key (or from the key itself for a uint64 that is already a
// hash). With 160 virtual nodes the load of each node is within about ±10%
// of the mean (tests/unit/cluster/hash_ring_test.cc). Placement depends only
// on the set of node names, so every router replica computes the same one.
//
// Thread-compatible: const methods may run concurrently; Add/Remove need
// exclusive access (routers typically rebuild a ring per membership change
// and swap it in).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace swaserve::cluster {

struct HashRingOptions {
  // Points per node on the ring. More: better balance, bigger ring.
  // Default 160.
  int virtual_nodes = 160;
};

class HashRing {
 public:
  explicit HashRing(HashRingOptions options = {});

  // Adds a node (no-op when present). Returns true when it was added.
  bool Add(absl::string_view node);
  // Removes a node (no-op when absent). Returns true when it was removed.
  bool Remove(absl::string_view node);

  // The node owning `key_hash` (a 64-bit hash of the key); nullopt when the
  // ring is empty.
  std::optional<std::string> NodeFor(uint64_t key_hash) const;
  // NodeFor(Hash64(key)).
  std::optional<std::string> NodeForKey(absl::string_view key) const;
  // Up to `n` distinct nodes in ring order starting at `key_hash`'s owner:
  // fallbacks when the owner is unhealthy.
  std::vector<std::string> NodesFor(uint64_t key_hash, size_t n) const;

  // The nodes, sorted.
  std::vector<std::string> nodes() const;
  size_t size() const { return nodes_.size(); }
  bool empty() const { return nodes_.empty(); }

 private:
  // Index into points_ of the owner of `key_hash` (points_ non-empty).
  size_t PointIndex(uint64_t key_hash) const;
  void Rebuild();

  HashRingOptions options_;
  // Sorted node names; points_ refer to them by index.
  std::vector<std::string> nodes_;
  // (position, node index), sorted by position (ties: by node name).
  std::vector<std::pair<uint64_t, uint32_t>> points_;
};

}  // namespace swaserve::cluster
