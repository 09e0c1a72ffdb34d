#include "lib/kv/prefix_cache.h"

#include "lib/kv/prefix_cache_node.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace swaserve::kv {


CacheHit& CacheHit::operator=(CacheHit&& other) noexcept {
  page_size_ = other.page_size_;
  matched_tokens_ = other.matched_tokens_;
  window_safe_tokens_ = other.window_safe_tokens_;
  full_pages_ = std::move(other.full_pages_);
  swa_pages_ = std::move(other.swa_pages_);
  swa_first_page_ = other.swa_first_page_;
  node_ = other.node_;
  swa_node_ = other.swa_node_;
  swa_locked_tokens_ = other.swa_locked_tokens_;
  other.full_pages_.clear();
  other.swa_pages_.clear();
  other.node_ = nullptr;
  other.swa_node_ = nullptr;
  other.swa_locked_tokens_ = 0;
  other.matched_tokens_ = 0;
  other.window_safe_tokens_ = 0;
  other.swa_first_page_ = 0;
  return *this;
}

absl::StatusOr<std::unique_ptr<PrefixCache>> PrefixCache::Create(
    const PrefixCacheOptions& options) {
  if (options.pools == nullptr) {
    return absl::InvalidArgumentError("PrefixCache needs pools");
  }
  if (options.l2 != nullptr) {
    const KvShape& a = options.pools->shape();
    const KvShape& b = options.l2->shape();
    if (a.page_size != b.page_size || a.sliding_window != b.sliding_window ||
        options.pools->full().page_bytes() != options.l2->full().page_bytes() ||
        options.pools->swa().page_bytes() != options.l2->swa().page_bytes()) {
      return absl::InvalidArgumentError("PrefixCache: the L2 pools must have the L1 pools' shape");
    }
  }
  if (options.l3 != nullptr && options.l2 == nullptr) {
    return absl::InvalidArgumentError("PrefixCache: an L3 store needs an L2 (pages come back through it)");
  }
  return std::unique_ptr<PrefixCache>(new PrefixCache(options));
}

PrefixCache::PrefixCache(const PrefixCacheOptions& options)
    : pools_(options.pools),
      l2_(options.l2),
      l3_(options.l3),
      l3_layouts_(L3Layouts::For(options.pools->shape(), options.l3_model_identity)),
      l3_write_through_hits_(options.l3_write_through_hits),
      l3_write_through_from_pages_(
          options.l3_write_through_from_tokens <= 0
              ? 0
              : (options.l3_write_through_from_tokens + options.pools->shape().page_size - 1) /
                    options.pools->shape().page_size),
      page_size_(options.pools->shape().page_size),
      window_(options.pools->shape().sliding_window),
      keep_tombstones_(options.keep_restorable_tombstones),
      cold_superseded_(options.cold_superseded_windows),
      on_event_(options.on_event),
      root_(std::make_unique<CacheNode>()) {
  root_->id = next_id_++;
  event_anchor_page_ = std::max(0, options.event_anchor_page);
}

PrefixCache::~PrefixCache() {
  // Free every cached page; iterative to bound stack depth.
  std::vector<CacheNode*> stack = {root_.get()};
  while (!stack.empty()) {
    CacheNode* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) {
      KvPools& pools = PoolsOf(n);
      pools.full().Free(n->full);
      if (!n->swa.empty()) pools.swa().Free(n->swa);
    }
    for (auto& [h, child] : n->children) stack.push_back(child.get());
  }
  // Destroy children iteratively too (deep trees).
  std::vector<std::unique_ptr<CacheNode>> owned;
  for (auto& [h, c] : root_->children) owned.push_back(std::move(c));
  root_->children.clear();
  while (!owned.empty()) {
    std::unique_ptr<CacheNode> n = std::move(owned.back());
    owned.pop_back();
    for (auto& [h, c] : n->children) owned.push_back(std::move(c));
    n->children.clear();
  }
}

bool PrefixCache::FullEvictable(const CacheNode* n) const {
  // No child in its own tier (children are in the same or a lower tier).
  const bool bottom = n->tier == 0 ? n->l1_children == 0 : n->leaf();
  return n != root_.get() && bottom && n->full_lock == 0;
}

bool PrefixCache::SwaEvictable(const CacheNode* n) const {
  // Unlocked leaves are deleted, every other node without a SWA lock is
  // tombstoned (a full-locked leaf then waits, as a locked tombstone leaf, for
  // its request to unlock it).
  // A node an asynchronous load-back is still copying into keeps its SWA
  // pages (tombstoning would free pages the copies write).
  return n != root_.get() && !n->tombstone() && n->swa_lock == 0 &&
         (n->load_generation == 0 || !loading_.contains(n->load_generation));
}

void PrefixCache::Unindex(CacheNode* n) {
  if (n->in_full_lru) {
    full_lru_[n->key_tier].erase({LruKey{n->full_key_tick, n->key_depth, n->id}, n});
    n->in_full_lru = false;
  }
  if (n->in_swa_lru) {
    swa_lru_[n->key_tier].erase({LruKey{n->swa_key_tick, n->key_depth, n->id}, n});
    n->in_swa_lru = false;
  }
}

