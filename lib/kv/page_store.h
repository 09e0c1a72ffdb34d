// The L3 KV tier (ARCHITECTURE §3, issue 21): a store of KV page blobs that
// outlives L1/L2 eviction, behind one small interface with two backends:
//   FilePageStore  (lib/kv/file_page_store.h)    local files, survives a
//                  worker restart (a restarted prefill worker comes back warm)
//   RedisPageStore (lib/cluster/redis_page_store.h)  shared across workers,
//                  bounded by Redis's own maxmemory
//
// A blob is the bytes of ONE page of one pool (full or SWA), keyed by
// PageKey: the page's chained hash (base::ChainedPageHashes, which already
// covers the whole prefix and any multimodal content) plus a layout
// fingerprint (KvLayoutFingerprint: model shape, pool kind, dtype, page
// size), so pages of another model or pool never match.
//
// Correctness rule: a store may lose anything at any time (eviction, a
// flushed or restarted Redis, a deleted, torn or corrupted file); every such
// case reads as a miss (NotFound), never as wrong bytes. Backends therefore
// store each blob with a header holding the key, the payload length and an
// XXH3-128 checksum of the payload, and verify all three on every Get.
//
// Thread-safety: implementations are thread-safe (the prefetcher reads from
// its own thread while the scheduler thread writes back).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"

namespace swaserve::kv {

struct PageKey {
  uint64_t hash = 0;    // chained page hash
  uint64_t layout = 0;  // KvLayoutFingerprint of the page's pool
  bool operator==(const PageKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const PageKey& k) {
    return H::combine(std::move(h), k.hash, k.layout);
  }
};

// Fingerprint of everything that decides a page's bytes layout: the pool's
// geometry (layers, heads, head dims, dtype, page size) and its kind.
uint64_t KvLayoutFingerprint(const KvShape& shape, PoolKind kind);

// Counters since creation; safe to read from any thread.
struct PageStoreStats {
  std::atomic<int64_t> puts{0};
  std::atomic<int64_t> put_bytes{0};
  std::atomic<int64_t> put_errors{0};   // backend unavailable, too large, I/O
  std::atomic<int64_t> gets{0};
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> get_bytes{0};
  std::atomic<int64_t> misses{0};       // absent
  std::atomic<int64_t> corrupt{0};      // present but failed verification (then erased)
  std::atomic<int64_t> evictions{0};    // LRU evictions by the store itself
  std::atomic<int64_t> bytes{0};        // gauge: bytes held (where the backend knows)
  std::atomic<int64_t> entries{0};      // gauge
};

class PageStore {
 public:
  virtual ~PageStore() = default;

  // Stores `bytes` under `key`, replacing any previous blob. May evict
  // least-recently-used blobs to stay within the store's bound. Errors
  // (the blob is then simply not stored): Unavailable (backend down),
  // ResourceExhausted (larger than the whole store), Internal (I/O).
  virtual absl::Status Put(const PageKey& key, absl::Span<const uint8_t> bytes) = 0;

  // Reads the blob of `key` into `out`, which must be exactly its size.
  // NotFound for a miss: absent, evicted, or failing verification (wrong
  // key, length or checksum: the entry is then erased and counted corrupt).
  // Unavailable when the backend cannot be reached (also a miss to callers).
  // Refreshes the entry's recency.
  virtual absl::Status Get(const PageKey& key, absl::Span<uint8_t> out) = 0;

  // Whether a blob for `key` is (probably) present, without reading it: a
  // true may still be followed by a NotFound Get (lost meanwhile, corrupt).
  virtual bool Contains(const PageKey& key) = 0;

  virtual void Erase(const PageKey& key) = 0;

  // Short backend name for metrics and logs: "file", "redis".
  virtual std::string_view backend() const = 0;

  virtual const PageStoreStats& stats() const = 0;
};

}  // namespace swaserve::kv
