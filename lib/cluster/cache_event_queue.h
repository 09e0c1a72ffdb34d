// CacheEventQueue: the bounded, ordered queue of a worker's prefix-cache
// events (pages stored / removed / SWA KV dropped or healed / cache cleared)
// waiting to be written to
// the prefix-affinity index in Redis (WorkerRegistration drains it).
//
// Order matters (stored h, removed h, stored h must end with h present), so
// the queue is FIFO and batches are applied in order. Consecutive events of
// the same kind are coalesced into one op (up to kMaxOpHashes hashes). A
// "cleared" event supersedes everything queued before it, which is dropped (not
// counted as lost).
//
// Bound: at most max_hashes hashes are queued. When a push (or a requeue
// after a failed flush) exceeds it, the OLDEST hashes are dropped (counted
// in dropped_hashes()) and a kCleared op is put first: the worker's index is
// then rebuilt from the newest events only. Dropping a removal would
// otherwise leave an entry that never goes away (authoritative entries have
// no per-entry TTL, prefix_index.h); this way an overflow only costs the
// affinity of pages stored before it. While Redis is down a worker keeps
// serving with a bounded backlog.
//
// Delivery is at-least-once: TakeBatch() hands out the oldest ops; after a
// failed write the caller gives them back with Requeue() and they go first
// again. Replaying an in-order batch is idempotent for the index.
//
// Thread-safe: producers (the serving threads) and the draining thread may
// call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace swaserve::cluster {

struct CacheEventOp {
  // kSwaRemoved / kSwaStored: the pages keep their full KV but lose (or
  // regain) their SWA KV (kv::CacheEvent).
  // kTierDown / kTierUp: the pages moved to the lower tier (L2, host
  // memory) or back to L1 (kv::CacheEvent::kTierChanged); still cached.
  enum class Kind { kStored, kRemoved, kCleared, kSwaRemoved, kSwaStored, kTierDown, kTierUp };
  Kind kind = Kind::kStored;
  // Chained page hashes (empty for kCleared).
  std::vector<uint64_t> hashes;
  // A sharded index (prefix_index.h; IndexShardMapper): the index shard the
  // op applies to (0 when the index has one shard; ignored by kCleared,
  // which clears every shard), whether it applies to the index at all, and
  // whether it goes to the worker's KV event stream (false for the copies a
  // sharded index needs: head pages copied into another shard).
  int shard = 0;
  bool index = true;
  bool stream = true;

  bool operator==(const CacheEventOp&) const = default;
};

class CacheEventQueue {
 public:
  // Largest op built by coalescing pushes (bigger pushes are split), so that
  // dropping or splitting the oldest op stays cheap.
  static constexpr size_t kMaxOpHashes = 4096;

  // max_hashes >= 1.
  explicit CacheEventQueue(size_t max_hashes);

  // Appends hashes that were stored (or removed). Empty spans are ignored.
  void Push(CacheEventOp::Kind kind, absl::Span<const uint64_t> hashes);
  // The same with the op's shard and flags: consecutive ops coalesce only
  // when kind, shard and flags agree. A kCleared op is PushCleared().
  void Push(const CacheEventOp& op);
  // The worker's cache was cleared: drops what is queued, appends kCleared.
  void PushCleared();

  // Removes and returns the oldest ops holding at most `max_hashes` hashes
  // in total (an op is split when needed; a kCleared op counts as one).
  // Empty when the queue is empty.
  std::vector<CacheEventOp> TakeBatch(size_t max_hashes);

  // Puts a batch that could not be written back at the front, ahead of
  // everything pushed since; then applies the bound (dropping oldest). A
  // batch taken before a kCleared that is now queued is discarded instead
  // (superseded).
  void Requeue(std::vector<CacheEventOp> batch);

  size_t queued_hashes() const;
  size_t queued_ops() const;
  bool empty() const;
  // Hashes dropped by the bound since construction.
  uint64_t dropped_hashes() const;

 private:
  static size_t Weight(const CacheEventOp& op);
  void EnforceBound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_hashes_;
  mutable absl::Mutex mu_;
  std::deque<CacheEventOp> ops_ ABSL_GUARDED_BY(mu_);
  size_t queued_hashes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_hashes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace swaserve::cluster