void PrefixCache::Reindex(CacheNode* n) {
  if (n == root_.get()) return;
  Unindex(n);
  n->key_depth = n->start_page;
  n->key_tier = n->tier;
  if (FullEvictable(n)) {
    n->full_key_tick = n->full_tick;
    full_lru_[n->tier].insert({LruKey{n->full_tick, n->key_depth, n->id}, n});
    n->in_full_lru = true;
  }
  if (SwaEvictable(n)) {
    n->swa_key_tick = n->swa_tick;
    swa_lru_[n->tier].insert({LruKey{n->swa_tick, n->key_depth, n->id}, n});
    n->in_swa_lru = true;
  }
}

CacheNode* PrefixCache::NewNode(CacheNode* parent) {
  auto node = std::make_unique<CacheNode>();
  node->parent = parent;
  node->id = next_id_++;
  CacheNode* raw = node.get();
  (void)node.release();
  stats_.nodes.fetch_add(1, std::memory_order_relaxed);
  return raw;
}

CacheNode* PrefixCache::Split(CacheNode* node, int pages) {
  CacheNode* parent = node->parent;
  auto it = parent->children.find(node->hashes[0]);
  std::unique_ptr<CacheNode> owned = std::move(it->second);
  CacheNode* prefix = NewNode(parent);
  prefix->hashes.assign(node->hashes.begin(), node->hashes.begin() + pages);
  prefix->full.assign(node->full.begin(), node->full.begin() + pages);
  if (!node->tombstone()) {
    prefix->swa.assign(node->swa.begin(), node->swa.begin() + pages);
    node->swa.erase(node->swa.begin(), node->swa.begin() + pages);
  } else {
    stats_.tombstone_nodes.fetch_add(1, std::memory_order_relaxed);
  }
  node->hashes.erase(node->hashes.begin(), node->hashes.begin() + pages);
  node->full.erase(node->full.begin(), node->full.begin() + pages);
  prefix->start_page = node->start_page;
  node->start_page += pages;
  prefix->tier = node->tier;
  prefix->l3_full = node->l3_full;
  prefix->l3_swa = node->l3_swa;
  prefix->hits = node->hits;
  prefix->load_generation = node->load_generation;
  prefix->l1_children = node->tier == 0 ? 1 : 0;
  prefix->full_lock = node->full_lock;
  prefix->swa_lock = node->swa_lock;
  prefix->full_tick = node->full_tick;
  prefix->swa_tick = node->swa_tick;
  node->parent = prefix;
  it->second.reset(prefix);
  prefix->children.emplace(node->hashes[0], std::move(owned));
  Reindex(prefix);
  Reindex(node);
  return prefix;
}

void PrefixCache::Emit(CacheEvent::Type type, const CacheNode* node,
                       int first_page, int num_pages, uint8_t tier) {
  if (!on_event_ || num_pages <= 0) return;
  CacheEvent e{.type = type,
               .hashes = std::vector<uint64_t>(node->hashes.begin() + first_page,
                                               node->hashes.begin() + first_page + num_pages),
               .tier = tier,
               .depth = node->start_page + first_page};
  if (first_page > 0) {
    e.parent = node->hashes[first_page - 1];
  } else if (node->parent != nullptr && node->parent != root_.get()) {
    e.parent = node->parent->hashes.back();
  }
  const int k = event_anchor_page_;
  if (k > 0 && node->end_page() > k) {
    const CacheNode* n = node;
    while (n->start_page > k) n = n->parent;
    e.anchor = n->hashes[k - n->start_page];
  }
  on_event_(e);
}

void PrefixCache::DeleteLeaf(CacheNode* node, EvictResult* result) {
  while (true) {
    CacheNode* parent = node->parent;
    // Write-back: the leaf's full KV and its trailing window's SWA KV.
    if (l3_ != nullptr) {
      WriteToL3(node, WindowFirstPage(node->end_page(), page_size_, window_), false);
    }
    Unindex(node);
    KvPools& pools = PoolsOf(node);
    const int t = node->tier;
    // EvictResult counts L1 pages (what L1 allocations can use).
    const int64_t l1 = t == 0 ? node->pages() : 0;
    pools.full().Free(node->full);
    cached_full_[t] -= node->pages();
    result->full_pages_freed += l1;
    stats_.evicted_full_pages.fetch_add(node->pages(), std::memory_order_relaxed);
    if (t == 1) stats_.l2_evicted_full_pages.fetch_add(node->pages(), std::memory_order_relaxed);
    if (!node->tombstone()) {
      pools.swa().Free(node->swa);
      cached_swa_[t] -= node->pages();
      result->swa_pages_freed += l1;
      stats_.evicted_swa_pages.fetch_add(node->pages(), std::memory_order_relaxed);
    } else {
      stats_.tombstone_nodes.fetch_sub(1, std::memory_order_relaxed);
    }
    Emit(CacheEvent::Type::kRemoved, node, 0, node->pages());
    stats_.nodes.fetch_sub(1, std::memory_order_relaxed);
    if (t == 0) --parent->l1_children;
    parent->children.erase(node->hashes[0]);  // destroys node
    if (parent == root_.get()) return;
    Reindex(parent);
    // Leaves are never tombstones: an unlocked tombstone parent left without
    // children goes too (unless tombstones are kept for restore).
    if (!keep_tombstones_ && parent->leaf() && parent->tombstone() &&
        parent->full_lock == 0) {
      node = parent;
      continue;
    }
    return;
  }
}

