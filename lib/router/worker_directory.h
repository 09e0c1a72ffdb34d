// WorkerDirectory: the router's cached view of the registered workers, their
// gRPC stubs and a circuit breaker per worker.
//
// The registry lives in Redis (cluster::ClusterView::ListWorkers, TTL'd
// records); the directory re-reads it every refresh_interval on a background
// thread, so a request never waits for the worker list (it reads Redis only
// for loads and the prefix index). This is a cache of Redis, not router
// state: a new router replica rebuilds it on its first refresh. A worker that
// disappears from the registry loses its channel; one that re-registers with
// a new incarnation (restart) gets a fresh channel and a closed breaker.
//
// Circuit breaker: `failures_to_open` consecutive failures (ReportFailure)
// open the breaker for `open_for`; then the worker is offered to the policy
// again (half-open: Healthy() is true, without side effects), and the trial
// is taken only when the policy actually picks it (Pick() re-arms the
// breaker for another `open_for`, so at most one trial per period; a second
// request picking it in that period gets false and chooses again) — a
// success (ReportSuccess) closes it, a failure keeps it open. Open workers
// are skipped by the router's policy. Only worker faults are reported
// (failure.h): a request error or an overload never moves a breaker.
//
// Breaker state is per router replica, in memory, not shared through Redis:
// it is this replica's own evidence of reaching the worker (a network
// partition may cut one replica off and not another), it changes on every
// failure (sharing it would add Redis writes to the failure path, exactly
// when Redis may be the thing failing), and the cluster-wide liveness signal
// already is shared: a dead worker's registry record expires within its TTL
// for every replica. A new replica starts with closed breakers and learns
// within failures_to_open requests.
//
// Ownership: does not own the ClusterView (must outlive it).
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "lib/base/clock.h"
#include "lib/cluster/cluster_view.h"
#include "lib/rpc/channel.h"
#include "lib/router/worker_client.h"

namespace swaserve::router {

struct CircuitBreakerOptions {
  // Consecutive failures that open the breaker. Default 3.
  int failures_to_open = 3;
  // How long it stays open before a trial request. Default 10 s.
  absl::Duration open_for = absl::Seconds(10);
};

struct WorkerDirectoryOptions {
  // Required; not owned.
  cluster::ClusterView* view = nullptr;
  // How often the registry is re-read. Default 500 ms.
  absl::Duration refresh_interval = absl::Milliseconds(500);
  CircuitBreakerOptions breaker;
  // Clock of the breaker (tests use a FakeClock). Default: real.
  base::Clock* clock = nullptr;
  // Start the background refresh thread. Default true; tests may refresh by
  // hand (Refresh()).
  bool background_refresh = true;
  // The workers' channels. Their HTTP/2 keepalive is what notices a worker
  // that went silent (a partition, a hung process) under a call that is
  // waiting for its answer: keepalive_time + keepalive_timeout, 30 s + 10 s
  // by default; a worker's GrpcServer accepts pings every 10 s at most.
  rpc::ChannelOptions channel;
};

// One registered worker and the client to call it.
struct WorkerEndpoint {
  cluster::WorkerInfo info;
  std::shared_ptr<WorkerClient> client;
};

// The router's view of the workers: the
// registry snapshot and the breakers the router consults and feeds.
// WorkerDirectory is the Redis-backed one; unit tests give the router a
// fixed list (tests/unit/router/router_legs_test.cc). Thread-safe.
class WorkerSource {
 public:
  virtual ~WorkerSource() = default;
  // The registered workers, sorted by id; Unavailable when the registry
  // cannot be read.
  virtual absl::StatusOr<std::vector<std::shared_ptr<const WorkerEndpoint>>> Workers() = 0;
  // Breaker state (CircuitBreakers below).
  virtual bool Healthy(absl::string_view worker_id) = 0;
  virtual bool Pick(absl::string_view worker_id) = 0;
  virtual void ReportSuccess(absl::string_view worker_id) = 0;
  virtual void ReportFailure(absl::string_view worker_id) = 0;
};

// The circuit breakers of the workers (the file comment's semantics), by
// worker id. Thread-safe.
class CircuitBreakers {
 public:
  // `clock`: nullptr is the real clock; not owned.
  explicit CircuitBreakers(const CircuitBreakerOptions& options, base::Clock* clock = nullptr);
  // Healthy() is false while the breaker is open; after open_for it is true
  // (half-open) without side effects.
  bool Healthy(absl::string_view worker_id);
  // Takes the half-open trial; false when this period's was taken.
  bool Pick(absl::string_view worker_id);
  void ReportSuccess(absl::string_view worker_id);
  void ReportFailure(absl::string_view worker_id);
  // Forgets the breakers of workers not in `live` (they left the registry).
  void Retain(const std::vector<std::shared_ptr<const WorkerEndpoint>>& live);
  // Forgets one worker's breaker (a new incarnation starts closed).
  void Reset(absl::string_view worker_id);
  // Workers whose breaker is open now.
  int Open();

 private:
  struct Breaker {
    int consecutive_failures = 0;
    absl::Time open_until = absl::InfinitePast();
    int trials = 0;
  };
  const CircuitBreakerOptions options_;
  base::Clock* const clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Breaker> breakers_ ABSL_GUARDED_BY(mu_);
};

class WorkerDirectory final : public WorkerSource {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerDirectory>> Create(
      const WorkerDirectoryOptions& options);
  ~WorkerDirectory();
  WorkerDirectory(const WorkerDirectory&) = delete;
  WorkerDirectory& operator=(const WorkerDirectory&) = delete;

  // The workers of the last successful refresh, sorted by id. Refreshes
  // first when none has succeeded yet (Unavailable if Redis is down then).
  absl::StatusOr<std::vector<std::shared_ptr<const WorkerEndpoint>>> Workers() override;

  // Re-reads the registry now.
  absl::Status Refresh();

  // Breaker state. Healthy() is false while the breaker is open; after
  // open_for it returns true once and re-arms (half-open).
  bool Healthy(absl::string_view worker_id) override { return breakers_.Healthy(worker_id); }
  // The policy chose `worker_id`: takes the half-open trial when its
  // breaker is open and the period is over. False when the breaker is open
  // and the trial of this period was already taken (choose another).
  bool Pick(absl::string_view worker_id) override { return breakers_.Pick(worker_id); }
  void ReportSuccess(absl::string_view worker_id) override { breakers_.ReportSuccess(worker_id); }
  void ReportFailure(absl::string_view worker_id) override { breakers_.ReportFailure(worker_id); }
  // Workers whose breaker is open now (a gauge for operators).
  int OpenBreakers() { return breakers_.Open(); }

 private:
  explicit WorkerDirectory(const WorkerDirectoryOptions& options);
  void RefreshLoop();

  const WorkerDirectoryOptions options_;
  CircuitBreakers breakers_;
  absl::Mutex mu_;
  // By id; replaced wholesale on refresh (entries shared with in-flight
  // requests stay valid through their shared_ptr).
  std::vector<std::shared_ptr<const WorkerEndpoint>> workers_ ABSL_GUARDED_BY(mu_);
  bool refreshed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace swaserve::router
