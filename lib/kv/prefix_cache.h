// The SWA-aware prefix cache (docs/architecture.md#kv-cache): a radix tree over page-aligned
// token spans, keyed by chained page hashes (base::ChainedPageHashes, which
// already mixes multimodal content hashes into the keys).
//
// Each node covers a span of whole pages and carries, per page, a full-pool
// page and — unless the node is a tombstone — a SWA-pool page. A node is
// either entirely live (SWA pages for all its pages) or entirely a tombstone
// (no SWA pages); inserts and evictions split nodes to keep that true.
//
// Window-safe matching: a hit of length L (a multiple of page_size) is usable
// only when tokens [L - W + 1, L) all have SWA KV (the next query at position
// L attends to them), i.e. the pages covering them are live. Match() returns
// both the raw matched length (full KV) and the window-safe length; only the
// window-safe part is used, and the difference is counted as "tokens lost to
// the window-safe rule".
//
// Locks: MatchAndLock() puts a full lock on every node from the hit's end to
// the root and a SWA lock on the nodes that cover the hit's last window (the
// only SWA pages the request will read). Locked pages are never evicted.
//
// Full-KV hits (MatchOptions::full_kv, for window restore): when the full-KV
// match M is longer than the window-safe one L, the hit locks the full pages
// of [0, M) and no SWA page; the caller recomputes the window's SWA (and
// MTP) KV from a bounded stretch before M (WindowRestoreStart in
// sequence.h) and inserts it, which heals the tombstones on the path. With
// MatchOptions::lock_safe_window it also locks L's window, and the stretch
// can start at L (when L is past WindowRestoreStart(M): less to compute).
// ReleaseSwa() drops the SWA lock early (once the request's own window has
// moved past the hit); Unlock() drops everything. Invariant: full_lock >=
// swa_lock on every node.
//
// Eviction (Evict): a full pass deletes least-recently-used unlocked leaves
// (freeing their full and SWA pages; tombstone parents left as leaves are
// deleted too), then a SWA pass frees the SWA pages of least-recently-used
// nodes without SWA lock: unlocked leaves are deleted, other nodes become
// tombstones. Among equally recent nodes the root side goes first. A leaf is
// never an unlocked tombstone: a node tombstoned after its request released
// the SWA lock (ReleaseSwa) keeps its full KV while the request reads it,
// even if its children are evicted meanwhile; it is deleted when the request
// unlocks it (or gains children again when the request inserts). Recency is
// tracked separately for full KV (every node on a matched path is touched)
// and SWA KV (only the nodes of the hit's last window are touched), so
// out-of-window SWA ages out while hot prefixes stay. SWA KV inserted cold
// (Insert's swa_cold: checkpoint windows) ranks below all hot SWA KV.
//
// Restorable tombstones (PrefixCacheOptions::keep_restorable_tombstones, for
// workers that restore windows): the SWA pass only ever tombstones, and
// tombstones left childless stay as leaves (full KV, a full-KV match for a
// window restore) until the full pass takes them. Without restore
// no leaf is a tombstone; with it a tombstone leaf is worth its full KV, and
// SWA pressure does not throw full KV away (docs/architecture.md#kv-cache).
//
// Tiers (PrefixCacheOptions::l2): every node lives in one tier,
// L1 (the KV pools requests read) or L2 (a second pair of pools), and tiers
// only grow down a path (a child is never in a higher tier than its parent).
// The full pass above demotes instead of deleting: it takes least-recently
// used unlocked L1 nodes without L1 children, copies their full pages to L2
// and, only for the node's trailing window and only where a hit can end (a
// leaf or a divergence point), their SWA pages (docs/architecture.md#kv-cache: lower tiers
// hold SWA KV for windows only); the node is split so that exactly that
// window keeps SWA. L2 makes room the same way L1 used to: LRU leaves are
// deleted, LRU SWA tombstoned. Requests only ever lock L1 nodes: Match and
// MatchAndLock stop where L1 stops (Match reports the L2 part as
// lower_tier_tokens), and LoadBack() moves a prompt's L2 part into L1 first
// (the worker calls it when the request is admitted). An Insert whose path
// runs through L2 nodes adopts its own freshly computed pages for them.
//
// L3 (PrefixCacheOptions::l3): a PageStore below L2, content-addressed by
// chained hash (it is not part of the tree). Pages are written to it when
// they leave the tree (write-back: a deleted L2 node, or an L1 node when
// nothing sits below) and, for hot prefixes, once a node has been on
// l3_write_through_hits hits' paths (write-through), so a restarted worker
// with a file store comes back warm. Full KV of every such page goes down;
// SWA KV only for the trailing window of a deleted leaf or of a hit (the
// same rule as L2). Each node writes its pages at most once. Reading back is
// FetchFromL3 (l3_prefetch.h, off the loop thread), then AttachFromL3, which
// adds the fetched pages as L2 nodes, then LoadBack. A page lost or corrupt
// in L3 reads as a miss there, never as wrong bytes.
//
// Insert() hands a finished (or partially computed) request's pages to the
// cache: pages that extend the tree become new nodes (tombstones where the
// request kept no SWA KV, live nodes where it did: typically [tombstone |
// live] for a request that kept only its last window, or [tombstone | live |
// tombstone | live] when it also kept the window where its prompt diverged
// from a cached path); pages the tree already has are freed; fresh SWA pages
// heal the tombstones they cover, so a path whose SWA KV was tombstoned (or
// never stored mid-prompt) becomes window-safe again at that point.
//
// Every structural change is reported to an optional event callback (pages
// stored/removed with their chained hashes) so a worker can publish them to
// the router's affinity index.
//
// Not thread-safe: owned by the worker's scheduler thread, like the pools.
// stats() is safe to read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/page_store.h"

