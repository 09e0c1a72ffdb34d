// L2 tier copy bandwidth (issue 21): PrefixCache::LoadBack (L2 -> L1) and
// the demotion of L1 eviction (L1 -> L2) against a plain memcpy of the same
// pages between two buffers, in the same run (the physical limit on this
// machine: both tiers are host memory here).
//
// MiMo-V2.5-Pro KV shape (16-token pages: a full page is 800 KiB, a SWA page
// 4.7 MiB), real page memory. A prompt of --pages pages (default 256, 4K
// tokens) is inserted with its trailing window's SWA KV, evicted to L2
// (untimed), then each iteration:
//   LoadBack   moves the whole prompt back to L1 (manual time: the copy
//              inside LoadBack, LoadBackResult::seconds, which excludes the
//              tree walk) — then demotes it again, untimed;
//   Demote     Evict(all) of the prompt from L1 to L2 (timed whole, tree
//              work included) — then loads it back, untimed;
//   Memcpy     memcpy of the same pages (full + window SWA) from one pool
//              buffer to another, page by page.
// Bytes per second are reported by Google Benchmark (bytes_per_second).
//
// Usage: kv_tier_bench [--benchmark_* flags]
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv {
namespace {

constexpr int kPromptPages = 256;

struct Setup {
  std::unique_ptr<KvPools> l1, l2;
  std::unique_ptr<PrefixCache> cache;
  std::vector<uint64_t> hashes;
  int64_t swa_pages = 0;  // pages of the prompt that keep SWA KV (its window)

  explicit Setup(int pages) {
    const KvShape shape = KvShape::MiMoV25Pro();
    // The window a query at the prompt's end reads: what demotion keeps.
    const int window_pages = (shape.sliding_window - 1 + shape.page_size - 1) / shape.page_size;
    KvPoolsOptions o{.shape = shape, .full_pages = pages + 8, .swa_pages = window_pages + 2};
    l1 = *KvPools::Create(o);
    l2 = *KvPools::Create(o);
    cache = *PrefixCache::Create({.pools = l1.get(), .l2 = l2.get()});
    std::vector<uint32_t> tokens(static_cast<size_t>(pages) * shape.page_size);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
    hashes = base::ChainedPageHashes(tokens, shape.page_size);
    Reservation r = *l1->Reserve(pages, window_pages);
    const std::vector<PageId> full = r.full, window = r.swa;
    l1->Commit(r);  // empties r
    std::vector<PageId> swa(pages, kNoPage);
    for (int i = 0; i < window_pages; ++i) swa[pages - window_pages + i] = window[i];
    for (PageId p : full) std::memset(l1->full().PageData(p), p & 0xFF, l1->full().page_bytes());
    for (PageId p : window) std::memset(l1->swa().PageData(p), p & 0xFF, l1->swa().page_bytes());
    cache->Insert(hashes, full, swa);
    swa_pages = window_pages;
  }
  int64_t Bytes() const {
    return static_cast<int64_t>(hashes.size()) * static_cast<int64_t>(l1->full().page_bytes()) +
           swa_pages * static_cast<int64_t>(l1->swa().page_bytes());
  }
  void ToL2() { cache->Evict(static_cast<int64_t>(hashes.size()), 0); }
  LoadBackResult ToL1() { return cache->LoadBack(hashes); }
};

void BM_LoadBack(benchmark::State& state) {
  Setup s(kPromptPages);
  s.ToL2();
  for (auto _ : state) {
    const LoadBackResult r = s.ToL1();
    if (r.pages != kPromptPages) state.SkipWithError("load-back incomplete");
    state.SetIterationTime(r.seconds);
    s.ToL2();
  }
  state.SetBytesProcessed(state.iterations() * s.Bytes());
}
BENCHMARK(BM_LoadBack)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Demote(benchmark::State& state) {
  Setup s(kPromptPages);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    s.ToL2();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (s.cache->l2_full_pages() != kPromptPages) state.SkipWithError("demotion incomplete");
    s.ToL1();
  }
  state.SetBytesProcessed(state.iterations() * s.Bytes());
}
BENCHMARK(BM_Demote)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Memcpy(benchmark::State& state) {
  Setup s(kPromptPages);
  const PagePool& from = s.l1->full();
  PagePool& to = s.l2->full();
  const PagePool& swa_from = s.l1->swa();
  PagePool& swa_to = s.l2->swa();
  for (auto _ : state) {
    for (int p = 0; p < kPromptPages; ++p) {
      std::memcpy(to.PageData(p), from.PageData(p), from.page_bytes());
    }
    for (int p = 0; p < s.swa_pages; ++p) {
      std::memcpy(swa_to.PageData(p), swa_from.PageData(p), swa_from.page_bytes());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * s.Bytes());
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace swaserve::kv

BENCHMARK_MAIN();
