// WorkerRegistration: a worker's presence in the cluster state
// (docs/architecture.md#redis-state). A background thread
//   - registers the worker record (key_schema.h) with a TTL and refreshes the
//     TTL every heartbeat_interval; when the record is gone (Redis restarted,
//     or the worker was partitioned longer than the TTL) it registers again;
//   - publishes the worker's load (a swaserve.v1.WorkerLoad from load_fn)
//     every load_interval, with its own short TTL;
//   - writes the worker's prefix-cache events (PublishCacheEvent) to the
//     prefix-affinity index (prefix_index.h) in ordered batches, one script
//     call per batch, at most event_flush_interval after they were queued.
// When Redis is unavailable the worker keeps serving: publishing fails
// quietly (counted in stats and swaserve_redis_errors_total), cache events
// queue up to max_queued_hashes (beyond it the oldest are dropped, counted,
// and the worker's index is rebuilt from the newest events: see
// cache_event_queue.h), and registration comes back within about one reconnect
// backoff (RedisOptions) plus one heartbeat after Redis returns, followed by
// the queued events. Once no heartbeat has reached Redis for record_ttl (a
// partition, a hung Redis), the worker knows its record expired: stats and
// swaserve_cluster_registered say 0, and it registers again as soon as Redis
// answers.
//
// The first registration of a WorkerRegistration also clears the worker's
// old prefix-index entries (a restarted worker has an empty cache);
// re-registrations after an outage do not (the cache survived). Stop()
// removes the record, the load report and the index entries (unless
// deregister_on_stop is false, which leaves them to expire as after a
// crash).
//
//   ASSIGN_OR_RETURN(auto reg, WorkerRegistration::Create({
//       .redis = redis.get(), .info = info,
//       .load_fn = [&] { return scheduler.Load(); }}));
//   // kv::PrefixCacheOptions::on_event (lib/kv/prefix_cache.h):
//   [&](const kv::CacheEvent& e) {
//     reg->PublishCacheEvent(kind of e.type, e.hashes);  // all four types:
//   }    // the index tracks full KV and where SWA KV is gone (window-safe ends)
//   ...
//   reg->Stop();   // before shutting the gRPC server down
//
// Ownership: does not own the RedisClient (must outlive this object) or
// what load_fn reads (must stay valid until Stop()). Thread-safety:
// PublishCacheEvent/PublishCacheCleared/stats/WaitRegistered are thread-safe
// and never block on Redis; Stop() must not race with the destructor.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/base/clock.h"
#include "lib/cluster/cache_event_queue.h"
#include "lib/cluster/index_shard_mapper.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/prefix_index.h"
#include "lib/cluster/redis_client.h"
#include "lib/metrics/registry.h"
#include "swaserve/v1/common.pb.h"

namespace swaserve::cluster {

struct WorkerRegistrationOptions {
  // Required; not owned.
  RedisClient* redis = nullptr;
  // Cluster name (key_schema.h). Default "default".
  std::string cluster = "default";
  // The record. `id` and `role` are required. started_at_ms and incarnation
  // are filled in (now, random) when zero.
  WorkerInfo info;
  // Returns the current load; called on the registration thread every
  // load_interval (must not block long). worker_id, role and timestamp_ms
  // are filled in when unset. Empty: no load reports.
  std::function<swaserve::v1::WorkerLoad()> load_fn;
  // The record expires this long after the last heartbeat. Default 5 s.
  absl::Duration record_ttl = absl::Seconds(5);
  // Heartbeat period; must be below record_ttl (a third or less is wise).
  // Default 1 s.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Load report period and lifetime. Defaults 200 ms and 2 s.
  absl::Duration load_interval = absl::Milliseconds(200);
  absl::Duration load_ttl = absl::Seconds(2);
  // Longest time a cache event waits before it is written. Default 50 ms.
  absl::Duration event_flush_interval = absl::Milliseconds(50);
  // Queue bound and batch size (hashes). Defaults 2^20 and 16384.
  size_t max_queued_hashes = size_t{1} << 20;
  size_t max_hashes_per_flush = 16384;
  // Bounds of the index entries (index_ttl, max_entries_per_worker apply
  // here; the heartbeat refreshes index_ttl).
  PrefixIndexOptions index;
  // Clear the worker's old index entries at the first registration.
  bool clear_index_on_start = true;
  // Stop() deletes the record, load and index entries. Default true.
  bool deregister_on_stop = true;
  // Metrics (see worker_registration.cc for names); not owned. nullptr:
  // none.
  metrics::Registry* metrics = nullptr;
  // Time source for started_at_ms and load timestamps; not owned. nullptr:
  // real time.
  base::Clock* clock = nullptr;
  // Identity check (two processes never share a worker id): when Redis holds a record
  // of this id from another incarnation at another gRPC address, this is
  // asked whether that worker is alive (e.g. a gRPC health check of its
  // address with a short deadline; must not block for long). True: the id
  // is taken and registration is refused for good (refused()). A record at
  // this worker's own address is a dead predecessor (this process holds the
  // port now) and is replaced without asking. Empty: records are replaced.
  std::function<bool(const WorkerInfo& other)> is_live;
};

// A registry id unique across hosts and restarts: <role>-<host>-<pid>-<4 hex
// random digits>.
std::string DefaultWorkerId(absl::string_view role);

class WorkerRegistration {
 public:
  struct Stats {
    // Successful (re-)registrations; more than 1 means Redis lost the record.
    uint64_t registrations = 0;
    uint64_t heartbeats = 0;
    uint64_t load_reports = 0;
    // Calls that failed (Redis unavailable or an error reply).
    uint64_t failures = 0;
    // Hashes written to / dropped before the index, and still queued.
    uint64_t event_hashes_written = 0;
    uint64_t event_hashes_dropped = 0;
    uint64_t event_hashes_queued = 0;
    // Whether the record is believed present: the last heartbeat succeeded,
    // or failed less than record_ttl after the last one that reached Redis.
    bool registered = false;
  };

