#include "tests/unit/rpc/echo_service.h"

#include <grpcpp/alarm.h>

#include <atomic>
#include <utility>

#include "lib/rpc/deadline.h"
#include "lib/rpc/status_conversion.h"

namespace swaserve::rpctest {
namespace {

// Every reactor below deletes itself when its last reference goes: one is
// held until OnDone, one per pending alarm or outgoing call, so an alarm
// callback or client callback that fires after OnDone never touches freed
// memory.

class DelayedUnary final : public grpc::ServerUnaryReactor {
 public:
  DelayedUnary(EchoService* service, grpc::CallbackServerContext* context,
               const EchoRequest& request, EchoResponse* response)
      : service_(service) {
    service_->ReactorStarted();
    response->set_message(request.message());
    response->set_deadline_unix_us(
        ToUnixMicrosOrZero(rpc::IncomingDeadline(*context)));
    const absl::Duration remaining = rpc::RemainingTime(*context);
    response->set_remaining_us(remaining == absl::InfiniteDuration()
                                   ? -1
                                   : absl::ToInt64Microseconds(remaining));
    if (request.fail_code() != 0) {
      result_ = rpc::ToGrpcStatus(rpc::ErrorWithDetail(
          static_cast<absl::StatusCode>(request.fail_code()),
          v1::ERROR_CODE_OVERLOADED, request.message(), "echo-worker",
          /*retryable=*/true));
    }
    if (request.delay_ms() <= 0) {
      FinishOnce(result_);
      return;
    }
    refs_.fetch_add(1);
    alarm_.Set(absl::ToChronoTime(absl::Now() +
                                  absl::Milliseconds(request.delay_ms())),
               [this](bool fired) {
                 if (fired) FinishOnce(result_);
                 Unref();
               });
  }

  void OnCancel() override {
    service_->ReactorCancelled();
    alarm_.Cancel();
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_->ReactorDone();
    Unref();
  }

 private:
  void FinishOnce(grpc::Status status) {
    if (finished_.exchange(true)) return;
    Finish(std::move(status));
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  EchoService* const service_;
  grpc::Status result_;
  grpc::Alarm alarm_;
  std::atomic<bool> finished_{false};
  std::atomic<int> refs_{1};
};

class PacedStream final : public grpc::ServerWriteReactor<EchoResponse> {
 public:
  PacedStream(EchoService* service, const EchoRequest& request)
      : service_(service), request_(request) {
    service_->ReactorStarted();
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNKNOWN, "write failed"));
      return;
    }
    service_->MessageWritten();
    ++sent_;  // Writes are serialized: one OnWriteDone at a time.
    Next();
  }

  void OnCancel() override {
    service_->ReactorCancelled();
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (alarm_ != nullptr) alarm_->Cancel();
    }
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_->ReactorDone();
    Unref();
  }

 private:
  void Next() {
    if (sent_ >= request_.count()) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    if (request_.interval_ms() <= 0) {
      Write();
      return;
    }
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    refs_.fetch_add(1);
    // The previous alarm (if any) has fired; replacing it is safe.
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(absl::ToChronoTime(absl::Now() +
                                   absl::Milliseconds(request_.interval_ms())),
                [this](bool fired) {
                  if (fired) Write();
                  Unref();
                });
  }

  void Write() {
    if (finished_.load()) return;
    response_.set_message(request_.message());
    response_.set_index(sent_);
    StartWrite(&response_);
  }

  void FinishOnce(grpc::Status status) {
    if (finished_.exchange(true)) return;
    Finish(std::move(status));
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  EchoService* const service_;
  const EchoRequest request_;
  EchoResponse response_;
  int sent_ = 0;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> finished_{false};
  std::atomic<int> refs_{1};
};

class RelayUnary final : public grpc::ServerUnaryReactor {
 public:
  RelayUnary(EchoService* service, grpc::CallbackServerContext* context,
             const EchoRequest& request, EchoResponse* response)
      : service_(service), response_(response) {
    service_->ReactorStarted();
    if (service_->relay_stub() == nullptr) {
      FinishOnce(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "no relay target"));
      return;
    }
    rpc::ChildContextOptions options;
    if (request.relay_max_timeout_ms() > 0) {
      options.max_timeout = absl::Milliseconds(request.relay_max_timeout_ms());
    }
    child_context_ = rpc::MakeChildContext(*context, options);
    response_->set_deadline_unix_us(
        ToUnixMicrosOrZero(rpc::IncomingDeadline(*context)));
    downstream_request_ = request;
    downstream_request_.set_relay_max_timeout_ms(0);
    refs_.fetch_add(1);
    service_->relay_stub()->async()->Unary(
        child_context_.get(), &downstream_request_, &downstream_response_,
        [this](grpc::Status status) {
          bool finish = false;
          {
            absl::MutexLock lock(&mu_);
            if (!finished_) {
              finished_ = finish = true;
              // response_ is valid until our Finish: nobody else finished.
              response_->set_message(downstream_response_.message());
              response_->set_downstream_deadline_unix_us(
                  downstream_response_.deadline_unix_us());
            }
          }
          if (finish) Finish(std::move(status));
          Unref();
        });
  }

  void OnCancel() override {
    service_->ReactorCancelled();
    FinishOnce(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_->ReactorDone();
    Unref();
  }

 private:
  void FinishOnce(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(std::move(status));
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  EchoService* const service_;
  EchoResponse* const response_;
  std::unique_ptr<grpc::ClientContext> child_context_;
  EchoRequest downstream_request_;
  EchoResponse downstream_response_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> refs_{1};
};

}  // namespace

int64_t ToUnixMicrosOrZero(absl::Time time) {
  if (time == absl::InfiniteFuture()) return 0;
  return absl::ToUnixMicros(time);
}

void EchoService::SetRelayTarget(std::shared_ptr<grpc::Channel> channel) {
  relay_stub_ = Echo::NewStub(std::move(channel));
}

grpc::ServerUnaryReactor* EchoService::Unary(
    grpc::CallbackServerContext* context, const EchoRequest* request,
    EchoResponse* response) {
  return new DelayedUnary(this, context, *request, response);
}

grpc::ServerWriteReactor<EchoResponse>* EchoService::Stream(
    grpc::CallbackServerContext* /*context*/, const EchoRequest* request) {
  return new PacedStream(this, *request);
}

grpc::ServerUnaryReactor* EchoService::Relay(
    grpc::CallbackServerContext* context, const EchoRequest* request,
    EchoResponse* response) {
  return new RelayUnary(this, context, *request, response);
}

int EchoService::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}
int EchoService::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}
int EchoService::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool EchoService::WaitForCancelled(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return cancelled_ >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

bool EchoService::WaitForIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto idle = [&]()
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_ == started_; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

bool EchoService::WaitForWrites(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [&]()
                     ABSL_SHARED_LOCKS_REQUIRED(mu_) { return written_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

void EchoService::ReactorStarted() {
  absl::MutexLock lock(&mu_);
  ++started_;
}
void EchoService::ReactorCancelled() {
  absl::MutexLock lock(&mu_);
  ++cancelled_;
}
void EchoService::ReactorDone() {
  absl::MutexLock lock(&mu_);
  ++done_;
}
void EchoService::MessageWritten() {
  absl::MutexLock lock(&mu_);
  ++written_;
}

}  // namespace swaserve::rpctest
