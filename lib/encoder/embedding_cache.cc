#include "lib/encoder/embedding_cache.h"

#include "lib/base/status.h"

namespace swaserve::encoder {

struct EmbeddingCache::Metrics {
  metrics::Counter* hits = nullptr;
  metrics::Counter* misses = nullptr;
  metrics::Counter* evictions = nullptr;
  metrics::Gauge* bytes = nullptr;
  metrics::Gauge* entries = nullptr;
};

EmbeddingCache::EmbeddingCache(const EmbeddingCacheOptions& options) : options_(options) {}
EmbeddingCache::~EmbeddingCache() = default;

absl::StatusOr<std::unique_ptr<EmbeddingCache>> EmbeddingCache::Create(
    const EmbeddingCacheOptions& options) {
  if (options.max_bytes < 0) {
    return absl::InvalidArgumentError("EmbeddingCacheOptions.max_bytes must be >= 0");
  }
  std::unique_ptr<EmbeddingCache> c(new EmbeddingCache(options));
  c->metrics_ = std::make_unique<Metrics>();
  if (metrics::Registry* reg = options.registry; reg != nullptr) {
    ASSIGN_OR_RETURN(metrics::CounterFamily * lookups,
                     reg->AddCounter("swaserve_encoder_cache_lookups_total",
                                     "Embedding-cache lookups by result (hit, miss).", {"result"}));
    c->metrics_->hits = &lookups->WithLabels({"hit"});
    c->metrics_->misses = &lookups->WithLabels({"miss"});
    ASSIGN_OR_RETURN(metrics::CounterFamily * ev,
                     reg->AddCounter("swaserve_encoder_cache_evictions_total",
                                     "Embeddings evicted from the cache (least recently used)."));
    c->metrics_->evictions = &ev->WithLabels();
    ASSIGN_OR_RETURN(metrics::GaugeFamily * bytes,
                     reg->AddGauge("swaserve_encoder_cache_bytes",
                                   "Bytes of embeddings in the cache."));
    c->metrics_->bytes = &bytes->WithLabels();
    ASSIGN_OR_RETURN(metrics::GaugeFamily * entries,
                     reg->AddGauge("swaserve_encoder_cache_entries",
                                   "Items in the embedding cache."));
    c->metrics_->entries = &entries->WithLabels();
  }
  return c;
}

std::shared_ptr<const ItemEmbedding> EmbeddingCache::Get(const base::Hash128& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    if (metrics_->misses != nullptr) metrics_->misses->Increment();
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.hits;
  if (metrics_->hits != nullptr) metrics_->hits->Increment();
  return it->second->value;
}

std::shared_ptr<const ItemEmbedding> EmbeddingCache::Peek(const base::Hash128& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

bool EmbeddingCache::Put(const base::Hash128& key, std::shared_ptr<const ItemEmbedding> value) {
  if (value == nullptr) return false;
  const int64_t size = value->bytes();
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    stats_.bytes -= it->second->value->bytes();
    lru_.erase(it->second);
    index_.erase(it);
    --stats_.entries;
  }
  if (size > options_.max_bytes) {
    PublishLocked();
    return false;
  }
  lru_.push_front(Entry{key, std::move(value)});
  index_[key] = lru_.begin();
  stats_.bytes += size;
  ++stats_.entries;
  EvictLocked();
  PublishLocked();
  return true;
}

void EmbeddingCache::EvictLocked() {
  while (stats_.bytes > options_.max_bytes && !lru_.empty()) {
    const Entry& last = lru_.back();
    stats_.bytes -= last.value->bytes();
    index_.erase(last.key);
    lru_.pop_back();
    --stats_.entries;
    ++stats_.evictions;
    if (metrics_->evictions != nullptr) metrics_->evictions->Increment();
  }
}

void EmbeddingCache::PublishLocked() {
  if (metrics_->bytes != nullptr) metrics_->bytes->Set(static_cast<double>(stats_.bytes));
  if (metrics_->entries != nullptr) metrics_->entries->Set(static_cast<double>(stats_.entries));
}

EmbeddingCacheStats EmbeddingCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace swaserve::encoder
