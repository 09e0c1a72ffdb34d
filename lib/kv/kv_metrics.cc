#include "lib/kv/kv_metrics.h"

#include "lib/base/status.h"
#include "lib/kv/memory_page_store.h"

namespace swaserve::kv {

absl::StatusOr<std::unique_ptr<KvMetrics>> KvMetrics::Create(
    metrics::Registry* registry, const KvPools* pools,
    const PrefixCache* cache, const PageStore* l3) {
  std::unique_ptr<KvMetrics> m(new KvMetrics(registry));
  auto add = [&](absl::Status s, const char* name) -> absl::Status {
    if (s.ok()) m->names_.push_back(name);
    return s;
  };
  RETURN_IF_ERROR(add(
      registry->AddCallbackGauge(
          "swaserve_kv_pages",
          "KV cache pages per pool (full: full-attention layers; swa: "
          "sliding-window and MTP layers) and state",
          {"pool", "state"},
          [pools] {
            std::vector<metrics::CallbackSample> out;
            for (const PagePool* p : {&pools->full(), &pools->swa()}) {
              const std::string pool(PoolKindName(p->kind()));
              out.push_back({{pool, "free"}, static_cast<double>(p->num_free())});
              out.push_back({{pool, "reserved"}, static_cast<double>(p->num_reserved())});
              out.push_back({{pool, "in_use"}, static_cast<double>(p->num_in_use())});
              out.push_back({{pool, "cached"}, static_cast<double>(p->num_cached())});
            }
            return out;
          }),
      "swaserve_kv_pages"));
  if (cache == nullptr) return m;
  const PrefixCacheStats* st = &cache->stats();
  struct CounterDef {
    const char* name;
    const char* help;
    const std::atomic<int64_t>* value;
  };
  const CounterDef counters[] = {
      {"swaserve_prefix_cache_lookup_tokens_total",
       "Prompt tokens looked up in the prefix cache", &st->lookup_tokens},
      {"swaserve_prefix_cache_hit_tokens_total",
       "Prompt tokens served from the prefix cache (window-safe hits)",
       &st->hit_tokens},
      {"swaserve_prefix_cache_window_lost_tokens_total",
       "Tokens whose full KV matched but which the window-safe rule could not "
       "reuse (their SWA KV was evicted)",
       &st->window_lost_tokens},
      {"swaserve_prefix_cache_inserted_pages_total",
       "Pages added to the prefix cache", &st->inserted_pages},
      {"swaserve_prefix_cache_duplicate_pages_total",
       "Inserted pages that the cache already held (freed)", &st->duplicate_pages},
      {"swaserve_prefix_cache_healed_pages_total",
       "SWA pages adopted into tombstoned cache nodes", &st->healed_pages},
      {"swaserve_prefix_cache_cooled_swa_pages_total",
       "SWA pages of windows a longer prompt superseded, made first to evict "
       "(--kv.cold_superseded_windows)",
       &st->cooled_swa_pages},
      {"swaserve_prefix_cache_tombstoned_nodes_total",
       "Cache nodes whose SWA KV was evicted while their full KV stayed",
       &st->tombstoned_nodes},
  };
  for (const CounterDef& c : counters) {
    const std::atomic<int64_t>* v = c.value;
    RETURN_IF_ERROR(add(registry->AddCallbackCounter(
                            c.name, c.help,
                            [v] { return static_cast<double>(v->load()); }),
                        c.name));
  }
  RETURN_IF_ERROR(add(
      registry->AddCallbackCounter(
          "swaserve_prefix_cache_evicted_pages_total",
          "Pages evicted from the prefix cache, per pool", {"pool"},
          [st] {
            return std::vector<metrics::CallbackSample>{
                {{"full"}, static_cast<double>(st->evicted_full_pages.load())},
                {{"swa"}, static_cast<double>(st->evicted_swa_pages.load())}};
          }),
      "swaserve_prefix_cache_evicted_pages_total"));
  RETURN_IF_ERROR(add(
      registry->AddCallbackGauge(
          "swaserve_prefix_cache_nodes",
          "Radix-tree nodes of the prefix cache (tombstone: SWA KV evicted)",
          {"kind"},
          [st] {
            const int64_t all = st->nodes.load();
            const int64_t tomb = st->tombstone_nodes.load();
            return std::vector<metrics::CallbackSample>{
                {{"live"}, static_cast<double>(all - tomb)},
                {{"tombstone"}, static_cast<double>(tomb)}};
          }),
      "swaserve_prefix_cache_nodes"));
  if (!cache->has_l2()) return m;
  // Tiers.
  RETURN_IF_ERROR(add(
      registry->AddCallbackGauge(
          "swaserve_prefix_cache_tier_pages",
          "Pages the prefix cache holds per tier (l1: the KV pools; l2: the host tier) and pool",
          {"tier", "pool"},
          [cache] {
            return std::vector<metrics::CallbackSample>{
                {{"l1", "full"}, static_cast<double>(cache->cached_full_pages())},
                {{"l1", "swa"}, static_cast<double>(cache->cached_swa_pages())},
                {{"l2", "full"}, static_cast<double>(cache->l2_full_pages())},
                {{"l2", "swa"}, static_cast<double>(cache->l2_swa_pages())}};
          }),
      "swaserve_prefix_cache_tier_pages"));
  RETURN_IF_ERROR(add(
      registry->AddCallbackCounter(
          "swaserve_prefix_cache_tier_moved_pages_total",
          "Full pages moved between tiers (demoted: L1 eviction to L2; loaded_back: L2 to L1 "
          "for a hit; evicted: deleted from L2)",
          {"direction"},
          [st, l3 = cache->has_l3()] {
            std::vector<metrics::CallbackSample> v{
                {{"demoted"}, static_cast<double>(st->demoted_pages.load())},
                {{"loaded_back"}, static_cast<double>(st->loaded_back_pages.load())},
                {{"evicted"}, static_cast<double>(st->l2_evicted_full_pages.load())}};
            if (l3) {
              v.push_back({{"to_l3"}, static_cast<double>(st->l3_written_pages.load())});
              v.push_back({{"from_l3"}, static_cast<double>(st->l3_attached_pages.load())});
            }
            return v;
          }),
      "swaserve_prefix_cache_tier_moved_pages_total"));
  const CounterDef tier_counters[] = {
      {"swaserve_prefix_cache_loaded_back_bytes_total",
       "Bytes copied from L2 back to L1 for prefix hits", &st->loaded_back_bytes},
      {"swaserve_prefix_cache_tier_dropped_swa_pages_total",
       "SWA pages not kept when their node was demoted (only trailing windows go down)",
       &st->dropped_swa_pages},
  };
  for (const CounterDef& c : tier_counters) {
    const std::atomic<int64_t>* v = c.value;
    RETURN_IF_ERROR(add(registry->AddCallbackCounter(
                            c.name, c.help,
                            [v] { return static_cast<double>(v->load()); }),
                        c.name));
  }
  RETURN_IF_ERROR(add(registry->AddCallbackCounter(
                          "swaserve_prefix_cache_loaded_back_seconds_total",
                          "Time spent copying L2 pages back to L1",
                          [st] { return st->loaded_back_nanos.load() * 1e-9; }),
                      "swaserve_prefix_cache_loaded_back_seconds_total"));
  if (cache->has_l3()) RETURN_IF_ERROR(m->AddL3(cache, l3));
  return m;
}

absl::Status KvMetrics::AddL3(const PrefixCache* cache, const PageStore* l3) {
  const PrefixCacheStats* st = &cache->stats();
  auto add = [this](absl::Status s, const char* name) {
    if (s.ok()) names_.push_back(name);
    return s;
  };
  RETURN_IF_ERROR(add(
      registry_->AddCallbackCounter(
          "swaserve_prefix_cache_l3_pages_total",
          "L3 traffic of the prefix cache in pages, by op (written: full pages put, "
          "write-back and write-through; written_through: of those, by write-through; "
          "written_at_bound: of those, at the insert of a prompt near its bucket's bound; "
          "written_checkpoint: of those, by a long prefill's checkpoints; "
          "written_swa: SWA pages put; attached / attached_swa: read back into L2; "
          "healed_swa: SWA pages that healed a tombstone; write_errors: puts refused)",
          {"op"},
          [st] {
            return std::vector<metrics::CallbackSample>{
                {{"written"}, static_cast<double>(st->l3_written_pages.load())},
                {{"written_through"}, static_cast<double>(st->l3_write_through_pages.load())},
                {{"written_at_bound"},
                 static_cast<double>(st->l3_write_through_bound_pages.load())},
                {{"written_checkpoint"}, static_cast<double>(st->l3_checkpoint_pages.load())},
                {{"written_swa"}, static_cast<double>(st->l3_written_swa_pages.load())},
                {{"attached"}, static_cast<double>(st->l3_attached_pages.load())},
                {{"attached_swa"}, static_cast<double>(st->l3_attached_swa_pages.load())},
                {{"healed_swa"}, static_cast<double>(st->l3_healed_swa_pages.load())},
                {{"write_errors"}, static_cast<double>(st->l3_write_errors.load())}};
          }),
      "swaserve_prefix_cache_l3_pages_total"));
  if (l3 == nullptr) return absl::OkStatus();
  const PageStoreStats* ps = &l3->stats();
  RETURN_IF_ERROR(add(
      registry_->AddCallbackCounter(
          "swaserve_kv_l3_store_ops_total",
          "Operations of the L3 page store by outcome (get_hit, get_miss, get_corrupt: "
          "failed verification and erased, get_error, put, put_error, eviction)",
          {"backend", "op"},
          [ps, b = std::string(l3->backend())] {
            return std::vector<metrics::CallbackSample>{
                {{b, "get_hit"}, static_cast<double>(ps->hits.load())},
                {{b, "get_miss"}, static_cast<double>(ps->misses.load())},
                {{b, "get_corrupt"}, static_cast<double>(ps->corrupt.load())},
                {{b, "get_error"}, static_cast<double>(ps->get_errors.load())},
                {{b, "put"}, static_cast<double>(ps->puts.load())},
                {{b, "put_error"}, static_cast<double>(ps->put_errors.load())},
                {{b, "eviction"}, static_cast<double>(ps->evictions.load())}};
          }),
      "swaserve_kv_l3_store_ops_total"));
  RETURN_IF_ERROR(add(
      registry_->AddCallbackCounter(
          "swaserve_kv_l3_store_bytes_total",
          "Payload bytes moved to and from the L3 page store (dir: put, get)", {"dir"},
          [ps] {
            return std::vector<metrics::CallbackSample>{
                {{"put"}, static_cast<double>(ps->put_bytes.load())},
                {{"get"}, static_cast<double>(ps->get_bytes.load())}};
          }),
      "swaserve_kv_l3_store_bytes_total"));
  RETURN_IF_ERROR(add(
      registry_->AddCallbackGauge(
          "swaserve_kv_l3_store_bytes",
          "Bytes (and blobs) the L3 page store holds, where the backend knows it (file)",
          {"what"},
          [ps] {
            return std::vector<metrics::CallbackSample>{
                {{"bytes"}, static_cast<double>(ps->bytes.load())},
                {{"blobs"}, static_cast<double>(ps->entries.load())}};
          }),
      "swaserve_kv_l3_store_bytes"));
  // A write-behind store (the worker's): its queue and what it dropped.
  if (const auto* async = dynamic_cast<const AsyncPageStore*>(l3); async != nullptr) {
    RETURN_IF_ERROR(add(
        registry_->AddCallbackGauge(
            "swaserve_kv_l3_write_queue_bytes",
            "Page bytes queued for the L3 store's write-behind thread (bound: --kv.l3_queue_mib)",
            [async] { return static_cast<double>(async->queued_bytes()); }),
        "swaserve_kv_l3_write_queue_bytes"));
    RETURN_IF_ERROR(add(
        registry_->AddCallbackCounter(
            "swaserve_kv_l3_write_queue_dropped_total",
            "L3 puts dropped because the write-behind queue was full (of "
            "swaserve_prefix_cache_l3_pages_total{op=\"write_errors\"})",
            [async] { return static_cast<double>(async->dropped()); }),
        "swaserve_kv_l3_write_queue_dropped_total"));
  }
  return absl::OkStatus();
}

KvMetrics::~KvMetrics() {
  for (const std::string& name : names_) (void)registry_->RemoveCallback(name);
}

}  // namespace swaserve::kv
