#include "lib/transfer/sender.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/transfer/ucx_util.h"
#include "lib/transfer/wire.h"

namespace swaserve::transfer::internal {

absl::StatusOr<MessagePlan> PlanMessages(const Destination& d,
                                         const std::vector<PageCopy>& copies,
                                         uint64_t max_message_bytes) {
  MessagePlan plan;
  std::vector<Message>& messages = plan.messages;
  for (size_t i = 0; i < copies.size(); ++i) {
    const PageCopy& c = copies[i];
    if (c.bytes == 0) continue;
    if (c.local == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer '", d.transfer_id, "': copy ", i,
          " has a null local pointer (metadata-only KV pools cannot be sent)"));
    }
    if (c.region >= d.regions.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer '", d.transfer_id, "': copy ", i, " names region ",
          c.region, " but the destination has ", d.regions.size()));
    }
    const uint64_t length = d.regions[c.region].length;
    if (c.offset > length || c.bytes > length - c.offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transfer '%s': copy %d (%d bytes at offset %d) does not fit region "
          "%d (%d bytes): the page list and the destination disagree on the "
          "layout; plan the copies from this KvDestination",
          d.transfer_id, i, c.bytes, c.offset, c.region, length));
    }
    const auto* local = static_cast<const uint8_t*>(c.local);
    uint64_t remote = d.regions[c.region].base_address + c.offset;
    uint64_t left = c.bytes;
    while (left > 0) {
      uint64_t take = std::min<uint64_t>(left, max_message_bytes);
      Message* last = messages.empty() ? nullptr : &messages.back();
      if (last != nullptr && last->region == c.region &&
          last->local + last->bytes == local &&
          last->remote_address + last->bytes == remote &&
          last->bytes < max_message_bytes) {
        take = std::min<uint64_t>(left, max_message_bytes - last->bytes);
        last->bytes += take;
      } else {
        messages.push_back(Message{local, remote, take, c.region, nullptr});
      }
      local += take;
      remote += take;
      left -= take;
    }
    plan.total_bytes += c.bytes;
  }
  return plan;
}

absl::Status Sender::RegisterHandlers(ucp_worker_h worker) {
  return SetAmHandler(worker, wire::kAmReply, &Sender::AmReplyFn, this);
}

const SendState* Sender::Find(uint64_t id) const {
  auto it = sends_.find(id);
  return it == sends_.end() ? nullptr : it->second.get();
}

void Sender::Start(uint64_t id, SendRequest request, SendCallback done) {
  auto state = std::make_unique<SendState>();
  SendState& s = *state;
  s.id = id;
  s.done = std::move(done);
  s.transfer_id = request.destination.transfer_id;
  s.commit_payload = std::move(request.commit_payload);
  s.start_ns = NowNanos();
  const absl::Duration timeout = request.timeout > absl::ZeroDuration()
                                     ? request.timeout
                                     : ctx_->options.default_timeout;
  s.deadline_ns = s.start_ns + DurationNanos(timeout);
  ctx_->next_deadline_ns = std::min(ctx_->next_deadline_ns, s.deadline_ns);
  sends_.emplace(id, std::move(state));
  ctx_->metrics.Started(Direction::kSend);
  if (ctx_->shutting_down) {
    Fail(s, absl::CancelledError("the transfer engine is shutting down"),
         Reason::kCancelled);
  } else if (absl::Status st = Prepare(s, request); !st.ok()) {
    Fail(s, st,
         absl::IsUnavailable(st) ? Reason::kPeerFailure : Reason::kInvalid);
  }
  Mark(id);
}

