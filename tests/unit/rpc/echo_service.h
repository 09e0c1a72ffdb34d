// Test support for lib/rpc: an implementation of swaserve.rpctest.Echo on the
// gRPC callback API that never blocks in a reactor (delays and stream pacing
// use grpc::Alarm) and counts its reactors, so tests can assert that a
// cancelled call reached OnCancel and that every reactor's OnDone ran.
//
// Thread-safe. Must outlive the server it is registered with.
#pragma once

#include <grpcpp/channel.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpctest/echo.grpc.pb.h"

namespace swaserve::rpctest {

class EchoService final : public Echo::CallbackService {
 public:
  EchoService() = default;

  // Where Relay forwards to. Set before serving.
  void SetRelayTarget(std::shared_ptr<grpc::Channel> channel);

  // Reactors created / whose OnDone ran / that saw OnCancel.
  int started() const;
  int done() const;
  int cancelled() const;
  int active() const { return started() - done(); }

  // Waits until at least `n` reactors saw OnCancel.
  bool WaitForCancelled(int n, absl::Duration timeout) const;
  // Waits until every started reactor's OnDone ran.
  bool WaitForIdle(absl::Duration timeout) const;
  // Waits until at least `n` stream messages were written in total.
  bool WaitForWrites(int n, absl::Duration timeout) const;

  // Called by the reactors.
  void ReactorStarted();
  void ReactorCancelled();
  void ReactorDone();
  void MessageWritten();
  Echo::Stub* relay_stub() { return relay_stub_.get(); }

 private:
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                  const EchoRequest* request,
                                  EchoResponse* response) override;
  grpc::ServerWriteReactor<EchoResponse>* Stream(
      grpc::CallbackServerContext* context,
      const EchoRequest* request) override;
  grpc::ServerUnaryReactor* Relay(grpc::CallbackServerContext* context,
                                  const EchoRequest* request,
                                  EchoResponse* response) override;

  std::unique_ptr<Echo::Stub> relay_stub_;

  mutable absl::Mutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  int written_ ABSL_GUARDED_BY(mu_) = 0;
};

// Microseconds since the epoch of an absl::Time; 0 for InfiniteFuture.
int64_t ToUnixMicrosOrZero(absl::Time time);

}  // namespace swaserve::rpctest
