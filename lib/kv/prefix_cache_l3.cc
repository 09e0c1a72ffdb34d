// The prefix cache's L3 tier (the "L3" section of prefix_cache.h):
// write-back and write-through of pages to a PageStore, and attaching pages
// read back from it (FetchFromL3) as L2 nodes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "lib/kv/prefix_cache.h"
#include "lib/kv/prefix_cache_node.h"

namespace swaserve::kv {
namespace {

absl::Span<const uint8_t> PageBytes(const PagePool& pool, PageId page) {
  const uint8_t* data = pool.PageData(page);
  if (data == nullptr) return {};
  return {data, pool.page_bytes()};
}

}  // namespace

L3FetchOptions PrefixCache::l3_fetch_options() const {
  return L3FetchOptions{.layouts = l3_layouts_,
                        .page_size = page_size_,
                        .sliding_window = window_,
                        .full_page_bytes = pools_->full().base() != nullptr
                                               ? pools_->full().page_bytes() : 0,
                        .swa_page_bytes = pools_->swa().base() != nullptr
                                              ? pools_->swa().page_bytes() : 0,
                        .full_kv_only_ok = keep_tombstones_};
}

int64_t PrefixCache::WriteToL3(CacheNode* n, int swa_from_page, bool through) {
  if (l3_ == nullptr || n == root_.get()) return 0;
  // Its L1 pages are still being copied in (an asynchronous load-back):
  // written on a later hit or when it leaves the tree.
  if (n->load_generation != 0 && loading_.contains(n->load_generation)) return 0;
  KvPools& pools = PoolsOf(n);
  auto put = [&](const PagePool& pool, const std::vector<PageId>& pages, uint64_t layout,
                 int from) { return PutPages(pool, n->hashes, pages, layout, from, n->pages()); };
  int64_t full_written = 0;
  if (!n->l3_full) {
    full_written = put(pools.full(), n->full, l3_layouts_.full, 0);
    n->l3_full = true;
    stats_.l3_written_pages.fetch_add(full_written, std::memory_order_relaxed);
    if (through) stats_.l3_write_through_pages.fetch_add(full_written, std::memory_order_relaxed);
  }
  const int from = std::max(0, swa_from_page - n->start_page);
  if (!n->tombstone() && !n->l3_swa && from < n->pages()) {
    const int64_t written = put(pools.swa(), n->swa, l3_layouts_.swa, from);
    n->l3_swa = true;
    stats_.l3_written_swa_pages.fetch_add(written, std::memory_order_relaxed);
  }
  return full_written;
}

void PrefixCache::CountHit(CacheNode* end, int hit_end_page) {
  if (l3_ == nullptr || l3_write_through_hits_ <= 0) return;
  const int swa_from = WindowFirstPage(hit_end_page, page_size_, window_);
  std::vector<CacheNode*> path;
  for (CacheNode* n = end; n != root_.get(); n = n->parent) path.push_back(n);
  // Root first: a write-behind store that drops puts when its queue is
  // full (AsyncPageStore) then keeps the path's head, and a fetch, which
  // reads from the first page on and stops at the first missing one, still
  // finds the longest prefix it could.
  // A node the store has no room for now (a full write-behind queue) is
  // not written, nor any below it: a later hit writes them, instead of
  // puts that would be dropped.
  bool room = true;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    CacheNode* n = *it;
    if (n->hits < UINT32_MAX) ++n->hits;
    if (!room || n->hits < static_cast<uint32_t>(l3_write_through_hits_)) continue;
    const int swa_from_page = n == end || n->end_page() > swa_from ? swa_from : n->end_page();
    if (L3WriteBytes(n, swa_from_page, n->pages()) > l3_->PutRoom()) {
      room = false;
      continue;
    }
    WriteToL3(n, swa_from_page, true);
  }
}

int64_t PrefixCache::L3WriteBytes(const CacheNode* n, int swa_from_page, int pages) const {
  const KvPools& pools = PoolsOf(n);
  const int64_t fpb = pools.full().base() != nullptr ? pools.full().page_bytes() : 0;
  const int64_t spb = pools.swa().base() != nullptr ? pools.swa().page_bytes() : 0;
  int64_t b = n->l3_full ? 0 : pages * fpb;
  if (!n->tombstone() && !n->l3_swa) {
    b += std::max(0, pages - std::max(0, swa_from_page - n->start_page)) * spb;
  }
  return b;
}