namespace swaserve::kv {

// A change to the cache's contents, for the router's affinity index.
struct CacheEvent {
  enum class Type : uint8_t {
    kStored,      // pages of these hashes are now cached (full KV; pages
                  // stored without SWA KV are followed by kSwaRemoved)
    kRemoved,     // evicted: no longer cached at all
    kSwaStored,   // SWA KV of these pages is cached again (healed)
    kSwaRemoved,  // SWA KV dropped (tombstoned); full KV still cached
    kTierChanged, // the pages moved to `tier` (demoted on eviction, loaded
                  // back on a hit); still cached, SWA state unchanged
  };
  Type type;
  // Chained page hashes, in prefix order.
  std::vector<uint64_t> hashes;
  // Where the pages are now (kStored: always 0; kTierChanged: the new tier).
  uint8_t tier = 0;
  // Where the pages sit on their path (for an index sharded by path,
  // cluster::IndexShardMapper): pages from the root to hashes[0], the hash
  // of the page before it (0 when depth is 0), and, when the cache has
  // event_anchor_page = K > 0 and the path goes past page K (depth +
  // hashes.size() > K), the hash of page K of the path (0 otherwise).
  int32_t depth = 0;
  uint64_t parent = 0;
  uint64_t anchor = 0;
};

struct PrefixCacheOptions {
  // Not owned; must outlive the cache. Page size and window come from its
  // shape.
  KvPools* pools = nullptr;
  // Called synchronously on every change (keep it cheap: queue and publish
  // elsewhere). May be empty.
  std::function<void(const CacheEvent&)> on_event;
  // Restorable tombstones (for window restore): the SWA eviction pass only
  // ever tombstones, so a leaf whose SWA KV is evicted keeps its full KV as a
  // tombstone leaf until the full pass deletes it (LRU by full-KV recency).
  // Such a leaf ends no window-safe hit but is a full-KV match a restore
  // turns into a hit; SWA pressure then no longer throws away full KV.
  // Off (default): tombstone leaves are useless, so unlocked ones are
  // deleted with their full KV and "no unlocked tombstone leaf" is an
  // invariant. Turn it on only where full-KV hits are restored.
  bool keep_restorable_tombstones = false;
  // Superseded windows go cold: when an insert extends a path past the end
  // of a leaf (a conversation's next turn growing the previous prompt), the
  // SWA KV of that old end's window — which only a prompt diverging exactly
  // there could use, while the new end's window serves every continuation —
  // ranks with the cold SWA KV (checkpoints) and is evicted before any hot
  // window. That includes SWA KV the insert brings for the old window (a
  // window a restore rebuilt there); pages of the inserting prompt's own
  // trailing window stay hot. Default false.
  bool cold_superseded_windows = false;
  // L2: a second pair of pools with the same shape (host memory
  // under a device L1; on a CPU-only machine both are host memory, kept
  // apart with their own budgets so the logic is the same). Not owned; null
  // (the default): no L2, eviction deletes. See "Tiers" above.
  KvPools* l2 = nullptr;
  // L3: a page store below L2 (see "L3" above). Not owned; must
  // outlive the cache; thread-safe (wrap a slow backend in AsyncPageStore so
  // writes stay off the caller's thread). Null (the default): no L3.
  // Requires l2 (pages come back from L3 through L2).
  PageStore* l3 = nullptr;
  // Mixed into the L3 keys (KvLayoutFingerprint's model): set it to an
  // identity of the weights whenever the store can outlive a model swap (a
  // file store's directory, a shared Redis). Default 0.
  uint64_t l3_model_identity = 0;
  // Write-through: a node's pages are written to L3 once it has been on
  // this many hits' paths, so hot prefixes survive a restart before they
  // are ever evicted; a node the store has no room for (PutRoom), and the
  // path below it, waits for a later hit. 0: write-back only (pages
  // leaving the tree). Default 2.
  int l3_write_through_hits = 2;
  // Write-through of long prompts at once: an Insert whose path reaches at
  // least this many tokens writes that whole path to L3 (the nodes not yet
  // written, root first; SWA KV of its trailing window), without waiting
  // for hits. For a worker near the top of a length bucket: an agent's
  // prompt that grows past the bound goes to another bucket's worker, which
  // finds its prefix in a shared L3 only if it is already there. Paced by
  // the store's PutRoom (a write-behind queue's free space): what does not
  // fit now is written by later ContinueL3Writes calls, a node split where
  // the room ends, so a prompt's KV larger than the queue is written whole
  // without dropping puts. 0 (default): off.
  int l3_write_through_from_tokens = 0;
  // K > 0: every event carries the hash of page K of its path
  // (CacheEvent::anchor, found by walking up the tree: O(nodes on the
  // path)). 0 (default): no anchors.
  int event_anchor_page = 0;
};

// Result of PrefixCache::LoadBack.
struct LoadBackResult {
  int64_t pages = 0;       // full pages moved L2 -> L1
  int64_t swa_pages = 0;   // SWA pages moved with them
  int64_t bytes = 0;       // bytes copied (0 for metadata-only pools)
  double seconds = 0;      // copying time
};

class PrefixCache;
struct CacheNode;

// One page copy of a load-back (PendingLoadBack).
struct PageCopy {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  size_t bytes = 0;
};

// An asynchronous load-back (PrefixCache::BeginLoadBack): the tree already
// shows the moved nodes in L1, with their new L1 pages, but those pages
// hold their bytes only once every copy has run. Until FinishLoadBack the
// moved path is locked (not evictable, not demoted, not written to L3), the
// L2 source pages stay allocated, and PrefixCache::Loading() is true for
// any hit that covers a moved page: the owner must not let such a request
// compute before FinishLoadBack. Move-only; run the copies on any thread
// (they touch only these pages), finish on the cache's thread.
class PendingLoadBack {
 public:
  PendingLoadBack() = default;
  PendingLoadBack(PendingLoadBack&&) = default;
  PendingLoadBack& operator=(PendingLoadBack&&) = default;
  PendingLoadBack(const PendingLoadBack&) = delete;
  PendingLoadBack& operator=(const PendingLoadBack&) = delete;

