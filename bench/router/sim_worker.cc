#include "bench/router/sim_worker.h"

#include <chrono>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/status.h"
#include "lib/base/timer_queue.h"
#include "lib/cluster/worker_registration.h"
#include "lib/rpc/grpc_server.h"
#include "lib/rpc/stream_writer.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::bench {
namespace {

constexpr int64_t kLatencyWrapUs = int64_t{1} << 17;
constexpr uint32_t kFirstId = 4096;

}  // namespace

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint32_t SimTokenId(int64_t now_us) {
  return kFirstId + static_cast<uint32_t>(now_us % kLatencyWrapUs);
}

int64_t SimTokenLatencyUs(uint32_t token, int64_t now_us) {
  const int64_t sent = static_cast<int64_t>(token) - kFirstId;
  return ((now_us % kLatencyWrapUs) - sent + kLatencyWrapUs) % kLatencyWrapUs;
}

// A decode stream's state, shared by its reactor and its timers (the
// reactor may be gone when a timer fires: the writer then drops writes).
struct Stream {
  std::shared_ptr<rpc::StreamWriter<v1::DecodeResponse>> writer;
  uint32_t max_tokens = 1;
  uint32_t prompt_tokens = 0;
  uint32_t sent = 0;
  std::atomic<bool> started{false};
};

struct SimWorker::Impl {
  SimWorkerOptions o;
  base::TimerQueue timers;
  absl::Mutex mu;
  // Decode streams waiting for their commit, and commits that came first.
  absl::flat_hash_map<std::string, std::shared_ptr<Stream>> waiting ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<std::string> early_commits ABSL_GUARDED_BY(mu);
  std::atomic<int64_t> open{0};
  std::atomic<int64_t> tokens{0};

  void Tick(const std::shared_ptr<Stream>& s) {
    v1::DecodeResponse msg;
    v1::TokenChunk* c = msg.mutable_tokens();
    c->add_token_ids(SimTokenId(SteadyMicros()));
    ++s->sent;
    tokens.fetch_add(1, std::memory_order_relaxed);
    const bool last = s->sent >= s->max_tokens;
    if (last) {
      c->set_finish_reason(v1::FINISH_REASON_LENGTH);
      c->mutable_usage()->set_prompt_tokens(s->prompt_tokens);
      c->mutable_usage()->set_completion_tokens(s->sent);
    }
    if (!s->writer->Write(std::move(msg))) return;  // cancelled or gone
    if (last) {
      s->writer->Finish(grpc::Status::OK);
      return;
    }
    timers.Schedule(absl::Now() + o.tpot, [this, s] { Tick(s); });
  }

  void StartStream(const std::shared_ptr<Stream>& s) {
    if (s->started.exchange(true)) return;
    timers.Schedule(absl::Now() + o.tpot, [this, s] { Tick(s); });
  }

  void Commit(const std::string& transfer_id) {
    std::shared_ptr<Stream> s;
    {
      absl::MutexLock lock(&mu);
      auto it = waiting.find(transfer_id);
      if (it == waiting.end()) {
        early_commits.insert(transfer_id);
        return;
      }
      s = std::move(it->second);
      waiting.erase(it);
    }
    StartStream(s);
  }

  class DecodeReactor final : public rpc::StreamingReactor<v1::DecodeResponse> {
   public:
    DecodeReactor(Impl* impl, const v1::DecodeRequest& req) : impl_(impl), id_(req.request_id()) {
      impl_->open.fetch_add(1);
      stream_ = std::make_shared<Stream>();
      stream_->writer = writer();
      stream_->max_tokens = std::max<uint32_t>(1, req.sampling().max_tokens());
      stream_->prompt_tokens = static_cast<uint32_t>(req.prompt_token_ids_size());
      v1::DecodeResponse accepted;
      accepted.mutable_accepted()->set_worker_id(impl_->o.id);
      writer()->Write(std::move(accepted));
      bool now = false;
      {
        absl::MutexLock lock(&impl_->mu);
        now = impl_->early_commits.erase(id_) > 0;
        if (!now) impl_->waiting[id_] = stream_;
      }
      if (now) impl_->StartStream(stream_);
    }