bool PrefixCache::WritePathToL3(absl::Span<const uint64_t> path, int64_t* written) {
  const int swa_from = WindowFirstPage(static_cast<int>(path.size()), page_size_, window_);
  CacheNode* node = root_.get();
  size_t pos = 0;
  while (pos < path.size()) {
    auto it = node->children.find(path[pos]);
    if (it == node->children.end()) return true;  // the rest left the tree
    CacheNode* n = it->second.get();
    const int k = CommonPages(n, path, pos);
    const int end = n->start_page + k;
    const int swa_from_page = end > swa_from ? swa_from : end;
    const bool swa_to_write =
        !n->tombstone() && !n->l3_swa && k > std::max(0, swa_from_page - n->start_page);
    if (n->l3_full && !swa_to_write) {  // its part of the path is written
      if (k < n->pages()) return true;
      pos += k;
      node = n;
      continue;
    }
    if (k < n->pages()) n = Split(n, k);  // the path ends (or the tree's diverges) in it
    const int64_t room = l3_->PutRoom();
    if (L3WriteBytes(n, swa_from_page, n->pages()) > room) {
      // Write the pages that fit now (a node of their own); the rest later.
      int fit = 0;
      while (fit + 1 < n->pages() && L3WriteBytes(n, swa_from_page, fit + 1) <= room) ++fit;
      if (fit == 0) return false;
      n = Split(n, fit);
    }
    *written += WriteToL3(n, swa_from_page, true);
    if (!n->l3_full) return false;  // a load-back still copies into it: later
    pos += n->pages();
    node = n;
  }
  return true;
}

void PrefixCache::QueueL3Path(absl::Span<const uint64_t> path) {
  if (path.empty()) return;
  // A longer path of the same prompt supersedes its shorter pending one.
  if (!l3_pending_paths_.empty() && l3_pending_paths_.back().size() <= path.size() &&
      std::equal(l3_pending_paths_.back().begin(), l3_pending_paths_.back().end(), path.begin())) {
    l3_pending_paths_.pop_back();
  }
  l3_pending_paths_.emplace_back(path.begin(), path.end());
  if (l3_pending_paths_.size() > kMaxPendingL3Paths) l3_pending_paths_.pop_front();
  ContinueL3Writes();
}

void PrefixCache::WriteThroughToL3(absl::Span<const uint64_t> page_hashes) {
  if (l3_ != nullptr) QueueL3Path(page_hashes);
}

