#include "lib/metrics/instruments.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <utility>

namespace swaserve::metrics {
namespace internal {

namespace {

// Live threads per shard. A thread takes the least-used shard on its first
// update and gives it back when it exits, so short-lived threads do not
// push long-lived ones onto a shared shard (plain round-robin would wrap
// around onto busy shards after kNumShards thread creations).
std::atomic<uint32_t> shard_users[kNumShards];

struct ShardLease {
  explicit ShardLease(uint32_t s) : shard(s) {}
  // Keeps tls_shard_plus_one: a metric updated by a later TLS destructor of
  // this thread still uses a valid shard (it is merely no longer counted).
  ~ShardLease() { shard_users[shard].fetch_sub(1, std::memory_order_relaxed); }
  const uint32_t shard;
};

}  // namespace

uint32_t AssignThreadShard() {
  uint32_t best = 0;
  while (true) {
    uint32_t best_users = UINT32_MAX;
    for (uint32_t i = 0; i < kNumShards; ++i) {
      const uint32_t users = shard_users[i].load(std::memory_order_relaxed);
      if (users < best_users) {
        best = i;
        best_users = users;
      }
    }
    // The CAS fails if another thread took this shard since we looked; then
    // look again. So concurrent new threads never share a shard while a
    // less-used one exists.
    if (shard_users[best].compare_exchange_strong(best_users, best_users + 1,
                                                  std::memory_order_relaxed)) {
      break;
    }
  }
  thread_local ShardLease lease(best);
  tls_shard_plus_one = best + 1;
  return best;
}

}  // namespace internal

double Counter::Value() const {
  double total = 0;
  for (const internal::Line& line : shards_) {
    total +=
        std::bit_cast<double>(line.words[0].load(std::memory_order_relaxed));
  }
  return total;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  std::erase_if(bounds_, [](double b) { return !std::isfinite(b); });
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  const size_t words = 2 + bounds_.size();  // sum + finite buckets + +Inf
  lines_per_shard_ =
      (words + internal::kWordsPerLine - 1) / internal::kWordsPerLine;
  lines_ = std::make_unique<internal::Line[]>(lines_per_shard_ *
                                              internal::kNumShards);
}

HistogramSnapshot Histogram::Collect() const {
  const size_t buckets = bounds_.size() + 1;
  HistogramSnapshot snapshot;
  snapshot.cumulative_counts.assign(buckets, 0);
  for (uint32_t s = 0; s < internal::kNumShards; ++s) {
    const internal::Line* shard = lines_.get() + s * lines_per_shard_;
    snapshot.sum += std::bit_cast<double>(
        shard[0].words[0].load(std::memory_order_relaxed));
    for (size_t i = 0; i < buckets; ++i) {
      const size_t word = 1 + i;
      snapshot.cumulative_counts[i] +=
          shard[word / internal::kWordsPerLine]
              .words[word % internal::kWordsPerLine]
              .load(std::memory_order_relaxed);
    }
  }
  for (size_t i = 1; i < buckets; ++i) {
    snapshot.cumulative_counts[i] += snapshot.cumulative_counts[i - 1];
  }
  snapshot.count = snapshot.cumulative_counts.back();
  return snapshot;
}

}  // namespace swaserve::metrics