  bool empty() const { return generation_ == 0; }
  const std::vector<PageCopy>& copies() const { return copies_; }
  // Runs every copy here; returns the seconds it took.
  double RunCopies() const;
  // Pages and bytes moved; the caller sets seconds (copy time) before
  // FinishLoadBack, which adds it to the cache's stats.
  LoadBackResult result;

 private:
  friend class PrefixCache;
  uint64_t generation_ = 0;
  CacheNode* end_ = nullptr;  // deepest moved node; the path above is locked
  std::vector<PageCopy> copies_;
  std::vector<PageId> l2_full_;  // source pages, freed by FinishLoadBack
  std::vector<PageId> l2_swa_;
};

// A locked prefix-cache hit, owned by the request that matched it. Moving is
// allowed; it must be released with PrefixCache::Unlock (or handed to a
// Sequence, which does that) before the cache is destroyed.
class CacheHit {
 public:
  CacheHit() = default;
  CacheHit(CacheHit&& other) noexcept { *this = std::move(other); }
  CacheHit& operator=(CacheHit&& other) noexcept;
  CacheHit(const CacheHit&) = delete;
  CacheHit& operator=(const CacheHit&) = delete;

  // Hit length in tokens (a multiple of page_size): the prefix whose full
  // KV the request reuses. The window-safe length, unless this is a
  // full-KV hit (needs_window_restore()): then the full-KV match.
  int tokens() const { return static_cast<int>(full_pages_.size()) * page_size_; }
  // Longest prefix with full KV in the cache (>= tokens()).
  int matched_tokens() const { return matched_tokens_; }
  // Longest window-safe prefix (<= tokens()).
  int window_safe_tokens() const { return window_safe_tokens_; }
  // A full-KV hit: the SWA KV of its last window is not in the cache; the
  // caller must restore it before reading it. No SWA page is locked, or
  // (MatchOptions::lock_safe_window) those of the window at
  // window_safe_tokens().
  bool needs_window_restore() const { return tokens() > window_safe_tokens_; }
  // Full-pool pages of tokens [0, tokens()).
  absl::Span<const PageId> full_pages() const { return full_pages_; }
  // SWA-pool pages of pages [swa_first_page(), swa_first_page() +
  // swa_pages().size()): the hit's last window — for a full-KV hit with
  // lock_safe_window, the window at window_safe_tokens() (ending there).
  // Pages before swa_first_page have no SWA KV for this hit.
  absl::Span<const PageId> swa_pages() const { return swa_pages_; }
  int swa_first_page() const { return swa_first_page_; }
  bool locked() const { return node_ != nullptr; }
  bool swa_locked() const { return swa_locked_tokens_ > 0; }

