#include "lib/kv/page_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace swaserve::kv {
namespace {

PoolGeometry SmallGeometry(PoolKind kind = PoolKind::kFull) {
  PoolGeometry g;
  g.kind = kind;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.k_head_dim = 6;
  g.v_head_dim = 4;
  g.dtype = DType::kBF16;
  g.page_size = 4;
  return g;
}

KvShape SmallShape() {
  KvShape s;
  s.full_layers = 2;
  s.full_kv_heads = 2;
  s.full_k_head_dim = 6;
  s.full_v_head_dim = 4;
  s.swa_layers = 5;
  s.swa_kv_heads = 1;
  s.swa_k_head_dim = 8;
  s.swa_v_head_dim = 2;
  s.sliding_window = 8;
  s.page_size = 4;
  s.dtype = DType::kF32;
  return s;
}

std::unique_ptr<PagePool> MakePool(int64_t n, bool memory = true) {
  PagePoolOptions o;
  o.geometry = SmallGeometry();
  o.num_pages = n;
  o.allocate_memory = memory;
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

void ExpectCounts(const PagePool& p, int64_t free, int64_t reserved,
                  int64_t in_use, int64_t cached) {
  EXPECT_EQ(p.num_free(), free);
  EXPECT_EQ(p.num_reserved(), reserved);
  EXPECT_EQ(p.num_in_use(), in_use);
  EXPECT_EQ(p.num_cached(), cached);
  EXPECT_EQ(p.num_in_state(PageState::kFree), free);
  EXPECT_EQ(p.num_in_state(PageState::kReserved), reserved);
  EXPECT_EQ(p.num_in_state(PageState::kInUse), in_use);
  EXPECT_EQ(p.num_in_state(PageState::kCached), cached);
  EXPECT_EQ(free + reserved + in_use + cached, p.num_pages());
}

TEST(PagePool, CreateStartsAllFree) {
  auto pool = MakePool(10);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_pages(), 10);
  EXPECT_EQ(pool->kind(), PoolKind::kFull);
  EXPECT_EQ(pool->geometry().num_layers, 2);
  ExpectCounts(*pool, 10, 0, 0, 0);
  for (PageId p = 0; p < 10; ++p) EXPECT_EQ(pool->state(p), PageState::kFree);
  EXPECT_TRUE(pool->Valid(0));
  EXPECT_TRUE(pool->Valid(9));
  EXPECT_FALSE(pool->Valid(10));
  EXPECT_FALSE(pool->Valid(-1));
  EXPECT_FALSE(pool->Valid(kNoPage));
}

TEST(PagePool, CreateRejectsBadOptions) {
  PagePoolOptions o;
  o.geometry = SmallGeometry();
  o.num_pages = -1;
  EXPECT_FALSE(PagePool::Create(o).ok());
  o.num_pages = 4;
  o.geometry.k_head_dim = 0;
  absl::StatusOr<std::unique_ptr<PagePool>> bad = PagePool::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagePool, StateTransitions) {
  auto pool = MakePool(8);
  ASSERT_NE(pool, nullptr);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool->Reserve(3, &pages));
  ASSERT_EQ(pages.size(), 3u);
  std::set<PageId> distinct(pages.begin(), pages.end());
  EXPECT_EQ(distinct.size(), 3u);
  for (PageId p : pages) {
    EXPECT_TRUE(pool->Valid(p));
    EXPECT_EQ(pool->state(p), PageState::kReserved);
  }
  ExpectCounts(*pool, 5, 3, 0, 0);

  pool->Commit(pages);
  for (PageId p : pages) EXPECT_EQ(pool->state(p), PageState::kInUse);
  ExpectCounts(*pool, 5, 0, 3, 0);

  pool->ToCache({pages[0], pages[1]});
  EXPECT_EQ(pool->state(pages[0]), PageState::kCached);
  EXPECT_EQ(pool->state(pages[1]), PageState::kCached);
  EXPECT_EQ(pool->state(pages[2]), PageState::kInUse);
  ExpectCounts(*pool, 5, 0, 1, 2);

  pool->Free({pages[0]});   // cached -> free
  pool->Free({pages[2]});   // in use -> free
  EXPECT_EQ(pool->state(pages[0]), PageState::kFree);
  EXPECT_EQ(pool->state(pages[2]), PageState::kFree);
  ExpectCounts(*pool, 7, 0, 0, 1);

