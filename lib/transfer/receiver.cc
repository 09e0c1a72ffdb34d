#include "lib/transfer/receiver.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/transfer/ucx_util.h"

namespace swaserve::transfer::internal {
namespace {

std::string UnknownTransferMessage(absl::string_view id) {
  return absl::StrCat(
      "the receiver expects no transfer '", id,
      "' (never announced, or finished longer ago than finished_linger): the "
      "decode worker must call ExpectTransfer first and hand out the "
      "KvDestination it returns");
}

}  // namespace

absl::Status Receiver::RegisterHandlers(ucp_worker_h worker) {
  RETURN_IF_ERROR(
      SetAmHandler(worker, wire::kAmData, &Receiver::AmDataFn, this));
  RETURN_IF_ERROR(
      SetAmHandler(worker, wire::kAmCommit, &Receiver::AmCommitFn, this));
  return SetAmHandler(worker, wire::kAmBegin, &Receiver::AmBeginFn, this);
}

const ReceiveState* Receiver::Find(const std::string& id) const {
  auto it = receives_.find(id);
  return it == receives_.end() ? nullptr : it->second.get();
}

absl::Status Receiver::Validate(const ReceiveRequest& request) {
  RETURN_IF_ERROR(wire::CheckTransferId(request.transfer_id));
  if (request.regions.empty() || request.regions.size() > wire::kMaxRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", request.transfer_id, "' has ", request.regions.size(),
        " regions; 1..", wire::kMaxRegions, " are allowed"));
  }
  uint64_t capacity = 0;
  for (size_t i = 0; i < request.regions.size(); ++i) {
    const LocalRegion& lr = request.regions[i];
    if (lr.registration == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer '", request.transfer_id, "': region ", i,
          " has no registration (Register the staging memory first)"));
    }
    if (lr.offset > lr.registration->size() ||
        lr.length > lr.registration->size() - lr.offset || lr.length == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transfer '%s': region %d [%d, +%d) is empty or outside its "
          "registration of %d bytes",
          request.transfer_id, i, lr.offset, lr.length,
          lr.registration->size()));
    }
    capacity += lr.length;
  }
  if (request.expected_bytes > capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "transfer '%s' expects %d bytes but its regions hold only %d",
        request.transfer_id, request.expected_bytes, capacity));
  }
  return absl::OkStatus();
}

absl::StatusOr<Destination> Receiver::Expect(const ReceiveRequest& request,
                                             const std::vector<RegionRef>& refs,
                                             ReceiveCallback done) {
  if (ctx_->shutting_down) {
    return absl::FailedPreconditionError(
        "the transfer engine is shutting down");
  }
  auto existing = receives_.find(request.transfer_id);
  if (existing != receives_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "transfer id '", request.transfer_id, "' is ",
        existing->second->finished ? "recently finished" : "already pending",
        " on this engine: transfer ids must be unique"));
  }
  auto r = std::make_unique<ReceiveState>();
  r->id = request.transfer_id;
  r->expected = request.expected_bytes;
  r->done = std::move(done);
  r->start_ns = NowNanos();
  const absl::Duration timeout = request.timeout > absl::ZeroDuration()
                                     ? request.timeout
                                     : ctx_->options.default_timeout;
  r->deadline_ns = r->start_ns + DurationNanos(timeout);
  Destination dest;
  dest.transfer_id = request.transfer_id;
  dest.worker_address = ctx_->framed_address;
  for (size_t i = 0; i < request.regions.size(); ++i) {
    const LocalRegion& lr = request.regions[i];
    const RegionRec* rec = registrations_->Find(refs[i].registration);
    if (rec == nullptr || rec->releasing || !refs[i].this_engine) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer '", request.transfer_id, "': region ", i,
          " uses a registration of another engine or one being released"));
    }
    Slot slot;
    slot.data = rec->data + lr.offset;
    slot.length = lr.length;
    do {
      slot.tag = ctx_->rng();
    } while (slot.tag == 0);
    slot.memh = rec->memh;
    slot.registration = rec->id;
    r->regions.push_back(slot);
    RemoteRegion rr;
    rr.pool = lr.pool;
    rr.base_address = reinterpret_cast<uint64_t>(slot.data);
    rr.length = slot.length;
    rr.rkey = wire::PackRkey(
        wire::Rkey{slot.tag, rr.base_address, rr.length, rec->ucx_rkey,
                   rec->allocated ? wire::kRkeyUcxAllocated : 0});
    dest.regions.push_back(std::move(rr));
  }
  for (const Slot& slot : r->regions) {
    registrations_->AddUser(slot.registration);
  }
  ctx_->next_deadline_ns = std::min(ctx_->next_deadline_ns, r->deadline_ns);
  receives_.emplace(r->id, std::move(r));
  ++pending_;
  ctx_->metrics.Started(Direction::kReceive);
  ctx_->publish_stats();
  return dest;
}

