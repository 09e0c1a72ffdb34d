#include "services/worker/prefill_service.h"

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/status.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/async_unary.h"
#include "lib/rpc/status_conversion.h"
#include "lib/worker/convert.h"
#include "services/worker/load_reply.h"
#include "swaserve/v1/encoder.grpc.pb.h"

namespace swaserve::worker_service {

// gRPC stubs of one service by address, created on first use. Thread-safe.
template <typename Service>
class StubCache {
 public:
  absl::StatusOr<typename Service::Stub*> For(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto it = stubs_.find(address);
    if (it != stubs_.end()) return it->second.get();
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, rpc::CreateChannel(address));
    auto stub = Service::NewStub(channel);
    typename Service::Stub* raw = stub.get();
    stubs_.emplace(address, std::move(stub));
    return raw;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<typename Service::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

struct PrefillService::Shared {
  PrefillServiceOptions options;
  absl::Mutex mu;
  std::mt19937_64 seeds ABSL_GUARDED_BY(mu){std::random_device{}()};
  std::atomic<bool> draining{false};
  StubCache<v1::Decode> decode_stubs;
  StubCache<v1::Encoder> encoder_stubs;  // by-reference embeddings (Encoder.Fetch)

  uint64_t NextSeed() {
    absl::MutexLock lock(&mu);
    return seeds();
  }
  absl::StatusOr<v1::Decode::Stub*> StubFor(const std::string& address) {
    return decode_stubs.For(address);
  }
  absl::StatusOr<v1::Encoder::Stub*> EncoderStubFor(const std::string& address) {
    return encoder_stubs.For(address);
  }
};

namespace {

using Shared = PrefillService::Shared;

// The values of multimodal item `index`, sent by reference: streamed from
// its encoder (Encoder.Fetch). Any failure (evicted, encoder gone, short
// answer) is ERROR_CODE_EMBEDDINGS_UNAVAILABLE: the router encodes the item
// again inline and retries; it is not this worker's fault.
absl::Status FetchEmbeddings(Shared& shared, int index, v1::MultimodalItem* item) {
  const std::string& me = shared.options.worker_id;
  auto unavailable = [&](absl::string_view why) {
    return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable,
                                v1::ERROR_CODE_EMBEDDINGS_UNAVAILABLE,
                                absl::StrCat("multimodal item ", index, ": fetching its embeddings "
                                             "from encoder ", item->embeddings_address(), ": ",
                                             why),
                                me, /*retryable=*/true);
  };
  const v1::Tensor& t = item->embeddings();
  if (t.shape_size() != 2 || t.shape(0) <= 0 || t.shape(1) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("multimodal item ", index, ": a by-reference embedding needs its shape"));
  }
  absl::StatusOr<v1::Encoder::Stub*> stub = shared.EncoderStubFor(item->embeddings_address());
  if (!stub.ok()) return unavailable(stub.status().message());
  const size_t row_bytes = static_cast<size_t>(t.shape(1)) * sizeof(float);
  const size_t expected = static_cast<size_t>(t.shape(0)) * row_bytes;
  std::string data;
  data.reserve(expected);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::FetchRequest req;
  req.set_content_hash(item->content_hash());
  std::unique_ptr<grpc::ClientReader<v1::FetchChunk>> reader = (*stub)->Fetch(&ctx, req);
  v1::FetchChunk chunk;
  bool in_order = true;
  while (reader->Read(&chunk)) {
    if (static_cast<size_t>(chunk.first_row()) * row_bytes != data.size() ||
        data.size() + chunk.rows().data().size() > expected) {
      in_order = false;
      ctx.TryCancel();
      break;
    }
    data += chunk.rows().data();
  }
  const grpc::Status s = reader->Finish();
  if (!in_order) return unavailable("chunks out of order or too long");
  if (!s.ok()) return unavailable(s.error_message());
  if (data.size() != expected) {
    return unavailable(absl::StrCat(data.size(), " bytes, ", expected, " expected"));
  }
  item->mutable_embeddings()->set_data(std::move(data));
  item->clear_embeddings_address();
  return absl::OkStatus();
}

class PrefillCall final : public grpc::ServerUnaryReactor {
 public:
  PrefillCall(std::shared_ptr<Shared> shared, grpc::CallbackServerContext* context,
              const v1::PrefillRequest* request, v1::PrefillResponse* response)
      : shared_(std::move(shared)), request_(request), response_(response) {
    absl::Status st = Begin();
    if (!st.ok()) FinishOnce(rpc::ToGrpcStatus(st));
  }

