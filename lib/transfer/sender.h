// The sending side of the transfer protocol (internal to lib/transfer; the
// protocol is the README in transfer_engine.h, steps 3-6): validates a
// SendRequest against its Destination, plans the data messages, and runs
// each send through its phases
//   [kBegin: BEGIN sent, awaiting READY (puts only)] -> kData (AMs or puts,
//   at most max_inflight_messages outstanding) -> [kFlush (puts)] ->
//   kCommit -> kAwaitAck -> finished (callback)
// failing it on a REJECT, a failed request, a closed endpoint, a released
// registration, cancellation, shutdown or its deadline. A failed send's
// callback runs only once none of its UCX requests is outstanding (the
// caller may free its pages right away).
//
// Thread-safety: progress-thread state (see engine_context.h): every method
// runs on the engine's progress thread. Send callbacks run there too.
// Ownership: the Sender owns its SendStates; a state holds its Peer (shared)
// and uses cached rkeys of it and registrations by id, released when the
// send finishes.
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

namespace swaserve::transfer::internal {

// One data message (an AM or a put).
struct Message {
  const uint8_t* local = nullptr;
  uint64_t remote_address = 0;
  uint64_t bytes = 0;
  uint32_t region = 0;
  ucp_mem_h memh = nullptr;  // set when `local` lies in a registration
};

struct MessagePlan {
  std::vector<Message> messages;
  uint64_t total_bytes = 0;  // of the copies
};

// The data messages of `copies` into `destination`: adjacent copies (local
// and remote contiguous, same region) merged, runs split at
// `max_message_bytes`, empty copies skipped. InvalidArgument (naming the
// transfer and the copy) for a null local pointer, a region index out of
// range, or a copy that does not fit its region.
absl::StatusOr<MessagePlan> PlanMessages(const Destination& destination,
                                         const std::vector<PageCopy>& copies,
                                         uint64_t max_message_bytes);

// kBegin (puts only): BEGIN sent, waiting for the receiver's READY.
enum class SendPhase { kBegin, kData, kFlush, kCommit, kAwaitAck };

struct SendState {
  uint64_t id = 0;
  std::string transfer_id;
  std::string commit_payload;
  SendCallback done;
  std::shared_ptr<Peer> peer;
  Primitive primitive = Primitive::kActiveMessage;
  Transport transport = Transport::kUnknown;
  std::vector<Message> messages;
  std::vector<uint64_t> region_tags;
  std::vector<ucp_rkey_h> ucx_rkeys;  // owned by peer->rkeys
  std::vector<std::string> rkey_keys;
  std::vector<uint64_t> registrations;  // RegionRec ids used for memh
  size_t next = 0;
  int inflight = 0;
  uint64_t total_bytes = 0;
  uint64_t am_bytes_done = 0;
  uint64_t put_bytes_done = 0;
  SendPhase phase = SendPhase::kData;
  bool flush_posted = false;
  bool begin_posted = false;
  bool acked = false;
  bool failed = false;
  absl::Status error;
  Reason reason = Reason::kInternal;
  int64_t start_ns = 0;
  int64_t deadline_ns = 0;
};

class Sender : public OpHandler {
 public:
  // All three must outlive the Sender.
  Sender(EngineContext* ctx, RegistrationTable* registrations, PeerTable* peers)
      : ctx_(ctx), registrations_(registrations), peers_(peers) {}
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Sets the REPLY handler (READY, ACK, REJECT) on the worker.
  absl::Status RegisterHandlers(ucp_worker_h worker);

  // Starts send `id`; `done` runs exactly once (invalid requests fail
  // through it, see TransferEngine::Send).
  void Start(uint64_t id, SendRequest request, SendCallback done);
  // Fails send `id` with Cancelled; no-op when it has finished.
  void Cancel(uint64_t id);
  // Fails every send with `why` (Cancelled: shutdown).
  void FailAll(const absl::Status& why);
  // PeerTable::Observer's half: fails the sends on closing `peer`.
  void FailSendsOf(Peer& peer, const absl::Status& why);
  // Fails the sends that use registration `id` (being released).
  void FailSendsUsing(uint64_t registration, const absl::Status& why);
  // Fails the sends past their deadline at `now` (DeadlineExceeded), closes
  // the endpoints of those (or of already failed ones) with messages still
  // outstanding, and lowers ctx->next_deadline_ns to the earliest deadline
  // left.
  void CheckDeadlines(int64_t now);
  // Advances every send marked since the last call.
  void PumpDirty();
  bool HasDirty() const { return !dirty_.empty(); }

  // Sends not yet finished.
  size_t active() const { return sends_.size(); }
  // The live state of send `id`; null when unknown or finished.
  const SendState* Find(uint64_t id) const;

  // The REPLY active-message handler (arg: the Sender).
  static ucs_status_t AmReplyFn(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* p);
  void OnReply(const void* header, size_t header_length, const void* data,
               size_t length, const ucp_am_recv_param_t* p);

  void OnOpDone(OpCtx& ctx, ucs_status_t status) override;

 private:
  absl::Status Prepare(SendState& s, SendRequest& request);
  absl::Status UseRkeys(SendState& s, const std::vector<wire::Rkey>& rkeys);
  void Pump(SendState& s);
  void PostMessage(SendState& s, const Message& m);
  void PostBegin(SendState& s);
  void PostFlush(SendState& s);
  void PostCommit(SendState& s);
  void Fail(SendState& s, absl::Status status, Reason reason);
  void Finish(uint64_t id);
  void Mark(uint64_t id) { dirty_.insert(id); }

  EngineContext* const ctx_;
  RegistrationTable* const registrations_;
  PeerTable* const peers_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<SendState>> sends_;
  absl::flat_hash_set<uint64_t> dirty_;
};

}  // namespace swaserve::transfer::internal
