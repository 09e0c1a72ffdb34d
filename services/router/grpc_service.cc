#include "services/router/grpc_service.h"

#include <thread>
#include <utility>

#include "lib/rpc/status_conversion.h"
#include "services/router/call_state.h"

namespace swaserve::router_service {

void RequestThreads::Spawn(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    ++running_;
  }
  std::thread([this, fn = std::move(fn)] {
    fn();
    absl::MutexLock lock(&mu_);
    --running_;
  }).detach();
}

bool RequestThreads::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int RequestThreads::running() {
  absl::MutexLock lock(&mu_);
  return running_;
}

namespace {

class GenerateReactor;

// What the producer's notifications and the reactor's callbacks share; the
// reactor pointer is cleared in OnDone, so a late notification is a no-op.
struct Link {
  absl::Mutex mu;
  GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;
  v1::GenerateResponse buffer;  // the write in flight (owned while writing)
  std::shared_ptr<CallState> call;

  void Pump();
};

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(router::Router* router, RequestThreads* threads,
                  const v1::GenerateRequest& request)
      : link_(std::make_shared<Link>()) {
    link_->call = std::make_shared<CallState>();
    {
      absl::MutexLock lock(&link_->mu);
      link_->reactor = this;
    }
    link_->call->SetNotify([link = link_] { link->Pump(); });
    threads->Spawn([router, call = link_->call, request] {
      absl::Status s = router->Generate(request, *call, &call->cancel_flag());
      call->Finish(std::move(s));
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) link_->call->Cancel();
    {
      absl::MutexLock lock(&link_->mu);
      link_->writing = false;
    }
    link_->Pump();
  }
  void OnCancel() override { link_->call->Cancel(); }
  void OnDone() override {
    {
      absl::MutexLock lock(&link_->mu);
      link_->reactor = nullptr;
    }
    delete this;
  }

  void DoWrite(const v1::GenerateResponse* r) { StartWrite(r); }
  void DoFinish(const grpc::Status& s) { Finish(s); }

 private:
  std::shared_ptr<Link> link_;
};

void Link::Pump() {
  GenerateReactor* r = nullptr;
  bool write = false;
  absl::Status final_status;
  {
    absl::MutexLock lock(&mu);
    if (reactor == nullptr || writing || finished) return;
    r = reactor;
    switch (call->TryPop(&buffer, &final_status)) {
      case CallState::Next::kItem:
        writing = true;
        write = true;
        break;
      case CallState::Next::kFinished:
        finished = true;
        break;
      case CallState::Next::kEmpty:
        return;
    }
  }
  // The reactor stays alive: it is deleted only after DoFinish, which only
  // this path calls, once.
  if (write) {
    r->DoWrite(&buffer);
  } else {
    r->DoFinish(rpc::ToGrpcStatus(final_status));
  }
}

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterGrpcService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateReactor(router_, threads_, *request);
}

grpc::ServerUnaryReactor* RouterGrpcService::ListModels(grpc::CallbackServerContext* context,
                                                        const v1::ListModelsRequest* request,
                                                        v1::ListModelsResponse* response) {
  *response = router_->ListModels();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace swaserve::router_service
