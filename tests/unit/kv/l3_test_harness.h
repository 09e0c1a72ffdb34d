// A prefix cache with real page bytes, an L2 and an optional L3, for the
// L3 tier's tests (tests/unit/kv/l3_tier_test.cc and the Redis L3 replay in
// tests/integration/cluster/redis_page_store_test.cc): inserts prompts with
// known bytes per page (Pattern), moves them through the tiers, fetches and
// attaches from L3 and checks every byte a hit reads. Header-only.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/page_store.h"
#include "lib/kv/prefix_cache.h"
#include "tests/unit/kv/page_store_test_util.h"

namespace swaserve::kv::testing {

using Hashes = std::vector<uint64_t>;

inline KvShape Shape() {
  KvShape s;
  s.full_layers = 2;
  s.full_kv_heads = 1;
  s.full_k_head_dim = 4;
  s.full_v_head_dim = 4;
  s.swa_layers = 3;
  s.swa_kv_heads = 1;
  s.swa_k_head_dim = 4;
  s.swa_v_head_dim = 4;
  s.sliding_window = 8;  // 2 pages of 4 tokens
  s.page_size = 4;
  s.dtype = DType::kF32;
  return s;
}

// The bytes a page of `pool` holds for chained hash h (what "the writer"
// wrote).
inline std::vector<uint8_t> Pattern(uint64_t h, PoolKind pool, size_t bytes) {
  return Payload(h, pool == PoolKind::kFull ? 1 : 2, bytes);
}

class L3Harness {
 public:
  void Init(PageStore* l3, int write_through_hits, int64_t l1_pages = 16, int64_t l2_pages = 8,
            bool keep_tombstones = false, int write_through_from_tokens = 0) {
    cache_.reset();
    KvPoolsOptions o;
    o.shape = Shape();
    o.full_pages = l1_pages;
    o.swa_pages = l1_pages;
    o.allocate_memory = true;
    pools_ = std::move(*KvPools::Create(o));
    o.full_pages = l2_pages;
    o.swa_pages = l2_pages;
    l2_ = std::move(*KvPools::Create(o));
    PrefixCacheOptions co;
    co.pools = pools_.get();
    co.l2 = l2_.get();
    co.l3 = l3;
    co.l3_write_through_hits = write_through_hits;
    co.l3_write_through_from_tokens = write_through_from_tokens;
    co.keep_restorable_tombstones = keep_tombstones;
    absl::StatusOr<std::unique_ptr<PrefixCache>> c = PrefixCache::Create(co);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(*c);
  }
  void Check() {
    if (cache_ == nullptr) return;
    absl::Status s = cache_->CheckInvariants();
    ASSERT_TRUE(s.ok()) << s << "\n" << cache_->DebugString();
  }

  Hashes H(uint32_t label, int pages) const {
    std::vector<uint32_t> t;
    for (int i = 0; i < pages * 4; ++i) t.push_back(label * 1000 + i);
    return base::ChainedPageHashes(t, 4);
  }

  // Inserts `h` with the writer's bytes; SWA KV for its trailing window.
  void Insert(const Hashes& h) {
    const int n = static_cast<int>(h.size());
    std::vector<PageId> full, swa;
    ASSERT_TRUE(pools_->full().Reserve(n, &full));
    pools_->full().Commit(full);
    ASSERT_TRUE(pools_->swa().Reserve(2, &swa));
    pools_->swa().Commit(swa);
    std::vector<PageId> swa_all(n, kNoPage);
    for (int i = 0; i < n; ++i) {
      Fill(pools_->full(), full[i], h[i], PoolKind::kFull);
      if (i >= n - 2) {
        swa_all[i] = swa[i - (n - 2)];
        Fill(pools_->swa(), swa_all[i], h[i], PoolKind::kSwa);
      }
    }
    cache_->Insert(h, full, swa_all);
    Check();
  }
  static void Fill(PagePool& pool, PageId p, uint64_t h, PoolKind kind) {
    const std::vector<uint8_t> v = Pattern(h, kind, pool.page_bytes());
    std::memcpy(pool.PageData(p), v.data(), v.size());
  }

  // Evicts everything out of L1 and L2 (write-back to L3).
  void EvictAll() {
    cache_->Evict(1 << 20, 1 << 20);
    for (int i = 0; i < 4; ++i) cache_->Evict(1 << 20, 0);
    cache_->Clear();
    Check();
  }

  // Fetch from L3 for where the tree stands, attach, load back; returns the
  // full pages attached.
  int FetchAttach(PageStore& l3, const Hashes& h) {
    const MatchLengths m = cache_->Match(h);
    const L3Fetch f = FetchFromL3(l3, cache_->l3_fetch_options(), h,
                                  (m.matched_tokens + m.lower_tier_tokens) / 4, m.safe_tokens / 4);
    const int attached = cache_->AttachFromL3(h, f);
    Check();
    cache_->LoadBack(h);
    Check();
    return attached;
  }

  // Another worker on the same store (a fresh cache, no write-through)
  // fetches every page of `h` from `l3` and hits all of it, byte for byte.
  void ExpectAnotherWorkerFindsAll(PageStore& l3, const Hashes& h) {
    Init(&l3, /*write_through_hits=*/0);
    EXPECT_EQ(FetchAttach(l3, h), static_cast<int>(h.size()));
    EXPECT_EQ(VerifyHit(h), static_cast<int>(h.size()) * 4);
  }

  // Locks the hit of `h` and checks every byte it reads against the
  // writer's; returns the hit's length in tokens.
  int VerifyHit(const Hashes& h) {
    CacheHit hit = cache_->MatchAndLock(h);
    const int pages = hit.tokens() / 4;
    for (int i = 0; i < pages; ++i) {
      const PagePool& pool = pools_->full();
      EXPECT_EQ(0, std::memcmp(pool.PageData(hit.full_pages()[i]),
                               Pattern(h[i], PoolKind::kFull, pool.page_bytes()).data(),
                               pool.page_bytes()))
          << "full page " << i;
    }
    for (size_t j = 0; j < hit.swa_pages().size(); ++j) {
      const int i = hit.swa_first_page() + static_cast<int>(j);
      const PagePool& pool = pools_->swa();
      EXPECT_EQ(0, std::memcmp(pool.PageData(hit.swa_pages()[j]),
                               Pattern(h[i], PoolKind::kSwa, pool.page_bytes()).data(),
                               pool.page_bytes()))
          << "SWA page " << i;
    }
    const int tokens = hit.tokens();
    cache_->Unlock(hit);
    return tokens;
  }

  std::unique_ptr<KvPools> pools_, l2_;
  std::unique_ptr<PrefixCache> cache_;
};

}  // namespace swaserve::kv::testing
