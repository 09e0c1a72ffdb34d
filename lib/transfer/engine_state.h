// Everything the transfer engine's progress thread owns (internal to
// lib/transfer): the UCP context and worker (EngineContext), the
// registrations, the peer table, the sender and the receiver, wired
// together — and the pieces of one progress-loop iteration (deferred work,
// deadlines, shutdown) over them. The thread, its task queue and its sleep
// are TransferEngine's (transfer_engine.cc: internal::Core).
//
// Thread-safety: progress-thread state (see engine_context.h), except
// Create, Stats and address(), which any thread may call (Create before the
// thread exists).
// Ownership: owns its parts; they refer to each other by raw pointer and
// die together. The destructor unmaps the remaining registrations and
// destroys the worker (if DestroyWorker has not) and the context; the parts
// (and OpCtxs UCX never completed) make no UCX call after that.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "lib/transfer/engine_context.h"
#include "lib/transfer/peer_table.h"
#include "lib/transfer/receiver.h"
#include "lib/transfer/registration_table.h"
#include "lib/transfer/sender.h"
#include "lib/transfer/transfer_engine.h"

namespace swaserve::transfer::internal {

class EngineState : private PeerTable::Observer {
 public:
  // Reads the UCX configuration (ucx_tls, MM_ERROR_HANDLING when shared
  // memory may be used, KEEPALIVE_INTERVAL), creates the context and a
  // single-threaded worker, checks its AM header limit, frames its address
  // and sets the protocol's AM handlers. Options are not validated here.
  static absl::StatusOr<std::unique_ptr<EngineState>> Create(
      const TransferEngineOptions& options);
  ~EngineState() override;
  EngineState(const EngineState&) = delete;
  EngineState& operator=(const EngineState&) = delete;

  const std::string& address() const { return ctx_.framed_address; }
  ucp_worker_h worker() const { return ctx_.worker; }
  EngineContext& context() { return ctx_; }
  RegistrationTable& registrations() { return registrations_; }
  PeerTable& peers() { return peers_; }
  Sender& sender() { return sender_; }
  Receiver& receiver() { return receiver_; }

  // Maps memory as registration `id` (see RegistrationTable::Map);
  // FailedPrecondition once shutting down.
  absl::StatusOr<void*> Register(uint64_t id, void* data, size_t size,
                                 bool allocate);
  // Releases registration `id`: unmapped now when unused or `unmap_now`
  // (false then); otherwise marked releasing, its transfers failed
  // (Cancelled), `released` (may be null) notified once unmapped by
  // ProcessDeferred, and true returned.
  bool Release(uint64_t id, bool unmap_now, absl::Notification* released);

  // One loop iteration's parts, in the loop's order.
  void NewRound() { peers_.NewRound(); }
  unsigned Progress();
  // Endpoint errors, HELLOs, replies, sends and receives marked dirty (up to
  // 4 rounds while any is left), then registrations whose release waited.
  void ProcessDeferred();
  // Every 5 ms (or when the earliest deadline passed, see
  // DeadlineCheckDue): liveness of peers every keepalive_interval, then
  // send and receive deadlines.
  void CheckDeadlines(int64_t now);
  bool DeadlineCheckDue(int64_t now) const {
    return now >= next_deadline_check_ns_ || now >= ctx_.next_deadline_ns;
  }
  // Starts shutting down: every transfer fails Cancelled, every endpoint
  // closes.
  void BeginShutdown();
  // Deferred work is queued (ProcessDeferred has something to do).
  bool HasPendingWork() const;
  // A transfer is moving: the loop polls instead of sleeping.
  bool Busy() const { return sender_.active() > 0 || receiver_.started() > 0; }
  // Nothing outstanding: shutdown may stop the thread.
  bool Quiescent() const;
  // Destroys the worker (after the thread stopped); registrations stay
  // valid (their memory handles are context-level).
  void DestroyWorker();

  // Publishes the counters for Stats (also ctx.publish_stats).
  void PublishStats();
  // The last published counters; thread-safe.
  EngineStats Stats() const;

 private:
  explicit EngineState(const TransferEngineOptions& options);
  absl::Status Init();

  // PeerTable::Observer.
  void OnPeerClosing(Peer& peer, const absl::Status& why) override;
  void OnBackEpClosing(const BackEp& back, ucp_ep_h ep,
                       const absl::Status& why) override;

  EngineContext ctx_;
  RegistrationTable registrations_;
  PeerTable peers_;
  Sender sender_;
  Receiver receiver_;
  int64_t next_deadline_check_ns_ = 0;
  int64_t next_liveness_check_ns_ = 0;

  // Published copies of the counters for Stats().
  std::atomic<int64_t> stat_sends_{0};
  std::atomic<int64_t> stat_receives_{0};
  std::atomic<int64_t> stat_inflight_{0};
  std::atomic<int64_t> stat_endpoints_{0};
};

}  // namespace swaserve::transfer::internal
