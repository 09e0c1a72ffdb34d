// EmbeddingCache: an encoder replica's in-process cache of item embeddings,
// keyed by the item's content hash (media::ContentHash: XXH3-128 of the
// bytes seeded with the preprocessing parameters), least recently used
// evicted first under a byte budget. The
// router places each item on an encoder by consistent hashing of the same
// hash (cluster::HashRing), so a repeated item meets its cached embedding.
//
// Values are immutable and shared: Get hands out the stored pointer, which
// stays valid after the entry is evicted.
//
// Metrics (on options.registry; none when null):
//   swaserve_encoder_cache_lookups_total{result}  hit | miss
//   swaserve_encoder_cache_evictions_total
//   swaserve_encoder_cache_bytes                  gauge
//   swaserve_encoder_cache_entries                gauge
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/hash.h"
#include "lib/metrics/registry.h"

namespace swaserve::encoder {

// The embeddings of one item: [num_tokens, hidden] row-major, one row per
// placeholder token.
struct ItemEmbedding {
  int num_tokens = 0;
  int hidden = 0;
  std::vector<float> values;

  int64_t bytes() const { return static_cast<int64_t>(values.size() * sizeof(float)); }
};

struct EmbeddingCacheOptions {
  // Budget of the cached values' bytes (>= 0; 0 caches nothing: every
  // lookup misses). An item larger than the budget is not cached. Default
  // 1 GiB.
  int64_t max_bytes = int64_t{1} << 30;
  // Not owned; null: no metrics.
  metrics::Registry* registry = nullptr;
};

struct EmbeddingCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;
  int64_t entries = 0;
  int64_t bytes = 0;
};

class EmbeddingCache {
 public:
  // InvalidArgument for max_bytes < 0; registry errors.
  static absl::StatusOr<std::unique_ptr<EmbeddingCache>> Create(
      const EmbeddingCacheOptions& options);
  ~EmbeddingCache();
  EmbeddingCache(const EmbeddingCache&) = delete;
  EmbeddingCache& operator=(const EmbeddingCache&) = delete;

  // The cached embedding (now the most recently used), or null.
  std::shared_ptr<const ItemEmbedding> Get(const base::Hash128& key);
  // Get without counting a lookup (the hit/miss statistics are the
  // encoder's answers to Encode; Peek serves Fetch of a by-reference item).
  std::shared_ptr<const ItemEmbedding> Peek(const base::Hash128& key);
  // Caches `value` under `key` (replacing an older one), evicting least
  // recently used entries until the budget holds. False when the value alone
  // exceeds the budget (not cached).
  bool Put(const base::Hash128& key, std::shared_ptr<const ItemEmbedding> value);

  EmbeddingCacheStats stats() const;

 private:
  struct Metrics;
  struct Entry {
    base::Hash128 key;
    std::shared_ptr<const ItemEmbedding> value;
  };
  explicit EmbeddingCache(const EmbeddingCacheOptions& options);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EmbeddingCacheOptions options_;
  std::unique_ptr<Metrics> metrics_;
  mutable absl::Mutex mu_;
  // Most recently used first.
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<base::Hash128, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  EmbeddingCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace swaserve::encoder