absl::Status Sender::Prepare(SendState& s, SendRequest& request) {
  const Destination& d = request.destination;
  RETURN_IF_ERROR(wire::CheckTransferId(d.transfer_id));
  if (d.regions.empty() || d.regions.size() > wire::kMaxRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", d.transfer_id, "': the destination has ",
        d.regions.size(), " regions; 1..", wire::kMaxRegions, " are allowed"));
  }
  absl::StatusOr<wire::WorkerAddress> address =
      wire::UnpackWorkerAddress(d.worker_address);
  if (!address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", d.transfer_id, "': ", address.status().message()));
  }
  std::vector<wire::Rkey> rkeys;
  for (size_t i = 0; i < d.regions.size(); ++i) {
    const RemoteRegion& region = d.regions[i];
    absl::StatusOr<wire::Rkey> rkey = wire::UnpackRkey(region.rkey);
    if (!rkey.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer '", d.transfer_id, "': region ", i, ": ",
                       rkey.status().message()));
    }
    if (rkey->base_address != region.base_address ||
        rkey->length != region.length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transfer '%s': the rkey of region %d was issued for [0x%x, +%d) "
          "but the region says [0x%x, +%d): the destination mixes regions of "
          "different transfers; use the KvDestination ExpectTransfer "
          "returned, unmodified",
          d.transfer_id, i, rkey->base_address, rkey->length,
          region.base_address, region.length));
    }
    s.region_tags.push_back(rkey->tag);
    rkeys.push_back(*std::move(rkey));
  }
  absl::StatusOr<MessagePlan> plan =
      PlanMessages(d, request.copies, ctx_->options.max_message_bytes);
  if (!plan.ok()) return plan.status();
  s.messages = std::move(plan->messages);
  s.total_bytes = plan->total_bytes;
  for (Message& m : s.messages) {
    uint64_t reg = 0;
    m.memh = registrations_->FindMemh(m.local, m.bytes, &reg);
    if (m.memh != nullptr &&
        std::find(s.registrations.begin(), s.registrations.end(), reg) ==
            s.registrations.end()) {
      s.registrations.push_back(reg);
      registrations_->AddUser(reg);
    }
  }

  absl::StatusOr<std::shared_ptr<Peer>> peer =
      peers_->GetPeer(d.worker_address);
  if (!peer.ok()) {
    return base::Annotate(peer.status(),
                          absl::StrCat("transfer '", d.transfer_id, "'"));
  }
  s.peer = *peer;
  s.peer->sends.insert(s.id);
  s.transport = s.peer->transport;
  bool all_allocated = true;
  for (const wire::Rkey& k : rkeys) {
    all_allocated = all_allocated && (k.flags & wire::kRkeyUcxAllocated);
  }
  s.primitive = request.primitive != Primitive::kAuto ? request.primitive
                : ctx_->options.primitive != Primitive::kAuto
                    ? ctx_->options.primitive
                    : AutoPrimitive(s.transport, all_allocated);
  if (s.primitive == Primitive::kPut) return UseRkeys(s, rkeys);
  return absl::OkStatus();
}

absl::Status Sender::UseRkeys(SendState& s,
                              const std::vector<wire::Rkey>& rkeys) {
  for (size_t i = 0; i < rkeys.size(); ++i) {
    ucp_rkey_h handle = nullptr;
    const ucs_status_t st =
        peers_->AcquireRkey(*s.peer, rkeys[i].ucx_rkey, &handle);
    if (st != UCS_OK) {
      return FromUcs(st, absl::StrCat("transfer '", s.transfer_id,
                                      "': UCX cannot unpack the rkey of "
                                      "region ",
                                      i));
    }
    s.ucx_rkeys.push_back(handle);
    s.rkey_keys.push_back(rkeys[i].ucx_rkey);
  }
  // Puts land without the receiver looking: first let it check the
  // transfer id and the rkeys (BEGIN -> READY).
  if (!s.messages.empty()) s.phase = SendPhase::kBegin;
  return absl::OkStatus();
}

void Sender::FailSendsOf(Peer& peer, const absl::Status& why) {
  for (uint64_t id : peer.sends) {
    auto s = sends_.find(id);
    if (s == sends_.end()) continue;
    Fail(*s->second,
         base::Annotate(
             why, absl::StrCat("transfer '", s->second->transfer_id, "'")),
         absl::IsCancelled(why) ? Reason::kCancelled : Reason::kPeerFailure);
    Mark(id);
  }
}

void Sender::FailSendsUsing(uint64_t registration, const absl::Status& why) {
  for (auto& [sid, s] : sends_) {
    if (std::find(s->registrations.begin(), s->registrations.end(),
                  registration) != s->registrations.end()) {
      Fail(*s, why, Reason::kCancelled);
    }
  }
}

void Sender::FailAll(const absl::Status& why) {
  for (auto& [id, s] : sends_) Fail(*s, why, Reason::kCancelled);
}

void Sender::CheckDeadlines(int64_t now) {
  std::vector<std::shared_ptr<Peer>> to_close;
  for (auto& [id, s] : sends_) {
    if (now >= s->deadline_ns) {
      if (s->failed) {
        // Failed (e.g. cancelled) with messages still outstanding past its
        // deadline: the peer is not draining them.
        if (s->inflight > 0 && s->peer != nullptr) to_close.push_back(s->peer);
        continue;
      }
      Fail(*s,
           absl::DeadlineExceededError(absl::StrFormat(
               "transfer '%s': no commit acknowledgement within %s "
               "(%d of %d bytes written, phase %d): the receiver is dead, "
               "overloaded or unreachable",
               s->transfer_id, absl::FormatDuration(Since(s->start_ns)),
               s->am_bytes_done + s->put_bytes_done, s->total_bytes,
               static_cast<int>(s->phase))),
           Reason::kTimeout);
      if (s->inflight > 0 && s->peer != nullptr) to_close.push_back(s->peer);
    } else {
      ctx_->next_deadline_ns = std::min(ctx_->next_deadline_ns, s->deadline_ns);
    }
  }
  for (auto& p : to_close) {
    if (p->closing) continue;
    peers_->ClosePeer(p, absl::UnavailableError(
                             "the endpoint to this receiver was closed because "
                             "a transfer on it timed out with data "
                             "outstanding"));
  }
}