 private:
  friend class PrefixCache;
  int page_size_ = 1;
  int matched_tokens_ = 0;
  int window_safe_tokens_ = 0;
  std::vector<PageId> full_pages_;
  std::vector<PageId> swa_pages_;
  int swa_first_page_ = 0;
  CacheNode* node_ = nullptr;     // deepest locked node (null: nothing locked)
  // Deepest SWA-locked node (node_, or for a full-KV hit with
  // lock_safe_window the window-safe end, an ancestor of node_).
  CacheNode* swa_node_ = nullptr;
  int swa_locked_tokens_ = 0;     // tokens of SWA lock counted up from swa_node_
};

// Result of a lookup without locking: both lengths a caller chooses from
// (page aligned; safe_tokens <= matched_tokens).
struct MatchLengths {
  int matched_tokens = 0;  // full-KV prefix length M (in L1)
  int safe_tokens = 0;     // window-safe prefix length L (usable as is)
  // Further full-KV match in L2 beyond M (usable after LoadBack).
  int lower_tier_tokens = 0;
};

struct MatchOptions {
  // At most this many tokens are matched (rounded down to pages). Pass the
  // prompt length minus one so that at least one token is computed.
  int max_tokens = INT32_MAX;
  // Lock the full-KV match M instead of the window-safe L when M > L (a
  // full-KV hit: see above). When M == L the hit is an ordinary one.
  bool full_kv = false;
  // With full_kv, when 0 < L < M: also lock the SWA pages of L's last window
  // (as an ordinary hit at L would), so that the caller can restore from L
  // instead of from WindowRestoreStart(M): cheaper when L is past that start
  // (the restore then reads SWA keys below L from those pages:
  // Sequence::BeginWindowRestore). Ignored otherwise.
  bool lock_safe_window = false;
};

struct EvictResult {
  int64_t full_pages_freed = 0;
  int64_t swa_pages_freed = 0;
};

// Counters since creation; safe to read from any thread.
struct PrefixCacheStats {
  std::atomic<int64_t> lookups{0};
  std::atomic<int64_t> lookup_tokens{0};      // tokens presented to MatchAndLock
  std::atomic<int64_t> hit_tokens{0};         // window-safe tokens reused
  std::atomic<int64_t> window_lost_tokens{0}; // matched but not window-safe
  std::atomic<int64_t> inserted_pages{0};     // new full pages adopted
  std::atomic<int64_t> duplicate_pages{0};    // inserted pages already cached (freed)
  std::atomic<int64_t> healed_pages{0};       // SWA pages adopted into tombstones
  std::atomic<int64_t> cooled_swa_pages{0};   // superseded windows' SWA pages made cold
  std::atomic<int64_t> evicted_full_pages{0};
  std::atomic<int64_t> evicted_swa_pages{0};  // includes SWA freed with a deleted leaf
  std::atomic<int64_t> tombstoned_nodes{0};
  std::atomic<int64_t> nodes{0};              // current node count (gauge)
  std::atomic<int64_t> tombstone_nodes{0};    // current tombstones (gauge)
  // Tiers (L2).
  std::atomic<int64_t> demoted_pages{0};      // full pages L1 -> L2
  std::atomic<int64_t> demoted_swa_pages{0};  // SWA pages that went with them
  std::atomic<int64_t> dropped_swa_pages{0};  // SWA pages not kept on demotion
  std::atomic<int64_t> loaded_back_pages{0};  // full pages L2 -> L1
  std::atomic<int64_t> loaded_back_bytes{0};
  std::atomic<int64_t> loaded_back_nanos{0};     // copying time
  std::atomic<int64_t> l2_evicted_full_pages{0};  // deleted from L2
  // L3.
  std::atomic<int64_t> l3_written_pages{0};      // full pages put (write-back + write-through)
  std::atomic<int64_t> l3_written_swa_pages{0};
  std::atomic<int64_t> l3_write_through_pages{0};  // of l3_written_pages, written through
  // Of l3_write_through_pages, at an insert reaching l3_write_through_from_tokens
  // (or a WriteThroughToL3 call).
  std::atomic<int64_t> l3_write_through_bound_pages{0};
  std::atomic<int64_t> l3_write_errors{0};       // puts refused (queue full, store down)
  // Full pages written by CheckpointToL3 (also in l3_written_pages).
  std::atomic<int64_t> l3_checkpoint_pages{0};
  std::atomic<int64_t> l3_attached_pages{0};     // full pages attached from L3 (into L2)
  std::atomic<int64_t> l3_attached_swa_pages{0};
  std::atomic<int64_t> l3_healed_swa_pages{0};   // tombstones healed from L3
};

class PrefixCache {
 public:
  static absl::StatusOr<std::unique_ptr<PrefixCache>> Create(
      const PrefixCacheOptions& options);
  // Frees every cached page back to the pools. All hits must be unlocked.
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int page_size() const { return page_size_; }
  int sliding_window() const { return window_; }