  std::vector<PageId> more;
  ASSERT_TRUE(pool->Reserve(2, &more));
  ExpectCounts(*pool, 5, 2, 0, 1);
  pool->Unreserve(more);
  for (PageId p : more) EXPECT_EQ(pool->state(p), PageState::kFree);
  ExpectCounts(*pool, 7, 0, 0, 1);
  pool->Free({pages[1]});
  ExpectCounts(*pool, 8, 0, 0, 0);
}

TEST(PagePool, ReserveIsAllOrNothingAndAppends) {
  auto pool = MakePool(5);
  ASSERT_NE(pool, nullptr);
  std::vector<PageId> out = {kNoPage};  // Reserve appends
  ASSERT_TRUE(pool->Reserve(4, &out));
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0], kNoPage);
  std::vector<PageId> before = out;
  EXPECT_FALSE(pool->Reserve(2, &out));
  EXPECT_EQ(out, before);
  ExpectCounts(*pool, 1, 4, 0, 0);
  EXPECT_TRUE(pool->Reserve(0, &out));
  EXPECT_EQ(out, before);
  EXPECT_TRUE(pool->Reserve(1, &out));
  EXPECT_EQ(out.size(), 6u);
  ExpectCounts(*pool, 0, 5, 0, 0);
  EXPECT_FALSE(pool->Reserve(1, &out));
  EXPECT_EQ(out.size(), 6u);
}

TEST(PagePool, EveryPageCanBeTakenOnceAndReused) {
  auto pool = MakePool(64);
  ASSERT_NE(pool, nullptr);
  std::vector<PageId> all;
  ASSERT_TRUE(pool->Reserve(64, &all));
  std::set<PageId> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), 64u);
  EXPECT_EQ(*distinct.begin(), 0);
  EXPECT_EQ(*distinct.rbegin(), 63);
  pool->Commit(all);
  pool->Free(all);
  ExpectCounts(*pool, 64, 0, 0, 0);
  std::vector<PageId> again;
  ASSERT_TRUE(pool->Reserve(64, &again));
  std::set<PageId> distinct2(again.begin(), again.end());
  EXPECT_EQ(distinct2, distinct);
  pool->Unreserve(again);
}

TEST(PagePool, RandomConservation) {
  auto pool = MakePool(32, /*memory=*/false);
  ASSERT_NE(pool, nullptr);
  std::mt19937 rng(11);
  std::vector<PageId> reserved, in_use, cached;
  auto take = [&](std::vector<PageId>& v, size_t n) {
    std::shuffle(v.begin(), v.end(), rng);
    std::vector<PageId> out(v.end() - n, v.end());
    v.resize(v.size() - n);
    return out;
  };
  for (int step = 0; step < 20000; ++step) {
    const int op = rng() % 6;
    if (op == 0) {
      const int64_t n = rng() % 6;
      const int64_t free_before = pool->num_free();
      std::vector<PageId> got;
      const bool ok = pool->Reserve(n, &got);
      ASSERT_EQ(ok, n <= free_before);
      ASSERT_EQ(pool->num_free(), ok ? free_before - n : free_before);
      if (ok) reserved.insert(reserved.end(), got.begin(), got.end());
      else ASSERT_TRUE(got.empty());
    } else if (op == 1 && !reserved.empty()) {
      auto v = take(reserved, 1 + rng() % reserved.size());
      pool->Commit(v);
      in_use.insert(in_use.end(), v.begin(), v.end());
    } else if (op == 2 && !reserved.empty()) {
      pool->Unreserve(take(reserved, 1 + rng() % reserved.size()));
    } else if (op == 3 && !in_use.empty()) {
      auto v = take(in_use, 1 + rng() % in_use.size());
      pool->ToCache(v);
      cached.insert(cached.end(), v.begin(), v.end());
    } else if (op == 4 && !in_use.empty()) {
      pool->Free(take(in_use, 1 + rng() % in_use.size()));
    } else if (op == 5 && !cached.empty()) {
      pool->Free(take(cached, 1 + rng() % cached.size()));
    }
    ASSERT_EQ(pool->num_reserved(), static_cast<int64_t>(reserved.size()));
    ASSERT_EQ(pool->num_in_use(), static_cast<int64_t>(in_use.size()));
    ASSERT_EQ(pool->num_cached(), static_cast<int64_t>(cached.size()));
    ASSERT_EQ(pool->num_free() + pool->num_reserved() + pool->num_in_use() +
                  pool->num_cached(),
              32);
    for (PageId p : reserved) ASSERT_EQ(pool->state(p), PageState::kReserved);
    for (PageId p : in_use) ASSERT_EQ(pool->state(p), PageState::kInUse);
    for (PageId p : cached) ASSERT_EQ(pool->state(p), PageState::kCached);
  }
}

