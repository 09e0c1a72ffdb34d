// IndexMirror: a router's in-memory copy of the prefix index, kept by reading the workers' KV event streams (kv_events.h), so a
// decision finds each candidate's depth, window-safe depth and L1 pages
// without the match script: the decision's Redis work shrinks to the
// predicted entries and the load reports (ClusterView::MatchPrefixesAndLoads).
// The way NVIDIA Dynamo's KV router keeps its radix tree, fed by engine
// events — here fed by the same streams the index's Apply script writes.
//
// Why it is exact. The streams carry every op the index's SETs received, in
// the same Lua call, with a gap-free sequence number per worker. The mirror
// starts each worker from a snapshot (KvEventReader::Snapshot: position,
// then the SETs), applies the events after it in order (KvWorkerState), and
// takes a new snapshot on any gap (trimmed entries, a stream Redis lost):
// so each worker's copy equals its index SETs as of the last event read. It
// lags the index by Options::batch_interval plus a round trip (an XREAD
// BLOCK over all streams returns as soon as one has news; the thread then
// waits batch_interval so that later events share the next read; on a Redis
// Cluster, see below, add up to Options::cluster_poll). Not mirrored: predicted
// entries (router-written ZSETs: still read from Redis in the decision's
// round trip) and the SETs' random SPOP past max_entries_per_worker (a
// safety valve that real caches do not reach).
//
// The router still keeps no state of its own (docs/architecture.md#redis-state): the copy is
// a cache of Redis state the router can drop and rebuild at any time (a new
// replica snapshots on start); Redis stays the only authority. It costs the
// router memory (about 40 bytes per indexed page: three flat hash sets per
// worker) and Redis one read of each event per router replica.
//
// It needs the workers' event streams (PrefixIndexOptions::
// event_stream_max_len > 0: the default, and no worker flag turns them off).
//
// On a Redis Cluster each worker's stream lives in its own hash slot, so no
// one XREAD can wait on all of them: the mirror polls instead, one XREAD per
// stream without BLOCK, pipelined (one round trip per master), every
// batch_interval while events come and up to cluster_poll apart (doubling
// from batch_interval) while none do. The copy is the union of the index
// shards (the snapshot's, and the events are the worker's own), so its
// depth is the worker's whole cached prefix, where the sharded match script
// sees only the prompt's shard (a shallow match may miss head pages not
// copied there: prefix_index.h): the mirror is exact on a cluster too.
// A master that is down stalls the reads (the copy keeps its last state)
// until its replica is promoted; the promoted replica may lack the last
// events (asynchronous replication), which the counter check or the next
// event's seq sees: a new snapshot.
//
// Ownership: does not own the RedisClient, which must outlive the mirror
// and be its own (the mirror blocks a connection for up to Options::poll:
// give it a command_timeout above that).
// Thread-safety: thread-safe; one background thread reads the streams.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/kv_events.h"
#include "lib/cluster/redis_client.h"
#include "lib/metrics/registry.h"

namespace swaserve::cluster {

struct IndexMirrorOptions {
  // The longest one XREAD waits for news (BLOCK): the thread's wake-up
  // period when nothing happens. Events are applied as soon as they arrive.
  // Default 100 ms.
  absl::Duration poll = absl::Milliseconds(100);
  // Entries read per stream per XREAD. Default 512.
  int batch = 512;
  // After a read that brought events, the thread waits this long before
  // the next, so events arriving meanwhile come in one XREAD (an XREAD per
  // event would cost Redis about a round trip each: bench/RESULTS.md). The
  // copy then lags its streams by at most this plus one round trip (the
  // predicted entries cover a just-dispatched prompt meanwhile). 0 reads
  // again at once. Default 2 ms.
  absl::Duration batch_interval = absl::Milliseconds(2);
  // How often the worker list is refreshed (new workers are snapshotted,
  // gone ones dropped) and each mirrored worker's sequence counter checked
  // against its copy (a counter behind the copy: Redis lost the stream).
  // Default 1 s.
  absl::Duration refresh = absl::Seconds(1);
  // Redis Cluster only: the longest wait between two polls of the streams
  // while none brings events (the copy's extra lag when a quiet worker
  // stores again; the router's own dispatches are covered by predicted
  // entries meanwhile). Each poll costs each master one round trip with an
  // XREAD per stream it holds (quiet: about 17 ms of Redis CPU per second
  // over 3 masters at 20 ms on this VM, bench/RESULTS.md). >= batch_interval.
  // Default 50 ms.
  absl::Duration cluster_poll = absl::Milliseconds(50);
  // Optional: swaserve_index_mirror_events_total, _snapshots_total,
  // _workers and _entries (gauges, set every refresh).
  metrics::Registry* metrics = nullptr;
};

// Checks the options; InvalidArgument names the bad field.
absl::Status ValidateIndexMirrorOptions(const IndexMirrorOptions& options);

class IndexMirror {
 public:
  // The ids of the workers to mirror (the router's prefill workers); called
  // on the mirror's thread every Options::refresh.
  using WorkerList = std::function<absl::StatusOr<std::vector<std::string>>()>;

