// The L3 KV tier (docs/architecture.md#kv-cache): a store of KV page blobs that
// outlives L1/L2 eviction, behind one small interface with two backends:
//   FilePageStore  (lib/kv/file_page_store.h)    local files, survives a
//                  worker restart (a restarted prefill worker comes back warm)
//   RedisPageStore (lib/cluster/redis_page_store.h)  shared across workers,
//                  bounded by Redis's own maxmemory
//
// A blob is the bytes of ONE page of one pool (full or SWA), keyed by
// PageKey: the page's chained hash (base::ChainedPageHashes, which already
// covers the whole prefix and any multimodal content) plus a layout
// fingerprint (KvLayoutFingerprint: pool geometry and kind, dtype, page
// size, and an optional model identity), so pages of another pool, shape or
// (when the caller passes its identity) model never match.
//
// Correctness rule: a store may lose anything at any time (eviction, a
// flushed or restarted Redis, a deleted, torn or corrupted file); every such
// case reads as a miss (NotFound), never as wrong bytes. Backends therefore
// store each blob with a header holding the key, the payload length and an
// XXH3-128 checksum of the payload, and verify all three on every Get. The
// format is lib/kv/page_blob.h, shared by every backend.
//
// Thread-safety: implementations are thread-safe (the prefetcher reads from
// its own thread while the scheduler thread writes back).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
// geometry (layers, heads, head dims, dtype, page size) and its kind, plus
// `model`: an identity of the weights (e.g. a hash of the checkpoint's name
// and revision). Two models with one KV shape produce different KV bytes for
// the same tokens, and the chained page hash covers only the tokens, so a
// store that may outlive a model swap (a file store's directory, a shared
// Redis) must be given a model identity; 0 means "not distinguished".
// Stable across processes and releases (part of stored keys): bump the
// version tag inside when the recipe changes.
uint64_t KvLayoutFingerprint(const KvShape& shape, PoolKind kind,
                             uint64_t model = 0);

// Counters since creation; safe to read from any thread. Every Get counts
// once in `gets` and once in exactly one of hits, misses, corrupt or
// get_errors (gets == hits + misses + corrupt + get_errors once calls in
// flight have returned); every Put once in puts or put_errors.
struct PageStoreStats {
  // Puts that stored their blob, and their payload bytes.
  std::atomic<int64_t> puts{0};
  std::atomic<int64_t> put_bytes{0};
  // Puts that did not: backend unavailable, too large, I/O.
  std::atomic<int64_t> put_errors{0};
  std::atomic<int64_t> gets{0};
  // Gets that returned the blob, and their payload bytes.
  std::atomic<int64_t> hits{0};
  std::atomic<int64_t> get_bytes{0};
  // Gets of an absent blob.
  std::atomic<int64_t> misses{0};
  // Gets of a blob that failed verification (then erased).
  std::atomic<int64_t> corrupt{0};
  // Gets that failed otherwise: backend unavailable, I/O, wrong out size.
  std::atomic<int64_t> get_errors{0};
  // LRU evictions by the store itself.
  std::atomic<int64_t> evictions{0};
  // Gauges: bytes held (headers included) and blobs, where the backend
  // knows them (the file store; not Redis, whose bound is its own).
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> entries{0};
};

class PageStore {
 public:
  virtual ~PageStore() = default;

  // Stores `bytes` under `key`, replacing any previous blob. May evict
  // least-recently-used blobs to stay within the store's bound. Errors
  // (the blob is then simply not stored): Unavailable (backend down),
  // ResourceExhausted (larger than the whole store), Internal (I/O).
  virtual absl::Status Put(const PageKey& key,
                           absl::Span<const uint8_t> bytes) = 0;

  // Reads the blob of `key` into `out`, which must be exactly its size.
  // NotFound for a miss: absent, evicted, or failing verification (wrong
  // key, a stored length that disagrees with the bytes present, or the
  // checksum: the entry is then erased and counted corrupt).
  // Unavailable when the backend cannot be reached (also a miss to callers).
  // InvalidArgument when an intact blob holds a different number of bytes
  // than out.size(): a caller bug (the layout fingerprint fixes the page
  // size), so the blob is left in place and the call counts in get_errors.
  // Callers may treat every non-OK status as a miss. On any error the
  // contents of `out` are unspecified. Refreshes the entry's recency.
  virtual absl::Status Get(const PageKey& key, absl::Span<uint8_t> out) = 0;

  // Whether a blob for `key` is (probably) present, without reading it: a
  // true may still be followed by a NotFound Get (lost meanwhile, corrupt).
  virtual bool Contains(const PageKey& key) = 0;

  // Contains for each of `keys`, in order. Backends where a probe is a
  // round trip answer in few of them (Redis: pipelined EXISTS); the default
  // asks Contains one key at a time.
  virtual std::vector<bool> ContainsEach(absl::Span<const PageKey> keys) {
    std::vector<bool> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) out[i] = Contains(keys[i]);
    return out;
  }

  virtual void Erase(const PageKey& key) = 0;

  // Payload bytes Put would take now without dropping any (a write-behind
  // store's free queue space); writers that can wait pace themselves by
  // it. Default: no limit (a Put is done or refused at once).
  virtual int64_t PutRoom() const { return std::numeric_limits<int64_t>::max(); }
  // Payload bytes accepted by Put and not yet stored (a write-behind
  // store's queue); 0 when every Put so far is stored or dropped.
  virtual int64_t queued_bytes() const { return 0; }

  // Short backend name for metrics and logs: "file", "redis".
  virtual std::string_view backend() const = 0;

  virtual const PageStoreStats& stats() const = 0;
};

}  // namespace swaserve::kv