  void OnCancel() override { shared_->options.core->Cancel(request_->request_id()); }
  void OnDone() override { delete this; }

 private:
  // Starts the call; with by-reference embeddings their fetch and the rest
  // of Start run on a thread of their own (never a gRPC callback thread).
  absl::Status Begin() {
    bool by_reference = false;
    for (const v1::MultimodalItem& m : request_->multimodal()) {
      by_reference |= !m.embeddings_address().empty() && m.embeddings().data().empty();
    }
    if (!by_reference) return Start({});
    std::thread([this] {
      std::vector<v1::MultimodalItem> items(request_->multimodal().begin(),
                                            request_->multimodal().end());
      absl::Status st;
      for (int i = 0; i < static_cast<int>(items.size()) && st.ok(); ++i) {
        if (!items[i].embeddings_address().empty()) st = FetchEmbeddings(*shared_, i, &items[i]);
      }
      if (st.ok()) st = Start(std::move(items));
      if (!st.ok()) FinishOnce(rpc::ToGrpcStatus(st));
    }).detach();
    return absl::OkStatus();
  }

  absl::Status Start(std::vector<v1::MultimodalItem> fetched) {
    const v1::PrefillRequest& req = *request_;
    if (shared_->draining.load()) {
      return rpc::ErrorWithDetail(
          absl::StatusCode::kUnavailable, v1::ERROR_CODE_DRAINING,
          absl::StrCat("prefill worker ", shared_->options.worker_id, " is draining"),
          shared_->options.worker_id, /*retryable=*/true);
    }
    if (req.request_id().empty()) return absl::InvalidArgumentError("request_id is required");
    if (req.token_ids().empty()) return absl::InvalidArgumentError("token_ids is required");
    ASSIGN_OR_RETURN(sampling_, worker::ToSamplingOptions(req.sampling(), shared_->NextSeed(),
                                                          shared_->options.constraints));
    worker::PrefillJob job;
    job.id = req.request_id();
    job.prompt.assign(req.token_ids().begin(), req.token_ids().end());
    // Multimodal placeholders with their encoder embeddings;
    // `fetched` holds the values of by-reference items.
    for (int i = 0; i < req.multimodal_size(); ++i) {
      const v1::MultimodalItem& item = fetched.empty() ? req.multimodal(i) : fetched[i];
      ASSIGN_OR_RETURN(worker::PrefillMultimodal m,
                       worker::ToPrefillMultimodal(item, i, shared_->options.hidden_size));
      job.multimodal.push_back(std::move(m));
    }
    job.sampling = sampling_;
    job.priority = req.priority();
    job.page_hash_seed = req.page_hash_seed();
    for (const v1::CachePin& pin : req.cache_pins()) {
      job.cache_pins.push_back({.tokens = static_cast<int>(std::min<uint32_t>(pin.tokens(), INT32_MAX)),
                                .ttl = absl::Seconds(pin.ttl_seconds())});
    }
    if (req.has_decode()) {
      const v1::DecodeTarget& target = req.decode();
      if (target.grpc_address().empty() || target.transfer_id().empty()) {
        return absl::InvalidArgumentError("decode target needs grpc_address and transfer_id");
      }
      ASSIGN_OR_RETURN(v1::Decode::Stub * stub, shared_->StubFor(target.grpc_address()));
      job.ship = shared_->options.sender->MakeShip(target.transfer_id(), target.worker_id(),
                                                   AskDestination(stub, target.transfer_id()),
                                                   &bytes_sent_);
    }
    job.done = [this](absl::StatusOr<worker::PrefillResult> r) {
      if (!r.ok()) {
        FinishOnce(rpc::ToGrpcStatus(r.status()));
        return;
      }
      response_->set_request_id(request_->request_id());
      response_->set_first_token(r->first_token.token);
      response_->set_cached_tokens(r->cached_tokens);
      response_->set_computed_tokens(r->computed_tokens);
      response_->set_kv_bytes_sent(bytes_sent_.load());
      response_->set_queue_seconds(r->queue_seconds);
      response_->set_compute_seconds(r->compute_seconds);
      response_->set_transfer_seconds(r->transfer_seconds);
      FinishOnce(grpc::Status::OK);
    };
    absl::Status st = shared_->options.core->Submit(std::move(job));
    return ClassifySubmitError(st);
  }

