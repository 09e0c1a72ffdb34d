// PrefixIndex: the prefix-affinity index in Redis (docs/architecture.md#request-path, #redis-state):
// which workers hold the KV of which chained page hashes (base/hash.h), so a
// router can find, for every candidate worker, how many leading pages of a
// prompt that worker has cached — in one round trip.
//
// Two kinds of entries per worker (key_schema.h; <x> is an index shard's key
// prefix), as in NVIDIA Dynamo's KV
// router (an event-fed index plus a short-TTL "predicted" side index):
//   authoritative  <x>prefix:<id>     SET of page hashes (8 bytes each).
//                  Written only from the worker's own cache events: stored
//                  -> SADD, removed -> SREM, cleared -> DEL. It mirrors the
//                  worker's cache, so entries need no per-entry TTL: the
//                  worker removes what it evicts. The key expires index_ttl
//                  after the worker's last event or heartbeat (the heartbeat
//                  refreshes it), so a dead worker leaves nothing behind.
//   predicted      <x>predicted:<id>  ZSET page hash -> expiry (Unix ms on
//                  the Redis server's clock: scripts read TIME, so hosts
//                  need no synchronized clocks). Written by routers on
//                  dispatch (RecordDispatch) for pages the worker does not
//                  hold yet; live while expiry > now; ZADD GT only ever
//                  extends an expiry. Bridges the time until the worker's
//                  stored events arrive, so sibling requests co-locate.
// A page is held by a worker when it is in its SET or live in its ZSET. A
// removed event deletes the page from both.
//   swa gone       <x>swa_gone:<id>   SET of the worker's pages whose SWA KV
//                  was dropped (kSwaRemoved: tombstoned; kSwaStored and
//                  stored/removed events take them out). A match of depth d
//                  ends window-safe when none of pages [d − wp, d) is in it
//                  (wp = ceil((W − 1) / page)): the worker then reuses all d
//                  pages; otherwise the match answers the window-safe depth
//                  L < d (Match), and the worker reuses L or what a window
//                  restore leaves (the router's credit, lib/router/policy.h). Exact as long
//                  as events arrive in order (the queue is FIFO); a lost or
//                  dropped event clears the worker's entries (kCleared), so
//                  the SET errs only toward "gone" for pages not yet
//                  re-stored, never keeps a page live that is not.
//   lower tier     <x>lower:<id>      SET of the worker's pages held in its
//                  lower tier (L2, host memory: kTierDown in, kTierUp,
//                  stored, removed and cleared out). A worker's tiers only
//                  go down a path (kv/prefix_cache.h), so the L2 pages of a
//                  match are a suffix of it: the match script finds where it
//                  starts by binary search, and the router credits those
//                  pages less (a load-back costs a copy; policy.h). Pages
//                  that left the tree for the worker's L3 store are removed
//                  from the index like any evicted page: a Redis L3 is shared
//                  by every worker (no affinity to credit), and a local one's
//                  own LRU evictions are not reported, so the index could not
//                  stay exact for them.
//   tier summary   <x>tiers:<id>      "0".."6": bit 2 = the SWA-gone SET has
//                  pages, bit 4 = the lower-tier SET has. Written by Apply
//                  after every call (exact then: only Apply fills those
//                  SETs), refreshed by the heartbeat, deleted by Clear; so
//                  a match reads it for all candidates in one MGET instead
//                  of an EXISTS per SET and candidate. A DEL or expiry of
//                  the SETs leaves it at most conservative ("has": the
//                  search finds nothing), and a missing one means EXISTS.
//
// Bounds: predicted entries by predicted_ttl and max_predicted_per_worker
// (the entries closest to expiry are evicted first); authoritative entries
// by the worker's cache (its events), index_ttl after it dies, and
// max_entries_per_worker (a safety valve against lost removal events:
// random eviction beyond it). Memory is roughly 50 bytes per authoritative
// entry and 100 per predicted one. Keep Redis' maxmemory-policy at
// noeviction (size maxmemory above workers x bounds): allkeys-* policies
// could evict worker records.
//
// Match: a Lua script (loaded once, EVALSHA) receives each candidate's keys
// and the prompt's page hashes in prefix order, packed into one argument
// (PackPageHashes) and cut apart lazily. It relies on one invariant: a
// worker's authoritative SET is closed under prefixes (with a page, all the
// pages before it in its chain). Chained hashes name a whole prefix, and
// the worker's cache is a radix tree that stores a node only under its
// parent and evicts only leaves (kv::PrefixCache emits kRemoved only from
// DeleteLeaf), its events are applied in order, a lost or dropped event
// clears the worker (kCleared), and a SET past max_entries_per_worker is
// dropped whole instead of evicted at random. So the prompt's pages in a
// SET are exactly its first d pages, and d is found by search, not a scan:
// the depths the same call found for earlier candidates as hints (pages h
// and h + 1: a held page h implies pages 1..h, so candidates that share a
// cached prefix, such as a system prompt, settle in two probes), page 1 when
// no hint was held (first, while there are no hints or an earlier candidate
// missed it: a miss then costs one probe), page n (a whole-prompt hit) and a
// binary search in the bracket left — O(log n) single-member SISMEMBER
// probes per candidate at worst
// instead of d members (bench/router/policy_sim: probes per candidate on
// the Mooncake trace; decision_bench: Redis CPU per decision). From
// page d on, a worker with predictions is scanned through its ZSET
// (ZMSCORE) in growing chunks (8, 32, 128, ...), stopping at the first page
// not live there; predicted entries need not be prefix-closed. The result
// is exact: depth(c) is the largest d such that pages 0..d-1 are all held
// by c (in its SET or live in its ZSET), given the invariant. Were the
// invariant broken (a bug, or a hand-edited key), a depth could be off
// until the worker's next clear; it only steers routing, never the output.
//
// Redis Cluster: a script's keys must share one hash slot, and a
// decision must stay one round trip, so on a cluster the index is split into
// index shards (PrefixIndexOptions::cluster_index_shards, hash tags in
// key_schema.h, spread over the masters). A prompt's whole chain lives in
// the shard of its anchor page K (anchor_page; a prompt of at most K pages:
// the home shard), and each shard stays closed under prefixes because the
// worker copies a chain's head pages into its anchor's shard
// (index_shard_mapper.h: why page K and not page 0, and what it costs).
// Match and RecordDispatch then touch one shard: one EVALSHA on one master.
// Apply writes every shard a batch touches (one EVALSHA per shard, pipelined
// per master), then the event stream (its own hash tag). The load reports
// live in another slot than the shard, so on a sharded index Match reads no
// value keys (ClusterView reads loads on its own). A single Redis keeps one
// shard and every behaviour above. Failover: a replica promoted after a
// master dies may miss the last writes (Redis replicates asynchronously):
// entries stored or removed just before are then missing or stale until
// the worker's next events on those pages — routing is steered, never the
// output.
//
// Ownership: does not own the RedisClient, which must outlive it.
// Thread-safety: thread-safe (stateless over the client).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/cluster/cache_event_queue.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/redis_client.h"

