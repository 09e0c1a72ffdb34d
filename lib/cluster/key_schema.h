// The Redis key schema of the cluster state (docs/architecture.md#redis-state), and the
// encoding of what lives under each key. Every key starts with
// "swaserve:v1:<cluster>:" — v1 is the schema version (bump it when an
// encoding below changes incompatibly, so old and new processes never read
// each other's data) and <cluster> lets several clusters (or tests) share one
// Redis.
//
// Below, <p> is that prefix, <r> = <p>{<cluster>}: (the registry tag),
// <x> = <p>{<cluster>.ix.<s>[.<salt>]}: (index shard s; a single Redis has
// one shard, s = 0) and <e> = <p>{<cluster>.ev.<id>}: — the hash tags are
// explained at KeySchema.
//
//   <r>workers            SET of worker ids that registered. Discovery reads
//                         it; members whose record has expired are removed by
//                         the reader (ClusterView::ListWorkers).
//   <r>worker:<id>        HASH, the worker's record (WorkerInfo, fields
//                         below), PEXPIRE record_ttl, refreshed by the
//                         heartbeat. Its absence means the worker is dead.
//   <r>load:<id>          STRING, a serialized swaserve.v1.WorkerLoad, SET
//                         with PX load_ttl several times a second.
//   <x>prefix:<id>        SET of chained page hashes (8 bytes, big-endian)
//                         the worker holds, from its own cache events (the
//                         authoritative part of the prefix-affinity index);
//                         PEXPIRE index_ttl, refreshed by events and
//                         heartbeats. See prefix_index.h.
//   <x>predicted:<id>     ZSET of page hashes dispatched to the worker by
//                         routers, score = expiry in Unix ms on the Redis
//                         server's clock; the key expires with its latest
//                         member.
//   <x>predicted_until    HASH worker id -> Unix ms until which the worker's
//                         predicted ZSET of this shard may hold live entries.
//   <x>swa_gone:<id>      SET of page hashes the worker holds with full KV but
//                         without SWA KV (tombstoned), from its cache events;
//                         expires with <x>prefix:<id>. Tells the router
//                         whether a match ends window-safe (prefix_index.h).
//   <x>lower:<id>         SET of page hashes the worker holds only in a lower
//                         tier (L2 host memory); expires with the prefix SET.
//   <e>events:<id>, <e>events_seq:<id>  the worker's KV event stream and its
//                         sequence counter (kv_events.h).
//   <p>kvpage:<layout>:<hash>  STRING, one L3 KV page blob (kv/page_blob.h
//                         format: header with key, length and checksum, then
//                         the page's bytes), shared by every worker of the
//                         cluster; <layout> is the kv::KvLayoutFingerprint and
//                         <hash> the chained page hash, 16 lowercase hex
//                         digits each. Bounded by Redis's maxmemory with an
//                         allkeys-* policy (redis_page_store.h). No tag: the
//                         blobs spread over every slot of a Redis Cluster.
//
// The tags changed the key names without a version bump: processes of the
// old names and the new never read each other's keys, which is what a bump
// would achieve.
//
// Record fields (HASH <p>worker:<id>; all values are decimal text unless
// noted; readers ignore unknown fields and default missing optional ones):
//   id, role (swaserve.v1.Role name, e.g. "ROLE_PREFILL"), model,
//   bucket (length-bucket index), bucket_min_tokens, bucket_max_tokens,
//   grpc_address ("host:port"), ucx_address (raw bytes of the packed UCX
//   worker address), page_size, full_pages, swa_pages, max_running_requests,
//   sliding_window, swa_chain_layers, window_restore (0/1),
//   window_restore_work (tokens; optional: the model's window, SWA + MTP
//   layers, whether the worker restores windows and what a restore
//   computes — the router's cached-token credit), started_at_ms (Unix ms),
//   incarnation (16 hex digits, random per process
//   start: a new value means the worker restarted and lost its cache).
//
// Worker ids and cluster names: 1–200 characters of [A-Za-z0-9._:-] (they
// are parts of key names).
//
// Pure functions and value types; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::cluster {