void Sender::PumpDirty() {
  if (dirty_.empty()) return;
  auto dirty = std::move(dirty_);
  dirty_.clear();
  for (uint64_t id : dirty) {
    auto it = sends_.find(id);
    if (it != sends_.end()) Pump(*it->second);
  }
}

void Sender::Pump(SendState& s) {
  if (s.failed) {
    if (s.inflight == 0) Finish(s.id);
    return;
  }
  if (s.phase == SendPhase::kBegin) {
    if (!s.begin_posted) {
      s.begin_posted = true;
      PostBegin(s);
    }
    return;  // OnReply(kReady) moves it on
  }
  if (s.phase == SendPhase::kData) {
    while (s.next < s.messages.size() &&
           s.inflight < ctx_->options.max_inflight_messages && !s.failed) {
      PostMessage(s, s.messages[s.next++]);
    }
    if (s.failed) {
      if (s.inflight == 0) Finish(s.id);
      return;
    }
    if (s.next < s.messages.size() || s.inflight > 0) return;
    s.phase = s.put_bytes_done > 0 ? SendPhase::kFlush : SendPhase::kCommit;
  }
  if (s.phase == SendPhase::kFlush) {
    if (!s.flush_posted) {
      s.flush_posted = true;
      PostFlush(s);
    }
    if (s.phase == SendPhase::kFlush) return;  // OnOpDone moves it on
  }
  if (s.phase == SendPhase::kCommit) {
    PostCommit(s);
    s.phase = SendPhase::kAwaitAck;
  }
  if (s.phase == SendPhase::kAwaitAck && s.acked && s.inflight == 0) {
    Finish(s.id);
  }
}

void Sender::PostMessage(SendState& s, const Message& m) {
  const bool put = s.primitive == Primitive::kPut;
  OpCtx* op = ctx_->requests.NewOp(put ? OpKind::kPut : OpKind::kData, this);
  op->send_id = s.id;
  op->bytes = m.bytes;
  ++s.inflight;
  ucp_request_param_t rp = RequestTracker::SendParams(op);
  if (m.memh != nullptr) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = m.memh;
  }
  if (put) {
    ctx_->requests.Track(
        op, ucp_put_nbx(s.peer->ep, m.local, m.bytes, m.remote_address,
                        s.ucx_rkeys[m.region], &rp));
    return;
  }
  wire::DataHeader h;
  h.sender_engine = ctx_->engine_id;
  h.send_id = s.id;
  h.rkey_tag = s.region_tags[m.region];
  h.remote_address = m.remote_address;
  h.length = m.bytes;
  h.region = m.region;
  op->header = wire::EncodeData(h, s.transfer_id);
  rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY;
  ctx_->requests.Track(
      op, ucp_am_send_nbx(s.peer->ep, wire::kAmData, op->header.data(),
                          op->header.size(), m.local, m.bytes, &rp));
}

