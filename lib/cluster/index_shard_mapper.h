// IndexShardMapper: turns a worker's prefix-cache events into the ops of a
// sharded prefix-affinity index (prefix_index.h, Redis Cluster).
//
// Why sharding needs more than a hash tag. A decision reads one shard (one
// round trip), so a prompt's whole chain must be in one shard, chosen from
// the prompt itself. The first page will not do: real prompts share their
// first pages (a chat template, a system prompt, an agent's tool list: every
// request of the Mooncake conversation trace has the same first 512 tokens),
// which would put every decision on one shard. So a chain is sharded by its
// anchor, page K (PrefixIndexOptions::anchor_page, default 32: 512 tokens at
// 16 per page): pages at depth >= K go to shard ShardOf(anchor). The "head"
// pages (depth < K) are shared by chains of many anchors, so each shard
// needs its own copy of the heads of the chains it holds:
//   - when a chain's anchor page is stored, its head pages (and their SWA
//     and tier state) are copied into the anchor's shard unless already
//     there (a 64-bit mask per head page says where it was copied);
//   - a later change to a head page (removed, SWA dropped or healed, moved
//     between tiers) goes to every shard in its mask.
//   - every head page also lives in the home shard (kHomeShard), where it
//     is stored when the worker stores it: prompts of at most K pages are
//     matched there, and the union of the shards is the worker's whole
//     cache (the KV events snapshot reads it).
// Each shard is then exactly the worker's cache restricted to the chains
// whose anchor maps to it, plus those chains' heads (and, in the home shard,
// every head): closed under prefixes (the match's search stays exact) and
// with the true SWA and tier state. A match in a prompt's anchor shard is
// exact when it reaches the anchor; shallower, it may be less than the
// worker's true depth (its head is copied there only with an anchor of that
// shard) — such a match is worth at most K pages. Cost: K extra members per
// distinct anchor shard of a head (at most 64 copies of a shared system
// prompt's head per worker), and one op per shard holding a changed head.
//
// The event stream (kv_events.h) gets every event once: ops copying heads
// into shards carry stream = false.
//
// If the queue dropped events (it then clears the index: CacheEventQueue),
// call ForgetCopies(): the masks no longer describe Redis, and the next
// anchors copy their heads again.
//
// Thread-compatible (the caller serializes; WorkerRegistration holds its
// lock). Memory: about 64 bytes per cached head page.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "lib/cluster/cache_event_queue.h"
#include "lib/cluster/key_schema.h"

namespace swaserve::cluster {

// One prefix-cache event with its place on the path (kv::CacheEvent).
struct PathEvent {
  CacheEventOp::Kind kind = CacheEventOp::Kind::kStored;  // not kCleared
  absl::Span<const uint64_t> hashes;
  int depth = 0;         // pages before hashes[0] on its path
  uint64_t parent = 0;   // hash of the page before hashes[0] (0 at depth 0)
  uint64_t anchor = 0;   // hash of page anchor_page of the path, when it has one
};

class IndexShardMapper {
 public:
  // The shard holding every head page (PrefixIndex matches prompts of at
  // most anchor_page pages there).
  static constexpr int kHomeShard = 0;

  // `keys` decides the shard count (index_shards() <= 64) and ShardOf;
  // anchor_page >= 1.
  IndexShardMapper(const KeySchema& keys, int anchor_page)
      : keys_(keys), anchor_page_(anchor_page) {}

  // Appends the ops `e` becomes to *out, in the order they must be applied.
  void Map(const PathEvent& e, std::vector<CacheEventOp>* out);
  // The worker's cache was cleared: forget every head page.
  void Clear();
  // The index was cleared while the cache was not (dropped events).
  void ForgetCopies();

  // Shards that have received ops since the last Clear (bit s: shard s).
  uint64_t touched_shards() const { return touched_; }
  size_t head_pages() const { return heads_.size(); }

 private:
  struct Head {
    uint64_t parent = 0;
    uint64_t mask = 0;  // shards holding a copy
    bool swa_gone = false;
    bool lower = false;
  };

  // Copies the head path ending at `last` (depth anchor_page - 1) into
  // `shard` where it is not there yet.
  void CopyHead(uint64_t last, int shard, std::vector<CacheEventOp>* out);
  void Emit(CacheEventOp::Kind kind, std::vector<uint64_t> hashes, int shard, bool index,
            bool stream, std::vector<CacheEventOp>* out);

  const KeySchema keys_;
  const int anchor_page_;
  absl::flat_hash_map<uint64_t, Head> heads_;
  uint64_t touched_ = 0;
};

}  // namespace swaserve::cluster
