// The PrefixCache tests' fixture (prefix_cache_test.cc,
// prefix_cache_eviction_test.cc): tiny pools, prompts of labelled pages, an
// insert helper and a structural check of the cache after every step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv::prefix_cache_testing {
using Hashes = std::vector<uint64_t>;
using Lens = std::pair<int, int>;  // {matched_tokens, safe_tokens}

inline KvShape Shape(int window, int page_size) {
  KvShape s;
  s.full_layers = 1;
  s.full_kv_heads = 1;
  s.full_k_head_dim = 2;
  s.full_v_head_dim = 2;
  s.swa_layers = 1;
  s.swa_kv_heads = 1;
  s.swa_k_head_dim = 2;
  s.swa_v_head_dim = 2;
  s.sliding_window = window;
  s.page_size = page_size;
  s.dtype = DType::kF32;
  return s;
}

// Tokens of a prompt whose page i is made of `labels[i]` (page_size tokens
// label*1000 + j): prompts that share leading labels share a prefix.
inline std::vector<uint32_t> Tokens(const std::vector<uint32_t>& labels, int page_size) {
  std::vector<uint32_t> t;
  for (uint32_t l : labels)
    for (int j = 0; j < page_size; ++j) t.push_back(l * 1000 + j);
  return t;
}

struct Inserted {
  std::vector<PageId> full;
  std::vector<PageId> swa;  // kNoPage before the live run
};

class PrefixCacheTest : public ::testing::Test {
 protected:
  void Init(int window, int page_size = 4, int64_t full_pages = 64,
            int64_t swa_pages = 64) {
    KvPoolsOptions o;
    o.shape = Shape(window, page_size);
    o.full_pages = full_pages;
    o.swa_pages = swa_pages;
    o.allocate_memory = false;
    absl::StatusOr<std::unique_ptr<KvPools>> pools = KvPools::Create(o);
    ASSERT_TRUE(pools.ok()) << pools.status();
    pools_ = std::move(*pools);
    PrefixCacheOptions co;
    co.pools = pools_.get();
    co.keep_restorable_tombstones = keep_tombstones_;
    co.cold_superseded_windows = cold_superseded_;
    if (l2_full_pages_ > 0) {
      KvPoolsOptions l2 = o;
      l2.full_pages = l2_full_pages_;
      l2.swa_pages = l2_swa_pages_;
      absl::StatusOr<std::unique_ptr<KvPools>> l2_pools = KvPools::Create(l2);
      ASSERT_TRUE(l2_pools.ok()) << l2_pools.status();
      l2_ = std::move(*l2_pools);
      co.l2 = l2_.get();
    }
    co.on_event = [this](const CacheEvent& e) { events_.push_back(e); };
    absl::StatusOr<std::unique_ptr<PrefixCache>> cache = PrefixCache::Create(co);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
    ps_ = page_size;
    EXPECT_EQ(cache_->page_size(), page_size);
    EXPECT_EQ(cache_->sliding_window(), window);
  }

  void TearDown() override {
    if (cache_ != nullptr) {
      Check();
      cache_.reset();  // frees every cached page
    }
    if (pools_ != nullptr) {
      EXPECT_EQ(pools_->full().num_free(), pools_->full().num_pages())
          << "pages leaked after the cache was destroyed";
      EXPECT_EQ(pools_->swa().num_free(), pools_->swa().num_pages());
    }
  }

  Hashes H(const std::vector<uint32_t>& labels) const {
    return base::ChainedPageHashes(Tokens(labels, ps_), ps_);
  }

  // Structural invariants plus page conservation against the pools.
  void Check() {
    absl::Status s = cache_->CheckInvariants();
    ASSERT_TRUE(s.ok()) << s << "\n" << cache_->DebugString();
    for (PagePool* p : {&pools_->full(), &pools_->swa()}) {
      ASSERT_EQ(p->num_free() + p->num_reserved() + p->num_in_use() +
                    p->num_cached(),
                p->num_pages());
    }
    ASSERT_EQ(pools_->full().num_cached(), cache_->cached_full_pages());
    ASSERT_EQ(pools_->swa().num_cached(), cache_->cached_swa_pages());
  }

  std::vector<PageId> Take(PagePool& pool, int n) {
    std::vector<PageId> pages;
    EXPECT_TRUE(pool.Reserve(n, &pages));
    pool.Commit(pages);
    return pages;
  }

