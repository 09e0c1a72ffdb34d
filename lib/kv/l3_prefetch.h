// Reading a prompt's pages back from the L3 page store
// (docs/architecture.md#kv-tiers), off the prefill loop thread.
//
// What L3 holds (written by the prefix cache, prefix_cache.h "L3"): the
// full KV of every page that left the tree (and of hot pages, written
// through after N hits), and SWA KV only for pages inside a trailing window
// (a leaf's, or a hit's). Pages are blobs keyed by chained hash and pool
// layout (page_store.h), so a prompt's L3 part is found page by page from
// where the tree's match (L1 + L2) ends.
//
// FetchFromL3 (synchronous, any thread) takes where the tree's match of
// the prompt stands: tree_page (full KV of pages [0, tree_page) is in the
// tree, any tier) and safe_page <= tree_page (the tree's match is
// window-safe there). It extends the full KV from tree_page by the longest
// run of pages the store holds (Contains, then Get: a page that fails to
// read ends the run), then applies the window rule: the fetch ends at the
// largest e in (safe_page, run end] whose last window (tokens
// [e·P − W + 1, e·P)) has SWA pages in the store, and reads them. e may be
// <= tree_page: then the fetch only heals the window of the tree's own
// match (full KV in L1/L2, its SWA KV evicted there but kept in L3). When
// no e qualifies the fetch is empty, unless full_kv_only_ok (a worker that
// restores windows: a full-KV extension is worth a restore), then it is the
// whole run without SWA KV.
//
// L3Prefetcher: runs FetchFromL3 on its own thread for queued requests and
// hands each result to a callback (any thread; the prefill core queues it
// for its loop, which attaches it with PrefixCache::AttachFromL3). A caller
// that stops waiting simply ignores the result when it comes (Cancel drops
// a fetch not started yet).
//
// Thread-safety: L3Prefetcher is thread-safe; the store must be too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_store.h"

namespace swaserve::kv {

// The keys' layout fingerprints of a KV shape's two pools.
struct L3Layouts {
  uint64_t full = 0;
  uint64_t swa = 0;
  static L3Layouts For(const KvShape& shape, uint64_t model_identity) {
    return {KvLayoutFingerprint(shape, PoolKind::kFull, model_identity),
            KvLayoutFingerprint(shape, PoolKind::kSwa, model_identity)};
  }
};

struct L3FetchOptions {
  L3Layouts layouts;
  int page_size = 1;
  int sliding_window = 1;  // W; <= 1: no SWA KV is needed
  // Bytes of one page per pool (0: metadata-only pools, empty blobs).
  size_t full_page_bytes = 0;
  size_t swa_page_bytes = 0;
  // See the file comment.
  bool full_kv_only_ok = false;
};

// What FetchFromL3 read: full KV of pages [full_first, end) and SWA KV of
// pages [swa_first, end) of a prompt (absolute page indices).
struct L3Fetch {
  int full_first = 0;
  int swa_first = 0;  // == end: no SWA KV (a full-KV-only fetch)
  int end = 0;        // 0: empty
  // The prompt's hashes of pages [hash_base(), end).
  std::vector<uint64_t> hashes;
  std::vector<uint8_t> full_bytes;  // (end − full_first) × full_page_bytes
  std::vector<uint8_t> swa_bytes;   // (end − swa_first) × swa_page_bytes
  int64_t read_bytes = 0;
  double seconds = 0;

  bool empty() const { return end <= hash_base(); }
  int hash_base() const { return std::min(full_first, swa_first); }
  int full_pages() const { return std::max(0, end - full_first); }
  int swa_pages() const { return std::max(0, end - swa_first); }
};

// First page of the window that a hit ending at page `end` reads
// (tokens [end·P − W + 1, end·P)); end when W <= 1.
int WindowFirstPage(int end, int page_size, int sliding_window);

// `reuse` (optional): a spent fetch whose byte buffers are reused, so that a
// worker's fetches do not fault in and zero fresh buffers every time (on
// this VM that cost more than the reads: RESULTS.md, KV tiers).
L3Fetch FetchFromL3(PageStore& store, const L3FetchOptions& options,
                    absl::Span<const uint64_t> page_hashes, int tree_page, int safe_page,
                    L3Fetch* reuse = nullptr);

class L3Prefetcher {
 public:
  // Called with the fetch's id, the prompt's page hashes (as submitted) and
  // what was read.
  using Done = std::function<void(std::string id, std::vector<uint64_t> page_hashes,
                                  L3Fetch fetch)>;
  L3Prefetcher(PageStore* store, const L3FetchOptions& options, Done done);
  // Finishes the fetch in progress; queued ones are dropped.
  ~L3Prefetcher();
  L3Prefetcher(const L3Prefetcher&) = delete;
  L3Prefetcher& operator=(const L3Prefetcher&) = delete;

  // Queues FetchFromL3(page_hashes, tree_page, safe_page); `done` gets the
  // result (possibly empty) on the prefetcher's thread.
  void Submit(std::string id, std::vector<uint64_t> page_hashes, int tree_page, int safe_page);
  // Drops a queued fetch (no callback then); a running one still calls back.
  void Cancel(const std::string& id);
  // Hands a fetch back once attached: its buffers serve the next fetch.
  void Recycle(L3Fetch spent);

 private:
  struct Item {
    std::string id;
    std::vector<uint64_t> hashes;
    int tree_page = 0;
    int safe_page = 0;
  };
  void Run();

  PageStore* store_;
  const L3FetchOptions options_;
  Done done_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<L3Fetch> spare_ ABSL_GUARDED_BY(mu_);  // at most 2
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace swaserve::kv
