// StagingArena: carves per-request KV staging blocks out of one long-lived
// memory range (docs/architecture.md#request-path step 2).
//
// Why: a decode worker stages each request's KV in host memory that a
// prefill worker writes over UCX. Into memory from
// transfer::TransferEngine::Allocate() (UCX-allocated shared memory) a
// sender on the same host does single-copy puts; into ordinary malloc'd
// memory UCX falls back to active messages at a fraction of the bandwidth
// (bench/RESULTS.md, "KV transfer (UCX)"). Allocating per request is slow (a
// sender caches only a few unpacked rkeys per peer, and unpacking maps the
// whole segment), so the worker allocates one arena at start-up and every
// request's staging is a block of it (KvStaging::CreateIn).
//
// Allocation: best-fit over a free list of [offset, size) runs, kept both by
// offset (for coalescing) and by size (for the fit). A request of n bytes is
// rounded up to a multiple of `alignment` and takes the front of the
// smallest free run that holds it (lowest offset among equals); the rest of
// the run stays free. Free() merges the block with its free neighbours, so
// once every block is freed the arena is one free run again. Best-fit keeps
// large runs whole for long prompts; all operations are O(log runs).
//
// Ownership: the arena does not own [base, base + size). `owner` (optional)
// is kept alive as long as the arena is — e.g. the transfer::Registration
// that allocated and registered the memory — so whoever holds the arena
// (a KvStaging carved from it holds a shared_ptr) keeps the memory valid.
// Blocks not freed when the arena is destroyed are simply forgotten.
//
// Thread-safe (one absl::Mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace swaserve::worker {

struct StagingArenaOptions {
  // The range blocks are carved from; base must be aligned to `alignment`.
  // Required (non-null, size >= alignment).
  void* base = nullptr;
  size_t size = 0;
  // Block granularity and alignment of every block's offset (and, as base
  // is aligned, its address): a power of two. Default: 4096 (a host page).
  size_t alignment = 4096;
  // Kept alive for the arena's lifetime (may be null).
  std::shared_ptr<const void> owner;
};

class StagingArena {
 public:
  // One allocation: [offset, offset + size) from base(); size is the
  // request rounded up to the alignment.
  struct Block {
    size_t offset = 0;
    size_t size = 0;
  };

  // InvalidArgument for a null base, an alignment that is not a power of
  // two, a misaligned base or a size smaller than one alignment unit.
  // capacity() is size rounded down to the alignment.
  static absl::StatusOr<std::unique_ptr<StagingArena>> Create(
      const StagingArenaOptions& options);
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  // A block of at least `bytes` bytes, or nullopt when no free run is large
  // enough (or bytes == 0).
  std::optional<Block> Allocate(size_t bytes);
  // Returns the block starting at `offset`. NotFound (and nothing changes)
  // when no allocated block starts there (a double free).
  absl::Status Free(size_t offset);

  uint8_t* base() const { return base_; }
  size_t alignment() const { return alignment_; }
  size_t capacity() const { return capacity_; }
  size_t bytes_in_use() const;
  // Size of the largest free run: the largest Allocate() that succeeds now.
  size_t largest_free() const;
  // Number of allocated blocks and of free runs (fragmentation).
  size_t num_blocks() const;
  size_t num_free_runs() const;

 private:
  StagingArena(const StagingArenaOptions& options, size_t capacity);

  void InsertFreeLocked(size_t offset, size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFreeLocked(std::map<size_t, size_t>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint8_t* const base_;
  const size_t alignment_;
  const size_t capacity_;
  const std::shared_ptr<const void> owner_;

  mutable absl::Mutex mu_;
  // Free runs: offset -> size, and (size, offset) for the best fit.
  std::map<size_t, size_t> free_by_offset_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<size_t, size_t>> free_by_size_ ABSL_GUARDED_BY(mu_);
  // Allocated blocks: offset -> size.
  absl::flat_hash_map<size_t, size_t> used_ ABSL_GUARDED_BY(mu_);
  size_t bytes_in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace swaserve::worker