absl::Status Receiver::Cancel(const std::string& id) {
  auto it = receives_.find(id);
  if (it == receives_.end() || it->second->finished) {
    return absl::NotFoundError(absl::StrCat("no pending transfer '", id, "'"));
  }
  Fail(*it->second,
       absl::CancelledError(
           absl::StrCat("transfer '", id, "' was cancelled by the receiver")),
       Reason::kCancelled);
  return absl::OkStatus();
}

void Receiver::FailAll(const absl::Status& why) {
  std::vector<ReceiveState*> draining;
  for (auto& [id, r] : receives_) {
    if (!r->finished) Fail(*r, why, Reason::kCancelled);
    if (r->inflight > 0) draining.push_back(r.get());
  }
  for (ReceiveState* r : draining) ForceCloseReplyEps(*r, why);
}

void Receiver::OnSenderClosed(uint64_t engine, ucp_ep_h ep,
                              const absl::Status& why) {
  if (!absl::IsCancelled(why)) {
    std::vector<ReceiveState*> failed;
    for (auto& [id, r] : receives_) {
      if (r->finished || r->failed || !r->senders.contains(engine)) continue;
      Fail(*r, base::Annotate(why, absl::StrCat("transfer '", id, "'")),
           Reason::kPeerFailure);
      failed.push_back(r.get());
    }
    for (ReceiveState* r : failed) {
      r->reply_eps.erase(ep);
      if (r->inflight > 0) ForceCloseReplyEps(*r, r->error);
    }
  }
  for (auto& [id, r] : receives_) r->reply_eps.erase(ep);
}

void Receiver::FailReceivesUsing(uint64_t registration,
                                 const absl::Status& why) {
  for (auto& [rid, r] : receives_) {
    if (r->finished || r->failed) continue;
    for (const Slot& slot : r->regions) {
      if (slot.registration == registration) {
        Fail(*r, why, Reason::kCancelled);
        break;
      }
    }
  }
}

void Receiver::CheckDeadlines(int64_t now) {
  std::vector<std::string> expired;
  for (auto& [id, r] : receives_) {
    if (r->finished) {
      if (now >= r->linger_until_ns && r->inflight == 0) expired.push_back(id);
      continue;
    }
    if (r->failed) {
      // Failed (cancelled, rejected) with receives still outstanding past
      // its deadline: stop waiting for the sender.
      if (r->inflight > 0 && now >= r->deadline_ns) {
        ForceCloseReplyEps(*r, r->error);
      }
      continue;
    }
    if (now >= r->deadline_ns) {
      Fail(*r,
           absl::DeadlineExceededError(absl::StrFormat(
               "transfer '%s' was not committed within %s (%d of %d bytes "
               "received, %d receives outstanding): the sender is slow, died, "
               "or never got the KvDestination",
               id, absl::FormatDuration(Since(r->start_ns)), r->received,
               r->expected, r->inflight)),
           Reason::kTimeout);
      if (r->inflight > 0) ForceCloseReplyEps(*r, r->error);
    } else {
      ctx_->next_deadline_ns = std::min(ctx_->next_deadline_ns, r->deadline_ns);
    }
  }
  for (const std::string& id : expired) receives_.erase(id);
}

