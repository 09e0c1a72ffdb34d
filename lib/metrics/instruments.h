// The three metric kinds a Registry hands out: Counter, Gauge and Histogram.
//
// Usually obtained from a Registry family (`family->WithLabels({...})`),
// which owns them; callers cache the returned reference for the family's
// lifetime (the Registry's). They can also be created standalone.
//
// Thread-safety: every method is thread-safe, and the update paths
// (Counter::Increment, Gauge::Set/Increment/Decrement, Histogram::Observe)
// are lock-free. Counters and histograms are sharded: on its first update a
// thread is given the least-used of kNumShards shards (process-wide, given
// back when the thread exits), and every child has one cache-line-aligned
// slot per shard, so threads updating the same child do not bounce one cache
// line between cores. Reads (Value, Collect) sum the shards; a read concurrent
// with updates sees each update either fully or not at all per shard word, so a
// histogram's sum may lag its count by in-flight observations (as in every
// Prometheus client), while its buckets and count are always consistent.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace swaserve::metrics {

namespace internal {

inline constexpr size_t kCacheLineSize = 64;
// Shards per counter/histogram child. Threads beyond this share shards
// (still correct, just contended); 16 covers the handful of threads that
// update metrics in a swaserve service.
inline constexpr uint32_t kNumShards = 16;

// One cache line of 64-bit atomic words.
struct alignas(kCacheLineSize) Line {
  std::atomic<uint64_t> words[kCacheLineSize / sizeof(uint64_t)] = {};
};
inline constexpr size_t kWordsPerLine = kCacheLineSize / sizeof(uint64_t);

// Shard index of the calling thread plus one; 0 until first use.
// Constant-initialized, so access is a plain TLS load.
inline thread_local uint32_t tls_shard_plus_one = 0;

// Picks the calling thread's shard (the least-used one) and stores it in
// TLS.
uint32_t AssignThreadShard();

inline uint32_t ThisThreadShard() {
  const uint32_t s = tls_shard_plus_one;
  if (s == 0) [[unlikely]] {
    return AssignThreadShard();
  }
  return s - 1;
}

// Adds `delta` to the double stored (as its bit pattern) in `bits`.
// Relaxed: metric words are independent statistics, not synchronization.
inline void AtomicAddDouble(std::atomic<uint64_t>& bits, double delta) {
  uint64_t old_bits = bits.load(std::memory_order_relaxed);
  while (!bits.compare_exchange_weak(
      old_bits,
      std::bit_cast<uint64_t>(std::bit_cast<double>(old_bits) + delta),
      std::memory_order_relaxed, std::memory_order_relaxed)) {
  }
}

}  // namespace internal

// A monotonically increasing value (requests served, tokens generated).
class alignas(internal::kCacheLineSize) Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta`. Counters only go up: negative and NaN deltas are ignored.
  void Increment(double delta = 1.0) {
    if (!(delta >= 0)) return;
    internal::AtomicAddDouble(shards_[internal::ThisThreadShard()].words[0],
                              delta);
  }

  // The current total (sum over shards).
  double Value() const;

 private:
  internal::Line shards_[internal::kNumShards];
};

// A value that goes up and down (queue depth, pages in use).
class alignas(internal::kCacheLineSize) Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0) {
    value_.fetch_add(delta, std::memory_order_relaxed);
  }
  void Decrement(double delta = 1.0) {
    value_.fetch_sub(delta, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Point-in-time view of a histogram.
struct HistogramSnapshot {
  // Cumulative counts, one per finite bound plus the +Inf bucket last, so
  // cumulative_counts.back() == count.
  std::vector<uint64_t> cumulative_counts;
  double sum = 0;
  uint64_t count = 0;
};

// Counts observations into buckets with inclusive upper bounds ("le").
class Histogram {
 public:
  // `bounds` are the finite upper bounds, strictly increasing (see
  // NormalizeBuckets in buckets.h; the Registry validates them). Invalid
  // input is sanitized here rather than trusted: non-finite bounds are
  // dropped, the rest sorted and deduplicated.
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Records one observation: into the first bucket whose bound is >= value
  // (+Inf bucket when none), and into the sum. NaN is ignored.
  void Observe(double value) {
    if (std::isnan(value)) return;
    const size_t bucket = BucketIndex(value);
    internal::Line* shard =
        lines_.get() + internal::ThisThreadShard() * lines_per_shard_;
    const size_t word = 1 + bucket;  // word 0 holds the sum
    shard[word / internal::kWordsPerLine]
        .words[word % internal::kWordsPerLine]
        .fetch_add(1, std::memory_order_relaxed);
    internal::AtomicAddDouble(shard[0].words[0], value);
  }

  const std::vector<double>& bounds() const { return bounds_; }

  HistogramSnapshot Collect() const;

 private:
  size_t BucketIndex(double value) const {
    // Linear scan: bucket lists are short (~20) and the scan is branch-
    // predictable for the typical narrow value ranges of one metric.
    const size_t n = bounds_.size();
    const double* b = bounds_.data();
    size_t i = 0;
    while (i < n && value > b[i]) ++i;
    return i;
  }

  std::vector<double> bounds_;
  // kNumShards shards of lines_per_shard_ lines each. Shard words: [0] the
  // sum (double bits), [1 + i] the count of bucket i (non-cumulative),
  // i in [0, bounds_.size()], the last one being +Inf.
  size_t lines_per_shard_;
  std::unique_ptr<internal::Line[]> lines_;
};

}  // namespace swaserve::metrics