  // Validates the options and starts the background thread; does not wait
  // for Redis (see WaitRegistered).
  static absl::StatusOr<std::unique_ptr<WorkerRegistration>> Create(
      WorkerRegistrationOptions options);

  // Stop().
  ~WorkerRegistration();
  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;

  // Set when registration was refused for good (a live worker holds this
  // id); the background thread then stops trying. OK otherwise.
  absl::Status refused() const;

  // Queues cache events: pages (chained hashes) stored into, or removed from,
  // the worker's prefix cache. Never blocks on Redis.
  void PublishCacheEvent(bool stored, std::vector<uint64_t> hashes);
  void PublishCacheEvent(CacheEventOp::Kind kind, std::vector<uint64_t> hashes);
  // The same with the pages' place on their path (kv::CacheEvent depth,
  // parent, anchor; the cache must have event_anchor_page() set): a sharded
  // index (Redis Cluster) maps each event to its shards
  // (index_shard_mapper.h). The overloads above assume a path from the root
  // (depth 0), true of a whole prompt's pages.
  void PublishCacheEvent(CacheEventOp::Kind kind, std::vector<uint64_t> hashes, int depth,
                         uint64_t parent, uint64_t anchor);
  // kv::PrefixCacheOptions::event_anchor_page for this worker's cache: the
  // index's anchor page when it is sharded, else 0 (no anchors needed).
  int event_anchor_page() const { return mapper_ != nullptr ? options_.index.anchor_page : 0; }
  // The worker's whole prefix cache was emptied.
  void PublishCacheCleared();

  // Blocks until the record has been written or registration was refused
  // (true; see refused()), or `timeout` passed (false).
  bool WaitRegistered(absl::Duration timeout);
  // Blocks until the event queue is empty and no batch is being written
  // (true), or `timeout` passed (false: e.g. Redis is down).
  bool WaitEventsFlushed(absl::Duration timeout);

  // Stops the thread, then deregisters (deletes record, load and index
  // entries), or, when deregister_on_stop is false, writes the queued
  // events. Either is one Redis call, bounded by the client's timeouts.
  // Idempotent.
  void Stop();

  Stats stats() const;
  const WorkerInfo& info() const { return options_.info; }

 private:
  explicit WorkerRegistration(WorkerRegistrationOptions options, KeySchema keys,
                              std::unique_ptr<PrefixIndex> index);

  void Run();
  absl::Status Register();
  // AlreadyExists when a live worker of another incarnation holds the id.
  absl::Status CheckIdentity(const std::string& record);
  absl::Status Heartbeat(bool publish_load, bool refresh_record);
  // Writes queued events; returns false when a write failed.
  bool FlushEvents();
  absl::Status Deregister();

  const WorkerRegistrationOptions options_;
  const KeySchema keys_;
  base::Clock* const clock_;
  std::unique_ptr<PrefixIndex> index_;
  CacheEventQueue events_;
  // Sharded index only (nullptr otherwise): maps events to shards; guarded
  // by mapper_mu_, held while the ops are queued so they keep the events'
  // order. mapper_dropped_ is events_.dropped_hashes() as of the last map
  // (a drop cleared the index: the mapper forgets its copies).
  absl::Mutex mapper_mu_;
  std::unique_ptr<IndexShardMapper> mapper_ ABSL_PT_GUARDED_BY(mapper_mu_);
  uint64_t mapper_dropped_ ABSL_GUARDED_BY(mapper_mu_) = 0;
  // When the heartbeat next refreshes the index keys' TTL (registration
  // thread only).
  absl::Time next_index_refresh_ = absl::InfinitePast();

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status refused_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Set by producers to wake the thread (first event queued, or a full
  // batch); cleared by the thread.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  // When the oldest unwritten event was queued (InfiniteFuture: none).
  absl::Time first_event_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // A batch taken from events_ is being written.
  bool batch_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool ever_registered_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;

  metrics::Gauge* registered_gauge_ = nullptr;
  metrics::Counter* registrations_counter_ = nullptr;
  metrics::Counter* events_written_counter_ = nullptr;
  metrics::Counter* events_dropped_counter_ = nullptr;
};

}  // namespace swaserve::cluster
