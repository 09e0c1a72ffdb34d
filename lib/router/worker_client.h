// WorkerClient: the two calls a request's legs make on a worker, behind an
// interface so that the router's tests fake them: Decode.Decode (a server stream) on the decode worker
// and Prefill.Prefill (unary) on the prefill worker. The router's leg logic
// (router.cc RunLegs: accepted timeout, cancellation of the other leg,
// retries, migration, breakers) depends only on this interface, so unit
// tests run it against scripted fakes (tests/unit/router/router_legs_test.cc)
// and the services use the gRPC implementation (NewGrpcWorkerClient).
//
// Call objects are created per leg. Both are asynchronous: no thread waits
// on a worker. Read and Finish (DecodeCall) are called in sequence, Start
// (PrefillCall) once; Cancel from any thread at any time, also before the
// call started (then the call ends CANCELLED as soon as it starts) or after
// it ended (a no-op). Callbacks may run inline, so callers call them
// without holding a lock that a callback takes.
//
// Thread-safety: WorkerClient is thread-safe (one per worker, shared by all
// requests); call objects as above.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve::router {

// A Decode.Decode stream in progress, read asynchronously (a streaming
// request holds no router thread while it waits for tokens).
// Destroy it only after Finish's callback ran.
class DecodeCall {
 public:
  using ReadDone = std::function<void(bool ok)>;
  using FinishDone = std::function<void(grpc::Status)>;
  virtual ~DecodeCall() = default;
  // Reads the next message into *msg (valid until `done`): done(true) when
  // *msg holds it, done(false) when the stream ended (then Finish). One Read
  // at a time. `done` runs on any thread, possibly before Read returns; it
  // must not block.
  virtual void Read(v1::DecodeResponse* msg, ReadDone done) = 0;
  // The stream's final status, once a Read reported false (or after Cancel
  // with no Read pending): `done` runs once, on any thread, possibly before
  // Finish returns.
  virtual void Finish(FinishDone done) = 0;
  // Ends the call with CANCELLED: a pending Read reports false.
  virtual void Cancel() = 0;
};

// A Prefill.Prefill call, created before it starts so that another thread
// can cancel it at any time. Asynchronous: no thread waits on it (a request
// queued for minutes at a prefill worker holds no router thread for its
// prefill leg).
class PrefillCall {
 public:
  // Called exactly once with the call's status, on any thread (a gRPC
  // callback thread, or the caller's when the call fails at once). It must
  // not block.
  using Done = std::function<void(grpc::Status)>;
  // Destroying the call before `done` ran is not allowed.
  virtual ~PrefillCall() = default;
  // Starts the call (at most once); `response` must stay valid until `done`.
  virtual void Start(v1::PrefillRequest request, v1::PrefillResponse* response, Done done) = 0;
  virtual void Cancel() = 0;
};

class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  // Starts a decode stream that ends at `deadline` at the latest.
  virtual std::unique_ptr<DecodeCall> StartDecode(const v1::DecodeRequest& request,
                                                  absl::Time deadline) = 0;
  // A prefill call that will end at `deadline` at the latest.
  virtual std::unique_ptr<PrefillCall> NewPrefill(absl::Time deadline) = 0;
  // Prefill.GetProgress of the call whose PrefillRequest.request_id is
  // `request_id`, bounded by `timeout`; `done` runs once, on any thread
  // (possibly inline), with the status and the answer. The gRPC client
  // asks the worker; a client that cannot ask (the scripted fakes of the
  // router's unit tests) answers UNIMPLEMENTED at once, as an older worker
  // without the RPC does, and the router then shows no progress.
  using ProgressDone = std::function<void(grpc::Status, const v1::PrefillProgress&)>;
  virtual void GetPrefillProgress(const std::string& request_id, absl::Duration timeout,
                                  ProgressDone done) {
    done(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this client cannot ask for progress"),
         v1::PrefillProgress());
  }
};

// The gRPC implementation over `channel` (the worker's Prefill and Decode
// services).
std::unique_ptr<WorkerClient> NewGrpcWorkerClient(std::shared_ptr<grpc::Channel> channel);

}  // namespace swaserve::router