namespace swaserve::cluster {

struct PrefixIndexOptions {
  // A worker's authoritative entries disappear this long after its last
  // cache event or heartbeat (WorkerRegistration refreshes it). Default
  // 20 min.
  absl::Duration index_ttl = absl::Minutes(20);
  // Lifetime of a predicted entry (RecordDispatch). Default 60 s.
  absl::Duration predicted_ttl = absl::Seconds(60);
  // Safety bound on a worker's authoritative entries (random eviction
  // beyond it); 0 means unbounded. Default 2^20 pages (16M tokens at 16 per
  // page), above the KV capacity of one worker including host memory.
  int64_t max_entries_per_worker = int64_t{1} << 20;
  // Bound on a worker's predicted entries (closest to expiry evicted first);
  // 0 means unbounded. Default 2^18.
  int64_t max_predicted_per_worker = int64_t{1} << 18;
  // The KV events API (kv_events.h): Apply also appends every op to the
  // worker's event stream, trimmed to about this many entries (Redis'
  // approximate MAXLEN); a consumer further behind takes a snapshot. 0
  // turns the stream off. Memory: an entry holds one op, at most 4,096
  // pages (32 KiB), so a worker's stream takes at most about 32 KiB x this
  // (typically far less: most ops are a few pages). Default 1,000.
  int64_t event_stream_max_len = 1000;
  // On a Redis Cluster (RedisClient::cluster_mode()): the number of index
  // shards, 1..64 (KeySchema; 1 puts the whole index in one slot, so on one
  // master). Every process of a cluster must agree. Default 64: about
  // 21 per master of a 3-master cluster, so the shards spread evenly.
  int cluster_index_shards = 64;
  // On a sharded index: the anchor page K that chooses a chain's shard
  // (index_shard_mapper.h). Every process of a cluster must agree. Default
  // 32 (512 tokens at 16 per page: past the shared system prompt of the
  // Mooncake conversation trace, whose first 512 tokens every request
  // shares).
  int anchor_page = 32;
};

// The index shards `redis` gets: cluster_index_shards on a Redis Cluster, 1
// on a single Redis (KeySchema::Create's index_shards).
int IndexShardCount(const RedisClient& redis, const PrefixIndexOptions& options);

// Checks the options; InvalidArgument names the bad field.
absl::Status ValidatePrefixIndexOptions(const PrefixIndexOptions& options);

// Entry counts of one worker (see PrefixIndex::Sizes).
struct PrefixIndexSizes {
  int64_t authoritative = 0;
  int64_t predicted = 0;  // live ones
};

class PrefixIndex {
 public:
  // `redis` is not owned and must outlive the index.
  static absl::StatusOr<std::unique_ptr<PrefixIndex>> Create(
      RedisClient* redis, const KeySchema& keys,
      const PrefixIndexOptions& options);