   private:
    void OnCancelled() override { Forget(); }
    void OnStreamDone() override {
      Forget();
      impl_->open.fetch_sub(1);
    }
    void Forget() {
      absl::MutexLock lock(&impl_->mu);
      impl_->waiting.erase(id_);
    }
    Impl* const impl_;
    const std::string id_;
    std::shared_ptr<Stream> stream_;
  };

  class DecodeService final : public v1::Decode::CallbackService {
   public:
    explicit DecodeService(Impl* impl) : impl_(impl) {}
    grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext*,
                                                         const v1::DecodeRequest* req) override {
      return new DecodeReactor(impl_, *req);
    }

   private:
    Impl* const impl_;
  };

  class PrefillService final : public v1::Prefill::CallbackService {
   public:
    explicit PrefillService(Impl* impl) : impl_(impl) {}
    grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx,
                                      const v1::PrefillRequest* req,
                                      v1::PrefillResponse* resp) override {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      const absl::Duration compute = absl::Seconds(
          static_cast<double>(req->token_ids_size()) / impl_->o.prefill_tokens_per_second);
      impl_->timers.Schedule(absl::Now() + compute, [impl = impl_, reactor, resp,
                                                      id = req->request_id(),
                                                      transfer = req->decode().transfer_id()] {
        impl->Commit(transfer);
        resp->set_request_id(id);
        reactor->Finish(grpc::Status::OK);
      });
      return reactor;
    }

   private:
    Impl* const impl_;
  };

  DecodeService decode_service{this};
  PrefillService prefill_service{this};
  std::unique_ptr<cluster::RedisClient> redis;
  std::unique_ptr<rpc::GrpcServer> server;
  std::unique_ptr<cluster::WorkerRegistration> registration;
};

SimWorker::SimWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SimWorker::~SimWorker() {
  impl_->registration.reset();
  if (impl_->server != nullptr) impl_->server->Shutdown(absl::Seconds(2));
}

absl::StatusOr<std::unique_ptr<SimWorker>> SimWorker::Start(const SimWorkerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  rpc::GrpcServerOptions go;
  go.listen_address = "127.0.0.1:0";
  go.services = {&impl->decode_service, &impl->prefill_service};
  go.name = "sim-worker";
  go.drain_deadline = absl::Seconds(2);
  ASSIGN_OR_RETURN(impl->server, rpc::GrpcServer::Create(go));
  cluster::RedisOptions ro;
  RETURN_IF_ERROR(cluster::ParseRedisAddress(options.redis, &ro));
  ASSIGN_OR_RETURN(impl->redis, cluster::RedisClient::Create(ro));
  cluster::WorkerRegistrationOptions wo;
  wo.redis = impl->redis.get();
  wo.info.id = options.id;
  wo.info.role = v1::ROLE_BOTH;
  wo.info.model = options.model;
  wo.info.grpc_address = impl->server->address();
  wo.info.page_size = 16;
  wo.info.full_pages = int64_t{1} << 24;
  wo.info.max_running_requests = 1 << 20;
  ASSIGN_OR_RETURN(impl->registration, cluster::WorkerRegistration::Create(wo));
  if (!impl->registration->WaitRegistered(absl::Seconds(10))) {
    return absl::UnavailableError("the simulator could not register in Redis");
  }
  return std::unique_ptr<SimWorker>(new SimWorker(std::move(impl)));
}

std::string SimWorker::grpc_address() const { return impl_->server->address(); }
int64_t SimWorker::open_streams() const { return impl_->open.load(); }
int64_t SimWorker::tokens_sent() const { return impl_->tokens.load(); }

}  // namespace swaserve::bench