  // Lookup without side effects (for schedulers and estimates); at most
  // max_tokens tokens (rounded down to pages).
  MatchLengths Match(absl::Span<const uint64_t> page_hashes,
                     int max_tokens = INT32_MAX) const;

  // Finds the longest window-safe prefix of `page_hashes` (or, with
  // options.full_kv, the full-KV one), locks it, and refreshes recency. May
  // split a node at the hit's end or window boundary.
  CacheHit MatchAndLock(absl::Span<const uint64_t> page_hashes,
                        const MatchOptions& options);
  CacheHit MatchAndLock(absl::Span<const uint64_t> page_hashes,
                        int max_tokens = INT32_MAX) {
    return MatchAndLock(page_hashes, MatchOptions{.max_tokens = max_tokens});
  }

  // Tiers: moves the L2 part of the match of `page_hashes` (at most
  // max_tokens, rounded down to pages) into L1, root side first, so that a
  // following Match/MatchAndLock sees it in L1. Only when that part is at
  // least min_tokens long. L1 room comes from ordinary L1 eviction (which
  // may demote other nodes); the path itself is locked meanwhile. SWA KV
  // moves along where L1 has free SWA pages (else the node arrives as a
  // tombstone). Stops early when L1 cannot supply the pages. No-op without
  // L2.
  // Synchronous: BeginLoadBack, the copies, FinishLoadBack.
  LoadBackResult LoadBack(absl::Span<const uint64_t> page_hashes, int max_tokens = INT32_MAX,
                          int min_tokens = 0);
  // LoadBack whose copies run elsewhere (see PendingLoadBack); empty when
  // there is nothing to move. The moved nodes' path stays locked until
  // FinishLoadBack, which every non-empty result must get (before the cache
  // is destroyed), on this cache's thread, after all its copies ran.
  PendingLoadBack BeginLoadBack(absl::Span<const uint64_t> page_hashes,
                                int max_tokens = INT32_MAX, int min_tokens = 0);
  void FinishLoadBack(PendingLoadBack& pending);
  // Whether some page of the hit is still being loaded back (its bytes are
  // not there yet).
  bool Loading(const CacheHit& hit) const;
  int pending_load_backs() const { return static_cast<int>(loading_.size()); }