  // Applies a worker's cache events (authoritative), in order, in one
  // script call, and refreshes its index_ttl. Returns the number of
  // authoritative entries afterwards. `op` labels the Redis metrics.
  // Sharded (IndexShardMapper's ops: shard, index and stream flags): one
  // script call per shard touched, pipelined, then one for the event
  // stream; returns the entries of the shards touched.
  absl::StatusOr<int64_t> Apply(absl::string_view worker_id,
                                absl::Span<const CacheEventOp> ops,
                                absl::string_view op = "cache_events");

  // Records that `hashes` were dispatched to `worker_id`: pages it does not
  // hold get predicted entries living predicted_ttl (existing predictions
  // are extended, never shortened). One round trip.
  absl::Status RecordDispatch(absl::string_view worker_id,
                              absl::Span<const uint64_t> hashes);

  // For each candidate (in order): the number of leading `hashes` that
  // worker holds. One round trip. No candidates: empty; no hashes: all zero
  // (no round trip).
  absl::StatusOr<std::vector<int64_t>> Match(
      absl::Span<const uint64_t> hashes,
      absl::Span<const std::string> candidates);

  // The same, and in the same script call (one round trip) the values of
  // `value_keys` (plain string keys, e.g. load reports; nullopt when
  // absent) into *values (aligned with value_keys); with window_pages > 0
  // (wp = ceil((W − 1) / page size)) and safe_pages, each candidate's
  // window-safe depth L in pages: the largest p <= its depth d such that
  // none of pages max(1, p − wp + 1)..p lost its SWA KV (a hit of p pages
  // the worker uses as is; = d without the check, and when the last window
  // is intact: one SMISMEMBER of wp pages, as before). The search goes down
  // from d in growing chunks; window_scan_pages (empty, or one per
  // candidate) bounds it to d − S: -1 then says L < d − S (a router that
  // credits a restoring worker max(L, M − R) needs no L below M − R).
  // Why L is exact: the SWA-gone SET holds exactly the worker's pages whose
  // SWA KV was dropped (its events in order; a lost one clears the worker),
  // and the worker's own cache (kv::PrefixCache::Match) takes the same
  // largest window-safe end (SWA liveness is per radix node there, so its
  // node-end answer equals this page-level one).
  absl::StatusOr<std::vector<int64_t>> Match(
      absl::Span<const uint64_t> hashes,
      absl::Span<const std::string> candidates,
      absl::Span<const std::string> value_keys,
      std::vector<std::optional<std::string>>* values, int window_pages = 0,
      std::vector<int64_t>* safe_pages = nullptr, std::vector<int64_t>* l1_pages = nullptr,
      absl::Span<const int64_t> window_scan_pages = {},
      absl::Span<const int64_t> given_depths = {});

