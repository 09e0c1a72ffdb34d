#include "lib/transfer/peer_table.h"

#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/transfer/process_identity.h"
#include "lib/transfer/ucx_util.h"

namespace swaserve::transfer::internal {

absl::Status PeerTable::RegisterHandlers(ucp_worker_h worker) {
  return SetAmHandler(worker, wire::kAmHello, &PeerTable::AmHelloFn, this);
}

ucs_status_t PeerTable::CreateEp(const std::string& ucx_address,
                                 ucp_err_handler_cb_t on_error, void* arg,
                                 ucp_ep_h* ep) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(ucx_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_error;
  params.err_handler.arg = arg;
  return ucp_ep_create(ctx_->worker, &params, ep);
}

absl::StatusOr<std::shared_ptr<Peer>> PeerTable::GetPeer(
    const std::string& blob) {
  auto it = peers_.find(blob);
  if (it != peers_.end()) return it->second;
  absl::StatusOr<wire::WorkerAddress> address = wire::UnpackWorkerAddress(blob);
  if (!address.ok()) return address.status();
  auto peer = std::make_shared<Peer>();
  peer->blob = blob;
  peer->engine_id = address->engine_id;
  peer->process = address->process;
  peer->table = this;
  const ucs_status_t st = CreateEp(
      address->ucx_address, &PeerTable::PeerErrorFn, peer.get(), &peer->ep);
  if (st != UCS_OK) {
    // Whatever UCX's reason (unreachable, a vanished shared-memory segment,
    // a refused connection), the peer cannot be reached.
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the receiver (engine ", Hex(address->engine_id),
        "): ", ucs_status_string(st),
        ": it exited, or UCX_TLS leaves the two sides no common transport"));
  }
  peer->transport = DetectTransport(peer->ep);
  peers_.emplace(blob, peer);
  SendHello(peer);
  SWA_LOG(debug, "transfer engine '{}': endpoint to engine {} over {}",
          ctx_->options.name, Hex(peer->engine_id),
          std::string(TransportName(peer->transport)));
  return peer;
}

void PeerTable::SendHello(const std::shared_ptr<Peer>& peer) {
  // HELLO: our address, so the receiver can answer.
  wire::HelloHeader h;
  h.sender_engine = ctx_->engine_id;
  OpCtx* op = ctx_->requests.NewOp(OpKind::kHello, this);
  op->header = wire::EncodeHello(h);
  op->payload = ctx_->framed_address;
  ucp_request_param_t rp =
      RequestTracker::SendParams(op, UCP_AM_SEND_FLAG_EAGER);
  ctx_->requests.Track(
      op, ucp_am_send_nbx(peer->ep, wire::kAmHello, op->header.data(),
                          op->header.size(), op->payload.data(),
                          op->payload.size(), &rp));
}

ucs_status_t PeerTable::AcquireRkey(Peer& peer, const std::string& packed,
                                    ucp_rkey_h* handle) {
  auto cached = peer.rkeys.find(packed);
  if (cached == peer.rkeys.end()) {
    ucp_rkey_h unpacked = nullptr;
    const ucs_status_t st =
        ucp_ep_rkey_unpack(peer.ep, packed.data(), &unpacked);
    if (st != UCS_OK) return st;
    cached = peer.rkeys.emplace(packed, Peer::CachedRkey{unpacked, 0, 0}).first;
  }
  ++cached->second.users;
  cached->second.last_used = NowNanos();
  *handle = cached->second.handle;
  return UCS_OK;
}

void PeerTable::ReleaseRkey(Peer& peer, const std::string& packed) {
  auto it = peer.rkeys.find(packed);
  if (it != peer.rkeys.end()) --it->second.users;
}

void PeerTable::TrimRkeyCache(Peer& peer) {
  const size_t keep = peer.closing ? 0 : kRkeyCacheSize;
  while (peer.rkeys.size() > keep) {
    auto victim = peer.rkeys.end();
    for (auto it = peer.rkeys.begin(); it != peer.rkeys.end(); ++it) {
      if (it->second.users > 0) continue;
      if (victim == peer.rkeys.end() ||
          it->second.last_used < victim->second.last_used) {
        victim = it;
      }
    }
    if (victim == peer.rkeys.end()) return;  // all in use
    ucp_rkey_destroy(victim->second.handle);
    peer.rkeys.erase(victim);
  }
}

