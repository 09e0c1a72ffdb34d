// Fixed-size KV page pools and two-phase, all-or-nothing allocation across
// the full and SWA pools.
//
// A PagePool owns one contiguous, page-aligned buffer of num_pages pages (so a
// transfer engine or tier can register it once) and tracks the state of every
// page:
//   kFree      on the free list;
//   kReserved  taken by a Reservation that is neither committed nor cancelled;
//   kInUse     owned privately by one request (Sequence);
//   kCached    owned by the PrefixCache (possibly locked by requests).
// free + reserved + in_use + cached == num_pages always (page conservation).
//
// KvPools pairs a full and a SWA pool. Reserve() takes pages from both or
// from neither (a scheduler can dry-run with CanReserve()), Commit() makes
// them in-use, Cancel() returns them.
//
// Not thread-safe: one scheduler thread owns the pools and everything that
// allocates from them. The counters (num_free() etc.) may be read from other
// threads (e.g. a metrics scrape): they are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"

namespace swaserve::kv {

enum class PageState : uint8_t { kFree, kReserved, kInUse, kCached };

struct PagePoolOptions {
  PoolGeometry geometry;
  int64_t num_pages = 0;
  // Allocate the page memory. Off for metadata-only pools (benchmarks of the
  // cache structure with millions of pages); PageData() then returns null.
  bool allocate_memory = true;
};

class PagePool {
 public:
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(
      const PagePoolOptions& options);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  const PoolGeometry& geometry() const { return geometry_; }
  PoolKind kind() const { return geometry_.kind; }
  int64_t num_pages() const { return static_cast<int64_t>(state_.size()); }
  int64_t num_free() const { return count_[0].load(std::memory_order_relaxed); }
  int64_t num_reserved() const { return count_[1].load(std::memory_order_relaxed); }
  int64_t num_in_use() const { return count_[2].load(std::memory_order_relaxed); }
  int64_t num_cached() const { return count_[3].load(std::memory_order_relaxed); }
  int64_t num_in_state(PageState s) const {
    return count_[static_cast<int>(s)].load(std::memory_order_relaxed);
  }

  PageState state(PageId page) const { return state_[page]; }
  bool Valid(PageId page) const { return page >= 0 && page < num_pages(); }

  // Moves `n` free pages to kReserved and appends them to *out; all or none
  // (false and nothing taken when fewer than n are free).
  bool Reserve(int64_t n, std::vector<PageId>* out);
  // State transitions; each page must be in the `from` state (checked; a
  // violation is a bug and aborts with the page and states).
  void Commit(absl::Span<const PageId> pages);    // kReserved -> kInUse
  void Unreserve(absl::Span<const PageId> pages); // kReserved -> kFree
  void Free(absl::Span<const PageId> pages);      // kInUse|kCached -> kFree
  void ToCache(absl::Span<const PageId> pages);   // kInUse -> kCached

  // Page memory (null when allocate_memory was false).
  uint8_t* PageData(PageId page) const {
    return base_ == nullptr ? nullptr : base_ + static_cast<size_t>(page) * page_bytes_;
  }
  size_t page_bytes() const { return page_bytes_; }
  uint8_t* base() const { return base_; }
  size_t total_bytes() const { return page_bytes_ * state_.size(); }

 private:
  PagePool(const PoolGeometry& geometry, int64_t num_pages, uint8_t* base);
  void Move(absl::Span<const PageId> pages, uint8_t from_mask, PageState to,
            const char* what);

  PoolGeometry geometry_;
  size_t page_bytes_;
  uint8_t* base_;
  std::vector<PageState> state_;
  std::vector<PageId> free_list_;  // stack
  std::atomic<int64_t> count_[4];
};

// Pages taken from both pools by one KvPools::Reserve, not yet committed.
struct Reservation {
  std::vector<PageId> full;
  std::vector<PageId> swa;
  bool empty() const { return full.empty() && swa.empty(); }
};

struct KvPoolsOptions {
  KvShape shape;
  int64_t full_pages = 0;
  int64_t swa_pages = 0;
  bool allocate_memory = true;
};

// The dual pool of docs/architecture.md#kv-cache.
class KvPools {
 public:
  static absl::StatusOr<std::unique_ptr<KvPools>> Create(
      const KvPoolsOptions& options);
  // Sized from a byte budget and SWA/full token ratio (SizePools).
  static absl::StatusOr<std::unique_ptr<KvPools>> CreateForBudget(
      const KvShape& shape, int64_t byte_budget, double swa_full_token_ratio,
      bool allocate_memory = true);

  const KvShape& shape() const { return shape_; }
  PagePool& full() { return *full_; }
  PagePool& swa() { return *swa_; }
  const PagePool& full() const { return *full_; }
  const PagePool& swa() const { return *swa_; }
  PagePool& pool(PoolKind kind) { return kind == PoolKind::kFull ? *full_ : *swa_; }

  // Dry run: would Reserve(full_pages, swa_pages) succeed now?
  bool CanReserve(int64_t full_pages, int64_t swa_pages) const;
  // Takes the pages from both pools or from neither: ResourceExhausted
  // saying which pool is short (and by how much) when it cannot.
  absl::StatusOr<Reservation> Reserve(int64_t full_pages, int64_t swa_pages);
  // kReserved -> kInUse for every page; empties the reservation.
  void Commit(Reservation& reservation);
  // kReserved -> kFree for every page; empties the reservation.
  void Cancel(Reservation& reservation);

 private:
  KvPools(const KvShape& shape, std::unique_ptr<PagePool> full,
          std::unique_ptr<PagePool> swa)
      : shape_(shape), full_(std::move(full)), swa_(std::move(swa)) {}
  KvShape shape_;
  std::unique_ptr<PagePool> full_;
  std::unique_ptr<PagePool> swa_;
};

}  // namespace swaserve::kv