void PrefixCache::Tombstone(CacheNode* node, EvictResult* result) {
  PoolsOf(node).swa().Free(node->swa);
  cached_swa_[node->tier] -= node->pages();
  if (node->tier == 0) result->swa_pages_freed += node->pages();
  stats_.evicted_swa_pages.fetch_add(node->pages(), std::memory_order_relaxed);
  stats_.tombstoned_nodes.fetch_add(1, std::memory_order_relaxed);
  stats_.tombstone_nodes.fetch_add(1, std::memory_order_relaxed);
  node->swa.clear();
  Emit(CacheEvent::Type::kSwaRemoved, node, 0, node->pages());
  Reindex(node);
}

MatchLengths PrefixCache::Match(absl::Span<const uint64_t> page_hashes,
                                int max_tokens) const {
  MatchLengths out;
  page_hashes = page_hashes.subspan(
      0, std::min<size_t>(page_hashes.size(),
                          std::max(0, max_tokens) / static_cast<size_t>(page_size_)));
  const CacheNode* node = root_.get();
  size_t pos = 0;
  int live_start = 0;  // first page of the current run of live SWA pages
  int safe = 0;
  while (pos < page_hashes.size()) {
    auto it = node->children.find(page_hashes[pos]);
    if (it == node->children.end()) break;
    const CacheNode* child = it->second.get();
    if (child->tier != 0) {
      // The rest of the match is in L2 (tiers only grow down the path).
      size_t lower = pos;
      while (lower < page_hashes.size()) {
        const int k = CommonPages(child, page_hashes, lower);
        lower += k;
        if (k < child->pages() || lower == page_hashes.size()) break;
        auto next = child->children.find(page_hashes[lower]);
        if (next == child->children.end()) break;
        child = next->second.get();
      }
      out.lower_tier_tokens = static_cast<int>(lower - pos) * page_size_;
      break;
    }
    const int k = CommonPages(child, page_hashes, pos);
    const int end = static_cast<int>(pos) + k;
    if (child->tombstone()) {
      if (window_ <= 1) safe = end;  // nothing before the query is read
      live_start = child->end_page();
    } else {
      const int64_t need_from =
          std::max<int64_t>(0, int64_t{end} * page_size_ - (window_ - 1));
      if (need_from >= int64_t{live_start} * page_size_) safe = end;
    }
    pos = end;
    if (k < child->pages()) break;
    node = child;
  }
  out.matched_tokens = static_cast<int>(pos) * page_size_;
  out.safe_tokens = safe * page_size_;
  return out;
}