  // Starts the thread; its first refresh snapshots every worker.
  static absl::StatusOr<std::unique_ptr<IndexMirror>> Start(RedisClient* redis,
                                                            const KeySchema& keys,
                                                            WorkerList workers,
                                                            const IndexMirrorOptions& options);
  ~IndexMirror();  // stops and joins the thread

  // For each candidate, how many leading `hashes` it holds (prefix_index.h
  // Match, without predictions), into *depths; false (and *depths
  // unspecified) when some candidate is not mirrored yet.
  bool Depths(absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
              std::vector<int64_t>* depths) const;

  // For each candidate matched to depths[c] pages: its window-safe depth
  // (prefix_index.h Match: window_pages wp, the scan bound S of
  // window_scan_pages, -1 below d - S; = d when wp is 0) into *safe_pages
  // and its pages still in L1 into *l1_pages; the same answers as the match
  // script over the same SETs. False when some candidate is not mirrored.
  bool WindowAndTier(absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
                     absl::Span<const int64_t> depths, int window_pages,
                     absl::Span<const int64_t> window_scan_pages,
                     std::vector<int64_t>* safe_pages, std::vector<int64_t>* l1_pages) const;

  // The last event applied for `worker_id` (nullopt: not mirrored yet).
  std::optional<uint64_t> Seq(absl::string_view worker_id) const;

 private:
  struct Worker {
    mutable absl::Mutex mu;
    KvWorkerState state ABSL_GUARDED_BY(mu);
  };

  IndexMirror(RedisClient* redis, const KeySchema& keys, WorkerList workers,
              const IndexMirrorOptions& options);
  void Run();
  // Refreshes the worker list and snapshots new workers; checks counters.
  void Refresh();
  // Replaces a worker's copy with a fresh snapshot (logs on failure: the
  // worker stays unmirrored and is retried at the next refresh).
  void Snapshot(const std::string& id);
  // One XREAD over every mirrored worker's stream (a Redis Cluster: one
  // XREAD per stream, pipelined, after the idle wait); applies what it gets.
  void ReadOnce();
  // Applies one stream of an XREAD reply ([key, [entries]]); true when it
  // held events.
  bool ApplyStream(const RedisReply& stream,
                   const absl::flat_hash_map<std::string, size_t>& by_key,
                   const std::vector<std::pair<std::string, std::shared_ptr<Worker>>>& workers);
  std::shared_ptr<Worker> Find(absl::string_view id) const;

  RedisClient* const redis_;
  const KeySchema keys_;
  const WorkerList workers_;
  const IndexMirrorOptions options_;
  KvEventReader reader_;

  mutable absl::Mutex mu_;
  // Only the mirror's thread inserts or erases; Depths/WindowAndTier read.
  absl::flat_hash_map<std::string, std::shared_ptr<Worker>> mirrored_ ABSL_GUARDED_BY(mu_);

  // Redis Cluster: the wait before the next poll (the mirror's thread only).
  absl::Duration idle_wait_ = absl::ZeroDuration();

  metrics::Counter* events_ = nullptr;
  metrics::Counter* snapshots_ = nullptr;
  metrics::Gauge* workers_gauge_ = nullptr;
  metrics::Gauge* entries_gauge_ = nullptr;  // set with workers_gauge_

  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace swaserve::cluster
