// Two PageStore helpers for the L3 tier (page_store.h):
//
// MemoryPageStore: an in-process PageStore bounded by bytes with LRU
// eviction. For benchmarks (kv_trace_replay_bench's L3 section with
// metadata-only pools stores empty blobs) and tests; not a production
// backend (it dies with the process, which is what L3 is meant to survive).
//
// AsyncPageStore: a write-behind decorator over any PageStore. Put copies
// the bytes into a bounded queue and returns at once; one background thread
// performs the puts on the backend in order. Get/Contains see queued blobs
// (a page written back and asked for again before its put landed is a hit),
// Erase drops a queued blob too. When the queue is full a Put is dropped
// (counted in `dropped`; L3 is a cache, so a lost write is a later miss,
// never wrong data). This keeps file I/O and Redis round trips off the
// prefill loop thread, which writes back pages as it evicts them.
//
// Thread-safety: both are thread-safe. Ownership: AsyncPageStore owns its
// backend; its destructor finishes the queued puts first.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "lib/kv/page_store.h"

namespace swaserve::kv {

class MemoryPageStore final : public PageStore {
 public:
  // capacity_bytes: bound on the payload bytes held, plus 64 per blob (so
  // empty blobs are bounded too). Must be > 0.
  explicit MemoryPageStore(int64_t capacity_bytes);

  absl::Status Put(const PageKey& key, absl::Span<const uint8_t> bytes) override;
  absl::Status Get(const PageKey& key, absl::Span<uint8_t> out) override;
  bool Contains(const PageKey& key) override;
  void Erase(const PageKey& key) override;
  std::string_view backend() const override { return "memory"; }
  const PageStoreStats& stats() const override { return stats_; }
  // Drops everything (a "flushed" store, for tests).
  void Flush();

  static constexpr int64_t kEntryOverhead = 64;

 private:
  struct Entry {
    std::vector<uint8_t> bytes;
    std::list<PageKey>::iterator lru;
  };
  void EraseLocked(absl::flat_hash_map<PageKey, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<PageKey, Entry> map_ ABSL_GUARDED_BY(mu_);
  std::list<PageKey> lru_ ABSL_GUARDED_BY(mu_);  // front: most recent
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  PageStoreStats stats_;
};

struct AsyncPageStoreOptions {
  // Queued payload bytes at most; a Put beyond it is dropped. Default 256 MiB.
  int64_t max_queued_bytes = int64_t{256} << 20;
};

class AsyncPageStore final : public PageStore {
 public:
  AsyncPageStore(std::unique_ptr<PageStore> backend, const AsyncPageStoreOptions& options = {});
  // Performs every queued put, then stops the thread.
  ~AsyncPageStore() override;

  // Queues the put (OK), or drops it when the queue is full
  // (ResourceExhausted; counted in dropped()).
  absl::Status Put(const PageKey& key, absl::Span<const uint8_t> bytes) override;
  absl::Status Get(const PageKey& key, absl::Span<uint8_t> out) override;
  bool Contains(const PageKey& key) override;
  // The queue answers first; the rest goes to the backend in one call.
  std::vector<bool> ContainsEach(absl::Span<const PageKey> keys) override;
  void Erase(const PageKey& key) override;
  // max_queued_bytes minus what is queued (0 when full).
  int64_t PutRoom() const override;
  std::string_view backend() const override { return backend_->backend(); }
  // The backend's counters (what actually reached it).
  const PageStoreStats& stats() const override { return backend_->stats(); }

  // Blocks until every put queued so far has reached the backend.
  void Flush();
  int64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  int64_t queued_bytes() const override;
  PageStore& inner() { return *backend_; }

 private:
  struct Pending {
    PageKey key;
    std::vector<uint8_t> bytes;
    uint64_t seq = 0;
  };
  void Run();

  std::unique_ptr<PageStore> backend_;
  const AsyncPageStoreOptions options_;
  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  // Latest queued seq per key (Get/Contains answer from the queue).
  absl::flat_hash_map<PageKey, uint64_t> latest_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t done_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace swaserve::kv
