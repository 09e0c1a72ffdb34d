// ClusterView: the router's read (and dispatch-record) side of the cluster
// state in Redis (docs/architecture.md#request-path, #redis-state). It holds no state of its own
// beyond what Redis has, so any number of router replicas see the same
// workers, loads and prefix index, and a new replica routes as well as an old
// one.
//
//   ASSIGN_OR_RETURN(auto view, ClusterView::Create({.redis = redis.get()}));
//   ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, view->ListWorkers());
//   ASSIGN_OR_RETURN(auto loads, view->GetLoads(ids));            // 1 RTT
//   ASSIGN_OR_RETURN(auto depths, view->MatchPrefixes(hashes, ids));  // 1 RTT
//   ... pick a worker ...
//   view->RecordDispatch(chosen, hashes);   // predicted entries
//
// Every call is one Redis round trip and returns Unavailable when Redis is
// down, so the caller can fall back (e.g. route by load alone). Latency and
// errors are measured by the RedisClient (swaserve_redis_seconds{op} with op
// list_workers, get_loads, match_prefixes, record_dispatch, forget_worker).
//
// Ownership: does not own the RedisClient (must outlive the view).
// Thread-safety: thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/cluster/index_mirror.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/prefix_index.h"
#include "lib/cluster/redis_client.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::cluster {

struct ClusterViewOptions {
  // Required; not owned.
  RedisClient* redis = nullptr;
  // Cluster name (key_schema.h). Default "default".
  std::string cluster = "default";
  // predicted_ttl and max_entries_per_worker apply to RecordDispatch.
  PrefixIndexOptions index;
  // On a sharded index (Redis Cluster) the load reports live in another
  // hash slot than the prompt's shard, so MatchPrefixesAndLoads reads them
  // with their own MGET at most this often (the rest of the time from the
  // last one), keeping a decision at one round trip. Workers report every
  // 200 ms (WorkerRegistrationOptions::load_interval), so the default adds
  // at most an eighth of that to a report's age. Default 25 ms.
  absl::Duration sharded_load_max_age = absl::Milliseconds(25);
};

class ClusterView {
 public:
  static absl::StatusOr<std::unique_ptr<ClusterView>> Create(
      const ClusterViewOptions& options);

  // Every worker whose record is live, sorted by id (one round trip; ids
  // whose record expired are removed from the worker set on the way).
  // Records that cannot be decoded are skipped with a warning.
  absl::StatusOr<std::vector<WorkerInfo>> ListWorkers();

  // The latest load report of each id (aligned with `ids`); nullopt when the
  // worker has not reported within its load TTL. One round trip (MGET).
  absl::StatusOr<std::vector<std::optional<swaserve::v1::WorkerLoad>>> GetLoads(
      absl::Span<const std::string> ids);

  // For each candidate: how many leading pages of `hashes` (chained page
  // hashes of a prompt, in order) it holds per the index (prefix_index.h).
  // One round trip (EVALSHA).
  absl::StatusOr<std::vector<int64_t>> MatchPrefixes(
      absl::Span<const uint64_t> hashes,
      absl::Span<const std::string> candidates);

  // MatchPrefixes(hashes, candidates) and GetLoads(load_ids) in ONE round
  // trip (the match script also reads the load reports; on a sharded index
  // the loads come from a cache refreshed every sharded_load_max_age).
  // With window_pages > 0 (prefix_index.h), also each match's window-safe
  // depth (searched window_scan_pages below the depth: empty or one bound
  // per candidate; PrefixIndex::Match).
  struct PrefixesAndLoads {
    std::vector<int64_t> depths;
    // Window-safe depth L in pages per candidate; -1: below the scan bound.
    std::vector<int64_t> safe_pages;
    // Of each depth, the pages in the worker's L1 (the rest are in its L2).
    std::vector<int64_t> l1_pages;
    std::vector<std::optional<swaserve::v1::WorkerLoad>> loads;
    // Redis could not be read (Unavailable or DeadlineExceeded: a killed
    // master before its replica's promotion, a restart) but the index
    // mirror held every candidate: the depths are the mirror's, without
    // live predictions, and the loads the last ones the view read, whatever
    // their age (a sharded index: its load cache, unless a master still
    // answers the MGET; a single Redis: those its scripts returned), or
    // nullopt. Affinity survives the outage.
    bool redis_unreadable = false;
  };
  absl::StatusOr<PrefixesAndLoads> MatchPrefixesAndLoads(
      absl::Span<const uint64_t> hashes,
      absl::Span<const std::string> candidates,
      absl::Span<const std::string> load_ids, int window_pages = 0,
      absl::Span<const int64_t> window_scan_pages = {});

