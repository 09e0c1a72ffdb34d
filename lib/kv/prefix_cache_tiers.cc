// The prefix cache's L2 tier (the "Tiers" section of
// prefix_cache.h): demotion on L1 eviction, L2 eviction, load-back.
#include <chrono>
#include <cstring>

#include "lib/kv/prefix_cache.h"
#include "lib/kv/prefix_cache_node.h"

namespace swaserve::kv {
namespace {

// Takes n free pages of `pool` straight to kCached (the cache's own); false
// and nothing taken when fewer are free.
bool TakeCached(PagePool& pool, int64_t n, std::vector<PageId>* out) {
  out->clear();
  if (!pool.Reserve(n, out)) return false;
  pool.Commit(*out);
  pool.ToCache(*out);
  return true;
}

}  // namespace

KvPools& PrefixCache::PoolsOf(const CacheNode* node) const {
  return node->tier == 0 ? *pools_ : *l2_;
}

void PrefixCache::SetTier(CacheNode* node, int tier) {
  if (node->tier == tier) return;
  if (node->parent != nullptr) node->parent->l1_children += tier == 0 ? 1 : -1;
  node->tier = static_cast<uint8_t>(tier);
}

void PrefixCache::CopyPages(const PagePool& from, absl::Span<const PageId> src, PagePool& to,
                            absl::Span<const PageId> dst) {
  if (from.base() == nullptr || to.base() == nullptr) return;
  const size_t bytes = from.page_bytes();
  for (size_t i = 0; i < src.size(); ++i) {
    std::memcpy(to.PageData(dst[i]), from.PageData(src[i]), bytes);
  }
}

void PrefixCache::EvictFullL1(CacheNode* node, EvictResult* result) {
  if (l2_ == nullptr) {
    DeleteLeaf(node, result);
  } else {
    Demote(node, result);
  }
}

void PrefixCache::Demote(CacheNode* n, EvictResult* result) {
  // SWA KV goes down only for the node's trailing window, and only where a
  // hit can end on it: at a leaf or a divergence point (docs/architecture.md#kv-tiers:
  // the rule for lower tiers). Everything else of the node's SWA is dropped.
  int keep = 0;
  if (!n->tombstone() && window_ > 1 && (n->leaf() || n->children.size() >= 2)) {
    keep = n->end_page() - std::max(WindowFirstPage(n->end_page(), page_size_, window_), n->start_page);
  }
  if (keep > 0 && keep < n->pages()) {
    // The node keeps the window part; its new parent (the rest, still in
    // L1 and live) goes down later, without SWA (it has one child).
    Split(n, n->pages() - keep);
  }
  const int64_t pages = n->pages();
  const bool want_swa = keep > 0;
  // Held while L2 makes room: deleting the node's last L2 child must not
  // cascade to the node itself (a childless tombstone goes, by default).
  ++n->full_lock;
  EvictL2(pages, want_swa ? pages : 0, result);
  std::vector<PageId> full_dst;
  const bool fits = TakeCached(l2_->full(), pages, &full_dst);
  if (!fits) {
    // L2 cannot hold the node (smaller than it): it is deleted instead,
    // with whatever of its subtree is in L2.
    while (!n->leaf() && !full_lru_[1].empty()) {
      DeleteLeaf(full_lru_[1].begin()->second, result);
    }
  }
  --n->full_lock;
  Reindex(n);
  if (!fits) {
    if (n->leaf()) DeleteLeaf(n, result);
    return;
  }
  Unindex(n);
  CopyPages(pools_->full(), n->full, l2_->full(), full_dst);
  pools_->full().Free(n->full);
  cached_full_[0] -= pages;
  cached_full_[1] += pages;
  result->full_pages_freed += pages;
  n->full = std::move(full_dst);
  stats_.demoted_pages.fetch_add(pages, std::memory_order_relaxed);
  if (!n->tombstone()) {
    std::vector<PageId> swa_dst;
    const bool moved = want_swa && TakeCached(l2_->swa(), pages, &swa_dst);
    if (moved) CopyPages(pools_->swa(), n->swa, l2_->swa(), swa_dst);
    pools_->swa().Free(n->swa);
    cached_swa_[0] -= pages;
    result->swa_pages_freed += pages;
    if (moved) {
      cached_swa_[1] += pages;
      n->swa = std::move(swa_dst);
      stats_.demoted_swa_pages.fetch_add(pages, std::memory_order_relaxed);
    } else {
      n->swa.clear();
      stats_.dropped_swa_pages.fetch_add(pages, std::memory_order_relaxed);
      stats_.evicted_swa_pages.fetch_add(pages, std::memory_order_relaxed);
      stats_.tombstone_nodes.fetch_add(1, std::memory_order_relaxed);
      Emit(CacheEvent::Type::kSwaRemoved, n, 0, n->pages());
    }
  }
  SetTier(n, 1);
  Emit(CacheEvent::Type::kTierChanged, n, 0, n->pages(), 1);
  Reindex(n);
  if (n->parent != root_.get()) Reindex(n->parent);
  if (!keep_tombstones_ && n->tombstone() && n->leaf()) {
    // Without restore a tombstone leaf is worth nothing.
    DeleteLeaf(n, result);
  }
}

void PrefixCache::EvictL2(int64_t full_pages, int64_t swa_pages, EvictResult* result) {
  while (l2_->full().num_free() < full_pages && !full_lru_[1].empty()) {
    DeleteLeaf(full_lru_[1].begin()->second, result);
  }
  while (l2_->swa().num_free() < swa_pages && !swa_lru_[1].empty()) {
    CacheNode* n = swa_lru_[1].begin()->second;
    if (!keep_tombstones_ && n->leaf() && n->full_lock == 0) {
      DeleteLeaf(n, result);
    } else {
      Tombstone(n, result);
    }
  }
}

void PrefixCache::AdoptIntoL1(CacheNode* n, absl::Span<const PageId> full_pages) {
  Unindex(n);
  l2_->full().Free(n->full);
  cached_full_[1] -= n->pages();
  n->full.assign(full_pages.begin(), full_pages.end());
  pools_->full().ToCache(n->full);
  cached_full_[0] += n->pages();
  if (!n->tombstone()) {
    // The node arrives as a tombstone; the insert's own SWA KV heals it
    // where it has some.
    l2_->swa().Free(n->swa);
    cached_swa_[1] -= n->pages();
    stats_.evicted_swa_pages.fetch_add(n->pages(), std::memory_order_relaxed);
    n->swa.clear();
    stats_.tombstone_nodes.fetch_add(1, std::memory_order_relaxed);
    Emit(CacheEvent::Type::kSwaRemoved, n, 0, n->pages());
  }
  SetTier(n, 0);
  Emit(CacheEvent::Type::kTierChanged, n, 0, n->pages(), 0);
  Reindex(n);
  if (n->parent != root_.get()) Reindex(n->parent);
}

bool PrefixCache::Promote(CacheNode* n, PendingLoadBack* p) {
  const int64_t pages = n->pages();
  if (pools_->full().num_free() < pages) Evict(pages - pools_->full().num_free(), 0);
  std::vector<PageId> full_dst;
  if (!TakeCached(pools_->full(), pages, &full_dst)) return false;
  Unindex(n);
  // Copies are recorded, not run; the L2 pages stay allocated until
  // FinishLoadBack (kCached in L2, counted in loading_l2_*).
  auto record = [p](const PagePool& from, absl::Span<const PageId> src, const PagePool& to,
                    absl::Span<const PageId> dst, std::vector<PageId>* keep) {
    keep->insert(keep->end(), src.begin(), src.end());
    if (from.base() == nullptr || to.base() == nullptr) return;
    for (size_t i = 0; i < src.size(); ++i) {
      p->copies_.push_back({from.PageData(src[i]), to.PageData(dst[i]), from.page_bytes()});
      p->result.bytes += static_cast<int64_t>(from.page_bytes());
    }
  };
  record(l2_->full(), n->full, pools_->full(), full_dst, &p->l2_full_);
  loading_l2_full_ += pages;
  cached_full_[1] -= pages;
  cached_full_[0] += pages;
  n->full = std::move(full_dst);
  p->result.pages += pages;
  if (!n->tombstone()) {
    std::vector<PageId> swa_dst;
    // Only free L1 SWA pages: evicting hot windows for this one is not
    // worth it (the node then arrives as a tombstone).
    const bool moved = TakeCached(pools_->swa(), pages, &swa_dst);
    if (moved) {
      record(l2_->swa(), n->swa, pools_->swa(), swa_dst, &p->l2_swa_);
      loading_l2_swa_ += pages;
      p->result.swa_pages += pages;
    } else {
      l2_->swa().Free(n->swa);
    }
    cached_swa_[1] -= pages;
    if (moved) {
      cached_swa_[0] += pages;
      n->swa = std::move(swa_dst);
    } else {
      n->swa.clear();
      stats_.evicted_swa_pages.fetch_add(pages, std::memory_order_relaxed);
      stats_.tombstone_nodes.fetch_add(1, std::memory_order_relaxed);
      Emit(CacheEvent::Type::kSwaRemoved, n, 0, n->pages());
    }
  }
  n->load_generation = p->generation_;
  SetTier(n, 0);
  Emit(CacheEvent::Type::kTierChanged, n, 0, n->pages(), 0);
  Reindex(n);
  if (n->parent != root_.get()) Reindex(n->parent);
  return true;
}

void PrefixCache::Clear() {
  EvictResult ignored;
  for (int t = 1; t >= 0; --t) {
    // Deleting a leaf can make its parent evictable in the same tier; L1
    // nodes whose L2 children are gone become leaves.
    while (!full_lru_[t].empty()) {
      CacheNode* n = full_lru_[t].begin()->second;
      if (!n->leaf()) break;  // an L1 node above L2 nodes locked elsewhere
      DeleteLeaf(n, &ignored);
    }
  }
}

double PendingLoadBack::RunCopies() const {
  const auto t0 = std::chrono::steady_clock::now();
  for (const PageCopy& c : copies_) std::memcpy(c.dst, c.src, c.bytes);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

LoadBackResult PrefixCache::LoadBack(absl::Span<const uint64_t> page_hashes, int max_tokens,
                                     int min_tokens) {
  PendingLoadBack p = BeginLoadBack(page_hashes, max_tokens, min_tokens);
  if (p.empty()) return LoadBackResult();
  p.result.seconds = p.RunCopies();
  const LoadBackResult result = p.result;
  FinishLoadBack(p);
  return result;
}

PendingLoadBack PrefixCache::BeginLoadBack(absl::Span<const uint64_t> page_hashes,
                                           int max_tokens, int min_tokens) {
  PendingLoadBack p;
  if (l2_ == nullptr) return p;
  page_hashes = page_hashes.subspan(
      0, std::min<size_t>(page_hashes.size(),
                          std::max(0, max_tokens) / static_cast<size_t>(page_size_)));
  // The L2 part of the match: nodes below the L1 part, root side first.
  std::vector<CacheNode*> lower;
  CacheNode* node = root_.get();
  size_t pos = 0;
  int64_t lower_pages = 0;
  while (pos < page_hashes.size()) {
    auto it = node->children.find(page_hashes[pos]);
    if (it == node->children.end()) break;
    CacheNode* child = it->second.get();
    const int k = CommonPages(child, page_hashes, pos);
    if (child->tier != 0) {
      if (k < child->pages()) child = Split(child, k);
      lower.push_back(child);
      lower_pages += k;
    }
    pos += k;
    if (k < child->pages()) break;
    node = child;
  }
  if (lower.empty() || lower_pages * page_size_ < min_tokens) return p;
  // Lock the path so that making room in L1 (which demotes, and may delete
  // L2 leaves) cannot take any of it; the promoted part stays locked until
  // FinishLoadBack. (Its SWA cannot be tombstoned meanwhile either: a
  // loading node is not SwaEvictable, see there.)
  p.generation_ = next_load_generation_++;
  loading_.insert(p.generation_);
  CacheNode* end = lower.back();
  for (CacheNode* n = end; n != root_.get(); n = n->parent) {
    ++n->full_lock;
    Reindex(n);
  }
  CacheNode* last = nullptr;  // deepest promoted node
  for (CacheNode* n : lower) {
    if (!Promote(n, &p)) break;
    last = n;
  }
  if (last != end) {
    // L1 could not supply it all: the rest stays in L2, unlocked.
    for (CacheNode* n = end; n != last && n != root_.get(); n = n->parent) {
      --n->full_lock;
      Reindex(n);
    }
    if (!keep_tombstones_ && end->tombstone() && end->leaf() && end->full_lock == 0) {
      EvictResult ignored;
      DeleteLeaf(end, &ignored);  // without SWA and unlocked: worth nothing
    }
  }
  if (last == nullptr) {
    loading_.erase(p.generation_);
    return PendingLoadBack();
  }
  p.end_ = last;
  return p;
}

void PrefixCache::FinishLoadBack(PendingLoadBack& p) {
  if (p.empty()) return;
  loading_.erase(p.generation_);
  l2_->full().Free(p.l2_full_);
  l2_->swa().Free(p.l2_swa_);
  loading_l2_full_ -= static_cast<int64_t>(p.l2_full_.size());
  loading_l2_swa_ -= static_cast<int64_t>(p.l2_swa_.size());
  CacheNode* end = p.end_;
  for (CacheNode* n = end; n != root_.get(); n = n->parent) {
    --n->full_lock;
    Reindex(n);
  }
  if (!keep_tombstones_ && end->tombstone() && end->leaf() && end->full_lock == 0) {
    EvictResult ignored;
    DeleteLeaf(end, &ignored);  // arrived without SWA: worth nothing
  }
  stats_.loaded_back_pages.fetch_add(p.result.pages, std::memory_order_relaxed);
  stats_.loaded_back_bytes.fetch_add(p.result.bytes, std::memory_order_relaxed);
  stats_.loaded_back_nanos.fetch_add(static_cast<int64_t>(p.result.seconds * 1e9),
                                     std::memory_order_relaxed);
  p = PendingLoadBack();
}

bool PrefixCache::Loading(const CacheHit& hit) const {
  if (loading_.empty()) return false;
  for (const CacheNode* n = hit.node_; n != nullptr && n != root_.get(); n = n->parent) {
    if (n->load_generation != 0 && loading_.contains(n->load_generation)) return true;
  }
  return false;
}

}  // namespace swaserve::kv