void PeerTable::PeerErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  PeerTable* table = peer->table;
  auto it = table->peers_.find(peer->blob);
  if (it == table->peers_.end() || it->second.get() != peer) return;
  table->peer_errors_.emplace_back(
      it->second,
      PeerError(status, absl::StrCat("the endpoint to receiver engine ",
                                     Hex(peer->engine_id), " failed")));
}

void PeerTable::ClosePeer(std::shared_ptr<Peer> peer, const absl::Status& why) {
  if (peer->closing) return;
  peer->closing = true;
  auto it = peers_.find(peer->blob);
  if (it != peers_.end() && it->second == peer) peers_.erase(it);
  observer_->OnPeerClosing(*peer, why);
  TrimRkeyCache(*peer);
  CloseEp(peer->ep, peer, nullptr);
  peer->ep = nullptr;
}

ucs_status_t PeerTable::AmHelloFn(void* arg, const void* header,
                                  size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* p) {
  auto* table = static_cast<PeerTable*>(arg);
  absl::StatusOr<wire::HelloHeader> h =
      wire::DecodeHello(header, header_length);
  if (!h.ok() || (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    SWA_LOG(warn, "transfer engine '{}': dropped a malformed hello",
            table->ctx_->options.name);
    return UCS_OK;
  }
  absl::StatusOr<wire::WorkerAddress> address = wire::UnpackWorkerAddress(
      absl::string_view(static_cast<const char*>(data), length));
  if (!address.ok() || address->engine_id != h->sender_engine) {
    SWA_LOG(warn, "transfer engine '{}': dropped a hello with a bad address",
            table->ctx_->options.name);
    return UCS_OK;
  }
  table->pending_hellos_.push_back(*std::move(address));
  return UCS_OK;
}

void PeerTable::OpenBackEp(const wire::WorkerAddress& address) {
  if (ctx_->shutting_down) return;
  const uint64_t engine = address.engine_id;
  const std::string& ucx_address = address.ucx_address;
  // A second hello means the sender opened a new endpoint (it closed the old
  // one, e.g. after a timeout): the old connection back is dead too.
  if (auto it = back_eps_.find(engine); it != back_eps_.end()) {
    CloseBackEp(it->second,
                absl::CancelledError("the sender opened a new endpoint"));
  }
  auto back = std::make_shared<BackEp>();
  back->engine_id = engine;
  back->process = address.process;
  back->table = this;
  const ucs_status_t st =
      CreateEp(ucx_address, &PeerTable::BackEpErrorFn, back.get(), &back->ep);
  if (st != UCS_OK) {
    SWA_LOG(warn,
            "transfer engine '{}': cannot open an endpoint back to sender {}: "
            "{}; its transfers will time out",
            ctx_->options.name, Hex(engine), ucs_status_string(st));
    return;
  }
  back_eps_.emplace(engine, std::move(back));
}

void PeerTable::BackEpErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* back = static_cast<BackEp*>(arg);
  PeerTable* table = back->table;
  auto it = table->back_eps_.find(back->engine_id);
  if (it == table->back_eps_.end() || it->second.get() != back) return;
  table->back_errors_.emplace_back(
      it->second,
      PeerError(status, absl::StrCat("sender engine ", Hex(back->engine_id),
                                     " failed mid-transfer")));
}

void PeerTable::CloseBackEp(std::shared_ptr<BackEp> back,
                            const absl::Status& why) {
  if (back->closing) return;
  back->closing = true;
  auto it = back_eps_.find(back->engine_id);
  if (it != back_eps_.end() && it->second == back) back_eps_.erase(it);
  const ucp_ep_h ep = back->ep;
  back->ep = nullptr;
  observer_->OnBackEpClosing(*back, ep, why);
  CloseEp(ep, nullptr, back);
}

