// CachePins: prefixes of the prefix cache kept for a while (a client's
// cache_control breakpoints). A pin locks the full-KV path of a prompt
// prefix in a PrefixCache, so L1 eviction passes it by, until its deadline;
// pinning the same prefix again moves the deadline (the time-to-live starts
// over on every use, as Anthropic's cache_control does). The pinned pages
// are bounded: a pin that would take them past max_pinned_pages first
// releases the pins due soonest, and one larger than the bound alone is
// refused.
//
// Pinned paths are also written through to the cache's L3 (when it has
// one), so they outlive L1 and reach the other workers sharing the store.
//
// Expiry happens in Expire(), which the owner calls regularly (the prefill
// loop does at each wake-up); a pin may outlive its deadline until then.
//
// Ownership: holds locks in the cache it is given (not owned; must outlive
// this object). UnpinAll() or the destructor releases them all.
// Thread-safety: none; the cache's thread only (as the cache itself).
#pragma once

#include <cstdint>
#include <map>

#include "absl/types/span.h"
#include "lib/kv/prefix_cache.h"

namespace swaserve::kv {

struct CachePinsOptions {
  // Full-pool pages all pins together may hold; 0: no pins at all.
  // Default 0 (the owner sizes it, e.g. a quarter of the full pool).
  int64_t max_pinned_pages = 0;
};

class CachePins {
 public:
  CachePins(PrefixCache* cache, const CachePinsOptions& options);
  ~CachePins();
  CachePins(const CachePins&) = delete;
  CachePins& operator=(const CachePins&) = delete;

  // Pins the cached full-KV path of page_hashes (as far as the cache holds
  // it) until now_ns + ttl_ns. Returns the tokens pinned (0: nothing cached
  // there, no room, or pins off).
  int Pin(absl::Span<const uint64_t> page_hashes, int64_t ttl_ns, int64_t now_ns);
  // Releases the pins whose deadline is at or before now_ns.
  void Expire(int64_t now_ns);
  void UnpinAll();

  int64_t pinned_pages() const { return pinned_pages_; }
  int pins() const { return static_cast<int>(by_key_.size()); }

 private:
  struct Entry {
    int64_t deadline_ns = 0;
    CacheHit hit;
  };
  void Release(uint64_t key);

  PrefixCache* cache_;
  CachePinsOptions options_;
  // Keyed by the pinned path's last page hash (a chained hash names the
  // whole prefix).
  std::map<uint64_t, Entry> by_key_;
  // deadline -> key, soonest first.
  std::multimap<int64_t, uint64_t> by_deadline_;
  int64_t pinned_pages_ = 0;
};

}  // namespace swaserve::kv
