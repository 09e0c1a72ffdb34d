// The transfer engine's endpoints (internal to lib/transfer): one endpoint
// per receiver we send to (Peer, keyed by its framed worker address, with
// its cache of unpacked rkeys) and one back to each sender that sent us a
// HELLO (BackEp, keyed by its engine id; replies go over it). It opens them,
// sends the HELLO on a new Peer, closes them (force), turns UCX's endpoint
// error callbacks into deferred closes, and checks that peers on this host
// are still alive (process_identity.h).
//
// Closing a Peer fails its sends and closing a BackEp fails the receives its
// sender was writing: the table tells its Observer (the engine), before the
// endpoint is closed, and the Observer does that.
//
// Thread-safety: progress-thread state (see engine_context.h). UCX calls the
// error callbacks from ucp_worker_progress on that thread; they only queue.
// Ownership: the table holds its Peers and BackEps by shared_ptr; a request
// on (or closing) an endpoint holds one too (OpCtx), so the error handler's
// argument outlives every callback UCX may still make.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/transfer/engine_context.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/transfer/ucx_request.h"
#include "lib/transfer/wire.h"

namespace swaserve::transfer::internal {

class PeerTable;

// An endpoint to a receiver we send to.
struct Peer {
  std::string blob;  // the receiver's framed worker address
  uint64_t engine_id = 0;
  wire::ProcessIdentity process;
  ucp_ep_h ep = nullptr;  // null once closing
  Transport transport = Transport::kUnknown;
  bool closing = false;
  absl::flat_hash_set<uint64_t> sends;  // Sender ids using it
  PeerTable* table = nullptr;
  // Unpacked rkeys by packed UCX rkey, with the sends using each. Unpacking
  // the rkey of UCX-allocated shared memory maps the whole segment, which
  // made every put transfer 100x slower when done per transfer; a few are
  // kept (a mapping keeps a freed segment's memory alive until evicted).
  struct CachedRkey {
    ucp_rkey_h handle = nullptr;
    int users = 0;
    int64_t last_used = 0;
  };
  absl::flat_hash_map<std::string, CachedRkey> rkeys;
};

// An endpoint back to a sender (for replies).
struct BackEp {
  uint64_t engine_id = 0;
  wire::ProcessIdentity process;
  ucp_ep_h ep = nullptr;  // null once closing
  bool closing = false;
  PeerTable* table = nullptr;
};

class PeerTable : public OpHandler {
 public:
  // Unused rkeys a Peer keeps (least recently used evicted first).
  static constexpr size_t kRkeyCacheSize = 4;

  class Observer {
   public:
    virtual ~Observer() = default;
    // `peer` is closing (already out of the table; its endpoint is closed
    // right after): fail its sends with `why`.
    virtual void OnPeerClosing(Peer& peer, const absl::Status& why) = 0;
    // `back` is closing (out of the table, back.ep already null); `ep` was
    // its endpoint, closed right after: fail what its sender was writing
    // and forget `ep`.
    virtual void OnBackEpClosing(const BackEp& back, ucp_ep_h ep,
                                 const absl::Status& why) = 0;
  };

  // `ctx` and `observer` must outlive the table.
  PeerTable(EngineContext* ctx, Observer* observer)
      : ctx_(ctx), observer_(observer) {}
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // Sets the HELLO handler on the worker.
  absl::Status RegisterHandlers(ucp_worker_h worker);

  // The endpoint to the receiver with framed address `blob`: the open one,
  // else a new one (HELLO sent on it). InvalidArgument for a bad address,
  // Unavailable when UCX cannot create the endpoint.
  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const std::string& blob);
  // Sets *handle to the unpacked packed UCX rkey `packed` on `peer` (cached;
  // one more user, marked used now). UCX's status when it cannot unpack it
  // (then nothing changes).
  ucs_status_t AcquireRkey(Peer& peer, const std::string& packed,
                           ucp_rkey_h* handle);
  // One user fewer of cached rkey `packed` (no-op when not cached).
  void ReleaseRkey(Peer& peer, const std::string& packed);
  // Destroys unused cached rkeys beyond kRkeyCacheSize (every unused one
  // once the peer is closing), least recently used first.
  void TrimRkeyCache(Peer& peer);
  // Takes `peer` out of the table, tells the Observer, trims its rkeys and
  // force-closes its endpoint. Idempotent. By value: the table's own
  // reference goes while it runs.
  void ClosePeer(std::shared_ptr<Peer> peer, const absl::Status& why);

  // Opens the endpoint back to the sender that said HELLO from `address`
  // (closing an older one to the same engine). Logged when UCX refuses.
  void OpenBackEp(const wire::WorkerAddress& address);
  // Takes `back` out of the table, tells the Observer and force-closes its
  // endpoint. Idempotent. By value: the table's own reference goes while it
  // runs (a reference into back_eps_ would dangle).
  void CloseBackEp(std::shared_ptr<BackEp> back, const absl::Status& why);
  // Force-closes `ep` (once per progress round; see NewRound); `peer` and
  // `back` are kept alive until the close completes.
  void CloseEp(ucp_ep_h ep, std::shared_ptr<Peer> peer,
               std::shared_ptr<BackEp> back);
  // Closes every endpoint (engine shutdown).
  void CloseAll(const absl::Status& why);

  // The open endpoint back to sender `engine`; null when none.
  std::shared_ptr<BackEp> FindBackEp(uint64_t engine) const;
  // The Peer / BackEp whose endpoint is `ep`; null when none.
  std::shared_ptr<Peer> PeerWithEp(ucp_ep_h ep) const;
  std::shared_ptr<BackEp> BackEpWithEp(ucp_ep_h ep) const;

  // Closes the endpoints whose peer process on this host has exited.
  void CheckLiveness();
  // Deferred work, in the engine's order: endpoint errors UCX reported
  // (peers, then backs), then HELLOs received.
  void ProcessPeerErrors();
  void ProcessBackErrors();
  void ProcessHellos();
  bool HasPendingWork() const {
    return !pending_hellos_.empty() || !peer_errors_.empty() ||
           !back_errors_.empty();
  }
  // A new progress round: CloseEp may close an endpoint handle again.
  void NewRound() { closed_this_round_.clear(); }

  // Open endpoints (both kinds) plus those still closing.
  int64_t endpoints() const {
    return static_cast<int64_t>(peers_.size() + back_eps_.size()) +
           closing_eps_;
  }
  int64_t closing_endpoints() const { return closing_eps_; }

  // The HELLO active-message handler (arg: the PeerTable).
  static ucs_status_t AmHelloFn(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* p);

  void OnOpDone(OpCtx& ctx, ucs_status_t status) override;

 private:
  static void PeerErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void BackEpErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status);
  // An error-handling endpoint (UCP_ERR_HANDLING_MODE_PEER, which
  // ucp_ep_close_nbx(FORCE) needs) to UCX worker address `ucx_address`.
  ucs_status_t CreateEp(const std::string& ucx_address,
                        ucp_err_handler_cb_t on_error, void* arg, ucp_ep_h* ep);
  void SendHello(const std::shared_ptr<Peer>& peer);

  EngineContext* const ctx_;
  Observer* const observer_;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<BackEp>> back_eps_;
  int64_t closing_eps_ = 0;
  absl::flat_hash_set<ucp_ep_h> closed_this_round_;
  std::vector<wire::WorkerAddress> pending_hellos_;
  std::vector<std::pair<std::shared_ptr<Peer>, absl::Status>> peer_errors_;
  std::vector<std::pair<std::shared_ptr<BackEp>, absl::Status>> back_errors_;
};

}  // namespace swaserve::transfer::internal
