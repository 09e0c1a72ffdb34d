#include "lib/worker/kv_sender.h"

#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/rpc/status_conversion.h"
#include "lib/transfer/kv_destination.h"
#include "lib/worker/convert.h"

namespace swaserve::worker {

struct KvSender::Shared {
  KvSenderOptions options;
  metrics::Counter* kv_bytes = nullptr;
  metrics::CounterFamily* kv_sends = nullptr;

  // Sends the planned copies to `proto` with the commit; `shipped` once.
  static void Send(const std::shared_ptr<Shared>& self, const kv::Sequence& seq, const v1::KvDestination& proto, v1::CommitKvRequest commit,
            const std::string& worker, std::atomic<uint64_t>* bytes,
            std::function<void(absl::Status)> shipped);
};

v1::CommitKvRequest MakeCommit(const std::string& transfer_id, const PrefillResult& result) {
  v1::CommitKvRequest commit;
  commit.set_transfer_id(transfer_id);
  commit.set_num_tokens(result.prompt_tokens);
  commit.set_first_token(result.first_token.token);
  *commit.mutable_first_token_logprob() = ToProto(result.first_token);
  commit.set_cached_tokens(result.cached_tokens);
  commit.set_prefill_queue_seconds(result.queue_seconds);
  if (!result.tail_hidden.empty() && !result.last_hidden.empty()) {
    v1::Tensor* t = commit.mutable_tail_hidden_states();
    t->set_dtype(v1::DTYPE_F32);
    t->add_shape(static_cast<int64_t>(result.tail_hidden.size() / result.last_hidden.size()));
    t->add_shape(static_cast<int64_t>(result.last_hidden.size()));
    t->set_data(result.tail_hidden.data(), result.tail_hidden.size() * sizeof(float));
  }
  return commit;
}

absl::StatusOr<std::unique_ptr<KvSender>> KvSender::Create(const KvSenderOptions& options) {
  if (options.transfer == nullptr || options.pools == nullptr) {
    return absl::InvalidArgumentError("KvSender needs a transfer engine and pools");
  }
  auto shared = std::make_shared<Shared>();
  shared->options = options;
  if (options.registry != nullptr) {
    ASSIGN_OR_RETURN(auto* b, options.registry->AddCounter(
                                  "swaserve_prefill_kv_sent_bytes_total",
                                  "KV bytes shipped to decode workers (acknowledged)."));
    shared->kv_bytes = &b->WithLabels();
    ASSIGN_OR_RETURN(shared->kv_sends,
                     options.registry->AddCounter(
                         "swaserve_prefill_kv_sends_total",
                         "KV transfers to decode workers (acknowledged), by data primitive "
                         "(put: single copy into the decode worker's UCX-allocated staging; am: "
                         "active messages) and transport.",
                         {"primitive", "transport"}));
  }
  return std::unique_ptr<KvSender>(new KvSender(std::move(shared)));
}

KvSender::~KvSender() = default;

ShipFn KvSender::MakeShip(std::string transfer_id, std::string decode_worker,
                          DestinationSource destination,
                          std::atomic<uint64_t>* bytes_sent) const {
  return [shared = shared_, transfer_id = std::move(transfer_id),
          worker = std::move(decode_worker), destination = std::move(destination),
          bytes_sent](const kv::Sequence& seq, const PrefillResult& result,
                      std::function<void(absl::Status)> shipped) {
    v1::CommitKvRequest commit = MakeCommit(transfer_id, result);
    destination(shared->options.transfer_timeout,
                [shared, worker, bytes_sent, shipped, commit = std::move(commit),
                 seq = &seq](absl::StatusOr<v1::KvDestination> dest) mutable {
                  if (!dest.ok()) {
                    // A full staging budget is load, not a fault of that worker.
                    const absl::StatusCode c = dest.status().code();
                    const bool overload = c == absl::StatusCode::kDeadlineExceeded ||
                                          c == absl::StatusCode::kResourceExhausted;
                    return shipped(rpc::ErrorWithDetail(
                        absl::StatusCode::kUnavailable,
                        overload ? v1::ERROR_CODE_OVERLOADED : v1::ERROR_CODE_TRANSFER_FAILED,
                        absl::StrCat("no KV staging from decode worker ", worker, ": ",
                                     dest.status().message()),
                        worker, /*retryable=*/true));
                  }
                  Shared::Send(shared, *seq, *dest, std::move(commit), worker, bytes_sent,
                               std::move(shipped));
                });
  };
}

void KvSender::Shared::Send(const std::shared_ptr<Shared>& self, const kv::Sequence& seq, const v1::KvDestination& proto,
                            v1::CommitKvRequest commit, const std::string& worker,
                            std::atomic<uint64_t>* bytes,
                            std::function<void(absl::Status)> shipped) {
  absl::StatusOr<transfer::Destination> dest = transfer::DestinationFromProto(proto);
  if (!dest.ok()) return shipped(dest.status());
  absl::StatusOr<std::vector<transfer::PageCopy>> copies =
      transfer::PlanKvCopies(seq, *self->options.pools, proto);
  if (!copies.ok()) return shipped(copies.status());
  transfer::SendRequest send;
  send.destination = *std::move(dest);
  send.copies = *std::move(copies);
  send.commit_payload = transfer::EncodeCommitPayload(commit);
  send.timeout = self->options.transfer_timeout;
  self->options.transfer->Send(
      std::move(send), [self, shipped, bytes, worker](absl::StatusOr<transfer::SendResult> r) {
        if (!r.ok()) {
          return shipped(rpc::ErrorWithDetail(
              r.status().code(), v1::ERROR_CODE_TRANSFER_FAILED,
              absl::StrCat("KV transfer to decode worker ", worker, " failed: ",
                           r.status().message()),
              worker, /*retryable=*/true));
        }
        if (bytes != nullptr) bytes->store(r->bytes);
        if (self->kv_bytes != nullptr) self->kv_bytes->Increment(r->bytes);
        if (self->kv_sends != nullptr) {
          self->kv_sends
              ->WithLabels({std::string(transfer::PrimitiveName(r->primitive)),
                            std::string(transfer::TransportName(r->transport))})
              .Increment();
        }
        SWA_LOG(debug, "KV transfer to {}: {} bytes, {} messages, {} over {}, {}", worker,
                r->bytes, r->messages, std::string(transfer::PrimitiveName(r->primitive)),
                std::string(transfer::TransportName(r->transport)),
                absl::FormatDuration(r->elapsed));
        shipped(absl::OkStatus());
      });
}

}  // namespace swaserve::worker
