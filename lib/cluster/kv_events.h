// The KV events API, version 1: what external routers (the way
// NVIDIA Dynamo and llm-d consume engine KV events) read to know which
// worker holds which KV, without swaserve's router.
//
// Stream. Every prefill worker's prefix-cache events reach Redis through
// cluster::PrefixIndex::Apply (WorkerRegistration drains the worker's
// ordered queue). The same Lua script that updates the worker's index SETs
// appends each op to the worker's Redis Stream
//     <prefix>{<cluster>.ev.<worker id>}:events:<worker id>  (KeySchema::EventsKey)
// one entry per op, with the fields
//     v       "1" (this format; entries of a later version keep `v` and
//             `seq` and may change the rest: a consumer passes over a
//             version it does not know, counting its seq)
//     seq     the worker's sequence number: 1, 2, 3, ... with no gaps (a
//             counter next to the stream in its hash tag, KeySchema::EventSeqKey)
//     epoch   the stream's incarnation ("<sec>.<usec>" of Redis's clock when
//             its counter started at 1; KeySchema::EventEpochKey): a
//             consumer that finds another epoch than the one it read before
//             takes a snapshot, however continuous ids and seqs look.
//             Absent in entries written before it existed (then unchecked);
//             later versions keep it, as `v` and `seq`
//     op      stored | removed | cleared | swa_removed | swa_stored |
//             tier_changed
//     pool    full (stored, removed, tier_changed) | swa (swa_removed,
//             swa_stored) | "" (cleared)
//     tier    l1 (stored; tier_changed back up) | l2 (tier_changed down to
//             host memory) | "" (others)
//     hashes  the pages, 8 bytes each, big-endian, concatenated: chained
//             page hashes (base::ChainedPageHashes: XXH3-64 of the page's
//             token ids seeded with the previous page's hash), so a hash
//             names its whole prefix
// Meaning, per worker, applied in seq order:
//     stored        the pages' full KV is cached in L1 (and their SWA KV,
//                   unless a later swa_removed says otherwise)
//     removed       the pages left the cache (both pools, every tier)
//     cleared       the worker's cache is empty (a restart, or events were
//                   dropped: rebuild from what follows)
//     swa_removed   the pages keep full KV but lost their SWA KV (a window
//                   restore can recompute it: kv/sequence.h)
//     swa_stored    their SWA KV is cached again
//     tier_changed  the pages moved to `tier` (still cached)
// A worker's pages are closed under prefixes (its cache is a radix tree;
// removed names leaves first), so "how many leading pages of a prompt does
// worker w hold" is a prefix search (prefix_index.h).
//
// Delivery is at-least-once: after a failed write the worker resends a
// batch, so the same op may appear twice in a row with consecutive seqs.
// Ops are idempotent in order, so applying the duplicate is harmless.
//
// Gaps and replay. The stream is trimmed to about
// PrefixIndexOptions::event_stream_max_len entries and expires index_ttl
// after the worker's last write or heartbeat (a dead worker's history goes).
// A consumer remembers the last entry id and seq it applied and reads on
// from there (KvEventReader::Read, XREAD): the first entry it gets must
// carry seq + 1; anything else (trimmed entries, or a Redis that lost the
// stream and restarted its counter) is a gap, reported as DataLoss, and the
// consumer takes a snapshot. So is a counter behind the consumer's seq, and
// an epoch other than the consumer's (in an entry, or in the epoch key
// when nothing new came). The epoch is what catches a stream recreated
// behind the consumer's position: entry ids come from Redis's clock and
// XREAD skips ids at or below the position, so a stream recreated in the
// millisecond of the entry the consumer read last, or by a Redis whose
// clock is behind, hides its first entries, and the first one shown may
// carry exactly seq + 1.
//
// Snapshot (cold start or after a gap): KvEventReader::Snapshot reads the
// seq and stream id of the last event, then the worker's pages (its
// authoritative SETs: on a Redis Cluster the union of the index shards),
// its swa_removed and lower-tier pages. The index is written before the
// stream, so the pages include every event up to that seq and perhaps a few
// after it; reading on from that id replays those, which is harmless (each
// event sets its pages' state: the last one wins), so the consumer ends
// exactly where the worker stands. The list of workers is the registry
// (ClusterView::ListWorkers).
//
// Thread-safety: KvEventReader is thread-safe (stateless over the client);
// KvWorkerState is not (one per consumer thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/redis_client.h"

