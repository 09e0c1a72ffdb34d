// Prometheus metrics of the KV cache: pages per pool and state, prefix-cache
// hit/lookup/lost tokens, evictions, tombstones (docs/architecture.md#observability).
//
//   swaserve_kv_pages{pool="full|swa",state="free|reserved|in_use|cached"}
//   swaserve_prefix_cache_lookup_tokens_total       tokens looked up
//   swaserve_prefix_cache_hit_tokens_total          window-safe tokens reused
//   swaserve_prefix_cache_window_lost_tokens_total  matched, not window-safe
//   swaserve_prefix_cache_inserted_pages_total, _duplicate_pages_total,
//   swaserve_prefix_cache_healed_pages_total, _cooled_swa_pages_total
//   swaserve_prefix_cache_evicted_pages_total{pool}
//   swaserve_prefix_cache_tombstoned_nodes_total
//   swaserve_prefix_cache_nodes{kind="live|tombstone"}
// With an L2: swaserve_prefix_cache_tier_pages{tier,pool},
//   swaserve_prefix_cache_tier_moved_pages_total{direction} (demoted,
//   loaded_back, evicted; with an L3 also to_l3, from_l3),
//   swaserve_prefix_cache_loaded_back_{bytes,seconds}_total,
//   swaserve_prefix_cache_tier_dropped_swa_pages_total.
// With an L3: swaserve_prefix_cache_l3_pages_total{op}, and given the store:
//   swaserve_kv_l3_store_ops_total{backend,op},
//   swaserve_kv_l3_store_bytes_total{dir}, swaserve_kv_l3_store_bytes{what};
//   for a write-behind AsyncPageStore also swaserve_kv_l3_write_queue_bytes
//   and swaserve_kv_l3_write_queue_dropped_total.
//
// The values are read at scrape time from the pools' and cache's atomic
// counters. KvMetrics owns the registration: destroy it before the pools and
// the cache (its destructor removes the callbacks, after which they never
// run again). Thread-safe as the registry is.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/metrics/registry.h"

namespace swaserve::kv {

class KvMetrics {
 public:
  // `cache` may be null (pool metrics only). Fails when a metric of the same
  // name is already registered (one KvMetrics per registry).
  // `l3` (may be null) is the cache's L3 store, for its own counters.
  static absl::StatusOr<std::unique_ptr<KvMetrics>> Create(
      metrics::Registry* registry, const KvPools* pools,
      const PrefixCache* cache, const PageStore* l3 = nullptr);
  ~KvMetrics();
  KvMetrics(const KvMetrics&) = delete;
  KvMetrics& operator=(const KvMetrics&) = delete;

 private:
  explicit KvMetrics(metrics::Registry* registry) : registry_(registry) {}
  absl::Status AddL3(const PrefixCache* cache, const PageStore* l3);
  metrics::Registry* registry_;
  std::vector<std::string> names_;
};

}  // namespace swaserve::kv
