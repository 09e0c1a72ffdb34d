// L2 tier copy bandwidth: PrefixCache::LoadBack (L2 -> L1) and
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
//   L3ToL2     FetchFromL3 + AttachFromL3 of the whole prompt from a
//              FilePageStore (L3, page cache warm) into L2: verified reads
//              (XXH3-128 per blob) plus the copy into L2 pages — then the
//              cache is cleared, untimed;
//   FileRead   open + read() + close of the same blob files into one
//              buffer: the file-read limit of L3 -> L2 on this machine.
// Bytes per second are reported by Google Benchmark (bytes_per_second).
//
// The allocator keeps freed memory, as in the worker (lib/base/
// malloc_tuning.h); --default_malloc runs with glibc's defaults.
//
// Usage: kv_tier_bench [--default_malloc] [--fresh_buffers] [--benchmark_* flags]
// (--fresh_buffers: BM_L3ToL2 without reusing a spent fetch's buffers)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/base/hash.h"
#include "lib/base/malloc_tuning.h"
#include "lib/kv/file_page_store.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv {
namespace {

bool g_fresh_buffers = false;  // --fresh_buffers

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

// The prompt written to a FilePageStore through the cache (write-back).
struct L3Setup {
  std::string dir = (std::filesystem::temp_directory_path() / "kv_tier_bench_l3").string();
  std::unique_ptr<FilePageStore> store;
  std::unique_ptr<KvPools> l1, l2;
  std::unique_ptr<PrefixCache> cache;
  std::vector<uint64_t> hashes;
  int64_t bytes = 0;

  L3Setup() {
    std::filesystem::remove_all(dir);
    store = *FilePageStore::Open({.dir = dir, .capacity_bytes = int64_t{4} << 30});
    const KvShape shape = KvShape::MiMoV25Pro();
    const int window_pages = (shape.sliding_window - 1 + shape.page_size - 1) / shape.page_size;
    KvPoolsOptions o{.shape = shape, .full_pages = kPromptPages + 8, .swa_pages = window_pages + 2};
    l1 = *KvPools::Create(o);
    l2 = *KvPools::Create(o);
    cache = *PrefixCache::Create({.pools = l1.get(), .l2 = l2.get(), .l3 = store.get()});
    Setup w(kPromptPages);  // the writer: same tokens, its own cache over store
    w.cache.reset();
    w.cache = *PrefixCache::Create({.pools = w.l1.get(), .l2 = w.l2.get(), .l3 = store.get()});
    hashes = w.hashes;
    Reservation r = *w.l1->Reserve(kPromptPages, window_pages);
    const std::vector<PageId> full = r.full, window = r.swa;
    w.l1->Commit(r);
    std::vector<PageId> swa(kPromptPages, kNoPage);
    for (int i = 0; i < window_pages; ++i) swa[kPromptPages - window_pages + i] = window[i];
    for (PageId p : full) std::memset(w.l1->full().PageData(p), p & 0xFF, w.l1->full().page_bytes());
    for (PageId p : window) std::memset(w.l1->swa().PageData(p), 7, w.l1->swa().page_bytes());
    w.cache->Insert(hashes, full, swa);
    w.cache->Clear();  // write-back of every page to L3
    bytes = static_cast<int64_t>(kPromptPages) * static_cast<int64_t>(l1->full().page_bytes()) +
            window_pages * static_cast<int64_t>(l1->swa().page_bytes());
  }
  ~L3Setup() {
    cache.reset();
    store.reset();
    std::filesystem::remove_all(dir);
  }
};

void BM_L3ToL2(benchmark::State& state) {
  L3Setup s;
  // As the worker's prefetcher does (L3Prefetcher::Recycle): a spent
  // fetch's buffers serve the next one; --fresh_buffers measures without.
  L3Fetch spare;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    L3Fetch f = FetchFromL3(*s.store, s.cache->l3_fetch_options(), s.hashes, 0, 0,
                            g_fresh_buffers ? nullptr : &spare);
    const int attached = s.cache->AttachFromL3(s.hashes, f);
    spare = std::move(f);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (attached != kPromptPages) state.SkipWithError("L3 fetch incomplete");
    s.cache->Clear();  // already in L3: nothing is written again
  }
  state.SetBytesProcessed(state.iterations() * s.bytes);
}
BENCHMARK(BM_L3ToL2)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_FileRead(benchmark::State& state) {
  L3Setup s;
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(s.dir)) {
    if (e.path().extension() == ".kvpage") paths.push_back(e.path().string());
  }
  std::vector<uint8_t> buf(8 << 20);
  int64_t bytes = 0;
  for (auto _ : state) {
    bytes = 0;
    for (const std::string& path : paths) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) state.SkipWithError("open failed");
      ssize_t n;
      while ((n = ::read(fd, buf.data(), buf.size())) > 0) bytes += n;
      ::close(fd);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_FileRead)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace swaserve::kv

// As the worker does (lib/base/malloc_tuning.h); --default_malloc measures
// glibc's defaults instead.
int main(int argc, char** argv) {
  bool default_malloc = false;
  for (int i = 1; i < argc;) {
    const std::string_view a(argv[i]);
    if (a == "--default_malloc" || a == "--fresh_buffers") {
      (a == "--default_malloc" ? default_malloc : swaserve::kv::g_fresh_buffers) = true;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
    } else {
      ++i;
    }
  }
  if (!default_malloc) swaserve::base::KeepFreedMemory(size_t{1} << 30);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