TEST(PagePool, MemoryIsContiguousAndPageAligned) {
  auto pool = MakePool(17);
  ASSERT_NE(pool, nullptr);
  const size_t pb = SmallGeometry().PageBytes();
  EXPECT_EQ(pool->page_bytes(), pb);
  EXPECT_EQ(pool->total_bytes(), 17 * pb);
  ASSERT_NE(pool->base(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->base()) % 4096, 0u)
      << "pool memory should start on an OS page boundary";
  for (PageId p = 0; p < 17; ++p) {
    EXPECT_EQ(pool->PageData(p), pool->base() + p * pb);
  }
  // The whole buffer is usable memory (ASan checks the bounds).
  std::memset(pool->base(), 0x5A, pool->total_bytes());
  for (PageId p = 0; p < 17; ++p) {
    std::memset(pool->PageData(p), p, pb);
  }
  for (PageId p = 0; p < 17; ++p) {
    EXPECT_EQ(pool->PageData(p)[0], static_cast<uint8_t>(p));
    EXPECT_EQ(pool->PageData(p)[pb - 1], static_cast<uint8_t>(p));
  }
}

TEST(PagePool, MetadataOnlyPoolHasNoMemory) {
  auto pool = MakePool(1000000, /*memory=*/false);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->base(), nullptr);
  EXPECT_EQ(pool->PageData(0), nullptr);
  EXPECT_EQ(pool->PageData(999999), nullptr);
  EXPECT_EQ(pool->page_bytes(), SmallGeometry().PageBytes());
  std::vector<PageId> pages;
  EXPECT_TRUE(pool->Reserve(1000000, &pages));
  pool->Unreserve(pages);
  EXPECT_EQ(pool->num_free(), 1000000);
}

using PagePoolDeathTest = ::testing::Test;

TEST(PagePoolDeathTest, IllegalTransitionsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto pool = MakePool(4, /*memory=*/false);
  ASSERT_NE(pool, nullptr);
  std::vector<PageId> r;
  ASSERT_TRUE(pool->Reserve(2, &r));
  const PageId free_page = [&] {
    for (PageId p = 0; p < 4; ++p)
      if (pool->state(p) == PageState::kFree) return p;
    return kNoPage;
  }();
  ASSERT_NE(free_page, kNoPage);
  EXPECT_DEATH(pool->Commit({free_page}), "");     // free -> in use
  EXPECT_DEATH(pool->Free({r[0]}), "");            // reserved -> free
  EXPECT_DEATH(pool->ToCache({r[0]}), "");         // reserved -> cached
  EXPECT_DEATH(pool->Unreserve({free_page}), "");  // free -> free
  pool->Commit(r);
  EXPECT_DEATH(pool->Commit({r[0]}), "");          // in use -> in use
  EXPECT_DEATH(pool->Unreserve({r[0]}), "");
  pool->ToCache({r[0]});
  EXPECT_DEATH(pool->ToCache({r[0]}), "");  // cached -> cached
  pool->Free(r);
  EXPECT_DEATH(pool->Free({r[1]}), "");     // double free
}

// KvPools -------------------------------------------------------------------

std::unique_ptr<KvPools> MakePools(int64_t full, int64_t swa,
                                   bool memory = true) {
  KvPoolsOptions o;
  o.shape = SmallShape();
  o.full_pages = full;
  o.swa_pages = swa;
  o.allocate_memory = memory;
  absl::StatusOr<std::unique_ptr<KvPools>> pools = KvPools::Create(o);
  EXPECT_TRUE(pools.ok()) << pools.status();
  return pools.ok() ? std::move(*pools) : nullptr;
}

