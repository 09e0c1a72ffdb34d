#include "lib/kv/kv_metrics.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/metrics/registry.h"
#include "tests/unit/kv/fake_page_stores.h"

namespace swaserve::kv {
namespace {

// The value of the sample `series` (name plus labels exactly as rendered,
// e.g. `swaserve_kv_pages{pool="full",state="free"}`), or -1 when absent.
double Sample(const metrics::Registry& registry, absl::string_view series) {
  const std::string text = registry.RenderText();
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series) && line.size() > series.size() &&
        line[series.size()] == ' ') {
      return std::strtod(std::string(line.substr(series.size() + 1)).c_str(), nullptr);
    }
  }
  return -1;
}

class KvMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvPoolsOptions o;
    o.shape.full_layers = 1;
    o.shape.full_kv_heads = 1;
    o.shape.full_k_head_dim = 2;
    o.shape.full_v_head_dim = 2;
    o.shape.swa_layers = 1;
    o.shape.swa_kv_heads = 1;
    o.shape.swa_k_head_dim = 2;
    o.shape.swa_v_head_dim = 2;
    o.shape.sliding_window = 8;
    o.shape.page_size = 4;
    o.full_pages = 20;
    o.swa_pages = 12;
    o.allocate_memory = false;
    pools_ = std::move(*KvPools::Create(o));
    PrefixCacheOptions co;
    co.pools = pools_.get();
    cache_ = std::move(*PrefixCache::Create(co));
  }

  std::unique_ptr<KvPools> pools_;
  std::unique_ptr<PrefixCache> cache_;
  metrics::Registry registry_;
};

TEST_F(KvMetricsTest, ExportsPoolsAndCacheAndUnregisters) {
  {
    absl::StatusOr<std::unique_ptr<KvMetrics>> m =
        KvMetrics::Create(&registry_, pools_.get(), cache_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="full",state="free"})"), 20);
    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="swa",state="free"})"), 12);
    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="full",state="cached"})"), 0);

    // Insert 4 pages with SWA KV for the last 2, then look them up.
    std::vector<uint32_t> tokens(17);
    for (int i = 0; i < 17; ++i) tokens[i] = i;
    const std::vector<uint64_t> h = base::ChainedPageHashes(tokens, 4);
    absl::StatusOr<Reservation> r = pools_->Reserve(4, 2);
    ASSERT_TRUE(r.ok());
    std::vector<PageId> full = r->full;
    std::vector<PageId> swa = {kNoPage, kNoPage, r->swa[0], r->swa[1]};
    pools_->Commit(*r);
    cache_->Insert(h, full, swa);
    absl::StatusOr<Reservation> held = pools_->Reserve(1, 1);
    ASSERT_TRUE(held.ok());
    CacheHit hit = cache_->MatchAndLock(h, 16);  // 16 tokens, all window-safe
    ASSERT_EQ(hit.tokens(), 16);
    const std::vector<uint64_t> h3(h.begin(), h.begin() + 3);
    CacheHit miss = cache_->MatchAndLock(h3);  // 12 matched, 0 safe

    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="full",state="cached"})"), 4);
    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="swa",state="cached"})"), 2);
    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="full",state="reserved"})"), 1);
    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="full",state="free"})"), 15);
    EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="full",state="in_use"})"), 0);
    EXPECT_EQ(Sample(registry_, "swaserve_prefix_cache_lookup_tokens_total"), 16 + 12);
    EXPECT_EQ(Sample(registry_, "swaserve_prefix_cache_hit_tokens_total"), 16);
    EXPECT_EQ(Sample(registry_, "swaserve_prefix_cache_window_lost_tokens_total"), 12);
    EXPECT_EQ(Sample(registry_, "swaserve_prefix_cache_inserted_pages_total"), 4);
    EXPECT_EQ(Sample(registry_, "swaserve_prefix_cache_cooled_swa_pages_total"), 0);  // option off
    EXPECT_EQ(Sample(registry_, R"(swaserve_prefix_cache_nodes{kind="tombstone"})"), 1);
    EXPECT_GE(Sample(registry_, R"(swaserve_prefix_cache_nodes{kind="live"})"), 1);
    pools_->Cancel(*held);
    cache_->Unlock(hit);
    cache_->Unlock(miss);
    cache_->Evict(100, 100);
    EXPECT_EQ(Sample(registry_, R"(swaserve_prefix_cache_evicted_pages_total{pool="full"})"), 4);
    EXPECT_EQ(Sample(registry_, R"(swaserve_prefix_cache_evicted_pages_total{pool="swa"})"), 2);
    EXPECT_EQ(Sample(registry_, R"(swaserve_prefix_cache_nodes{kind="tombstone"})"), 0);

    // One KvMetrics per registry.
    EXPECT_FALSE(KvMetrics::Create(&registry_, pools_.get(), cache_.get()).ok());
  }
  // Destroyed: the callbacks are gone (the pools and cache may go next).
  EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="full",state="free"})"), -1);
  EXPECT_EQ(Sample(registry_, "swaserve_prefix_cache_hit_tokens_total"), -1);
}

// A write-behind L3 (the worker's AsyncPageStore): its queued bytes and the
// puts it dropped when full.
TEST_F(KvMetricsTest, AWriteBehindL3ShowsItsQueueAndDrops) {
  KvPoolsOptions o;
  o.shape = pools_->shape();
  o.full_pages = 8;
  o.swa_pages = 8;
  o.allocate_memory = false;
  std::unique_ptr<KvPools> l2 = std::move(*KvPools::Create(o));
  auto gated = std::make_unique<testing::GatedStore>();
  testing::GatedStore* gate = gated.get();
  AsyncPageStore l3(std::move(gated), {.max_queued_bytes = 100});
  absl::Cleanup open_gate = [gate] { gate->Open(); };  // l3's destructor puts what is queued
  PrefixCacheOptions co;
  co.pools = pools_.get();
  co.l2 = l2.get();
  co.l3 = &l3;
  std::unique_ptr<PrefixCache> cache = std::move(*PrefixCache::Create(co));
  metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<KvMetrics>> m =
      KvMetrics::Create(&registry, pools_.get(), cache.get(), &l3);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<uint8_t> page(40, 7);
  // A put's bytes count until the backend has it (the first waits at the gate).
  ASSERT_TRUE(l3.Put({1, 0}, page).ok());
  ASSERT_TRUE(l3.Put({2, 0}, page).ok());
  EXPECT_EQ(l3.Put({3, 0}, page).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Sample(registry, "swaserve_kv_l3_write_queue_dropped_total"), 1);
  EXPECT_EQ(Sample(registry, "swaserve_kv_l3_write_queue_bytes"), 80);
  EXPECT_EQ(l3.PutRoom(), 20);
  gate->Open();
  l3.Flush();
  EXPECT_EQ(Sample(registry, "swaserve_kv_l3_write_queue_bytes"), 0);
  m->reset();
  EXPECT_EQ(Sample(registry, "swaserve_kv_l3_write_queue_bytes"), -1) << "unregistered";
}

TEST_F(KvMetricsTest, PoolsOnly) {
  absl::StatusOr<std::unique_ptr<KvMetrics>> m =
      KvMetrics::Create(&registry_, pools_.get(), nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Sample(registry_, R"(swaserve_kv_pages{pool="swa",state="free"})"), 12);
}

}  // namespace
}  // namespace swaserve::kv
