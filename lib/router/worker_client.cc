#include "lib/router/worker_client.h"

#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "lib/rpc/async_unary.h"

namespace swaserve::router {
namespace {

// gRPC's callback API: a ClientReadReactor, so no thread blocks on the
// stream. gRPC delivers OnDone last, after every read completed; the object
// is destroyed only after Finish's callback ran (the DecodeCall contract),
// and the destructor waits for OnDone to have handed over the status.
//
// A hold (AddHold before StartCall, removed by Finish) keeps OnDone back
// until the router asks for the status. Without it, a call that fails at
// once (the worker just died: the channel fails fast) could reach OnDone
// before the router's first StartRead, and a read started after OnDone
// never completes: the request then waited for `accepted` until its
// deadline, the accept timeout's TryCancel being a no-op on a finished call
// (2 requests of the chaos replay, named by the stalled-request log).
class GrpcDecodeCall final : public DecodeCall,
                             public grpc::ClientReadReactor<v1::DecodeResponse> {
 public:
  GrpcDecodeCall(v1::Decode::Stub& stub, const v1::DecodeRequest& request, absl::Time deadline)
      : request_(request) {
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    stub.async()->Decode(&ctx_, &request_, this);
    AddHold();
    StartCall();
  }
  ~GrpcDecodeCall() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }
  void Read(v1::DecodeResponse* msg, ReadDone done) override {
    {
      absl::MutexLock lock(&mu_);
      read_done_ = std::move(done);
    }
    StartRead(msg);
  }
  void OnReadDone(bool ok) override {
    ReadDone d;
    {
      absl::MutexLock lock(&mu_);
      d = std::move(read_done_);
    }
    if (d) d(ok);
  }
  void Finish(FinishDone done) override {
    std::optional<grpc::Status> now;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      if (done_) {
        now = status_;
      } else {
        finish_done_ = std::move(done);
      }
      release = !released_;
      released_ = true;
    }
    if (release) RemoveHold();  // OnDone may run (and call `done`) from here on
    if (now) done(*std::move(now));
  }
  void OnDone(const grpc::Status& s) override {
    FinishDone d;
    {
      absl::MutexLock lock(&mu_);
      status_ = s;
      done_ = true;
      d = std::move(finish_done_);
    }
    // Nothing of this object is touched after the lock is released: the
    // owner may destroy it as soon as `done_` is set.
    if (d) d(s);
  }
  // ClientContext::TryCancel is thread-safe and a no-op after the call ended.
  void Cancel() override { ctx_.TryCancel(); }

 private:
  grpc::ClientContext ctx_;
  const v1::DecodeRequest request_;
  absl::Mutex mu_;
  ReadDone read_done_ ABSL_GUARDED_BY(mu_);
  FinishDone finish_done_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // the hold, by Finish
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

class GrpcPrefillCall final : public PrefillCall {
 public:
  GrpcPrefillCall(v1::Prefill::Stub& stub, absl::Time deadline) : stub_(stub) {
    ctx_.set_deadline(absl::ToChronoTime(deadline));
  }
  // gRPC's callback API: the request and the context live in this object,
  // which the caller keeps until `done` ran.
  void Start(v1::PrefillRequest request, v1::PrefillResponse* response, Done done) override {
    request_ = std::move(request);
    stub_.async()->Prefill(&ctx_, &request_, response, std::move(done));
  }
  // Before the call started, TryCancel marks the context: the call is
  // cancelled as soon as it starts.
  void Cancel() override { ctx_.TryCancel(); }

 private:
  v1::Prefill::Stub& stub_;
  grpc::ClientContext ctx_;
  v1::PrefillRequest request_;
};

class GrpcWorkerClient final : public WorkerClient {
 public:
  explicit GrpcWorkerClient(const std::shared_ptr<grpc::Channel>& channel)
      : prefill_(v1::Prefill::NewStub(channel)), decode_(v1::Decode::NewStub(channel)) {}
  std::unique_ptr<DecodeCall> StartDecode(const v1::DecodeRequest& request,
                                          absl::Time deadline) override {
    return std::make_unique<GrpcDecodeCall>(*decode_, request, deadline);
  }
  std::unique_ptr<PrefillCall> NewPrefill(absl::Time deadline) override {
    return std::make_unique<GrpcPrefillCall>(*prefill_, deadline);
  }
  void GetPrefillProgress(const std::string& request_id, absl::Duration timeout,
                          ProgressDone done) override {
    v1::GetPrefillProgressRequest request;
    request.set_request_id(request_id);
    v1::Prefill::Stub* stub = prefill_.get();
    rpc::CallUnary<v1::GetPrefillProgressRequest, v1::PrefillProgress>(
        std::move(request), timeout,
        [stub](grpc::ClientContext* ctx, const v1::GetPrefillProgressRequest* req,
               v1::PrefillProgress* resp, std::function<void(grpc::Status)> cb) {
          stub->async()->GetProgress(ctx, req, resp, std::move(cb));
        },
        [done = std::move(done)](grpc::Status s, v1::PrefillProgress p) { done(s, p); });
  }

 private:
  std::unique_ptr<v1::Prefill::Stub> prefill_;
  std::unique_ptr<v1::Decode::Stub> decode_;
};

}  // namespace

std::unique_ptr<WorkerClient> NewGrpcWorkerClient(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcWorkerClient>(channel);
}

}  // namespace swaserve::router