namespace swaserve::cluster {

struct KvEvent {
  // kUnknown: an entry of a later version (only seq and id are set).
  enum class Op { kStored, kRemoved, kCleared, kSwaRemoved, kSwaStored, kTierChanged, kUnknown };
  Op op = Op::kStored;
  // The worker's sequence number and the stream entry id.
  uint64_t seq = 0;
  std::string id;
  // The stream's incarnation ("": an entry written before epochs).
  std::string epoch;
  // "full", "swa" or "" (kCleared); "l1", "l2" or "".
  std::string pool;
  std::string tier;
  std::vector<uint64_t> hashes;
};

struct KvSnapshot {
  // The last event the snapshot includes (0 / "0-0": none yet).
  uint64_t seq = 0;
  std::string id = "0-0";
  std::string epoch;               // "": none yet
  std::vector<uint64_t> pages;     // full KV cached (any tier)
  std::vector<uint64_t> swa_gone;  // of those, without SWA KV
  std::vector<uint64_t> lower;     // of those, in L2
};

class KvEventReader {
 public:
  // `redis` is not owned and must outlive the reader. A SET of more than
  // `smembers_max` entries is read by SSCAN in steps of about 1,000 (Redis
  // serves other clients between the steps: one SMEMBERS of 10^6 entries
  // would stall it for about 100 ms), smaller ones by one pipelined
  // SMEMBERS. Default 10,000.
  KvEventReader(RedisClient* redis, KeySchema keys, int64_t smembers_max = 10000)
      : redis_(redis), keys_(std::move(keys)), smembers_max_(smembers_max) {}

  // SSCAN returns every entry present throughout the scan, and entries
  // stored or removed meanwhile may or may not come back: both are events
  // after the snapshot's position, which a reader replays (the last event
  // of a page sets its state), so a scanned snapshot is as exact as one
  // SMEMBERS.
  absl::StatusOr<KvSnapshot> Snapshot(absl::string_view worker_id);

  // Up to `count` events of `worker_id` after stream id `after_id`, the
  // first of which must have seq `after_seq` + 1 (and, both known, epoch
  // `after_epoch`); waits up to `block` for one when none is there (zero:
  // do not wait; keep it below the client's command timeout). Empty when
  // nothing new. DataLoss when the first event does not follow (take a
  // Snapshot), or when nothing came and the counter is behind after_seq or
  // the epoch changed (Redis lost the stream). Entries of another version
  // come as kUnknown (apply them as no-ops: KvWorkerState does).
  absl::StatusOr<std::vector<KvEvent>> Read(absl::string_view worker_id,
                                            absl::string_view after_id, uint64_t after_seq,
                                            int count, absl::Duration block = absl::ZeroDuration(),
                                            absl::string_view after_epoch = "");

 private:
  // The members of the SET at `key` (SSCAN), appended to *out.
  absl::Status Scan(const std::string& key, std::vector<RedisReply>* out);

  RedisClient* const redis_;
  const KeySchema keys_;
  const int64_t smembers_max_;
};

// A consumer's copy of one worker's KV state, kept by applying its events
// in order (what an external router keeps per worker).
class KvWorkerState {
 public:
  void Reset(const KvSnapshot& snapshot);
  // InvalidArgument when `e` does not follow the last applied seq, or
  // carries another epoch (both known).
  absl::Status Apply(const KvEvent& e);

  uint64_t seq() const { return seq_; }
  const std::string& id() const { return id_; }
  const std::string& epoch() const { return epoch_; }
  const absl::flat_hash_set<uint64_t>& pages() const { return pages_; }
  const absl::flat_hash_set<uint64_t>& swa_gone() const { return swa_gone_; }
  const absl::flat_hash_set<uint64_t>& lower() const { return lower_; }
  // Leading pages of `hashes` held (the index's depth, without predictions).
  // The pages held are closed under prefixes (prefix_index.h: a worker's
  // cache stores a page only under its parent and evicts leaves first), so
  // this is a binary search, as the match script's: O(log n) lookups.
  int64_t Depth(absl::Span<const uint64_t> hashes) const;

 private:
  uint64_t seq_ = 0;
  std::string id_ = "0-0";
  std::string epoch_;
  absl::flat_hash_set<uint64_t> pages_, swa_gone_, lower_;
};

// Whether two epochs name different incarnations of a stream: both known
// ("" is an entry or a key written before epochs) and not equal.
inline bool KvEpochsDiffer(absl::string_view a, absl::string_view b) {
  return !a.empty() && !b.empty() && a != b;
}

// The name of `op` in the stream ("stored", ...).
absl::string_view KvEventOpName(KvEvent::Op op);

// Parses one stream entry as XREAD returns it: [id, [field, value, ...]].
// An entry of another version is kUnknown (seq and id only); InternalError
// for a malformed entry (no seq, an unknown v1 op, hashes not a multiple of
// 8 bytes, wrong shape). Never crashes on any reply (tests/fuzz).
absl::StatusOr<KvEvent> ParseKvEventEntry(const RedisReply& entry);

}  // namespace swaserve::cluster
