// CallState: the hand-off between a request running in router::Router (the
// producer: a GenerateSink, written from the router's callbacks) and the
// HTTP handler that streams its output (the gRPC reactor writes through
// rpc::StreamWriter instead).
//
// Write() queues a response without blocking; it returns false once the
// consumer cancelled. OnReady() runs its callback once fewer than
// `max_queued` wait (a slow client slows its own request, not the router).
// Finish() records the final status. The consumer pops with a timeout (Pop),
// so it can notice a client that left.
//
// Shared between the producer thread and the consumer through shared_ptr.
// Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/router/router.h"
#include "swaserve/v1/router.pb.h"

namespace swaserve::router_service {

class CallState : public router::GenerateSink {
 public:
  explicit CallState(size_t max_queued = 64) : max_queued_(max_queued) {}

  // Producer side.
  bool Write(const v1::GenerateResponse& response) override;
  void OnReady(std::function<void()> ready) override;
  void Finish(absl::Status status);

  // Consumer side. kItem: *out holds the next response; kEmpty: nothing yet;
  // kFinished: no more responses, final status in *status.
  enum class Next { kItem, kEmpty, kFinished };
  // Blocks up to `timeout` for the next item or the end (kEmpty on timeout).
  Next Pop(v1::GenerateResponse* out, absl::Status* status, absl::Duration timeout);
  // The client went away: cancels the request (and runs a pending OnReady
  // callback, so that the request notices).
  void Cancel();

  router::CancelFlag& cancel_flag() { return cancel_; }

 private:
  const size_t max_queued_;
  router::CancelFlag cancel_;
  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> ready_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace swaserve::router_service