CacheHit PrefixCache::MatchAndLock(absl::Span<const uint64_t> page_hashes,
                                   const MatchOptions& options) {
  CacheHit hit;
  hit.page_size_ = page_size_;
  const size_t limit = std::min<size_t>(
      page_hashes.size(), std::max(0, options.max_tokens) / static_cast<size_t>(page_size_));
  page_hashes = page_hashes.subspan(0, limit);
  stats_.lookups.fetch_add(1, std::memory_order_relaxed);
  stats_.lookup_tokens.fetch_add(static_cast<int64_t>(limit) * page_size_,
                                 std::memory_order_relaxed);

  // Walk, remembering the deepest window-safe end (node + pages into it).
  CacheNode* node = root_.get();
  size_t pos = 0;
  int live_start = 0;
  int safe = 0;
  CacheNode* safe_node = nullptr;
  int safe_k = 0;
  CacheNode* full_node = nullptr;  // where the full-KV match ends
  int full_k = 0;
  while (pos < page_hashes.size()) {
    auto it = node->children.find(page_hashes[pos]);
    if (it == node->children.end() || it->second->tier != 0) break;  // L1 only
    CacheNode* child = it->second.get();
    const int k = CommonPages(child, page_hashes, pos);
    const int end = static_cast<int>(pos) + k;
    full_node = child;
    full_k = k;
    bool is_safe = false;
    if (child->tombstone()) {
      is_safe = window_ <= 1;
      live_start = child->end_page();
    } else {
      const int64_t need_from =
          std::max<int64_t>(0, int64_t{end} * page_size_ - (window_ - 1));
      is_safe = need_from >= int64_t{live_start} * page_size_;
    }
    if (is_safe) {
      safe = end;
      safe_node = child;
      safe_k = k;
    }
    pos = end;
    if (k < child->pages()) break;
    node = child;
  }
  hit.matched_tokens_ = static_cast<int>(pos) * page_size_;
  hit.window_safe_tokens_ = safe * page_size_;
  stats_.window_lost_tokens.fetch_add(int64_t{static_cast<int>(pos) - safe} * page_size_,
                                      std::memory_order_relaxed);
  if (options.full_kv && static_cast<int>(pos) > safe) {
    // Counted like any lookup: `safe` window-safe tokens, the rest lost to
    // the window-safe rule (the caller's restore recovers part of it).
    stats_.hit_tokens.fetch_add(int64_t{safe} * page_size_, std::memory_order_relaxed);
    LockFullKv(hit, full_node, full_k);
    if (options.lock_safe_window && safe > 0 && window_ > 1) {
      // safe_node ends at `safe` (the walk went on past it: pos > safe), an
      // ancestor of the full-KV hit's end.
      LockSafeWindow(hit, safe_node, safe);
    }
    return hit;
  }
  if (safe == 0) return hit;
  stats_.hit_tokens.fetch_add(int64_t{safe} * page_size_, std::memory_order_relaxed);

  // The hit must end on a node boundary.
  CacheNode* end_node = safe_node;
  if (safe_k < end_node->pages()) end_node = Split(end_node, safe_k);

  // SWA window: pages [swa_first, safe). Make its start a node boundary.
  const int swa_first = window_ <= 1 ? safe : SplitAtWindowStart(end_node, safe);
  const int swa_pages = safe - swa_first;
  hit.swa_first_page_ = swa_first;

  // Collect pages root -> end, refresh recency, lock.
  std::vector<CacheNode*> path;
  for (CacheNode* n = end_node; n != root_.get(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  ++tick_;
  hit.full_pages_.reserve(safe);
  hit.swa_pages_.reserve(swa_pages);
  for (CacheNode* n : path) {
    hit.full_pages_.insert(hit.full_pages_.end(), n->full.begin(), n->full.end());
    n->full_tick = tick_;
    if (n->start_page >= swa_first && swa_pages > 0) {
      hit.swa_pages_.insert(hit.swa_pages_.end(), n->swa.begin(), n->swa.end());
      n->swa_tick = tick_;
    }
  }
  hit.node_ = end_node;
  hit.swa_node_ = end_node;
  hit.swa_locked_tokens_ = swa_pages * page_size_;
  LockPath(end_node, swa_pages);
  CountHit(end_node, safe);
  return hit;
}

void PrefixCache::LockFullKv(CacheHit& hit, CacheNode* end_node, int k) {
  // The hit ends where the full-KV match does; no SWA page is locked (the
  // caller restores the window). Recency: full KV only.
  if (k < end_node->pages()) end_node = Split(end_node, k);
  std::vector<CacheNode*> path;
  for (CacheNode* n = end_node; n != root_.get(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  ++tick_;
  for (CacheNode* n : path) {
    hit.full_pages_.insert(hit.full_pages_.end(), n->full.begin(), n->full.end());
    n->full_tick = tick_;
  }
  hit.swa_first_page_ = static_cast<int>(hit.full_pages_.size());
  hit.node_ = end_node;
  hit.swa_node_ = end_node;
  hit.swa_locked_tokens_ = 0;
  LockPath(end_node, 0);
}

void PrefixCache::CoolWindow(CacheNode* end, int keep_hot_from,
                             absl::Span<const PageId> incoming_swa) {
  const int swa_first = WindowFirstPage(end->end_page(), page_size_, window_);
  for (CacheNode* n = end; n != root_.get() && n->end_page() > swa_first; n = n->parent) {
    if (n->tombstone() || n->swa_tick < kHotTicks) continue;
    bool hot = false;
    for (int p = std::max(n->start_page, keep_hot_from); p < n->end_page() && !hot; ++p) {
      hot = incoming_swa[p] != kNoPage;
    }
    if (hot) continue;
    n->swa_tick = ++cold_tick_;
    Reindex(n);
    stats_.cooled_swa_pages.fetch_add(n->pages(), std::memory_order_relaxed);
  }
}

int PrefixCache::SplitAtWindowStart(CacheNode* end_node, int end_page) {
  const int swa_first = WindowFirstPage(end_page, page_size_, window_);
  if (end_page > swa_first) {
    CacheNode* n = end_node;
    while (n->start_page > swa_first) n = n->parent;
    if (n->start_page < swa_first) Split(n, swa_first - n->start_page);
  }
  return swa_first;
}

void PrefixCache::LockSafeWindow(CacheHit& hit, CacheNode* safe_node, int safe) {
  // Split() keeps the node it splits as the tail: safe_node and the hit's
  // end stay valid.
  const int swa_first = SplitAtWindowStart(safe_node, safe);
  std::vector<CacheNode*> window;  // safe_node up to the window's first node
  for (CacheNode* n = safe_node; n != root_.get() && n->start_page >= swa_first; n = n->parent) {
    window.push_back(n);
  }
  std::reverse(window.begin(), window.end());
  for (CacheNode* n : window) {
    hit.swa_pages_.insert(hit.swa_pages_.end(), n->swa.begin(), n->swa.end());
    n->swa_tick = tick_;
    ++n->swa_lock;
    Reindex(n);
  }
  hit.swa_first_page_ = swa_first;
  hit.swa_node_ = safe_node;
  hit.swa_locked_tokens_ = (safe - swa_first) * page_size_;
}

void PrefixCache::LockPath(CacheNode* end, int swa_pages) {
  for (CacheNode* n = end; n != root_.get(); n = n->parent) {
    ++n->full_lock;
    if (swa_pages > 0) {
      ++n->swa_lock;
      swa_pages -= n->pages();
    }
    Reindex(n);
  }
}

void PrefixCache::UnlockSwa(CacheNode* end, int swa_pages) {
  for (CacheNode* n = end; swa_pages > 0 && n != root_.get(); n = n->parent) {
    --n->swa_lock;
    swa_pages -= n->pages();
    Reindex(n);
  }
}

void PrefixCache::ReleaseSwa(CacheHit& hit) {
  if (hit.node_ == nullptr || hit.swa_locked_tokens_ == 0) return;
  UnlockSwa(hit.swa_node_, hit.swa_locked_tokens_ / page_size_);
  hit.swa_locked_tokens_ = 0;
  hit.swa_pages_.clear();
  hit.swa_first_page_ = static_cast<int>(hit.full_pages_.size());
}

void PrefixCache::Unlock(CacheHit& hit) {
  if (hit.node_ == nullptr) return;
  ReleaseSwa(hit);
  for (CacheNode* n = hit.node_; n != root_.get(); n = n->parent) {
    --n->full_lock;
    Reindex(n);
  }
  // The hit's end may have become a childless tombstone while it was locked
  // (its SWA evicted after ReleaseSwa, then its children evicted): it goes
  // now, cascading to tombstone ancestors left childless and unlocked.
  CacheNode* end = hit.node_;
  if (!keep_tombstones_ && end->tombstone() && end->leaf() && end->full_lock == 0) {
    EvictResult ignored;
    DeleteLeaf(end, &ignored);
  }
  hit = CacheHit();
}

void PrefixCache::Insert(absl::Span<const uint64_t> page_hashes,
                         absl::Span<const PageId> full_pages,
                         absl::Span<const PageId> swa_pages,
                         absl::Span<const uint8_t> swa_cold, int l3_written_from_page,
                         int l3_written_to_page) {
  const int n = static_cast<int>(page_hashes.size());
  if (static_cast<int>(full_pages.size()) != n ||
      static_cast<int>(swa_pages.size()) != n ||
      (!swa_cold.empty() && static_cast<int>(swa_cold.size()) != n)) {
    std::fprintf(stderr, "PrefixCache::Insert: %d hashes, %zu full, %zu swa pages, %zu cold flags\n",
                 n, full_pages.size(), swa_pages.size(), swa_cold.size());
    std::abort();
  }
  PagePool& full_pool = pools_->full();
  PagePool& swa_pool = pools_->swa();
  // Incoming pages the caller owns privately are ours to adopt or free.
  auto release_full = [&](PageId p) {
    if (p != kNoPage && full_pool.state(p) == PageState::kInUse) {
      full_pool.Free({&p, 1});
      stats_.duplicate_pages.fetch_add(1, std::memory_order_relaxed);
    }
  };
  auto release_swa = [&](PageId p) {
    if (p != kNoPage && swa_pool.state(p) == PageState::kInUse) swa_pool.Free({&p, 1});
  };
  // Pages with SWA KV may form several runs (the trailing window, and a
  // window the request kept where its prefix diverged from the tree). Pages
  // after the last live one would make a tombstone leaf: they are dropped.
  int usable = n;
  while (usable > 0 && swa_pages[usable - 1] == kNoPage) --usable;
  auto live = [&](int i) { return swa_pages[i] != kNoPage; };
  auto cold = [&](int i) { return !swa_cold.empty() && swa_cold[i] != 0; };
  // Runs of SWA pages are split where liveness or coldness changes.
  auto same_run = [&](int i, int j) {
    return live(i) == live(j) && (!live(i) || cold(i) == cold(j));
  };
  // Recency of incoming SWA KV: cold pages rank below every hot one.
  auto swa_tick_for = [&](int i) { return cold(i) ? ++cold_tick_ : tick_; };

  ++tick_;
  CacheNode* node = root_.get();
  int pos = 0;
  while (pos < usable) {
    auto it = node->children.find(page_hashes[pos]);
    if (it == node->children.end()) {
      // Extending a leaf: its end's window is superseded by the new end's.
      if (cold_superseded_ && node != root_.get() && node->children.empty()) {
        // Pages of the inserting prompt's own trailing window stay hot; SWA
        // KV it brings elsewhere on the old window (the window a restore
        // rebuilt there) is superseded all the same.
        CoolWindow(node, WindowFirstPage(usable, page_size_, window_), swa_pages);
      }
      // New suffix: one node per run of equal liveness (ends live).
      auto add = [&](int from, int to, bool is_live) {
        CacheNode* c = NewNode(node);
        c->start_page = node == root_.get() ? 0 : node->end_page();
        c->hashes.assign(page_hashes.begin() + from, page_hashes.begin() + to);
        c->full.assign(full_pages.begin() + from, full_pages.begin() + to);
        full_pool.ToCache(c->full);
        cached_full_[0] += to - from;
        if (is_live) {
          c->swa.assign(swa_pages.begin() + from, swa_pages.begin() + to);
          swa_pool.ToCache(c->swa);
          cached_swa_[0] += to - from;
        } else {
          stats_.tombstone_nodes.fetch_add(1, std::memory_order_relaxed);
        }
        c->full_tick = tick_;
        c->swa_tick = is_live ? swa_tick_for(from) : tick_;
        node->children.emplace(c->hashes[0], std::unique_ptr<CacheNode>(c));
        ++node->l1_children;
        stats_.inserted_pages.fetch_add(to - from, std::memory_order_relaxed);
        Emit(CacheEvent::Type::kStored, c, 0, c->pages());
        // Stored without SWA KV: say so, so an index can tell these pages
        // cannot end a window-safe hit.
        if (!is_live) Emit(CacheEvent::Type::kSwaRemoved, c, 0, c->pages());
        Reindex(node);
        Reindex(c);
        node = c;
      };
      for (int from = pos; from < usable;) {
        int to = from + 1;
        while (to < usable && same_run(to, from)) ++to;
        add(from, to, live(from));
        from = to;
      }
      pos = usable;
      break;
    }
    CacheNode* child = it->second.get();
    int k = CommonPages(child, page_hashes, pos);
    if (k < child->pages()) child = Split(child, k);
    // An L2 node on the path takes the incoming (L1) pages instead: the
    // path from the root stays in L1 down to the new pages.
    if (child->tier != 0) AdoptIntoL1(child, full_pages.subspan(pos, k));
    // Full KV: the tree's pages win; incoming duplicates are freed.
    for (int i = 0; i < k; ++i) {
      if (full_pages[pos + i] != child->full[i]) release_full(full_pages[pos + i]);
    }
    int end = pos + k;
    int first_live = pos;
    while (first_live < end && !live(first_live)) ++first_live;
    if (child->tombstone() && first_live < end) {
      // Heal the first run of incoming SWA KV inside the tombstone: split so
      // that one node covers exactly that run (a later run is healed when
      // the walk reaches the rest of the node).
      int run_end = first_live + 1;
      while (run_end < end && same_run(run_end, first_live)) ++run_end;
      if (run_end < end) {
        child = Split(child, run_end - pos);  // child: [pos, run_end)
        end = run_end;
      }
      if (first_live > pos) {
        CacheNode* before = Split(child, first_live - pos);  // child: [first_live, end)
        before->full_tick = tick_;
        Reindex(before);
        pos = first_live;
      }
      child->swa.assign(swa_pages.begin() + pos, swa_pages.begin() + end);
      child->swa_tick = swa_tick_for(pos);
      swa_pool.ToCache(child->swa);
      cached_swa_[0] += end - pos;
      stats_.healed_pages.fetch_add(end - pos, std::memory_order_relaxed);
      stats_.tombstone_nodes.fetch_sub(1, std::memory_order_relaxed);
      Emit(CacheEvent::Type::kSwaStored, child, 0, child->pages());
      if (child->swa_lock > 0) {
        // Cannot happen: SWA locks sit on live nodes only.
        std::fprintf(stderr, "PrefixCache: SWA-locked tombstone\n");
        std::abort();
      }
    }
    child->full_tick = tick_;
    // A hot incoming window refreshes a live node's SWA recency; a cold one
    // never lowers it.
    if (!child->tombstone() && first_live < end && !cold(first_live)) child->swa_tick = tick_;
    Reindex(child);
    pos = end;
    node = child;
  }
  if (l3_written_from_page < l3_written_to_page) {
    MarkFullKvInL3(page_hashes, l3_written_from_page, std::min(l3_written_to_page, pos));
  }
  if (l3_ != nullptr && l3_write_through_from_pages_ > 0 && pos >= l3_write_through_from_pages_ &&
      node != root_.get()) {
    QueueL3Path(page_hashes.first(static_cast<size_t>(pos)));
  }
  // Pages past `usable` are freed, and so is every incoming SWA page the
  // tree did not adopt (duplicates, and runs that heal nothing).
  for (int i = usable; i < n; ++i) release_full(full_pages[i]);
  for (int i = 0; i < n; ++i) release_swa(swa_pages[i]);
}

EvictResult PrefixCache::Evict(int64_t full_pages, int64_t swa_pages) {
  EvictResult result;
  while (result.full_pages_freed < full_pages && !full_lru_[0].empty()) {
    const int64_t before = result.full_pages_freed;
    EvictFullL1(full_lru_[0].begin()->second, &result);
    // A node L2 can neither take nor let go of (L2 smaller than the node,
    // its L2 subtree locked by a load-back) stays: stop rather than spin.
    if (result.full_pages_freed == before) break;
  }
  EvictSwa(swa_pages, /*cold_only=*/false, &result);
  return result;
}

EvictResult PrefixCache::EvictColdSwa(int64_t swa_pages) {
  EvictResult result;
  EvictSwa(swa_pages, /*cold_only=*/true, &result);
  return result;
}

void PrefixCache::EvictSwa(int64_t swa_pages, bool cold_only, EvictResult* result) {
  while (result->swa_pages_freed < swa_pages && !swa_lru_[0].empty()) {
    CacheNode* n = swa_lru_[0].begin()->second;
    if (cold_only && n->swa_tick >= kHotTicks) return;  // cold ranks first: none left
    if (!keep_tombstones_ && n->leaf() && n->full_lock == 0) {
      DeleteLeaf(n, result);
    } else {
      Tombstone(n, result);
    }
  }
}

int64_t PrefixCache::EvictableFullPages() const {
  // Every unlocked node can eventually go (leaves first, cascading up).
  int64_t locked = 0;
  std::vector<const CacheNode*> stack = {root_.get()};
  while (!stack.empty()) {
    const CacheNode* n = stack.back();
    stack.pop_back();
    if (n != root_.get() && n->full_lock > 0) locked += n->pages();
    for (const auto& [h, c] : n->children) {
      if (c->full_lock > 0) stack.push_back(c.get());
    }
  }
  return cached_full_[0] - locked;
}

int64_t PrefixCache::EvictableSwaPages() const {
  int64_t pages = 0;
  for (const auto& [key, n] : swa_lru_[0]) pages += n->pages();
  return pages;
}

int64_t PrefixCache::EvictableColdSwaPages() const {
  int64_t pages = 0;
  for (const auto& [key, n] : swa_lru_[0]) {
    if (n->swa_tick >= kHotTicks) break;  // cold ranks first
    pages += n->pages();
  }
  return pages;
}

void PrefixCache::VisitSwaEvictionOrder(
    const std::function<bool(absl::Span<const uint64_t> hashes)>& visit) const {
  for (const auto& [key, n] : swa_lru_[0]) {
    if (!visit(n->hashes)) return;
  }
}

absl::Status PrefixCache::CheckInvariants() const {
  auto fail = [&](const CacheNode* n, absl::string_view what) {
    return absl::InternalError(absl::StrCat(
        "prefix cache invariant: node ", n->id, " [", n->start_page, ",",
        n->end_page(), ") tier ", n->tier, " ", what, "\n", DebugString()));
  };
  absl::flat_hash_set<PageId> full_seen[2], swa_seen[2];
  int64_t nodes = 0, tombstones = 0;
  std::set<std::pair<LruKey, CacheNode*>> want_full[2], want_swa[2];
  std::vector<const CacheNode*> stack = {root_.get()};
  while (!stack.empty()) {
    const CacheNode* n = stack.back();
    stack.pop_back();
    int64_t child_locks = 0;
    int l1_children = 0;
    for (const auto& [h, c] : n->children) {
      if (c->parent != n) return fail(c.get(), "has a wrong parent pointer");
      if (c->hashes.empty() || c->hashes[0] != h) return fail(c.get(), "is filed under a wrong hash");
      const int expect_start = n == root_.get() ? 0 : n->end_page();
      if (c->start_page != expect_start) return fail(c.get(), "has a wrong start page");
      if (n != root_.get() && c->tier < n->tier) return fail(c.get(), "is in a higher tier than its parent");
      child_locks += c->full_lock;
      l1_children += c->tier == 0;
      stack.push_back(c.get());
    }
    if (n->l1_children != l1_children) return fail(n, "miscounts its L1 children");
    if (n == root_.get()) continue;
    ++nodes;
    if (n->tier > 1 || (n->tier == 1 && l2_ == nullptr)) return fail(n, "is in a tier that does not exist");
    if (n->tier != 0 && (n->full_lock != 0 || n->swa_lock != 0)) return fail(n, "is locked outside L1");
    if (n->full.size() != n->hashes.size()) return fail(n, "has full pages != hashes");
    if (!n->tombstone() && n->swa.size() != n->hashes.size()) return fail(n, "has swa pages != hashes");
    if (n->tombstone()) ++tombstones;
    if (!keep_tombstones_ && n->tombstone() && n->leaf() && n->full_lock == 0) {
      return fail(n, "is an unlocked tombstone leaf");
    }
    if (n->swa_lock < 0 || n->full_lock < n->swa_lock) return fail(n, "has full_lock < swa_lock");
    if (n->full_lock < child_locks) return fail(n, "has fewer full locks than its children together");
    if (n->tombstone() && n->swa_lock > 0) return fail(n, "is a SWA-locked tombstone");
    const KvPools& pools = PoolsOf(n);
    const int t = n->tier;
    for (PageId p : n->full) {
      if (!pools.full().Valid(p) || pools.full().state(p) != PageState::kCached) return fail(n, absl::StrCat("holds full page ", p, " not in cached state"));
      if (!full_seen[t].insert(p).second) return fail(n, absl::StrCat("shares full page ", p));
    }
    for (PageId p : n->swa) {
      if (!pools.swa().Valid(p) || pools.swa().state(p) != PageState::kCached) return fail(n, absl::StrCat("holds swa page ", p, " not in cached state"));
      if (!swa_seen[t].insert(p).second) return fail(n, absl::StrCat("shares swa page ", p));
    }
    CacheNode* mn = const_cast<CacheNode*>(n);
    if (FullEvictable(n)) want_full[t].insert({LruKey{n->full_tick, n->start_page, n->id}, mn});
    if (SwaEvictable(n)) want_swa[t].insert({LruKey{n->swa_tick, n->start_page, n->id}, mn});
  }
  for (int t = 0; t < (l2_ != nullptr ? 2 : 1); ++t) {
    const KvPools& pools = t == 0 ? *pools_ : *l2_;
    // L2 pages an unfinished load-back still reads are cached but no node's.
    const int64_t loading_full = t == 1 ? loading_l2_full_ : 0;
    const int64_t loading_swa = t == 1 ? loading_l2_swa_ : 0;
    if (static_cast<int64_t>(full_seen[t].size()) != cached_full_[t] ||
        cached_full_[t] + loading_full != pools.full().num_cached()) {
      return absl::InternalError(absl::StrCat("tier ", t, " full pages: tree ", full_seen[t].size(), ", counted ", cached_full_[t], ", pool cached ", pools.full().num_cached()));
    }
    if (static_cast<int64_t>(swa_seen[t].size()) != cached_swa_[t] ||
        cached_swa_[t] + loading_swa != pools.swa().num_cached()) {
      return absl::InternalError(absl::StrCat("tier ", t, " swa pages: tree ", swa_seen[t].size(), ", counted ", cached_swa_[t], ", pool cached ", pools.swa().num_cached()));
    }
    for (const PagePool* pool : {&pools.full(), &pools.swa()}) {
      int64_t sum = 0;
      for (PageState st : {PageState::kFree, PageState::kReserved, PageState::kInUse, PageState::kCached}) sum += pool->num_in_state(st);
      if (sum != pool->num_pages()) return absl::InternalError(absl::StrCat("tier ", t, " ", PoolKindName(pool->kind()), " pool: states sum to ", sum, " of ", pool->num_pages()));
    }
  }
  if (l2_ != nullptr && (l2_->full().num_in_use() != 0 || l2_->swa().num_in_use() != 0 ||
                         l2_->full().num_reserved() != 0 || l2_->swa().num_reserved() != 0)) {
    return absl::InternalError("L2 pages in use or reserved outside an operation");
  }
  if (nodes != stats_.nodes.load() || tombstones != stats_.tombstone_nodes.load()) {
    return absl::InternalError(absl::StrCat("node counts: tree ", nodes, "/", tombstones, " tombstones; stats ", stats_.nodes.load(), "/", stats_.tombstone_nodes.load()));
  }
  auto diff = [&](const auto& want, const auto& have, absl::string_view what) {
    for (const auto& e : want) {
      if (!have.contains(e)) {
        return absl::InternalError(absl::StrCat(what, ": node ", e.second->id, " (tick ", e.first.tick, ") missing\n", DebugString()));
      }
    }
    for (const auto& e : have) {
      if (!want.contains(e)) {
        return absl::InternalError(absl::StrCat(what, ": node ", e.second->id, " (tick ", e.first.tick, ", depth ", e.first.depth, ") should not be there\n", DebugString()));
      }
    }
    return absl::OkStatus();
  };
  for (int t = 0; t < 2; ++t) {
    if (absl::Status s = diff(want_full[t], full_lru_[t], absl::StrCat("tier ", t, " full LRU set")); !s.ok()) return s;
    if (absl::Status s = diff(want_swa[t], swa_lru_[t], absl::StrCat("tier ", t, " SWA LRU set")); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string PrefixCache::DebugString() const {
  std::string out;
  std::vector<std::pair<const CacheNode*, int>> stack = {{root_.get(), 0}};
  while (!stack.empty()) {
    auto [n, depth] = stack.back();
    stack.pop_back();
    if (n != root_.get()) {
      absl::StrAppend(&out, std::string(2 * depth, ' '), "#", n->id, " pages [",
                      n->start_page, ",", n->end_page(), ") ",
                      n->tier == 0 ? "" : "L2 ", n->tombstone() ? "tombstone" : "live", " lock ",
                      n->full_lock, "/", n->swa_lock, " tick ", n->full_tick,
                      "/", n->swa_tick, "\n");
    }
    for (const auto& [h, c] : n->children) stack.push_back({c.get(), depth + 1});
  }
  return out;
}

}  // namespace swaserve::kv