void Receiver::CheckDirty() {
  if (dirty_.empty()) return;
  auto dirty = std::move(dirty_);
  dirty_.clear();
  for (const std::string& id : dirty) {
    auto it = receives_.find(id);
    if (it != receives_.end()) Check(*it->second);
  }
}

void Receiver::NoteSender(ReceiveState& r, uint64_t engine,
                          const ucp_am_recv_param_t* p) {
  r.senders.insert(engine);
  if ((p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
      p->reply_ep != nullptr) {
    r.reply_eps.insert(p->reply_ep);
  }
  if (!r.started) {
    r.started = true;
    ++started_;
  }
}

bool Receiver::TagsMatch(const ReceiveState& r,
                         const std::vector<uint64_t>& tags) {
  bool tags_ok = tags.size() == r.regions.size();
  for (size_t i = 0; tags_ok && i < r.regions.size(); ++i) {
    tags_ok = tags[i] == r.regions[i].tag;
  }
  return tags_ok;
}

ucs_status_t Receiver::AmDataFn(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* p) {
  return static_cast<Receiver*>(arg)->OnData(header, header_length, data,
                                             length, p);
}

absl::Status Receiver::CheckDataHeader(const ReceiveState& r,
                                       const wire::DataHeader& h,
                                       size_t length) const {
  if (h.region >= r.regions.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer '", r.id, "': a data message names region ",
                     h.region, " but the transfer has ", r.regions.size()));
  }
  if (h.rkey_tag != r.regions[h.region].tag) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", r.id, "': the rkey of region ", h.region,
        " does not belong to this transfer (tag mismatch): the sender used a "
        "stale or foreign KvDestination; fetch it again from the decode "
        "worker"));
  }
  if (h.length != length) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer '", r.id, "': a data message declares ",
                     h.length, " bytes but carries ", length));
  }
  const Slot& slot = r.regions[h.region];
  const uint64_t base = reinterpret_cast<uint64_t>(slot.data);
  if (h.remote_address < base || h.remote_address - base > slot.length ||
      length > slot.length - (h.remote_address - base)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "transfer '%s': a data message writes [0x%x, +%d), outside region "
        "%d [0x%x, +%d): the sender's page list does not match the "
        "destination",
        r.id, h.remote_address, length, h.region, base, slot.length));
  }
  return absl::OkStatus();
}

ucs_status_t Receiver::OnData(const void* header, size_t header_length,
                              void* data, size_t length,
                              const ucp_am_recv_param_t* p) {
  ctx_->last_activity_ns = NowNanos();
  absl::StatusOr<wire::DecodedData> d = wire::DecodeData(header, header_length);
  if (!d.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a data message: {}",
            ctx_->options.name, d.status().ToString());
    return UCS_OK;
  }
  const wire::DataHeader& h = d->header;
  auto reject = [&](absl::Status status) {
    QueueReply(h.sender_engine, h.send_id, wire::ReplyKind::kReject,
               std::move(status));
    return UCS_OK;  // drops the data; the sender's request completes
  };
  auto it = receives_.find(d->transfer_id);
  if (it == receives_.end()) {
    return reject(absl::NotFoundError(UnknownTransferMessage(d->transfer_id)));
  }
  ReceiveState& r = *it->second;
  if (r.finished) {
    return reject(r.outcome.ok()
                      ? absl::FailedPreconditionError(absl::StrCat(
                            "transfer '", r.id,
                            "' is already complete; data after the commit is "
                            "not accepted"))
                      : r.outcome);
  }
  if (r.failed) return reject(r.error);
  if (absl::Status invalid = CheckDataHeader(r, h, length); !invalid.ok()) {
    Fail(r, invalid, Reason::kRejected);
    return reject(invalid);
  }
  NoteSender(r, h.sender_engine, p);
  const Slot& slot = r.regions[h.region];
  auto* dst = reinterpret_cast<void*>(h.remote_address);
  if (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    OpCtx* op = ctx_->requests.NewOp(OpKind::kRecvData, this);
    op->receive_id = r.id;
    op->bytes = length;
    ++r.inflight;
    ucp_request_param_t rp = RequestTracker::RecvParams(op);
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = slot.memh;
    ctx_->requests.Track(
        op, ucp_am_recv_data_nbx(ctx_->worker, data, dst, length, &rp));
    return UCS_INPROGRESS;
  }
  std::memcpy(dst, data, length);
  r.received += length;
  return UCS_OK;
}