  // L3: attaches pages read from L3 (FetchFromL3, for this prompt's
  // page_hashes). Its SWA KV heals the tombstones of the tree's own match
  // that it covers (free SWA pages of their tier only); its pages past where
  // the tree's match ends now become L2 nodes ([tombstone | live window],
  // like an Insert), so that LoadBack then moves them into L1. L2 makes room
  // by its own eviction; pages the tree already holds are skipped. Returns
  // the full pages attached (0: none new: the tree's match ends before the
  // fetch's full KV starts or past its end, the fetch ends no window-safe
  // hit and tombstones are not kept, L2 cannot hold it, or no L3/L2).
  int AttachFromL3(absl::Span<const uint64_t> page_hashes, const L3Fetch& fetch);
  bool has_l3() const { return l3_ != nullptr; }
  // Writes more of the paths near the bound (l3_write_through_from_tokens)
  // that the L3 store had no room for yet, as far as PutRoom allows now;
  // a path whose pages left the cache meanwhile is given up where they
  // went. Call it regularly while l3_writes_pending() (the prefill loop
  // does, every step and every 20 ms when idle).
  void ContinueL3Writes();
  // Paths near the bound not yet written whole.
  bool l3_writes_pending() const { return !l3_pending_paths_.empty(); }
  // Writes the path of page_hashes (as far as the tree holds it) to L3 like
  // a path reaching l3_write_through_from_tokens: at once, paced by PutRoom
  // (ContinueL3Writes). For a prefill cut short, whose retry may come to
  // another worker sharing the store. No-op without L3.
  void WriteThroughToL3(absl::Span<const uint64_t> page_hashes);
  // L3 checkpoint of a prefill in progress, so that a crash (kill -9, OOM)
  // loses no more than the chunks since the last one: a retry on any worker
  // sharing the store finds the prompt's prefix there. Writes the full KV of
  // pages [from_page, to_page) from a request's own page tables (its
  // Sequence's full_pages() and swa_pages(): L1 pages the request owns or
  // has locked, not the tree's nodes) and the SWA KV of the window ending at
  // to_page where the tables still hold every page of it (else full KV
  // only, which a restoring reader still turns into a hit). Paced by the
  // store's PutRoom (a write-behind queue's free space): full pages root
  // side first as far as the room takes whole pages now, the window only
  // after all of them and when it fits too; the caller goes on from
  // full_to_page at a later chunk (a MiMo-V2.5-Pro checkpoint of 16K tokens,
  // ~50 KB of full KV each, is three times the default 256 MiB queue).
  // Nothing is put that does not fit (nothing dropped). Pages below
  // from_page are the caller's business (the hit's part: the tree's pages,
  // WriteThroughToL3). Counted in stats().l3_checkpoint_pages.
  struct L3Checkpoint {
    // Full KV of [from_page, full_to_page) is in L3 now (from_page: none;
    // to_page: all of it).
    int full_to_page = 0;
    // The window ending at to_page went too (only with every full page).
    bool window = false;
  };
  L3Checkpoint CheckpointToL3(absl::Span<const uint64_t> page_hashes,
                              absl::Span<const PageId> full_pages,
                              absl::Span<const PageId> swa_pages, int from_page, int to_page);
  // Marks pages [from_page, to_page) of page_hashes' path (as far as the
  // tree holds it) as having their full KV in L3 (a checkpoint wrote it
  // before the request inserted the pages), splitting the nodes the range
  // starts or ends in, so write-back and write-through do not write the
  // same blobs again. No-op without L3.
  void MarkFullKvInL3(absl::Span<const uint64_t> page_hashes, int from_page, int to_page);
  // What FetchFromL3 needs to read this cache's pages back.
  L3FetchOptions l3_fetch_options() const;

  // Drops the hit's SWA lock (its window is no longer read). Idempotent.
  void ReleaseSwa(CacheHit& hit);
  // Drops all of the hit's locks and clears it. Idempotent.
  void Unlock(CacheHit& hit);

  // Hands pages to the cache. page_hashes[i] keys page i; full_pages[i] is
  // its full-pool page; swa_pages[i] its SWA-pool page or kNoPage (a request
  // keeps SWA KV for its trailing window and possibly for other windows, so
  // the live pages form one or more runs; pages after the last live one are
  // not inserted). All three spans have the same length. Pages the caller
  // owns privately (kInUse) are taken over: adopted (-> kCached) or freed;
  // pages that are already the cache's own (from the caller's hit) are left
  // alone. The caller's hit, if any, stays locked: Unlock it afterwards.
  //
  // swa_cold (empty, or one flag per page): SWA pages flagged cold (the
  // sequence's checkpoint windows) enter the SWA LRU below every hot node,
  // oldest first, so they only use SWA space nothing hot wants; a hit that
  // reads one makes it hot like any other.
  //
  // Pages [l3_written_from_page, l3_written_to_page) are in L3 already (the
  // inserting request's checkpoints, CheckpointToL3): marked as written
  // (MarkFullKvInL3) before any write-through of the path, so their full
  // KV is not put twice.
  void Insert(absl::Span<const uint64_t> page_hashes,
              absl::Span<const PageId> full_pages,
              absl::Span<const PageId> swa_pages,
              absl::Span<const uint8_t> swa_cold = {}, int l3_written_from_page = 0,
              int l3_written_to_page = 0);

