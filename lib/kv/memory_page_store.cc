#include "lib/kv/memory_page_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace swaserve::kv {

MemoryPageStore::MemoryPageStore(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

void MemoryPageStore::EraseLocked(absl::flat_hash_map<PageKey, Entry>::iterator it) {
  held_ -= static_cast<int64_t>(it->second.bytes.size()) + kEntryOverhead;
  lru_.erase(it->second.lru);
  map_.erase(it);
  stats_.bytes.store(held_, std::memory_order_relaxed);
  stats_.entries.store(static_cast<int64_t>(map_.size()), std::memory_order_relaxed);
}

absl::Status MemoryPageStore::Put(const PageKey& key, absl::Span<const uint8_t> bytes) {
  const int64_t need = static_cast<int64_t>(bytes.size()) + kEntryOverhead;
  if (need > capacity_) {
    stats_.put_errors.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("page blob of ", bytes.size(), " bytes exceeds the store (", capacity_, ")"));
  }
  absl::MutexLock lock(&mu_);
  if (auto it = map_.find(key); it != map_.end()) EraseLocked(it);
  while (held_ + need > capacity_ && !lru_.empty()) {
    EraseLocked(map_.find(lru_.back()));
    stats_.evictions.fetch_add(1, std::memory_order_relaxed);
  }
  lru_.push_front(key);
  map_.emplace(key, Entry{std::vector<uint8_t>(bytes.begin(), bytes.end()), lru_.begin()});
  held_ += need;
  stats_.puts.fetch_add(1, std::memory_order_relaxed);
  stats_.put_bytes.fetch_add(static_cast<int64_t>(bytes.size()), std::memory_order_relaxed);
  stats_.bytes.store(held_, std::memory_order_relaxed);
  stats_.entries.store(static_cast<int64_t>(map_.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status MemoryPageStore::Get(const PageKey& key, absl::Span<uint8_t> out) {
  stats_.gets.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    stats_.misses.fetch_add(1, std::memory_order_relaxed);
    return absl::NotFoundError("page not in the memory store");
  }
  if (it->second.bytes.size() != out.size()) {
    stats_.get_errors.fetch_add(1, std::memory_order_relaxed);
    return absl::InvalidArgumentError(absl::StrCat("page blob holds ", it->second.bytes.size(),
                                                   " bytes, caller expects ", out.size()));
  }
  if (!out.empty()) std::memcpy(out.data(), it->second.bytes.data(), out.size());
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  stats_.hits.fetch_add(1, std::memory_order_relaxed);
  stats_.get_bytes.fetch_add(static_cast<int64_t>(out.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

bool MemoryPageStore::Contains(const PageKey& key) {
  absl::MutexLock lock(&mu_);
  return map_.contains(key);
}

void MemoryPageStore::Erase(const PageKey& key) {
  absl::MutexLock lock(&mu_);
  if (auto it = map_.find(key); it != map_.end()) EraseLocked(it);
}

void MemoryPageStore::Flush() {
  absl::MutexLock lock(&mu_);
  while (!lru_.empty()) EraseLocked(map_.find(lru_.back()));
}

// --- AsyncPageStore ---

AsyncPageStore::AsyncPageStore(std::unique_ptr<PageStore> backend,
                               const AsyncPageStoreOptions& options)
    : backend_(std::move(backend)), options_(options) {
  thread_ = std::thread([this] { Run(); });
}

AsyncPageStore::~AsyncPageStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::Status AsyncPageStore::Put(const PageKey& key, absl::Span<const uint8_t> bytes) {
  absl::MutexLock lock(&mu_);
  const int64_t n = static_cast<int64_t>(bytes.size());
  if (queued_bytes_ + n > options_.max_queued_bytes && !queue_.empty()) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError("L3 write-behind queue full: put dropped");
  }
  const uint64_t seq = next_seq_++;
  queue_.push_back(Pending{key, std::vector<uint8_t>(bytes.begin(), bytes.end()), seq});
  latest_[key] = seq;
  queued_bytes_ += n;
  return absl::OkStatus();
}

absl::Status AsyncPageStore::Get(const PageKey& key, absl::Span<uint8_t> out) {
  {
    absl::MutexLock lock(&mu_);
    auto it = latest_.find(key);
    if (it != latest_.end() && !queue_.empty()) {
      // The queue is ordered by seq with no gaps except popped ones.
      const Pending& p = queue_[it->second - queue_.front().seq];
      if (p.bytes.size() != out.size()) {
        return absl::InvalidArgumentError(absl::StrCat("queued page blob holds ", p.bytes.size(),
                                                       " bytes, caller expects ", out.size()));
      }
      if (!out.empty()) std::memcpy(out.data(), p.bytes.data(), out.size());
      return absl::OkStatus();
    }
  }
  return backend_->Get(key, out);
}

bool AsyncPageStore::Contains(const PageKey& key) {
  {
    absl::MutexLock lock(&mu_);
    if (latest_.contains(key)) return true;
  }
  return backend_->Contains(key);
}

std::vector<bool> AsyncPageStore::ContainsEach(absl::Span<const PageKey> keys) {
  std::vector<bool> out(keys.size(), false);
  std::vector<PageKey> ask;
  std::vector<size_t> where;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (latest_.contains(keys[i])) {
        out[i] = true;
      } else {
        ask.push_back(keys[i]);
        where.push_back(i);
      }
    }
  }
  if (ask.empty()) return out;
  const std::vector<bool> got = backend_->ContainsEach(ask);
  for (size_t j = 0; j < ask.size() && j < got.size(); ++j) out[where[j]] = got[j];
  return out;
}

void AsyncPageStore::Erase(const PageKey& key) {
  {
    absl::MutexLock lock(&mu_);
    // A queued put of the key is skipped (Run checks latest_ before putting
    // and erases again after a put that raced with this).
    latest_.erase(key);
  }
  backend_->Erase(key);
}

int64_t AsyncPageStore::PutRoom() const {
  absl::MutexLock lock(&mu_);
  return std::max<int64_t>(0, options_.max_queued_bytes - queued_bytes_);
}

int64_t AsyncPageStore::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}

void AsyncPageStore::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = next_seq_ - 1;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_seq_ >= target; };
  mu_.Await(absl::Condition(&done));
}

void AsyncPageStore::Run() {
  while (true) {
    const Pending* p = nullptr;
    bool current = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      p = &queue_.front();        // references survive push_back
      auto it = latest_.find(p->key);
      current = it != latest_.end() && it->second == p->seq;
    }
    // A blob superseded by a later put of the same key, or erased, is skipped.
    if (current) (void)backend_->Put(p->key, p->bytes);
    absl::MutexLock lock(&mu_);
    auto it = latest_.find(p->key);
    if (current && it == latest_.end()) {
      backend_->Erase(p->key);  // erased while the put was in flight
    } else if (it != latest_.end() && it->second == p->seq) {
      latest_.erase(it);
    }
    queued_bytes_ -= static_cast<int64_t>(p->bytes.size());
    done_seq_ = p->seq;
    queue_.pop_front();
  }
}

}  // namespace swaserve::kv