// Schema version, part of every key.
inline constexpr absl::string_view kSchemaVersion = "v1";

// OK when `id` is a valid worker id (or cluster name); InvalidArgument
// naming `what` and the offending value otherwise.
absl::Status ValidateName(absl::string_view id, absl::string_view what);

// Builds the keys of one cluster.
//
// Hash tags (Redis Cluster, redis_cluster_protocol.h): keys that one script
// or transaction touches together share a tag, so they live in one slot on
// one Redis Cluster master; on a single Redis the tags are just part of the
// names.
//   registry  "{<cluster>}": the workers SET, worker records and load
//             reports (ListWorkers reads them in one script; a router reads
//             every load report with one MGET).
//   index     "{<cluster>.ix.<s>[.<salt>]}" for index shard s in
//             [0, index_shards): a worker's prefix, predicted, SWA-gone and
//             lower-tier SETs of shard s and the shard's predicted-until
//             HASH. A prompt's match reads one shard (prefix_index.h says
//             which), so a decision stays one round trip on a cluster. With
//             several shards the salt (the least number that does it) puts
//             shard s's slot in the s-th of index_shards equal bands of the
//             slot space, so the shards spread evenly over the masters.
//   events    "{<cluster>.ev.<worker id>}": the worker's KV event stream and
//             its sequence counter (kv_events.h).
//   kvpage    no tag: L3 page blobs spread over every slot.
class KeySchema {
 public:
  // `cluster` must pass ValidateName; index_shards in 1..64 (1: a single
  // Redis; cluster mode uses PrefixIndexOptions::cluster_index_shards).
  static absl::StatusOr<KeySchema> Create(absl::string_view cluster, int index_shards = 1);

  const std::string& prefix() const { return prefix_; }
  int index_shards() const { return static_cast<int>(shard_tags_.size()); }
  // The index shard of a chain whose anchor page (prefix_index.h) has this
  // chained hash.
  int ShardOf(uint64_t anchor_hash) const {
    return static_cast<int>(((anchor_hash >> 32) ^ anchor_hash) % shard_tags_.size());
  }

  std::string WorkersKey() const { return registry_ + "workers"; }
  // The record key of `id` is WorkerKeyPrefix() + id.
  std::string WorkerKeyPrefix() const { return registry_ + "worker:"; }
  std::string WorkerKey(absl::string_view id) const;
  std::string LoadKey(absl::string_view id) const;
  // Index keys of `id` in index shard `shard` (0 <= shard < index_shards).
  std::string PrefixKey(absl::string_view id, int shard = 0) const;
  std::string PredictedKey(absl::string_view id, int shard = 0) const;
  // HASH worker id -> Unix ms until which its predicted ZSET of this shard
  // may hold live entries (prefix_index.h: one HMGET tells the match which
  // candidates to scan predictions of).
  std::string PredictedUntilKey(int shard = 0) const {
    return absl::StrCat(shard_tags_[shard], "predicted_until");
  }
  std::string SwaGoneKey(absl::string_view id, int shard = 0) const;
  // The worker's pages held in a lower tier (L2, host memory): prefix_index.h.
  std::string LowerTierKey(absl::string_view id, int shard = 0) const;
  // The worker's tier summary (prefix_index_scripts.cc ApplyScript): "0"
  // to "6", bit 2 = it has SWA-gone pages, bit 4 = lower-tier pages.
  std::string TierSummaryKey(absl::string_view id, int shard = 0) const {
    return absl::StrCat(shard_tags_[shard], "tiers:", id);
  }
  // The worker's KV event stream (a Redis Stream) and its sequence counter
  // (kv_events.h: the versioned events API for external routers).
  std::string EventsKey(absl::string_view id) const {
    return absl::StrCat(prefix_, "{", cluster_, ".ev.", id, "}:events:", id);
  }
  std::string EventSeqKey(absl::string_view id) const {
    return absl::StrCat(prefix_, "{", cluster_, ".ev.", id, "}:events_seq:", id);
  }
  // The stream's incarnation (kv_events.h: `epoch`), set when the counter
  // starts over.
  std::string EventEpochKey(absl::string_view id) const {
    return absl::StrCat(prefix_, "{", cluster_, ".ev.", id, "}:events_epoch:", id);
  }
  // The L3 page blob key of (layout fingerprint, chained page hash).
  std::string KvPageKey(uint64_t layout, uint64_t hash) const;