  // Frees at least `full_pages` full-pool and `swa_pages` SWA-pool pages if
  // that many are evictable (see above); returns what was freed.
  EvictResult Evict(int64_t full_pages, int64_t swa_pages);
  // The SWA pass only, and only over cold SWA KV (checkpoint windows,
  // superseded windows): frees up to `swa_pages` SWA pages without touching
  // a hot window (Sequence: a request's own checkpoints yield before hot
  // windows do).
  EvictResult EvictColdSwa(int64_t swa_pages);

  // Deletes every unlocked node in every tier (nothing is demoted; with an
  // L3, pages not yet written there are written back, so a worker that
  // clears its cache on shutdown restarts warm); with nothing locked the
  // cache is then empty. For shutdown and tests.
  void Clear();

  // Number of pages the cache holds (kCached) per pool, in L1.
  int64_t cached_full_pages() const { return cached_full_[0]; }
  int64_t cached_swa_pages() const { return cached_swa_[0]; }
  // The same in L2 (0 without L2).
  int64_t l2_full_pages() const { return cached_full_[1]; }
  int64_t l2_swa_pages() const { return cached_swa_[1]; }
  bool has_l2() const { return l2_ != nullptr; }
  // Pages Evict() could free right now (unlocked), per pool.
  int64_t EvictableFullPages() const;
  int64_t EvictableSwaPages() const;
  // Of those, the cold ones (what EvictColdSwa could free).
  int64_t EvictableColdSwaPages() const;
  // L1's evictable SWA KV in the order Evict()'s SWA pass takes it (least
  // valuable first: cold before hot, then least recently used, the root
  // side first), one node's chained hashes per call, until `visit` returns
  // false. For studies of the eviction order (kv_trace_replay_bench's
  // layer-group estimate); O(nodes visited).
  void VisitSwaEvictionOrder(
      const std::function<bool(absl::Span<const uint64_t> hashes)>& visit) const;

  const PrefixCacheStats& stats() const { return stats_; }

  // Checks every structural invariant (for tests; O(size)): page ownership
  // and conservation against the pools, lock ordering, no unlocked tombstone
  // leaf (unless restorable tombstones are kept),
  // LRU sets hold exactly the evictable nodes keyed by their current
  // recency, hash index consistency. Internal error naming the first
  // violation.
  absl::Status CheckInvariants() const;

  // One line per node (for debugging and test failure messages).
  std::string DebugString() const;

 private:
  explicit PrefixCache(const PrefixCacheOptions& options);

  struct LruKey {
    uint64_t tick;
    int depth;  // tokens from the root to the node's start: root side first
    uint64_t id;
    auto operator<=>(const LruKey&) const = default;
  };

