#include "lib/kv/l3_prefetch.h"

#include <algorithm>
#include <chrono>

namespace swaserve::kv {

int WindowFirstPage(int end, int page_size, int sliding_window) {
  if (sliding_window <= 1) return end;
  const int64_t first_token =
      std::max<int64_t>(0, int64_t{end} * page_size - (sliding_window - 1));
  return static_cast<int>(first_token / page_size);
}

namespace {

// Reads pages [from, to) of one pool into out (resized); false at the first
// page that does not read (lost, corrupt, unavailable).
bool ReadPages(PageStore& store, uint64_t layout, absl::Span<const uint64_t> hashes, int from,
               int to, size_t page_bytes, std::vector<uint8_t>* out, int* read) {
  out->resize(static_cast<size_t>(to - from) * page_bytes);
  for (int p = from; p < to; ++p) {
    absl::Span<uint8_t> dst(out->data() + static_cast<size_t>(p - from) * page_bytes, page_bytes);
    if (!store.Get(PageKey{hashes[p], layout}, dst).ok()) {
      *read = p;
      return false;
    }
  }
  *read = to;
  return true;
}

std::vector<PageKey> Keys(absl::Span<const uint64_t> hashes, int from, int to, uint64_t layout) {
  std::vector<PageKey> keys;
  keys.reserve(std::max(0, to - from));
  for (int p = from; p < to; ++p) keys.push_back(PageKey{hashes[p], layout});
  return keys;
}

}  // namespace

L3Fetch FetchFromL3(PageStore& store, const L3FetchOptions& o,
                    absl::Span<const uint64_t> page_hashes, int tree_page, int safe_page,
                    L3Fetch* reuse) {
  const auto t0 = std::chrono::steady_clock::now();
  L3Fetch f;
  const int n = static_cast<int>(page_hashes.size());
  tree_page = std::clamp(tree_page, 0, n);
  safe_page = std::clamp(safe_page, 0, tree_page);
  // The run of full pages from tree_page, probed in growing chunks (8, 32,
  // 128, then 512): a short run costs one small probe, a long one few.
  int run = tree_page;
  for (size_t chunk = 8; run < n; chunk = std::min<size_t>(512, chunk * 4)) {
    const int to = std::min(n, run + static_cast<int>(chunk));
    const std::vector<bool> present = store.ContainsEach(Keys(page_hashes, run, to, o.layouts.full));
    int k = 0;
    while (k < to - run && present[k]) ++k;
    run += k;
    if (run < to) break;
  }
  // Buffers keep their size between uses (resize down does not touch the
  // bytes; up zero-fills only the growth).
  std::vector<uint8_t> full, swa;
  if (reuse != nullptr) {
    full = std::move(reuse->full_bytes);
    swa = std::move(reuse->swa_bytes);
  }
  int read = tree_page;
  ReadPages(store, o.layouts.full, page_hashes, tree_page, run, o.full_page_bytes, &full, &read);
  const int readable = read;
  int end = 0;
  int swa_first = 0;
  if (o.sliding_window <= 1) {
    end = readable;
    swa_first = readable;
  }
  // SWA presence of every page a window ending in (safe_page, readable]
  // reads, in one probe; then the largest such end whose window is all
  // there (and reads).
  const int probe_from = WindowFirstPage(safe_page + 1, o.page_size, o.sliding_window);
  std::vector<bool> swa_present;
  if (end == 0 && readable > safe_page) {
    swa_present = store.ContainsEach(Keys(page_hashes, probe_from, readable, o.layouts.swa));
  }
  // last_missing[p]: the last page <= p without SWA KV (probe_from - 1: none).
  std::vector<int> last_missing(swa_present.size());
  for (size_t i = 0, lm = 0; i < swa_present.size(); ++i) {
    if (!swa_present[i]) lm = i + 1;
    last_missing[i] = probe_from + static_cast<int>(lm) - 1;
  }
  for (int e = readable; end == 0 && e > safe_page; --e) {
    const int wf = WindowFirstPage(e, o.page_size, o.sliding_window);
    if (last_missing[e - 1 - probe_from] >= wf) continue;  // a window page lacks SWA KV
    int swa_read = wf;
    if (!ReadPages(store, o.layouts.swa, page_hashes, wf, e, o.swa_page_bytes, &swa, &swa_read)) {
      continue;
    }
    end = e;
    swa_first = wf;
  }
  if (end == 0) {
    if (!o.full_kv_only_ok || readable == tree_page) {
      if (reuse != nullptr) {  // nothing read: the buffers go back
        reuse->full_bytes = std::move(full);
        reuse->swa_bytes = std::move(swa);
      }
      return f;
    }
    end = readable;
    swa_first = readable;
    swa.clear();
  }
  f.full_first = std::min(tree_page, end);
  f.swa_first = swa_first;
  f.end = end;
  f.hashes.assign(page_hashes.begin() + f.hash_base(), page_hashes.begin() + end);
  full.resize(static_cast<size_t>(f.full_pages()) * o.full_page_bytes);
  if (swa_first >= end) swa.clear();
  f.full_bytes = std::move(full);
  f.swa_bytes = std::move(swa);
  f.read_bytes = static_cast<int64_t>(f.full_bytes.size() + f.swa_bytes.size());
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return f;
}

L3Prefetcher::L3Prefetcher(PageStore* store, const L3FetchOptions& options, Done done)
    : store_(store), options_(options), done_(std::move(done)) {
  thread_ = std::thread([this] { Run(); });
}

L3Prefetcher::~L3Prefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    queue_.clear();
  }
  thread_.join();
}

void L3Prefetcher::Submit(std::string id, std::vector<uint64_t> page_hashes, int tree_page,
                          int safe_page) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Item{std::move(id), std::move(page_hashes), tree_page, safe_page});
}

void L3Prefetcher::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const Item& i) { return i.id == id; }),
               queue_.end());
}

void L3Prefetcher::Recycle(L3Fetch spent) {
  absl::MutexLock lock(&mu_);
  if (spare_.size() < 2) spare_.push_back(std::move(spent));
}

void L3Prefetcher::Run() {
  while (true) {
    Item item;
    L3Fetch spare;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      if (!spare_.empty()) {
        spare = std::move(spare_.back());
        spare_.pop_back();
      }
    }
    L3Fetch f =
        FetchFromL3(*store_, options_, item.hashes, item.tree_page, item.safe_page, &spare);
    done_(std::move(item.id), std::move(item.hashes), std::move(f));
  }
}

}  // namespace swaserve::kv
