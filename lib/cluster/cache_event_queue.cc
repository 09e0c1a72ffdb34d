#include "lib/cluster/cache_event_queue.h"

#include <algorithm>
#include <utility>

namespace swaserve::cluster {

CacheEventQueue::CacheEventQueue(size_t max_hashes)
    : max_hashes_(std::max<size_t>(max_hashes, 1)) {}

size_t CacheEventQueue::Weight(const CacheEventOp& op) {
  return op.kind == CacheEventOp::Kind::kCleared ? 1 : op.hashes.size();
}

void CacheEventQueue::Push(CacheEventOp::Kind kind,
                           absl::Span<const uint64_t> hashes) {
  Push(CacheEventOp{.kind = kind, .hashes = {hashes.begin(), hashes.end()}});
}

void CacheEventQueue::Push(const CacheEventOp& op) {
  const CacheEventOp::Kind kind = op.kind;
  const std::vector<uint64_t>& hashes = op.hashes;
  if (kind == CacheEventOp::Kind::kCleared) {
    PushCleared();
    return;
  }
  if (hashes.empty()) return;
  absl::MutexLock lock(&mu_);
  size_t i = 0;
  while (i < hashes.size()) {
    if (ops_.empty() || ops_.back().kind != kind || ops_.back().shard != op.shard ||
        ops_.back().index != op.index || ops_.back().stream != op.stream ||
        ops_.back().hashes.size() >= kMaxOpHashes) {
      ops_.push_back(
          CacheEventOp{.kind = kind, .shard = op.shard, .index = op.index, .stream = op.stream});
    }
    std::vector<uint64_t>& tail = ops_.back().hashes;
    const size_t n = std::min(hashes.size() - i, kMaxOpHashes - tail.size());
    tail.insert(tail.end(), hashes.begin() + i, hashes.begin() + i + n);
    i += n;
  }
  queued_hashes_ += hashes.size();
  EnforceBound();
}

void CacheEventQueue::PushCleared() {
  absl::MutexLock lock(&mu_);
  ops_.clear();
  ops_.push_back(CacheEventOp{CacheEventOp::Kind::kCleared, {}});
  queued_hashes_ = 0;
}

std::vector<CacheEventOp> CacheEventQueue::TakeBatch(size_t max_hashes) {
  max_hashes = std::max<size_t>(max_hashes, 1);
  std::vector<CacheEventOp> batch;
  absl::MutexLock lock(&mu_);
  size_t taken = 0;
  while (!ops_.empty() && taken < max_hashes) {
    CacheEventOp& front = ops_.front();
    const size_t weight = Weight(front);
    if (taken + weight <= max_hashes) {
      taken += weight;
      queued_hashes_ -= front.hashes.size();
      batch.push_back(std::move(front));
      ops_.pop_front();
      continue;
    }
    // Split: take the first (max_hashes - taken) hashes of the front op.
    const size_t n = max_hashes - taken;
    CacheEventOp part{
        .kind = front.kind,
        .hashes = std::vector<uint64_t>(front.hashes.begin(), front.hashes.begin() + n),
        .shard = front.shard,
        .index = front.index,
        .stream = front.stream};
    front.hashes.erase(front.hashes.begin(), front.hashes.begin() + n);
    queued_hashes_ -= n;
    taken += n;
    batch.push_back(std::move(part));
  }
  return batch;
}

void CacheEventQueue::Requeue(std::vector<CacheEventOp> batch) {
  absl::MutexLock lock(&mu_);
  for (const CacheEventOp& op : ops_) {
    if (op.kind == CacheEventOp::Kind::kCleared) return;  // superseded
  }
  for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
    if (it->kind != CacheEventOp::Kind::kCleared && it->hashes.empty()) {
      continue;
    }
    queued_hashes_ += it->hashes.size();
    ops_.push_front(std::move(*it));
  }
  EnforceBound();
}

void CacheEventQueue::EnforceBound() {
  if (queued_hashes_ <= max_hashes_) return;
  // Whatever is dropped, the index is rebuilt from what is kept.
  if (ops_.empty() || ops_.front().kind != CacheEventOp::Kind::kCleared) {
    ops_.push_front(CacheEventOp{CacheEventOp::Kind::kCleared, {}});
  }
  // A kCleared op can only be first (it drops everything before it); it
  // is never dropped, the oldest hashes after it are.
  while (queued_hashes_ > max_hashes_) {
    const size_t index =
        (!ops_.empty() && ops_.front().kind == CacheEventOp::Kind::kCleared)
            ? 1
            : 0;
    if (index >= ops_.size()) break;
    CacheEventOp& oldest = ops_[index];
    const size_t excess = queued_hashes_ - max_hashes_;
    if (oldest.hashes.size() <= excess) {
      queued_hashes_ -= oldest.hashes.size();
      dropped_hashes_ += oldest.hashes.size();
      ops_.erase(ops_.begin() + index);
    } else {
      oldest.hashes.erase(oldest.hashes.begin(),
                          oldest.hashes.begin() + excess);
      queued_hashes_ -= excess;
      dropped_hashes_ += excess;
    }
  }
}

size_t CacheEventQueue::queued_hashes() const {
  absl::MutexLock lock(&mu_);
  return queued_hashes_;
}

size_t CacheEventQueue::queued_ops() const {
  absl::MutexLock lock(&mu_);
  return ops_.size();
}

bool CacheEventQueue::empty() const {
  absl::MutexLock lock(&mu_);
  return ops_.empty();
}

uint64_t CacheEventQueue::dropped_hashes() const {
  absl::MutexLock lock(&mu_);
  return dropped_hashes_;
}

}  // namespace swaserve::cluster