TEST(KvPools, CreateBuildsBothPools) {
  auto pools = MakePools(10, 6);
  ASSERT_NE(pools, nullptr);
  EXPECT_EQ(pools->full().num_pages(), 10);
  EXPECT_EQ(pools->swa().num_pages(), 6);
  EXPECT_EQ(pools->full().kind(), PoolKind::kFull);
  EXPECT_EQ(pools->swa().kind(), PoolKind::kSwa);
  EXPECT_EQ(&pools->pool(PoolKind::kFull), &pools->full());
  EXPECT_EQ(&pools->pool(PoolKind::kSwa), &pools->swa());
  EXPECT_EQ(pools->full().page_bytes(), SmallShape().Full().PageBytes());
  EXPECT_EQ(pools->swa().page_bytes(), SmallShape().Swa().PageBytes());
  EXPECT_EQ(pools->shape().swa_layers, 5);
  EXPECT_NE(pools->full().base(), nullptr);
  EXPECT_NE(pools->swa().base(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pools->swa().base()) % 4096, 0u);
}

TEST(KvPools, CreateRejectsInvalidShape) {
  KvPoolsOptions o;
  o.shape = SmallShape();
  o.shape.page_size = 0;
  o.full_pages = 4;
  o.swa_pages = 4;
  EXPECT_FALSE(KvPools::Create(o).ok());
}

TEST(KvPools, CreateForBudgetUsesSizePools) {
  KvShape s = SmallShape();
  const int64_t budget = 1 << 20;
  absl::StatusOr<PoolSizes> sizes = SizePools(s, budget, 3.0);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  absl::StatusOr<std::unique_ptr<KvPools>> pools =
      KvPools::CreateForBudget(s, budget, 3.0, /*allocate_memory=*/false);
  ASSERT_TRUE(pools.ok()) << pools.status();
  EXPECT_EQ((*pools)->full().num_pages(), sizes->full_pages);
  EXPECT_EQ((*pools)->swa().num_pages(), sizes->swa_pages);
  EXPECT_EQ((*pools)->full().total_bytes() + (*pools)->swa().total_bytes(),
            static_cast<size_t>(sizes->bytes));
  EXPECT_FALSE(KvPools::CreateForBudget(s, budget, -1.0, false).ok());
}