ucs_status_t Receiver::AmCommitFn(void* arg, const void* header,
                                  size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* p) {
  return static_cast<Receiver*>(arg)->OnCommit(header, header_length, data,
                                               length, p);
}

ucs_status_t Receiver::OnCommit(const void* header, size_t header_length,
                                void* data, size_t length,
                                const ucp_am_recv_param_t* p) {
  ctx_->last_activity_ns = NowNanos();
  absl::StatusOr<wire::DecodedCommit> c =
      wire::DecodeCommit(header, header_length);
  if (!c.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a commit: {}",
            ctx_->options.name, c.status().ToString());
    return UCS_OK;
  }
  const wire::CommitHeader& h = c->header;
  auto ack = [&](absl::Status status) {
    QueueReply(h.sender_engine, h.send_id, wire::ReplyKind::kAck,
               std::move(status));
    return UCS_OK;
  };
  auto it = receives_.find(c->transfer_id);
  if (it == receives_.end()) {
    return ack(absl::NotFoundError(UnknownTransferMessage(c->transfer_id)));
  }
  ReceiveState& r = *it->second;
  if (r.finished) {
    return ack(r.outcome.ok() ? absl::FailedPreconditionError(absl::StrCat(
                                    "transfer '", r.id,
                                    "' was already committed by another send"))
                              : r.outcome);
  }
  if (r.failed) return ack(r.error);
  if (r.committed || r.commit_receiving) {
    return ack(absl::FailedPreconditionError(
        absl::StrCat("transfer '", r.id, "' was already committed")));
  }
  if (!TagsMatch(r, c->region_tags)) {
    absl::Status invalid = absl::InvalidArgumentError(absl::StrCat(
        "transfer '", r.id,
        "': the commit carries rkeys that do not belong to this transfer: the "
        "sender used a stale or foreign KvDestination; fetch it again from "
        "the decode worker"));
    Fail(r, invalid, Reason::kRejected);
    r.commit_engine = h.sender_engine;
    r.commit_send_id = h.send_id;
    r.committed = true;  // so Finish acks the error
    return UCS_OK;
  }
  r.senders.insert(h.sender_engine);
  if (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    if ((p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
        p->reply_ep != nullptr) {
      r.reply_eps.insert(p->reply_ep);
    }
    OpCtx* op = ctx_->requests.NewOp(OpKind::kRecvCommit, this);
    op->receive_id = r.id;
    op->bytes = length;
    op->payload.resize(length);
    op->commit = *std::move(c);
    ++r.inflight;
    r.commit_receiving = true;
    ucp_request_param_t rp = RequestTracker::RecvParams(op);
    ctx_->requests.Track(
        op, ucp_am_recv_data_nbx(ctx_->worker, data, op->payload.data(), length,
                                 &rp));
    return UCS_INPROGRESS;
  }
  ApplyCommit(r, *c,
              std::string(static_cast<const char*>(data), data ? length : 0));
  return UCS_OK;
}

void Receiver::ApplyCommit(ReceiveState& r, const wire::DecodedCommit& commit,
                           std::string payload) {
  r.committed = true;
  r.payload = std::move(payload);
  r.declared_am_bytes = commit.header.am_bytes;
  r.put_bytes = commit.header.put_bytes;
  r.commit_engine = commit.header.sender_engine;
  r.commit_send_id = commit.header.send_id;
  Mark(r.id);
}

ucs_status_t Receiver::AmBeginFn(void* arg, const void* header,
                                 size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* p) {
  static_cast<Receiver*>(arg)->OnBegin(header, header_length, p);
  return UCS_OK;
}