  CacheNode* NewNode(CacheNode* parent);
  // Splits `node` so that its first `pages` pages become a new parent node;
  // returns the new parent. `node` keeps the suffix (pointers to it stay
  // valid, including hits that end at it).
  CacheNode* Split(CacheNode* node, int pages);
  void DeleteLeaf(CacheNode* node, EvictResult* result);
  void Tombstone(CacheNode* node, EvictResult* result);
  // Tiers (prefix_cache_tiers.cc).
  KvPools& PoolsOf(const CacheNode* node) const;
  void SetTier(CacheNode* node, int tier);
  // Evicts one full-evictable L1 node: to L2 when there is one, else deleted.
  void EvictFullL1(CacheNode* node, EvictResult* result);
  void Demote(CacheNode* node, EvictResult* result);
  // Makes at least this many L2 pages per pool free if possible (deletes
  // LRU L2 leaves, tombstones LRU L2 SWA), never touching locked nodes;
  // L1 pages freed on the way (childless tombstone parents) go to *result.
  void EvictL2(int64_t full_pages, int64_t swa_pages, EvictResult* result);
  // Moves n into L1 for `pending` (copies recorded, L2 pages kept there).
  bool Promote(CacheNode* node, PendingLoadBack* pending);
  // L3 (prefix_cache_l3.cc): puts the node's full pages (once) and its SWA
  // pages from absolute page swa_from_page on (once) into L3; returns the
  // full pages it put.
  int64_t WriteToL3(CacheNode* node, int swa_from_page, bool through);
  // Bytes WriteToL3(node, swa_from_page) would put for the node's first
  // `pages` pages (what it has not written yet).
  int64_t L3WriteBytes(const CacheNode* node, int swa_from_page, int pages) const;
  // Write-through accounting for the nodes of a hit's path.
  void CountHit(CacheNode* end, int hit_end_page);
  // Writes as much of `path` (page hashes from the root) to L3 as PutRoom
  // allows, root first, adding the full pages put to *written; true when it
  // is all written (or gone from the tree).
  bool WritePathToL3(absl::Span<const uint64_t> path, int64_t* written);
  // Gives tombstone nodes of `path` in [fetch.swa_first, heal_to) the
  // fetch's SWA KV (free SWA pages of their tier only).
  void HealFromL3(const std::vector<CacheNode*>& path, const L3Fetch& fetch, int heal_to);
  // Copies page bytes between pools (no-op for metadata-only pools).
  static void CopyPages(const PagePool& from, absl::Span<const PageId> src, PagePool& to,
                        absl::Span<const PageId> dst);
  // An L2 node on an inserting request's path takes the request's L1 pages.
  void AdoptIntoL1(CacheNode* node, absl::Span<const PageId> full_pages);
  void Reindex(CacheNode* node);
  // Evict's SWA pass (only over cold SWA KV when `cold_only`).
  void EvictSwa(int64_t swa_pages, bool cold_only, EvictResult* result);
  void Unindex(CacheNode* node);
  bool FullEvictable(const CacheNode* node) const;
  bool SwaEvictable(const CacheNode* node) const;
  void LockPath(CacheNode* node, int swa_tokens);
  // Locks the full pages of the path ending `k` pages into `end_node`.
  void LockFullKv(CacheHit& hit, CacheNode* end_node, int k);
  // Makes the first page of the window ending at page end_page (on
  // end_node's path) a node boundary; returns it.
  int SplitAtWindowStart(CacheNode* end_node, int end_page);
  // Adds the SWA lock of the window ending at `safe` pages (safe_node's
  // end) to a full-KV hit (MatchOptions::lock_safe_window).
  void LockSafeWindow(CacheHit& hit, CacheNode* safe_node, int safe);
  void UnlockSwa(CacheNode* node, int swa_tokens);
  // Ranks the SWA KV of the window ending at `end`'s end with the cold SWA
  // KV (cold_superseded_windows), except nodes holding a page at or past
  // `keep_hot_from` for which `incoming_swa` brings SWA KV (the inserting
  // prompt's own trailing window).
  void CoolWindow(CacheNode* end, int keep_hot_from, absl::Span<const PageId> incoming_swa);
  void Emit(CacheEvent::Type type, const CacheNode* node, int first_page,
            int num_pages, uint8_t tier = 0);
  void CountNodes();

  KvPools* pools_;
  KvPools* l2_;
  PageStore* l3_;
  L3Layouts l3_layouts_;
  int l3_write_through_hits_;
  int l3_write_through_from_pages_;  // 0: off
  // Page hashes of paths near the bound still being written (oldest first;
  // at most kMaxPendingL3Paths, the oldest given up beyond).
  static constexpr size_t kMaxPendingL3Paths = 8;
  std::deque<std::vector<uint64_t>> l3_pending_paths_;
  // Queues a path for ContinueL3Writes (superseding a pending prefix of it).
  void QueueL3Path(absl::Span<const uint64_t> path);
  // Puts pages [from, to) of `pool` keyed by hashes[i] and `layout`;
  // returns how many were stored (refusals count in l3_write_errors).
  int64_t PutPages(const PagePool& pool, absl::Span<const uint64_t> hashes,
                   absl::Span<const PageId> pages, uint64_t layout, int from, int to);
  int page_size_;
  int window_;
  bool keep_tombstones_;
  bool cold_superseded_;
  std::function<void(const CacheEvent&)> on_event_;
  int event_anchor_page_ = 0;
  std::unique_ptr<CacheNode> root_;
  uint64_t next_id_ = 1;
  // Recency ticks: hot ones start above every cold one (Insert's swa_cold),
  // so cold SWA KV is always evicted first.
  static constexpr uint64_t kHotTicks = uint64_t{1} << 48;
  uint64_t tick_ = kHotTicks;
  uint64_t cold_tick_ = 0;
  // Per tier (0: L1, 1: L2).
  int64_t cached_full_[2] = {0, 0};
  int64_t cached_swa_[2] = {0, 0};
  // Asynchronous load-backs not finished: their generations, and the L2
  // source pages they keep (kCached in L2, no node's).
  absl::flat_hash_set<uint64_t> loading_;
  uint64_t next_load_generation_ = 1;
  int64_t loading_l2_full_ = 0;
  int64_t loading_l2_swa_ = 0;
  // Full-evictable nodes (no child in their own tier, unlocked) and
  // SWA-evictable nodes, per tier.
  std::set<std::pair<LruKey, CacheNode*>> full_lru_[2];
  std::set<std::pair<LruKey, CacheNode*>> swa_lru_[2];
  PrefixCacheStats stats_;
};

}  // namespace swaserve::kv