  // Inserts fresh private pages for `hashes`; SWA KV only for pages
  // [live_from, size).
  Inserted Insert(const Hashes& hashes, int live_from = 0) {
    const int n = static_cast<int>(hashes.size());
    Inserted in;
    in.full = Take(pools_->full(), n);
    std::vector<PageId> live = Take(pools_->swa(), n - live_from);
    in.swa.assign(live_from, kNoPage);
    in.swa.insert(in.swa.end(), live.begin(), live.end());
    cache_->Insert(hashes, in.full, in.swa);
    EXPECT_EQ(pools_->full().num_in_use(), 0) << "Insert must take over private pages";
    EXPECT_EQ(pools_->swa().num_in_use(), 0);
    Check();
    return in;
  }

  // Inserts a 5-page prompt like one with SWA checkpoints: pages 0-1 a
  // cold window, page 2 a tombstone, pages 3-4 the hot trailing window.
  void InsertColdHead(const Hashes& hashes) {
    ASSERT_EQ(hashes.size(), 5u);
    std::vector<PageId> full = Take(pools_->full(), 5);
    std::vector<PageId> swa = Take(pools_->swa(), 5);
    pools_->swa().Free({&swa[2], 1});
    swa[2] = kNoPage;
    cache_->Insert(hashes, full, swa, std::vector<uint8_t>{1, 1, 0, 0, 0});
    Check();
  }

  // Inserts fresh private pages for `hashes`; SWA KV for the pages where
  // `live` is true (any pattern).
  Inserted InsertPattern(const Hashes& hashes, const std::vector<bool>& live) {
    const int n = static_cast<int>(hashes.size());
    Inserted in;
    in.full = Take(pools_->full(), n);
    for (int i = 0; i < n; ++i) {
      in.swa.push_back(live[i] ? Take(pools_->swa(), 1)[0] : kNoPage);
    }
    cache_->Insert(hashes, in.full, in.swa);
    EXPECT_EQ(pools_->full().num_in_use(), 0) << "Insert must take over private pages";
    EXPECT_EQ(pools_->swa().num_in_use(), 0);
    Check();
    return in;
  }

  Lens M(const Hashes& h) const {
    MatchLengths m = cache_->Match(h);
    return {m.matched_tokens, m.safe_tokens};
  }

  static Hashes Prefix(const Hashes& h, int pages) {
    return Hashes(h.begin(), h.begin() + pages);
  }

  // Hashes of all events of `type` since the last ClearEvents(), sorted.
  Hashes Events(CacheEvent::Type type) const {
    Hashes out;
    for (const CacheEvent& e : events_)
      if (e.type == type) out.insert(out.end(), e.hashes.begin(), e.hashes.end());
    std::sort(out.begin(), out.end());
    return out;
  }
  static Hashes Sorted(Hashes h) {
    std::sort(h.begin(), h.end());
    return h;
  }
  void ClearEvents() { events_.clear(); }

  void ExpectCached(PagePool& pool, absl::Span<const PageId> pages) {
    for (PageId p : pages) {
      ASSERT_TRUE(pool.Valid(p)) << p;
      EXPECT_EQ(pool.state(p), PageState::kCached) << "page " << p;
    }
  }
  void ExpectFree(PagePool& pool, absl::Span<const PageId> pages) {
    for (PageId p : pages) {
      if (p == kNoPage) continue;
      EXPECT_EQ(pool.state(p), PageState::kFree) << "page " << p;
    }
  }

  std::unique_ptr<KvPools> pools_;
  std::unique_ptr<PrefixCache> cache_;
  std::vector<CacheEvent> events_;
  int ps_ = 4;
  bool keep_tombstones_ = false;  // PrefixCacheOptions::keep_restorable_tombstones
  bool cold_superseded_ = false;   // PrefixCacheOptions::cold_superseded_windows
  // L2 pools (0: no L2).
  int64_t l2_full_pages_ = 0;
  int64_t l2_swa_pages_ = 0;
  std::unique_ptr<KvPools> l2_;
};

#define CHECK_CACHE() ASSERT_NO_FATAL_FAILURE(Check())
}  // namespace swaserve::kv::prefix_cache_testing
