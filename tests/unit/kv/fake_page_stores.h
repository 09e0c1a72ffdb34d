// PageStore test doubles over a MemoryPageStore, shared by the L3 tests
// (l3_tier_test, kv_metrics_test): a store whose puts wait at a gate the test
// opens (to hold a write-behind queue full), and one that records the order
// of its puts. Header-only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_store.h"

namespace swaserve::kv::testing {

// Forwards every call to `inner_` (1 MiB by default); subclasses change Put.
class ForwardingStore : public PageStore {
 public:
  explicit ForwardingStore(int64_t capacity = 1 << 20) : inner_(capacity) {}
  absl::Status Put(const PageKey& k, absl::Span<const uint8_t> b) override {
    return inner_.Put(k, b);
  }
  absl::Status Get(const PageKey& k, absl::Span<uint8_t> out) override { return inner_.Get(k, out); }
  bool Contains(const PageKey& k) override { return inner_.Contains(k); }
  void Erase(const PageKey& k) override { inner_.Erase(k); }
  std::string_view backend() const override { return "fake"; }
  const PageStoreStats& stats() const override { return inner_.stats(); }
  MemoryPageStore inner_;
};

// Puts wait until Open(). Thread-safe.
class GatedStore final : public ForwardingStore {
 public:
  absl::Status Put(const PageKey& k, absl::Span<const uint8_t> b) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&open_));
    return ForwardingStore::Put(k, b);
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  absl::Mutex mu_;
  bool open_ = false;
};

// Records the first put of each hash, in order. Not thread-safe.
class RecordingStore final : public ForwardingStore {
 public:
  absl::Status Put(const PageKey& k, absl::Span<const uint8_t> b) override {
    if (std::find(order_.begin(), order_.end(), k.hash) == order_.end()) order_.push_back(k.hash);
    return ForwardingStore::Put(k, b);
  }
  std::vector<uint64_t> order_;
};

// A store with a room for puts that the test sets (a write-behind queue's
// free space, PutRoom): a put larger than what is left of it is dropped
// (ResourceExhausted), as AsyncPageStore drops one. Not thread-safe.
class RoomLimitedStore final : public ForwardingStore {
 public:
  explicit RoomLimitedStore(int64_t capacity) : ForwardingStore(capacity) {}
  absl::Status Put(const PageKey& k, absl::Span<const uint8_t> b) override {
    if (static_cast<int64_t>(b.size()) > room_) {
      ++dropped_;
      return absl::ResourceExhaustedError("no room");
    }
    room_ -= static_cast<int64_t>(b.size());
    return ForwardingStore::Put(k, b);
  }
  int64_t PutRoom() const override { return room_; }
  int64_t room_ = std::numeric_limits<int64_t>::max();
  int64_t dropped_ = 0;
};

}  // namespace swaserve::kv::testing
