#include "lib/cluster/index_shard_mapper.h"

#include <algorithm>
#include <utility>

namespace swaserve::cluster {

using Kind = CacheEventOp::Kind;

void IndexShardMapper::Emit(Kind kind, std::vector<uint64_t> hashes, int shard, bool index,
                            bool stream, std::vector<CacheEventOp>* out) {
  if (hashes.empty()) return;
  if (index) touched_ |= uint64_t{1} << shard;
  out->push_back(CacheEventOp{
      .kind = kind, .hashes = std::move(hashes), .shard = shard, .index = index, .stream = stream});
}

void IndexShardMapper::CopyHead(uint64_t last, int shard, std::vector<CacheEventOp>* out) {
  const uint64_t bit = uint64_t{1} << shard;
  std::vector<uint64_t> path;
  for (uint64_t h = last;;) {
    auto it = heads_.find(h);
    // A page already in the shard has its whole path there (copies are
    // whole paths, and a page outlives none of its descendants).
    if (it == heads_.end() || (it->second.mask & bit) != 0) break;
    path.push_back(h);
    it->second.mask |= bit;
    if (it->second.parent == 0) break;
    h = it->second.parent;
  }
  std::reverse(path.begin(), path.end());
  std::vector<uint64_t> gone, lower;
  for (uint64_t h : path) {
    const Head& head = heads_.at(h);
    if (head.swa_gone) gone.push_back(h);
    if (head.lower) lower.push_back(h);
  }
  Emit(Kind::kStored, std::move(path), shard, /*index=*/true, /*stream=*/false, out);
  Emit(Kind::kSwaRemoved, std::move(gone), shard, true, false, out);
  Emit(Kind::kTierDown, std::move(lower), shard, true, false, out);
}

void IndexShardMapper::Map(const PathEvent& e, std::vector<CacheEventOp>* out) {
  const int n = static_cast<int>(e.hashes.size());
  if (n == 0 || e.kind == Kind::kCleared) return;
  const int head_n = std::clamp(anchor_page_ - e.depth, 0, n);
  const std::vector<uint64_t> head(e.hashes.begin(), e.hashes.begin() + head_n);
  std::vector<uint64_t> tail(e.hashes.begin() + head_n, e.hashes.end());
  const int shard = tail.empty() ? 0 : keys_.ShardOf(e.anchor);
  if (e.kind == Kind::kStored) {
    for (int i = 0; i < head_n; ++i) {
      heads_[e.hashes[i]] =
          Head{.parent = i == 0 ? e.parent : e.hashes[i - 1], .mask = uint64_t{1} << kHomeShard};
    }
    Emit(e.kind, head, kHomeShard, /*index=*/true, /*stream=*/true, out);
    if (!tail.empty()) {
      if (e.depth <= anchor_page_ && anchor_page_ > 0) {
        // The anchor page is in this event: its head path goes first.
        const uint64_t last = head_n > 0 ? e.hashes[head_n - 1] : e.parent;
        CopyHead(last, shard, out);
      }
      Emit(e.kind, std::move(tail), shard, true, true, out);
    }
    return;
  }
  // Removed, SWA dropped or healed, tier changes: the tail goes to its
  // anchor's shard, head pages to every shard holding a copy.
  Emit(e.kind, std::move(tail), shard, true, true, out);
  uint64_t shards = 0;
  for (uint64_t h : head) {
    auto it = heads_.find(h);
    if (it != heads_.end()) shards |= it->second.mask;
  }
  for (int s = 0; shards != 0; ++s, shards >>= 1) {
    if ((shards & 1) == 0) continue;
    std::vector<uint64_t> in_shard;
    for (uint64_t h : head) {
      auto it = heads_.find(h);
      if (it != heads_.end() && (it->second.mask >> s & 1) != 0) in_shard.push_back(h);
    }
    Emit(e.kind, std::move(in_shard), s, true, false, out);
  }
  Emit(e.kind, head, 0, false, true, out);
  for (uint64_t h : head) {
    auto it = heads_.find(h);
    if (it == heads_.end()) continue;
    switch (e.kind) {
      case Kind::kRemoved: heads_.erase(it); break;
      case Kind::kSwaRemoved: it->second.swa_gone = true; break;
      case Kind::kSwaStored: it->second.swa_gone = false; break;
      case Kind::kTierDown: it->second.lower = true; break;
      case Kind::kTierUp: it->second.lower = false; break;
      default: break;
    }
  }
}

void IndexShardMapper::Clear() {
  heads_.clear();
  touched_ = 0;
}

void IndexShardMapper::ForgetCopies() {
  for (auto& [hash, head] : heads_) head.mask = 0;
}

}  // namespace swaserve::cluster
