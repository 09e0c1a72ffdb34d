// An estimate, not a design that is built: how much a SWA pool split into
// two layer groups would add to window restore (bench/RESULTS.md, "window
// restore: layer-grouped SWA pool").
//
// A window's SWA KV is one page per 16 tokens holding every SWA layer. Split
// it into a bottom group (the first k SWA layers) and a top group (the
// rest), in separate pools, and evict bottom halves before top halves: a
// window whose bottom half is gone is restored by recomputing only the
// bottom k layers' chain (kv::WindowRestoreWorkPerRestore on those layers:
// ~953 token-equivalents for k = 30 of MiMo-V2.5-Pro's 60, against 3,811
// for the whole window), while the top layers read their cached window.
//
// The replay models it without changing the cache's layout: the real
// PrefixCache runs with the top group as its SWA pool (its page count sized
// for the top group's share of the SWA bytes) and decides, as today,
// full-KV matches, window-safe hits and whole-window restores; this shadow
// tracks which of the cache's live SWA pages (by chained hash) also have
// their bottom half, in a pool of its own size. A bottom page exists only
// where the cache has the page's SWA KV (it follows the cache's events) and
// is added when a request computes the page (stored, healed, a restore, its
// trailing or divergence window) or reads it (its bottom restored). When
// the bottom pool is over its size, bottom halves go in the order the
// cache's own SWA eviction pass would take the pages
// (PrefixCache::VisitSwaEvictionOrder: cold checkpoint and superseded
// windows first, then least recently used), ahead of the top halves. With
// the groups' shares equal to their layer shares both pools hold the same
// pages and the replay equals the ungrouped one exactly (a check the bench
// makes). A running request holds as many bottom pages as it holds SWA
// pages in the cache's pool (Running).
//
// Not thread-safe; one per replay.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv::replay {

class BottomGroupShadow {
 public:
  // `capacity`: bottom-half pages the bottom pool holds.
  explicit BottomGroupShadow(int64_t capacity) : capacity_(capacity) {}

  // Follows the cache's SWA state (PrefixCacheOptions::on_event): pages
  // stored with SWA KV or healed get their bottom half too (the request
  // computed every layer for them); pages whose SWA KV the cache drops lose
  // it.
  void OnEvent(const CacheEvent& e);

  // Whether every page in [first, end) of `hashes` has its bottom half.
  bool HasAll(absl::Span<const uint64_t> hashes, int first, int end) const;
  // The pages in [first, end) the cache has SWA KV for get their bottom half.
  void Put(absl::Span<const uint64_t> hashes, int first, int end);
  // Evicts bottom halves in `cache`'s SWA eviction order down to the
  // capacity less `reserved` pages (a running request's).
  void Trim(const PrefixCache& cache, int64_t reserved = 0);

  int64_t size() const { return static_cast<int64_t>(bottom_.size()); }
  int64_t evicted() const { return evicted_; }
  // Most bottom halves held at once before trimming (what a pool that never
  // evicts would need).
  int64_t peak() const { return peak_; }

 private:
  int64_t capacity_;
  int64_t evicted_ = 0;
  int64_t peak_ = 0;
  absl::flat_hash_set<uint64_t> swa_;     // pages the cache has SWA KV for
  absl::flat_hash_set<uint64_t> bottom_;  // those with their bottom half
};

// The layer-grouped pool around a replay's requests: what reading a cached
// window costs, and which bottom halves each request leaves behind.
class LayerGroupModel {
 public:
  // `swa_layer`: the main layers' pattern (bench::SwaPattern); the bottom
  // group is its first `bottom_layers` SWA layers (the full layers among
  // them run in a bottom restore too).
  LayerGroupModel(const KvShape& shape, const std::vector<bool>& swa_layer, int bottom_layers,
                  int64_t bottom_pages);

  // For PrefixCacheOptions::on_event.
  std::function<void(const CacheEvent&)> Listener();
  // A request starts from `hit` (window restore planned as `restoring`,
  // from the window-safe hit itself when `from_window_safe`). Returns the
  // work of restoring the bottom half of the cached window it reads (a
  // window-safe hit's, or a restore's that starts there) when the bottom
  // pool lacks a page of it: min(L, bottom_work()), else 0. That window's
  // bottom half is present afterwards.
  double Begin(absl::Span<const uint64_t> hashes, const CacheHit& hit, bool restoring,
               bool from_window_safe);
  // While the request runs, holding `running_pages` SWA pages of its own
  // (its window, kept windows, a restore's stretch): it holds as many bottom
  // halves, so the cached ones are evicted down to the rest of the pool.
  void Running(int64_t running_pages, const PrefixCache& cache);
  // After the request's Insert (Sequence::Finish, `inserted`) of a
  // `length`-token prompt: the pages it computed have their bottom halves
  // (those it stored came with the cache's events; its trailing and
  // divergence windows may have been cached already). Then evicts down to
  // the bottom pool's size in `cache`'s SWA eviction order.
  void Finished(absl::Span<const uint64_t> hashes, int length, bool inserted,
                const PrefixCache& cache);

  // A bottom restore's work for a long enough match, token-equivalents of
  // the whole model (kv::WindowRestoreWorkPerRestore over the bottom layers).
  double bottom_work() const { return bottom_work_; }
  const BottomGroupShadow& shadow() const { return shadow_; }

 private:
  // Pages covering the window a query at token `tokens` reads.
  std::pair<int, int> WindowPages(int tokens) const;

  int window_;
  int page_size_;
  double bottom_work_ = 0;
  BottomGroupShadow shadow_;
  // The current request's divergence window [from, end), in tokens (Begin).
  int divergence_from_ = 0;
  int divergence_end_ = 0;
};

}  // namespace swaserve::kv::replay
