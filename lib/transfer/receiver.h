// The receiving side of the transfer protocol (internal to lib/transfer; the
// protocol is the README in transfer_engine.h, steps 1-2 and 5-6): the
// expected transfers (ExpectTransfer's Destination with fresh rkey tags),
// validation of every BEGIN, data message and COMMIT against them, the
// receive state machine
//   pending -> [started: a message arrived] -> committed -> finished
//   (callback, then kept as a tombstone for finished_linger)
// with failure on a rejected message, a failed receive, a closed sender,
// a released registration, cancellation, shutdown or the deadline — and the
// replies (READY, ACK, REJECT) to senders. A receive's callback runs only
// once none of its UCX receives is outstanding (the caller may reuse the
// memory right away).
//
// Thread-safety: progress-thread state (see engine_context.h): every method
// except Validate runs on the engine's progress thread. Receive callbacks
// run there too.
// Ownership: the Receiver owns its ReceiveStates; a state uses
// registrations by id (released when it finishes) and remembers, but does
// not own, the UCX endpoints its data arrived on.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/transfer/engine_context.h"
#include "lib/transfer/peer_table.h"
#include "lib/transfer/registration_table.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/transfer/transfer_metrics.h"
#include "lib/transfer/ucx_request.h"
#include "lib/transfer/wire.h"

namespace swaserve::transfer::internal {

// One region of an expected transfer.
struct Slot {
  uint8_t* data = nullptr;
  uint64_t length = 0;
  uint64_t tag = 0;
  ucp_mem_h memh = nullptr;
  uint64_t registration = 0;
};

struct ReceiveState {
  std::string id;
  std::vector<Slot> regions;
  uint64_t expected = 0;
  uint64_t received = 0;  // by data messages, completed
  int inflight = 0;
  ReceiveCallback done;
  bool finished = false;  // callback ran; kept as a tombstone
  absl::Status outcome;   // of a finished receive
  bool failed = false;
  absl::Status error;
  Reason reason = Reason::kInternal;
  bool committed = false;
  bool started = false;           // a message of this transfer arrived
  bool commit_receiving = false;  // commit payload arriving by rendezvous
  std::string payload;
  uint64_t declared_am_bytes = 0;
  uint64_t put_bytes = 0;
  uint64_t commit_engine = 0;
  uint64_t commit_send_id = 0;
  int64_t start_ns = 0;
  int64_t deadline_ns = 0;
  int64_t linger_until_ns = 0;
  absl::flat_hash_set<uint64_t> senders;
  // UCX's endpoints the data arrived on (reply_ep), force-closed when the
  // sender is gone or the deadline passed with receives outstanding.
  absl::flat_hash_set<ucp_ep_h> reply_eps;
};

// A ReceiveRequest region's registration, as the engine resolved it.
struct RegionRef {
  uint64_t registration = 0;
  bool this_engine = false;  // created by this engine
};

class Receiver : public OpHandler {
 public:
  // All three must outlive the Receiver.
  Receiver(EngineContext* ctx, RegistrationTable* registrations,
           PeerTable* peers)
      : ctx_(ctx), registrations_(registrations), peers_(peers) {}
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  // Sets the DATA, COMMIT and BEGIN handlers on the worker.
  absl::Status RegisterHandlers(ucp_worker_h worker);