void Sender::PostBegin(SendState& s) {
  wire::CommitHeader h;
  h.sender_engine = ctx_->engine_id;
  h.send_id = s.id;
  OpCtx* op = ctx_->requests.NewOp(OpKind::kBegin, this);
  op->send_id = s.id;
  op->header = wire::EncodeBegin(h, s.region_tags, s.transfer_id);
  ++s.inflight;
  ucp_request_param_t rp = RequestTracker::SendParams(
      op, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
  ctx_->requests.Track(
      op, ucp_am_send_nbx(s.peer->ep, wire::kAmBegin, op->header.data(),
                          op->header.size(), nullptr, 0, &rp));
}

void Sender::PostFlush(SendState& s) {
  OpCtx* op = ctx_->requests.NewOp(OpKind::kFlush, this);
  op->send_id = s.id;
  ++s.inflight;
  ucp_request_param_t rp = RequestTracker::SendParams(op);
  ctx_->requests.Track(op, ucp_ep_flush_nbx(s.peer->ep, &rp));
}

void Sender::PostCommit(SendState& s) {
  wire::CommitHeader h;
  h.sender_engine = ctx_->engine_id;
  h.send_id = s.id;
  h.am_bytes = s.am_bytes_done;
  h.put_bytes = s.put_bytes_done;
  h.messages = s.messages.size();
  OpCtx* op = ctx_->requests.NewOp(OpKind::kCommit, this);
  op->send_id = s.id;
  op->header = wire::EncodeCommit(h, s.region_tags, s.transfer_id);
  op->payload = std::move(s.commit_payload);
  ++s.inflight;
  ucp_request_param_t rp =
      RequestTracker::SendParams(op, UCP_AM_SEND_FLAG_REPLY);
  ctx_->requests.Track(
      op, ucp_am_send_nbx(s.peer->ep, wire::kAmCommit, op->header.data(),
                          op->header.size(), op->payload.data(),
                          op->payload.size(), &rp));
}

void Sender::OnOpDone(OpCtx& ctx, ucs_status_t status) {
  auto it = sends_.find(ctx.send_id);
  if (it == sends_.end()) return;
  SendState& s = *it->second;
  --s.inflight;
  if (status == UCS_OK) {
    if (ctx.kind == OpKind::kData) {
      s.am_bytes_done += ctx.bytes;
    } else if (ctx.kind == OpKind::kPut) {
      s.put_bytes_done += ctx.bytes;
    } else if (ctx.kind == OpKind::kFlush) {
      s.phase = SendPhase::kCommit;
    }
  } else {
    const char* what = ctx.kind == OpKind::kCommit  ? "sending the commit"
                       : ctx.kind == OpKind::kFlush ? "flushing puts"
                                                    : "sending data";
    Fail(
        s,
        PeerError(status,
                  absl::StrCat("transfer '", s.transfer_id, "': ", what)),
        status == UCS_ERR_CANCELED ? Reason::kCancelled : Reason::kPeerFailure);
  }
  Mark(s.id);
}

void Sender::Fail(SendState& s, absl::Status status, Reason reason) {
  if (s.failed) return;
  s.failed = true;
  s.error = std::move(status);
  s.reason = reason;
  Mark(s.id);
}

void Sender::Finish(uint64_t id) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;
  std::unique_ptr<SendState> s = std::move(it->second);
  sends_.erase(it);
  if (s->peer != nullptr) {
    for (const std::string& key : s->rkey_keys) {
      peers_->ReleaseRkey(*s->peer, key);
    }
    peers_->TrimRkeyCache(*s->peer);
  }
  for (uint64_t reg : s->registrations) registrations_->RemoveUser(reg);
  if (s->peer != nullptr) s->peer->sends.erase(id);
  const absl::Duration elapsed = Since(s->start_ns);
  if (s->failed) {
    ctx_->metrics.Failed(Direction::kSend, s->reason);
  } else {
    ctx_->metrics.Succeeded(Direction::kSend,
                            s->am_bytes_done + s->put_bytes_done, elapsed);
  }
  ctx_->publish_stats();
  if (s->done == nullptr) return;
  if (s->failed) {
    s->done(s->error);
  } else {
    SendResult r;
    r.bytes = s->am_bytes_done + s->put_bytes_done;
    r.messages = s->messages.size();
    r.elapsed = elapsed;
    r.primitive = s->primitive;
    r.transport = s->transport;
    s->done(r);
  }
}

void Sender::Cancel(uint64_t id) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;
  SendState& s = *it->second;
  Fail(s,
       absl::CancelledError(absl::StrCat("transfer '", s.transfer_id,
                                         "' was cancelled by the sender")),
       Reason::kCancelled);
  // Outstanding messages drain normally; if the peer does not drain them by
  // the send's deadline, CheckDeadlines closes the endpoint.
}

ucs_status_t Sender::AmReplyFn(void* arg, const void* header,
                               size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* p) {
  static_cast<Sender*>(arg)->OnReply(header, header_length, data, length, p);
  return UCS_OK;
}

void Sender::OnReply(const void* header, size_t header_length, const void* data,
                     size_t length, const ucp_am_recv_param_t* p) {
  ctx_->last_activity_ns = NowNanos();
  absl::StatusOr<wire::ReplyHeader> h =
      wire::DecodeReply(header, header_length);
  if (!h.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a reply: {}",
            ctx_->options.name, h.status().ToString());
    return;
  }
  auto it = sends_.find(h->send_id);
  if (it == sends_.end()) return;  // already finished (e.g. timed out)
  SendState& s = *it->second;
  std::string message;
  if (!(p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) && data != nullptr) {
    message.assign(static_cast<const char*>(data), length);
  }
  const auto code = static_cast<absl::StatusCode>(h->code);
  if (h->reply_kind == static_cast<uint8_t>(wire::ReplyKind::kAck) &&
      code == absl::StatusCode::kOk) {
    if (s.phase == SendPhase::kAwaitAck) s.acked = true;
  } else if (h->reply_kind == static_cast<uint8_t>(wire::ReplyKind::kReady) &&
             code == absl::StatusCode::kOk) {
    if (s.phase == SendPhase::kBegin) s.phase = SendPhase::kData;
  } else {
    Fail(s,
         absl::Status(
             code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : code,
             absl::StrCat("receiver rejected the transfer: ", message)),
         Reason::kRejected);
  }
  Mark(s.id);
}

}  // namespace swaserve::transfer::internal