int64_t PrefixCache::PutPages(const PagePool& pool, absl::Span<const uint64_t> hashes,
                              absl::Span<const PageId> pages, uint64_t layout, int from,
                              int to) {
  int64_t written = 0;
  for (int i = from; i < to; ++i) {
    if (l3_->Put(PageKey{hashes[i], layout}, PageBytes(pool, pages[i])).ok()) {
      ++written;
    } else {
      stats_.l3_write_errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return written;
}

PrefixCache::L3Checkpoint PrefixCache::CheckpointToL3(absl::Span<const uint64_t> page_hashes,
                                                      absl::Span<const PageId> full_pages,
                                                      absl::Span<const PageId> swa_pages,
                                                      int from_page, int to_page) {
  from_page = std::max(0, from_page);
  L3Checkpoint out{.full_to_page = from_page};
  if (l3_ == nullptr) return out;
  to_page = std::min({to_page, static_cast<int>(page_hashes.size()),
                      static_cast<int>(full_pages.size())});
  if (from_page >= to_page) return out;
  // The window ending at to_page, when every page of it is still held.
  int swa_from = WindowFirstPage(to_page, page_size_, window_);
  for (int p = swa_from; p < to_page; ++p) {
    if (p >= static_cast<int>(swa_pages.size()) || swa_pages[p] == kNoPage) {
      swa_from = to_page;  // full KV only
      break;
    }
  }
  const PagePool& full = pools_->full();
  const PagePool& swa = pools_->swa();
  const int64_t fpb = full.base() != nullptr ? full.page_bytes() : 0;
  const int64_t spb = swa.base() != nullptr ? swa.page_bytes() : 0;
  int64_t room = l3_->PutRoom();
  // Whole full pages that fit, root side first (a fetch stops at the first
  // missing page).
  int full_to = to_page;
  if (fpb > 0) {
    full_to = from_page + static_cast<int>(std::min<int64_t>(to_page - from_page, room / fpb));
  }
  const int64_t written = PutPages(full, page_hashes, full_pages, l3_layouts_.full, from_page,
                                   full_to);
  room -= int64_t{full_to - from_page} * fpb;
  int64_t written_swa = 0;
  out.full_to_page = full_to;
  if (full_to == to_page && swa_from < to_page && int64_t{to_page - swa_from} * spb <= room) {
    written_swa = PutPages(swa, page_hashes, swa_pages, l3_layouts_.swa, swa_from, to_page);
    out.window = true;
  }
  stats_.l3_written_pages.fetch_add(written, std::memory_order_relaxed);
  stats_.l3_written_swa_pages.fetch_add(written_swa, std::memory_order_relaxed);
  stats_.l3_checkpoint_pages.fetch_add(written, std::memory_order_relaxed);
  return out;
}

void PrefixCache::MarkFullKvInL3(absl::Span<const uint64_t> page_hashes, int from_page,
                                 int to_page) {
  if (l3_ == nullptr) return;
  page_hashes = page_hashes.first(std::min<size_t>(page_hashes.size(), std::max(0, to_page)));
  CacheNode* node = root_.get();
  size_t pos = 0;
  while (pos < page_hashes.size()) {
    auto it = node->children.find(page_hashes[pos]);
    if (it == node->children.end()) return;
    CacheNode* n = it->second.get();
    const int k = CommonPages(n, page_hashes, pos);
    if (k < n->pages() && pos + k < page_hashes.size()) return;  // diverges
    if (n->end_page() > from_page && !n->l3_full) {
      // Split where the range starts and ends (a node is one L3 state).
      if (n->start_page < from_page) {
        Split(n, from_page - n->start_page);  // n keeps [from_page, end)
        continue;  // n is now the child found at the same position
      }
      if (k < n->pages()) n = Split(n, k);  // the part inside the range
      n->l3_full = true;
    }
    pos += static_cast<size_t>(n->pages());
    node = n;
  }
}

void PrefixCache::ContinueL3Writes() {
  while (!l3_pending_paths_.empty()) {
    int64_t written = 0;
    const bool done = WritePathToL3(l3_pending_paths_.front(), &written);
    stats_.l3_write_through_bound_pages.fetch_add(written, std::memory_order_relaxed);
    if (!done) return;
    l3_pending_paths_.pop_front();
  }
}

void PrefixCache::HealFromL3(const std::vector<CacheNode*>& path, const L3Fetch& fetch,
                             int heal_to) {
  const size_t spb = pools_->swa().page_bytes();
  for (CacheNode* n : path) {
    const int a = std::max(n->start_page, fetch.swa_first);
    const int b = std::min(n->end_page(), heal_to);
    if (a >= b || !n->tombstone()) continue;
    if (a > n->start_page) Split(n, a - n->start_page);  // n: [a, end)
    CacheNode* target = b < n->end_page() ? Split(n, b - a) : n;  // [a, b)
    KvPools& pools = PoolsOf(target);
    std::vector<PageId> swa;
    // Only free SWA pages: evicting other windows for this one could take
    // nodes of this very path.
    if (!pools.swa().Reserve(b - a, &swa)) return;
    pools.swa().Commit(swa);
    pools.swa().ToCache(swa);
    for (int p = a; p < b; ++p) {
      uint8_t* dst = pools.swa().PageData(swa[p - a]);
      const size_t src = static_cast<size_t>(p - fetch.swa_first) * spb;
      if (dst != nullptr && src + spb <= fetch.swa_bytes.size()) {
        std::memcpy(dst, fetch.swa_bytes.data() + src, spb);
      }
    }
    Unindex(target);
    target->swa = std::move(swa);
    target->swa_tick = tick_;
    target->l3_swa = true;
    cached_swa_[target->tier] += b - a;
    stats_.healed_pages.fetch_add(b - a, std::memory_order_relaxed);
    stats_.l3_healed_swa_pages.fetch_add(b - a, std::memory_order_relaxed);
    stats_.tombstone_nodes.fetch_sub(1, std::memory_order_relaxed);
    Emit(CacheEvent::Type::kSwaStored, target, 0, target->pages());
    Reindex(target);
  }
}

int PrefixCache::AttachFromL3(absl::Span<const uint64_t> page_hashes, const L3Fetch& fetch) {
  if (l3_ == nullptr || l2_ == nullptr || fetch.empty()) return 0;
  const int base = fetch.hash_base();
  const int end = fetch.end;
  if (end > static_cast<int>(page_hashes.size()) ||
      static_cast<int>(fetch.hashes.size()) != end - base) {
    return 0;
  }
  for (int i = base; i < end; ++i) {
    if (fetch.hashes[i - base] != page_hashes[i]) return 0;  // not this prompt's
  }
  // Where the tree's match (any tier) ends now, and the nodes on the way.
  std::vector<CacheNode*> path;
  CacheNode* node = root_.get();
  size_t pos = 0;
  CacheNode* partial = nullptr;  // the match ends inside this node
  int partial_k = 0;
  while (pos < static_cast<size_t>(end)) {
    auto it = node->children.find(page_hashes[pos]);
    if (it == node->children.end()) break;
    CacheNode* child = it->second.get();
    const int k = CommonPages(child, page_hashes, pos);
    pos += k;
    if (k < child->pages()) {
      partial = child;
      partial_k = k;
      break;
    }
    path.push_back(child);
    node = child;
  }
  const int d = static_cast<int>(pos);
  ++tick_;
  // 1. The fetched window's SWA KV heals tombstones of the tree's own match.
  if (partial != nullptr && fetch.swa_first < d) {
    node = Split(partial, partial_k);  // the match's end becomes a boundary
    path.push_back(node);
    partial = nullptr;
  }
  if (fetch.swa_first < std::min(d, end)) HealFromL3(path, fetch, std::min(d, end));
  // 2. Pages past the match become new L2 nodes: [tombstone | live window].
  if (d < fetch.full_first || d >= end) return 0;
  if (partial != nullptr) node = Split(partial, partial_k);  // a divergence point
  const int swa_start = std::max(d, fetch.swa_first);  // live from here
  const bool has_live = swa_start < end;
  // A run without SWA KV at its end is a tombstone leaf: worth something
  // only where tombstones are kept (window restore) or no window is read.
  if (!has_live && !keep_tombstones_ && window_ > 1) return 0;
  const int64_t full_n = end - d;
  const int64_t swa_n = has_live ? end - swa_start : 0;
  // Lock the path while L2 makes room, so eviction cannot take it.
  for (CacheNode* n = node; n != root_.get(); n = n->parent) {
    ++n->full_lock;
    Reindex(n);
  }
  EvictResult ignored;
  EvictL2(full_n, swa_n, &ignored);
  std::vector<PageId> full_dst, swa_dst;
  bool fits = l2_->full().Reserve(full_n, &full_dst);
  if (fits && swa_n > 0 && !l2_->swa().Reserve(swa_n, &swa_dst)) {
    l2_->full().Unreserve(full_dst);
    fits = false;
  }
  for (CacheNode* n = node; n != root_.get(); n = n->parent) {
    --n->full_lock;
    Reindex(n);
  }
  if (!fits) return 0;
  for (auto [pool, pages] : {std::pair{&l2_->full(), &full_dst}, std::pair{&l2_->swa(), &swa_dst}}) {
    if (pages->empty()) continue;
    pool->Commit(*pages);
    pool->ToCache(*pages);
  }
  // Copy the bytes in (metadata-only pools: nothing to copy).
  const size_t fpb = l2_->full().page_bytes();
  const size_t spb = l2_->swa().page_bytes();
  for (int p = d; p < end; ++p) {
    uint8_t* dst = l2_->full().PageData(full_dst[p - d]);
    const size_t src = static_cast<size_t>(p - fetch.full_first) * fpb;
    if (dst != nullptr && src + fpb <= fetch.full_bytes.size()) {
      std::memcpy(dst, fetch.full_bytes.data() + src, fpb);
    }
  }
  for (int p = swa_start; p < end && swa_n > 0; ++p) {
    uint8_t* dst = l2_->swa().PageData(swa_dst[p - swa_start]);
    const size_t src = static_cast<size_t>(p - fetch.swa_first) * spb;
    if (dst != nullptr && src + spb <= fetch.swa_bytes.size()) {
      std::memcpy(dst, fetch.swa_bytes.data() + src, spb);
    }
  }
  auto add = [&](int from, int to, bool live) {
    CacheNode* c = NewNode(node);
    c->start_page = node == root_.get() ? 0 : node->end_page();
    c->hashes.assign(page_hashes.begin() + from, page_hashes.begin() + to);
    c->full.assign(full_dst.begin() + (from - d), full_dst.begin() + (to - d));
    cached_full_[1] += to - from;
    if (live) {
      c->swa.assign(swa_dst.begin() + (from - swa_start), swa_dst.begin() + (to - swa_start));
      cached_swa_[1] += to - from;
    } else {
      stats_.tombstone_nodes.fetch_add(1, std::memory_order_relaxed);
    }
    c->tier = 1;
    c->l3_full = true;
    c->l3_swa = true;
    c->full_tick = tick_;
    c->swa_tick = tick_;
    node->children.emplace(c->hashes[0], std::unique_ptr<CacheNode>(c));
    Emit(CacheEvent::Type::kStored, c, 0, c->pages());
    if (!live) Emit(CacheEvent::Type::kSwaRemoved, c, 0, c->pages());
    Emit(CacheEvent::Type::kTierChanged, c, 0, c->pages(), 1);
    Reindex(node);
    Reindex(c);
    node = c;
  };
  const int live_from = has_live ? swa_start : end;
  if (live_from > d) add(d, live_from, false);
  if (live_from < end) add(live_from, end, true);
  stats_.l3_attached_pages.fetch_add(full_n, std::memory_order_relaxed);
  stats_.l3_attached_swa_pages.fetch_add(swa_n, std::memory_order_relaxed);
  return static_cast<int>(full_n);
}

}  // namespace swaserve::kv