  // The checks of ExpectTransfer that need no engine state (id length,
  // region count, ranges inside their registrations, expected bytes within
  // the regions). Thread-safe.
  static absl::Status Validate(const ReceiveRequest& request);
  // Records the expected transfer (`refs`: its regions' registrations) and
  // returns its Destination; see TransferEngine::ExpectTransfer.
  absl::StatusOr<Destination> Expect(const ReceiveRequest& request,
                                     const std::vector<RegionRef>& refs,
                                     ReceiveCallback done);
  // Fails pending receive `id` with Cancelled; NotFound when none.
  absl::Status Cancel(const std::string& id);
  // Fails every pending receive with `why` and force-closes the endpoints
  // of those with receives outstanding (shutdown).
  void FailAll(const absl::Status& why);
  // PeerTable::Observer's half: sender `engine`'s endpoint back `ep` is
  // closing. Unless `why` is Cancelled, fails its receives (force-closing
  // the endpoints of those with receives outstanding); forgets `ep`.
  void OnSenderClosed(uint64_t engine, ucp_ep_h ep, const absl::Status& why);
  // Fails the receives that use registration `id` (being released).
  void FailReceivesUsing(uint64_t registration, const absl::Status& why);
  // Fails the receives past their deadline at `now` (DeadlineExceeded),
  // force-closes the endpoints of those with receives outstanding, forgets
  // tombstones past finished_linger, and lowers ctx->next_deadline_ns to the
  // earliest deadline left.
  void CheckDeadlines(int64_t now);
  // Sends the replies queued since the last call.
  void SendPendingReplies();
  // Advances every receive marked since the last call.
  void CheckDirty();
  bool HasPendingWork() const {
    return !dirty_.empty() || !pending_replies_.empty();
  }
  bool HasDirty() const { return !dirty_.empty(); }

  // Pending receives (tombstones excluded), and those of them that have
  // seen a message.
  int64_t pending() const { return pending_; }
  int64_t started() const { return started_; }
  // The state of receive `id` (pending or tombstone); null when unknown.
  const ReceiveState* Find(const std::string& id) const;

  // Active-message handlers (arg: the Receiver) and what they call.
  static ucs_status_t AmDataFn(void* arg, const void* header,
                               size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* p);
  static ucs_status_t AmCommitFn(void* arg, const void* header,
                                 size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t AmBeginFn(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* p);
  ucs_status_t OnData(const void* header, size_t header_length, void* data,
                      size_t length, const ucp_am_recv_param_t* p);
  ucs_status_t OnCommit(const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* p);
  void OnBegin(const void* header, size_t header_length,
               const ucp_am_recv_param_t* p);

  void OnOpDone(OpCtx& ctx, ucs_status_t status) override;

 private:
  struct PendingReply {
    uint64_t engine = 0;
    uint64_t send_id = 0;
    wire::ReplyKind kind = wire::ReplyKind::kAck;
    absl::Status status;
  };

  absl::Status CheckDataHeader(const ReceiveState& r, const wire::DataHeader& h,
                               size_t length) const;
  // A BEGIN or data message of `engine` arrived for `r`: remember the
  // sender and its endpoint, count `r` as started.
  void NoteSender(ReceiveState& r, uint64_t engine,
                  const ucp_am_recv_param_t* p);
  // A BEGIN or COMMIT carries exactly `r`'s region tags.
  static bool TagsMatch(const ReceiveState& r,
                        const std::vector<uint64_t>& tags);
  void ApplyCommit(ReceiveState& r, const wire::DecodedCommit& commit,
                   std::string payload);
  void Check(ReceiveState& r);
  void Fail(ReceiveState& r, absl::Status status, Reason reason);
  void Finish(ReceiveState& r);
  void ForceCloseReplyEps(ReceiveState& r, const absl::Status& why);
  void QueueReply(uint64_t engine, uint64_t send_id, wire::ReplyKind kind,
                  absl::Status status);
  void SendReply(const PendingReply& reply);
  void Mark(const std::string& id) { dirty_.insert(id); }

  EngineContext* const ctx_;
  RegistrationTable* const registrations_;
  PeerTable* const peers_;
  absl::flat_hash_map<std::string, std::unique_ptr<ReceiveState>> receives_;
  int64_t pending_ = 0;
  int64_t started_ = 0;
  absl::flat_hash_set<std::string> dirty_;
  std::vector<PendingReply> pending_replies_;
};

}  // namespace swaserve::transfer::internal