 private:
  KeySchema(std::string cluster, std::string prefix, std::vector<std::string> shard_tags)
      : cluster_(std::move(cluster)),
        prefix_(std::move(prefix)),
        registry_(absl::StrCat(prefix_, "{", cluster_, "}:")),
        shard_tags_(std::move(shard_tags)) {}
  std::string cluster_;
  std::string prefix_;
  std::string registry_;  // prefix_ + "{<cluster>}:"
  // prefix_ + "{<cluster>.ix.<s>[.<salt>]}:" per shard.
  std::vector<std::string> shard_tags_;
};

// A chained page hash as a prefix-index member: 8 bytes, big-endian.
std::string EncodePageHash(uint64_t hash);
// Inverse of EncodePageHash; InvalidArgument unless `bytes` is 8 bytes long.
absl::StatusOr<uint64_t> DecodePageHash(absl::string_view bytes);
// EncodePageHash of each.
std::vector<std::string> EncodePageHashes(const std::vector<uint64_t>& hashes);
// EncodePageHash of each, concatenated (8 bytes per hash): how scripts
// receive lists of page hashes.
std::string PackPageHashes(absl::Span<const uint64_t> hashes);

// What a worker registers.
struct WorkerInfo {
  std::string id;
  swaserve::v1::Role role = swaserve::v1::ROLE_UNSPECIFIED;
  // Served model name.
  std::string model;
  // Length bucket: index and prompt-token bounds [min, max).
  int32_t bucket = 0;
  int64_t bucket_min_tokens = 0;
  int64_t bucket_max_tokens = 0;
  // Where its gRPC service listens, "host:port".
  std::string grpc_address;
  // Packed UCX worker address (opaque bytes; empty when it has none).
  std::string ucx_address;
  // Capacity: tokens per KV page, KV pages per pool, batch limit.
  int32_t page_size = 0;
  int64_t full_pages = 0;
  int64_t swa_pages = 0;
  int32_t max_running_requests = 0;
  // The model's sliding window W (0: none), its SWA-attention layers
  // including MTP layers (kv::WindowRestoreStart's chain), and whether the
  // worker restores windows (--prefill.window_restore_min_saved_work >= 0).
  int32_t sliding_window = 0;
  int32_t swa_chain_layers = 0;
  bool window_restore = false;
  // What one window restore computes, in token-equivalents, when the worker
  // restores as a pyramid (kv::WindowRestorePyramidWork for an unclamped,
  // page-aligned M: the same for every such M); 0: not published, a
  // restore computes its whole stretch [s, M) (kv::WindowRestoreStart).
  int32_t window_restore_work = 0;
  // When the process started (Unix ms) and its random incarnation.
  int64_t started_at_ms = 0;
  uint64_t incarnation = 0;

  bool operator==(const WorkerInfo&) const = default;
};

// The record as HASH field/value pairs (field order fixed).
std::vector<std::pair<std::string, std::string>> EncodeWorkerInfo(
    const WorkerInfo& info);
// Parses HGETALL output (field, value, field, value, ...). InvalidArgument
// naming the field when a value is malformed or `id`/`role` are missing.
absl::StatusOr<WorkerInfo> DecodeWorkerInfo(
    const std::vector<std::pair<std::string, std::string>>& fields);

}  // namespace swaserve::cluster
