#include "lib/kv/cache_pins.h"

#include <utility>

namespace swaserve::kv {

CachePins::CachePins(PrefixCache* cache, const CachePinsOptions& options)
    : cache_(cache), options_(options) {}

CachePins::~CachePins() { UnpinAll(); }

void CachePins::Release(uint64_t key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  auto range = by_deadline_.equal_range(it->second.deadline_ns);
  for (auto d = range.first; d != range.second; ++d) {
    if (d->second == key) {
      by_deadline_.erase(d);
      break;
    }
  }
  pinned_pages_ -= static_cast<int64_t>(it->second.hit.full_pages().size());
  cache_->Unlock(it->second.hit);
  by_key_.erase(it);
}

int CachePins::Pin(absl::Span<const uint64_t> page_hashes, int64_t ttl_ns, int64_t now_ns) {
  if (cache_ == nullptr || page_hashes.empty() || ttl_ns <= 0) return 0;
  const auto pages = static_cast<int64_t>(page_hashes.size());
  if (pages > options_.max_pinned_pages) return 0;
  const uint64_t key = page_hashes.back();
  Release(key);  // a repeated pin: the new one replaces it (its deadline moves)
  while (pinned_pages_ + pages > options_.max_pinned_pages && !by_deadline_.empty()) {
    Release(by_deadline_.begin()->second);
  }
  CacheHit hit = cache_->MatchAndLock(page_hashes, MatchOptions{.full_kv = true});
  if (hit.tokens() < static_cast<int>(pages) * cache_->page_size()) {
    // Only whole prefixes are pinned: a shorter match is another prefix.
    cache_->Unlock(hit);
    return 0;
  }
  cache_->WriteThroughToL3(page_hashes);
  const int tokens = hit.tokens();
  pinned_pages_ += pages;
  const int64_t deadline = now_ns + ttl_ns;
  by_deadline_.emplace(deadline, key);
  by_key_.emplace(key, Entry{.deadline_ns = deadline, .hit = std::move(hit)});
  return tokens;
}

void CachePins::Expire(int64_t now_ns) {
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now_ns) {
    Release(by_deadline_.begin()->second);
  }
}

void CachePins::UnpinAll() {
  while (!by_deadline_.empty()) Release(by_deadline_.begin()->second);
}

}  // namespace swaserve::kv