TEST(KvPools, CanReserveIsADryRun) {
  auto pools = MakePools(4, 3, false);
  ASSERT_NE(pools, nullptr);
  EXPECT_TRUE(pools->CanReserve(0, 0));
  EXPECT_TRUE(pools->CanReserve(4, 3));
  EXPECT_FALSE(pools->CanReserve(5, 3));
  EXPECT_FALSE(pools->CanReserve(4, 4));
  EXPECT_FALSE(pools->CanReserve(5, 0));
  EXPECT_FALSE(pools->CanReserve(0, 4));
  EXPECT_EQ(pools->full().num_free(), 4);
  EXPECT_EQ(pools->swa().num_free(), 3);
  absl::StatusOr<Reservation> r = pools->Reserve(3, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(pools->CanReserve(1, 2));
  EXPECT_FALSE(pools->CanReserve(2, 0));
  EXPECT_FALSE(pools->CanReserve(0, 3));
  pools->Cancel(*r);
}

TEST(KvPools, ReserveCommitCancel) {
  auto pools = MakePools(6, 6);
  ASSERT_NE(pools, nullptr);
  absl::StatusOr<Reservation> r = pools->Reserve(2, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->full.size(), 2u);
  ASSERT_EQ(r->swa.size(), 3u);
  EXPECT_FALSE(r->empty());
  for (PageId p : r->full) EXPECT_EQ(pools->full().state(p), PageState::kReserved);
  for (PageId p : r->swa) EXPECT_EQ(pools->swa().state(p), PageState::kReserved);
  const std::vector<PageId> full = r->full, swa = r->swa;
  pools->Commit(*r);
  EXPECT_TRUE(r->empty());
  for (PageId p : full) EXPECT_EQ(pools->full().state(p), PageState::kInUse);
  for (PageId p : swa) EXPECT_EQ(pools->swa().state(p), PageState::kInUse);
  EXPECT_EQ(pools->full().num_in_use(), 2);
  EXPECT_EQ(pools->swa().num_in_use(), 3);

  absl::StatusOr<Reservation> r2 = pools->Reserve(4, 3);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(pools->full().num_free(), 0);
  EXPECT_EQ(pools->swa().num_free(), 0);
  pools->Cancel(*r2);
  EXPECT_TRUE(r2->empty());
  EXPECT_EQ(pools->full().num_free(), 4);
  EXPECT_EQ(pools->swa().num_free(), 3);
  EXPECT_EQ(pools->full().num_reserved(), 0);
  EXPECT_EQ(pools->swa().num_reserved(), 0);

  absl::StatusOr<Reservation> empty = pools->Reserve(0, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  pools->Commit(*empty);
  pools->full().Free(full);
  pools->swa().Free(swa);
  EXPECT_EQ(pools->full().num_free(), 6);
  EXPECT_EQ(pools->swa().num_free(), 6);
}

TEST(KvPools, ReserveIsAllOrNothingAndNamesTheShortPool) {
  auto pools = MakePools(4, 3, false);
  ASSERT_NE(pools, nullptr);
  {
    absl::StatusOr<Reservation> r = pools->Reserve(2, 5);  // SWA short by 2
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find("swa"), std::string::npos) << msg;
    EXPECT_EQ(pools->full().num_free(), 4) << "full pages taken by a failed Reserve";
    EXPECT_EQ(pools->full().num_reserved(), 0);
    EXPECT_EQ(pools->swa().num_free(), 3);
  }
  {
    absl::StatusOr<Reservation> r = pools->Reserve(7, 1);  // full short by 3
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
    const std::string msg(r.status().message());
    EXPECT_NE(msg.find("full"), std::string::npos) << msg;
    EXPECT_EQ(pools->full().num_free(), 4);
    EXPECT_EQ(pools->swa().num_free(), 3) << "SWA pages taken by a failed Reserve";
    EXPECT_EQ(pools->swa().num_reserved(), 0);
  }
  absl::StatusOr<Reservation> ok = pools->Reserve(4, 3);
  ASSERT_TRUE(ok.ok());
  pools->Cancel(*ok);
}

TEST(KvPools, RandomReserveMatchesCanReserve) {
  auto pools = MakePools(16, 24, false);
  ASSERT_NE(pools, nullptr);
  std::mt19937 rng(5);
  std::vector<Reservation> held;
  std::vector<std::pair<std::vector<PageId>, std::vector<PageId>>> committed;
  for (int i = 0; i < 5000; ++i) {
    const int op = rng() % 4;
    if (op <= 1) {
      const int64_t f = rng() % 6, s = rng() % 8;
      const bool can = pools->CanReserve(f, s);
      const int64_t free_f = pools->full().num_free();
      const int64_t free_s = pools->swa().num_free();
      absl::StatusOr<Reservation> r = pools->Reserve(f, s);
      ASSERT_EQ(r.ok(), can);
      ASSERT_EQ(can, f <= free_f && s <= free_s);
      if (r.ok()) {
        ASSERT_EQ(static_cast<int64_t>(r->full.size()), f);
        ASSERT_EQ(static_cast<int64_t>(r->swa.size()), s);
        held.push_back(std::move(*r));
      } else {
        ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
        ASSERT_EQ(pools->full().num_free(), free_f);
        ASSERT_EQ(pools->swa().num_free(), free_s);
      }
    } else if (op == 2 && !held.empty()) {
      Reservation r = std::move(held.back());
      held.pop_back();
      if (rng() % 2) {
        auto f = r.full;
        auto s = r.swa;
        pools->Commit(r);
        committed.emplace_back(f, s);
      } else {
        pools->Cancel(r);
      }
    } else if (op == 3 && !committed.empty()) {
      pools->full().Free(committed.back().first);
      pools->swa().Free(committed.back().second);
      committed.pop_back();
    }
    for (const PagePool* p : {&pools->full(), &pools->swa()}) {
      ASSERT_EQ(p->num_free() + p->num_reserved() + p->num_in_use() +
                    p->num_cached(),
                p->num_pages());
    }
  }
  for (Reservation& r : held) pools->Cancel(r);
  for (auto& [f, s] : committed) {
    pools->full().Free(f);
    pools->swa().Free(s);
  }
  EXPECT_EQ(pools->full().num_free(), 16);
  EXPECT_EQ(pools->swa().num_free(), 24);
}

}  // namespace
}  // namespace swaserve::kv