  // Records that `hashes` were dispatched to `worker_id`: pages it does not
  // hold yet get predicted entries for predicted_ttl (prefix_index.h), so
  // sibling requests find them before the worker's own events arrive. One
  // round trip; may run after the dispatch, off the request's path.
  absl::Status RecordDispatch(absl::string_view worker_id,
                              absl::Span<const uint64_t> hashes);

  // Removes a worker's record, load report and index entries (an operator
  // action, or a router that found the worker dead before its TTL lapsed).
  absl::Status ForgetWorker(absl::string_view worker_id);

  PrefixIndex& index() { return *index_; }
  const KeySchema& keys() const { return keys_; }

  // From now on MatchPrefixesAndLoads takes the depths, window-safe depths
  // and L1 pages of candidates `mirror` holds from it (index_mirror.h) and
  // sends Redis only the predictions and load reads (a sharded index: the
  // predictions of the prompt's shard, the loads from the view's cache); a
  // candidate it does not hold yet still goes through the match script.
  // When Redis cannot be read, the mirror's answer stands alone
  // (PrefixesAndLoads::redis_unreadable). nullptr turns it off. Not owned: must outlive its use here.
  void SetIndexMirror(IndexMirror* mirror) { mirror_.store(mirror, std::memory_order_release); }

 private:
  ClusterView(RedisClient* redis, KeySchema keys, std::unique_ptr<PrefixIndex> index,
              absl::Duration load_max_age)
      : redis_(redis),
        keys_(std::move(keys)),
        index_(std::move(index)),
        load_max_age_(load_max_age) {}
  // The raw load reports of `load_keys` (nullopt: absent), one MGET.
  absl::StatusOr<std::vector<std::optional<std::string>>> ReadLoads(
      const std::vector<std::string>& load_keys);
  // Sharded index: the raw load reports of `load_keys`, from the cache when
  // it is younger than load_max_age_ and has every key, else one MGET.
  absl::StatusOr<std::vector<std::optional<std::string>>> CachedLoads(
      const std::vector<std::string>& load_keys);
  // The cache's reports of `load_keys` whatever their age (nullopt: not
  // cached; a single Redis reads them in the match script, never cached).
  std::vector<std::optional<std::string>> LastLoads(const std::vector<std::string>& load_keys);
  // A single Redis's mirrored decisions read the loads inside the script:
  // keeps the last one seen per key, so that a decision while Redis cannot
  // be read still has them (LastLoads). Never touches loads_at_ (the
  // cluster's load cache). At most kMaxRememberedLoads keys.
  void RememberLoads(const std::vector<std::string>& load_keys,
                     const std::vector<std::optional<std::string>>& raw);
  static constexpr size_t kMaxRememberedLoads = 4096;
  // The Redis part of a mirrored match: `held` (the mirror's depths)
  // extended by live predictions into out->depths, the load reports into
  // `raw`.
  absl::Status ExtendMirrored(absl::Span<const uint64_t> hashes,
                              absl::Span<const std::string> candidates,
                              absl::Span<const int64_t> held,
                              const std::vector<std::string>& load_keys, PrefixesAndLoads* out,
                              std::vector<std::optional<std::string>>* raw);

  RedisClient* const redis_;
  const KeySchema keys_;
  std::unique_ptr<PrefixIndex> index_;
  const absl::Duration load_max_age_;
  std::atomic<IndexMirror*> mirror_{nullptr};
  absl::Mutex loads_mu_;
  absl::Time loads_at_ ABSL_GUARDED_BY(loads_mu_) = absl::InfinitePast();
  absl::flat_hash_map<std::string, std::optional<std::string>> loads_
      ABSL_GUARDED_BY(loads_mu_);
};

}  // namespace swaserve::cluster