  // A Submit error with the taxonomy's detail: request errors (too long for
  // this bucket, too large for the pools, invalid input) are not retryable
  // and never count against this worker's health; a stopping core is
  // draining (retry elsewhere).
  absl::Status ClassifySubmitError(const absl::Status& st) const {
    if (st.ok()) return st;
    const std::string& me = shared_->options.worker_id;
    switch (st.code()) {
      case absl::StatusCode::kOutOfRange:
        return rpc::ErrorWithDetail(st.code(), v1::ERROR_CODE_PROMPT_TOO_LONG,
                                    std::string(st.message()), me, /*retryable=*/false);
      case absl::StatusCode::kResourceExhausted:
        return rpc::ErrorWithDetail(st.code(), v1::ERROR_CODE_TOO_LARGE_FOR_WORKER,
                                    std::string(st.message()), me, /*retryable=*/false);
      case absl::StatusCode::kInvalidArgument:
        return rpc::ErrorWithDetail(st.code(), v1::ERROR_CODE_INVALID_REQUEST,
                                    std::string(st.message()), me, /*retryable=*/false);
      case absl::StatusCode::kFailedPrecondition:
        return rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_DRAINING,
                                    std::string(st.message()), me, /*retryable=*/true);
      default:
        return st;
    }
  }

  // Decode.GetKvDestination of the decode target, for the KV sender.
  static worker::DestinationSource AskDestination(v1::Decode::Stub* stub,
                                                  std::string transfer_id) {
    return [stub, transfer_id](absl::Duration timeout, worker::DestinationFn done) {
      v1::GetKvDestinationRequest request;
      request.set_transfer_id(transfer_id);
      rpc::CallUnary<v1::GetKvDestinationRequest, v1::KvDestination>(
          std::move(request), timeout,
          [stub](grpc::ClientContext* ctx, const v1::GetKvDestinationRequest* req,
                 v1::KvDestination* resp, std::function<void(grpc::Status)> cb) {
            stub->async()->GetKvDestination(ctx, req, resp, std::move(cb));
          },
          [done = std::move(done)](grpc::Status s, v1::KvDestination d) {
            if (!s.ok()) return done(rpc::FromGrpcStatus(s));
            done(std::move(d));
          });
    };
  }

  void FinishOnce(const grpc::Status& s) {
    if (finished_.exchange(true)) return;
    Finish(s);
  }

  std::shared_ptr<Shared> shared_;
  const v1::PrefillRequest* request_;
  v1::PrefillResponse* response_;
  model::SamplingOptions sampling_;
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<bool> finished_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<PrefillService>> PrefillService::Create(
    const PrefillServiceOptions& options) {
  if (options.core == nullptr || options.sender == nullptr || options.pools == nullptr) {
    return absl::InvalidArgumentError("PrefillService needs a core, a KV sender and pools");
  }
  auto shared = std::make_shared<Shared>();
  shared->options = options;
  return std::unique_ptr<PrefillService>(new PrefillService(std::move(shared)));
}

PrefillService::~PrefillService() = default;

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  return new PrefillCall(shared_, context, request, response);
}

void PrefillService::StartDraining() { shared_->draining.store(true); }

v1::WorkerLoad PrefillService::Load() const {
  const worker::PrefillLoad l = shared_->options.core->GetLoad();
  v1::WorkerLoad w = worker::PoolLoad(shared_->options.worker_id, v1::ROLE_PREFILL, *shared_->options.pools);
  w.set_queued_requests(l.queued_requests);
  w.set_queued_uncached_tokens(l.queued_uncached_tokens);
  w.set_prefill_tokens_per_second(l.prefill_tokens_per_second);
  w.set_running_requests(l.running_requests);
  return w;
}

grpc::ServerUnaryReactor* PrefillService::GetLoad(grpc::CallbackServerContext* context,
                                                  const v1::GetLoadRequest*,
                                                  v1::WorkerLoad* response) {
  return FinishWithLoad(context, Load(), response);
}

grpc::ServerUnaryReactor* PrefillService::GetProgress(grpc::CallbackServerContext* context,
                                                      const v1::GetPrefillProgressRequest* request,
                                                      v1::PrefillProgress* response) {
  using State = worker::PrefillProgress::State;
  if (std::optional<worker::PrefillProgress> p =
          shared_->options.core->Progress(request->request_id())) {
    response->set_found(true);
    response->set_state(p->state == State::kQueued      ? v1::PrefillProgress::STATE_QUEUED
                        : p->state == State::kComputing ? v1::PrefillProgress::STATE_COMPUTING
                                                        : v1::PrefillProgress::STATE_SHIPPING);
    response->set_prompt_tokens(p->prompt_tokens);
    response->set_cached_tokens(p->cached_tokens);
    response->set_done_tokens(p->done_tokens);
    response->set_queued_requests(p->queued_requests);
    response->set_tokens_per_second(p->tokens_per_second);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace swaserve::worker_service
