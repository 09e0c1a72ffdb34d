#include "lib/router/worker_client.h"

#include <utility>

namespace swaserve::router {
namespace {

class GrpcDecodeCall final : public DecodeCall {
 public:
  GrpcDecodeCall(v1::Decode::Stub& stub, const v1::DecodeRequest& request, absl::Time deadline) {
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    reader_ = stub.Decode(&ctx_, request);
  }
  bool Read(v1::DecodeResponse* msg) override { return reader_->Read(msg); }
  grpc::Status Finish() override { return reader_->Finish(); }
  // ClientContext::TryCancel is thread-safe and a no-op after the call ended.
  void Cancel() override { ctx_.TryCancel(); }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader_;
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

 private:
  std::unique_ptr<v1::Prefill::Stub> prefill_;
  std::unique_ptr<v1::Decode::Stub> decode_;
};

}  // namespace

std::unique_ptr<WorkerClient> NewGrpcWorkerClient(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcWorkerClient>(channel);
}

}  // namespace swaserve::router