void Receiver::OnBegin(const void* header, size_t header_length,
                       const ucp_am_recv_param_t* p) {
  ctx_->last_activity_ns = NowNanos();
  absl::StatusOr<wire::DecodedCommit> b =
      wire::DecodeBegin(header, header_length);
  if (!b.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a begin: {}",
            ctx_->options.name, b.status().ToString());
    return;
  }
  const wire::CommitHeader& h = b->header;
  auto reply = [&](wire::ReplyKind kind, absl::Status status) {
    QueueReply(h.sender_engine, h.send_id, kind, std::move(status));
  };
  auto it = receives_.find(b->transfer_id);
  if (it == receives_.end()) {
    reply(wire::ReplyKind::kReject,
          absl::NotFoundError(UnknownTransferMessage(b->transfer_id)));
    return;
  }
  ReceiveState& r = *it->second;
  if (r.finished) {
    reply(wire::ReplyKind::kReject,
          r.outcome.ok() ? absl::FailedPreconditionError(absl::StrCat(
                               "transfer '", r.id, "' is already complete"))
                         : r.outcome);
    return;
  }
  if (r.failed) {
    reply(wire::ReplyKind::kReject, r.error);
    return;
  }
  if (!TagsMatch(r, b->region_tags)) {
    absl::Status invalid = absl::InvalidArgumentError(absl::StrCat(
        "transfer '", r.id,
        "': the sender's rkeys do not belong to this transfer: it used a "
        "stale or foreign KvDestination; fetch it again from the decode "
        "worker"));
    Fail(r, invalid, Reason::kRejected);
    reply(wire::ReplyKind::kReject, invalid);
    return;
  }
  NoteSender(r, h.sender_engine, p);
  reply(wire::ReplyKind::kReady, absl::OkStatus());
}

void Receiver::OnOpDone(OpCtx& ctx, ucs_status_t status) {
  if (ctx.kind == OpKind::kReply) {
    if (status != UCS_OK && status != UCS_ERR_CANCELED) {
      SWA_LOG(debug, "transfer control message failed: {}",
              ucs_status_string(status));
    }
    return;
  }
  auto it = receives_.find(ctx.receive_id);
  if (it == receives_.end()) return;
  ReceiveState& r = *it->second;
  --r.inflight;
  if (ctx.kind == OpKind::kRecvData) {
    if (status == UCS_OK) {
      r.received += ctx.bytes;
    } else if (!r.finished) {
      Fail(r,
           PeerError(status,
                     absl::StrCat("transfer '", r.id, "': receiving data")),
           Reason::kPeerFailure);
    }
  } else {
    r.commit_receiving = false;
    if (status == UCS_OK && !r.finished && !r.failed) {
      ApplyCommit(r, ctx.commit, std::move(ctx.payload));
    } else if (status != UCS_OK && !r.finished) {
      Fail(r,
           PeerError(status, absl::StrCat("transfer '", r.id,
                                          "': receiving the commit")),
           Reason::kPeerFailure);
    }
  }
  Mark(r.id);
}

void Receiver::Check(ReceiveState& r) {
  if (r.finished) return;
  if (r.failed) {
    if (r.inflight == 0) Finish(r);
    return;
  }
  if (!r.committed || r.inflight > 0) return;
  if (r.declared_am_bytes != r.received) {
    Fail(r,
         absl::FailedPreconditionError(absl::StrFormat(
             "transfer '%s': the sender committed %d bytes of data "
             "messages but %d arrived",
             r.id, r.declared_am_bytes, r.received)),
         Reason::kRejected);
  } else if (r.received + r.put_bytes != r.expected) {
    Fail(r,
         absl::FailedPreconditionError(absl::StrFormat(
             "transfer '%s': the sender wrote %d bytes but the "
             "receiver expects %d: both sides must plan from the same "
             "KvDestination (token count, page size, window)",
             r.id, r.received + r.put_bytes, r.expected)),
         Reason::kRejected);
  }
  Finish(r);
}

void Receiver::Fail(ReceiveState& r, absl::Status status, Reason reason) {
  if (r.finished || r.failed) return;
  r.failed = true;
  r.error = std::move(status);
  r.reason = reason;
  Mark(r.id);
}