void PeerTable::CloseEp(ucp_ep_h ep, std::shared_ptr<Peer> peer,
                        std::shared_ptr<BackEp> back) {
  // An endpoint can be reached twice in one round (as a sender's reply_ep of
  // two receives, and as our own endpoint back): close it once. Cleared every
  // loop iteration, so a handle UCX reuses later is not mistaken for it.
  if (ep == nullptr || !closed_this_round_.insert(ep).second) return;
  OpCtx* op = ctx_->requests.NewOp(OpKind::kClose, this);
  op->peer = std::move(peer);  // keeps the err_handler arg alive
  op->back = std::move(back);
  ++closing_eps_;
  ucp_request_param_t rp =
      RequestTracker::SendParams(op, UCP_EP_CLOSE_FLAG_FORCE);
  ctx_->requests.Track(op, ucp_ep_close_nbx(ep, &rp));
}

void PeerTable::CloseAll(const absl::Status& why) {
  std::vector<std::shared_ptr<Peer>> peers;
  for (auto& [blob, p] : peers_) peers.push_back(p);
  for (auto& p : peers) ClosePeer(p, why);
  std::vector<std::shared_ptr<BackEp>> backs;
  for (auto& [id, b] : back_eps_) backs.push_back(b);
  for (auto& b : backs) CloseBackEp(b, why);
}

std::shared_ptr<BackEp> PeerTable::FindBackEp(uint64_t engine) const {
  auto it = back_eps_.find(engine);
  return it == back_eps_.end() ? nullptr : it->second;
}

std::shared_ptr<Peer> PeerTable::PeerWithEp(ucp_ep_h ep) const {
  std::shared_ptr<Peer> peer;
  for (auto& [blob, p] : peers_) {
    if (p->ep == ep) peer = p;
  }
  return peer;
}

std::shared_ptr<BackEp> PeerTable::BackEpWithEp(ucp_ep_h ep) const {
  std::shared_ptr<BackEp> back;
  for (auto& [engine, b] : back_eps_) {
    if (b->ep == ep) back = b;
  }
  return back;
}

void PeerTable::CheckLiveness() {
  const wire::ProcessIdentity& self = ctx_->self_process;
  std::vector<std::shared_ptr<Peer>> dead_peers;
  for (auto& [blob, p] : peers_) {
    if (ProcessGone(p->process, self)) dead_peers.push_back(p);
  }
  for (auto& p : dead_peers) {
    ClosePeer(
        p, absl::UnavailableError(absl::StrCat("the receiver's process (pid ",
                                               p->process.pid, ") exited")));
  }
  std::vector<std::shared_ptr<BackEp>> dead_backs;
  for (auto& [engine, b] : back_eps_) {
    if (ProcessGone(b->process, self)) dead_backs.push_back(b);
  }
  for (auto& b : dead_backs) {
    CloseBackEp(b, absl::UnavailableError(
                       absl::StrCat("the sender's process (pid ",
                                    b->process.pid, ") exited mid-transfer")));
  }
}

void PeerTable::ProcessPeerErrors() {
  if (peer_errors_.empty()) return;
  auto errors = std::move(peer_errors_);
  peer_errors_.clear();
  for (auto& [peer, status] : errors) ClosePeer(peer, status);
}

void PeerTable::ProcessBackErrors() {
  if (back_errors_.empty()) return;
  auto errors = std::move(back_errors_);
  back_errors_.clear();
  for (auto& [back, status] : errors) CloseBackEp(back, status);
}

void PeerTable::ProcessHellos() {
  if (pending_hellos_.empty()) return;
  auto hellos = std::move(pending_hellos_);
  pending_hellos_.clear();
  for (const wire::WorkerAddress& address : hellos) OpenBackEp(address);
}

void PeerTable::OnOpDone(OpCtx& ctx, ucs_status_t status) {
  if (ctx.kind == OpKind::kClose) {
    --closing_eps_;
    return;
  }
  // kHello.
  if (status != UCS_OK && status != UCS_ERR_CANCELED) {
    SWA_LOG(debug, "transfer control message failed: {}",
            ucs_status_string(status));
  }
}

}  // namespace swaserve::transfer::internal