  // Match split in two, for a caller that pipelines several decisions in
  // one round trip (RedisClient::EvalshaPipeline): the script call Match
  // would send (same arguments; checks them as Match does), and the parse
  // of its reply. MatchReply holds one entry per candidate in depths,
  // safe_pages and l1_pages, and one per value key in values.
  struct MatchReply {
    std::vector<int64_t> depths;
    std::vector<int64_t> safe_pages;
    std::vector<int64_t> l1_pages;
    std::vector<std::optional<std::string>> values;
  };
  // given_depths (empty, or one per candidate): each candidate's depth in
  // its SET as the caller's IndexMirror found it; the call is then the
  // slimmer prefix_extend script (one key per candidate, the prompt's pages
  // after the smallest given depth), which only adds live predictions and
  // reads the values, and the window-safe and L1 answers are the depths
  // (the mirror computes the real ones). ParseMatchReply's given_depths
  // says which of the two calls the reply answers.
  absl::StatusOr<RedisScriptCall> MatchCall(absl::Span<const uint64_t> hashes,
                                            absl::Span<const std::string> candidates,
                                            absl::Span<const std::string> value_keys = {},
                                            int window_pages = 0,
                                            absl::Span<const int64_t> window_scan_pages = {},
                                            absl::Span<const int64_t> given_depths = {}) const;
  static absl::StatusOr<MatchReply> ParseMatchReply(const RedisReply& reply, size_t candidates,
                                                    size_t value_keys, bool given_depths = false);

  // Deletes every entry of `worker_id` (every shard).
  absl::Status Clear(absl::string_view worker_id);
  // The commands Clear sends (one DEL per shard), for a caller's pipeline.
  std::vector<RedisCommand> ClearCommands(absl::string_view worker_id) const;
  // PEXPIRE index_ttl of the worker's index keys in the shards of
  // `shard_mask` (bit s: shard s): a heartbeat keeps a live worker's entries.
  std::vector<RedisCommand> ExpireCommands(absl::string_view worker_id,
                                           uint64_t shard_mask) const;

  // More than one index shard (a Redis Cluster).
  bool sharded() const { return keys_.index_shards() > 1; }
  // The shard a prompt with these page hashes is matched (and recorded) in:
  // that of page anchor_page when it has one, else the home shard.
  int MatchShard(absl::Span<const uint64_t> hashes) const;
  const KeySchema& keys() const { return keys_; }

  // Entry counts of `worker_id` (tests, debugging tools); sharded: the sums
  // over the shards (a head page counts once per shard holding a copy).
  absl::StatusOr<PrefixIndexSizes> Sizes(absl::string_view worker_id);

  const PrefixIndexOptions& options() const { return options_; }

 private:
  PrefixIndex(RedisClient* redis, KeySchema keys, PrefixIndexOptions options)
      : redis_(redis), keys_(std::move(keys)), options_(options) {}

  // MatchCall with given depths (checked by MatchCall).
  RedisScriptCall ExtendCall(absl::Span<const uint64_t> hashes,
                             absl::Span<const std::string> candidates,
                             absl::Span<const std::string> value_keys,
                             absl::Span<const int64_t> given_depths, int shard) const;

  absl::StatusOr<int64_t> ApplySharded(absl::string_view worker_id,
                                       absl::Span<const CacheEventOp> ops, absl::string_view op);

  RedisClient* const redis_;
  const KeySchema keys_;
  const PrefixIndexOptions options_;
};

}  // namespace swaserve::cluster