void Receiver::Finish(ReceiveState& r) {
  if (r.finished) return;
  r.finished = true;
  --pending_;
  if (r.started) --started_;
  r.linger_until_ns = NowNanos() + DurationNanos(ctx_->options.finished_linger);
  for (const Slot& slot : r.regions) {
    registrations_->RemoveUser(slot.registration);
  }
  r.regions.clear();
  r.reply_eps.clear();
  const absl::Duration elapsed = Since(r.start_ns);
  r.outcome = r.failed ? r.error : absl::OkStatus();
  if (r.committed) {
    QueueReply(r.commit_engine, r.commit_send_id, wire::ReplyKind::kAck,
               r.outcome);
  }
  if (r.failed) {
    ctx_->metrics.Failed(Direction::kReceive, r.reason);
  } else {
    ctx_->metrics.Succeeded(Direction::kReceive, r.received + r.put_bytes,
                            elapsed);
  }
  ctx_->publish_stats();
  ReceiveCallback done = std::move(r.done);
  r.done = nullptr;
  if (done == nullptr) return;
  if (r.failed) {
    done(r.error);
  } else {
    ReceivedTransfer t;
    t.transfer_id = r.id;
    t.bytes = r.received + r.put_bytes;
    t.commit_payload = std::move(r.payload);
    t.elapsed = elapsed;
    done(std::move(t));
  }
}

void Receiver::ForceCloseReplyEps(ReceiveState& r, const absl::Status& why) {
  std::vector<ucp_ep_h> eps(r.reply_eps.begin(), r.reply_eps.end());
  // Forget them everywhere first, so that closing one (which may fail other
  // receives and force-close theirs) never reaches them again.
  for (auto& [id, other] : receives_) {
    for (ucp_ep_h ep : eps) other->reply_eps.erase(ep);
  }
  for (ucp_ep_h ep : eps) {
    // The endpoint may be one we own (UCX pairs our endpoint back to a
    // sender, or to a receiver we send to, with the sender's connection).
    std::shared_ptr<BackEp> back = peers_->BackEpWithEp(ep);
    std::shared_ptr<Peer> peer = peers_->PeerWithEp(ep);
    if (back != nullptr) {
      peers_->CloseBackEp(back, why);
    } else if (peer != nullptr) {
      peers_->ClosePeer(peer, why);
    } else {
      SWA_LOG(debug,
              "transfer engine '{}': force-closing the endpoint of transfer "
              "'{}' ({} receives outstanding): {}",
              ctx_->options.name, r.id, r.inflight, why.ToString());
      peers_->CloseEp(ep, nullptr, nullptr);
    }
  }
}

void Receiver::QueueReply(uint64_t engine, uint64_t send_id,
                          wire::ReplyKind kind, absl::Status status) {
  pending_replies_.push_back(PendingReply{engine, send_id, kind, status});
}

void Receiver::SendPendingReplies() {
  if (pending_replies_.empty()) return;
  auto replies = std::move(pending_replies_);
  pending_replies_.clear();
  for (const PendingReply& r : replies) SendReply(r);
}

void Receiver::SendReply(const PendingReply& reply) {
  std::shared_ptr<BackEp> back = peers_->FindBackEp(reply.engine);
  if (back == nullptr || back->ep == nullptr) {
    SWA_LOG(warn,
            "transfer engine '{}': no endpoint back to sender {} (its hello "
            "was lost or it failed); it will time out",
            ctx_->options.name, Hex(reply.engine));
    return;
  }
  wire::ReplyHeader h;
  h.send_id = reply.send_id;
  h.code = static_cast<uint32_t>(reply.status.code());
  h.reply_kind = static_cast<uint8_t>(reply.kind);
  OpCtx* op = ctx_->requests.NewOp(OpKind::kReply, this);
  op->header = wire::EncodeReply(h);
  op->payload = std::string(reply.status.message().substr(0, 2048));
  ucp_request_param_t rp =
      RequestTracker::SendParams(op, UCP_AM_SEND_FLAG_EAGER);
  const ucp_ep_h ep = back->ep;
  op->back = std::move(back);
  ctx_->requests.Track(
      op,
      ucp_am_send_nbx(ep, wire::kAmReply, op->header.data(), op->header.size(),
                      op->payload.data(), op->payload.size(), &rp));
}

}  // namespace swaserve::transfer::internal
