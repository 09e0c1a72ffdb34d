// StreamWriter<T>: the one pump between producers on any thread and a gRPC
// server-streaming reactor (grpc::ServerWriteReactor<T>), which allows one
// write in flight at a time and must not be written after Finish.
//
//   class MyReactor : public rpc::StreamingReactor<v1::DecodeResponse> { ... };
//   // producers, any thread, never blocked by gRPC:
//   writer->Write(msg);            // queued in order; false once finishing
//   writer->Finish(status);        // after everything queued was written
//   writer->WriteWhenRoom(msg, 64) // the same, but waits while 64 are queued
//   writer->WhenRoom(64, fn)       // fn() once fewer than 64 are queued
//                                  // (asynchronous producers: no wait)
//
// Semantics:
//   - messages are written in the order queued, one at a time;
//   - Finish(status) finishes once, after the queued messages went out
//     (also for an error status: a client sees every message produced before
//     the error). Later Write/Finish calls are ignored (Write returns false);
//   - Cancel(status) (the client went away, or a write failed) drops what is
//     queued, wakes blocked writers, and finishes after the write in flight;
//   - after Detach() (the reactor's OnDone) nothing reaches the reactor.
// Ownership: shared (shared_ptr) by the reactor and every producer, so a
// late producer after OnDone is harmless. Thread-safe; the gRPC calls
// (start_write, finish) are made without the writer's lock held.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace swaserve::rpc {

template <typename T>
class StreamWriter {
 public:
  // What the writer calls on the reactor (its protected StartWrite/Finish)
  // and, once, when the stream is cancelled (may be null): the work behind
  // the stream should stop. The reactor is not finished while it runs.
  struct Ops {
    std::function<void(const T*)> start_write;
    std::function<void(const grpc::Status&)> finish;
    std::function<void()> on_cancel;
  };
  explicit StreamWriter(Ops ops) : ops_(std::move(ops)) {}
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // Queues `message`; false (dropped) once finishing, cancelled or detached.
  bool Write(T message) {
    {
      absl::MutexLock lock(&mu_);
      if (closed()) return false;
      queue_.push_back(std::move(message));
    }
    Pump();
    return true;
  }

  // Like Write, but first waits while `max_queued` (>= 1) messages wait to be
  // written: a slow client slows its producer. False once finishing,
  // cancelled or detached (also when that happens during the wait).
  bool WriteWhenRoom(T message, size_t max_queued) {
    {
      absl::MutexLock lock(&mu_);
      auto room = [this, max_queued]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed() || queue_.size() < max_queued;
      };
      mu_.Await(absl::Condition(&room));
      if (closed()) return false;
      queue_.push_back(std::move(message));
    }
    Pump();
    return true;
  }

  // Runs `ready` once fewer than `max_queued` (>= 1) messages wait to be
  // written: at once (before returning) if so now, else from the write
  // completion that makes room; also when the stream is cancelled, finishing
  // or detached (then the next Write returns false). One pending at a time
  // (a later call replaces it). Never called with the lock held.
  void WhenRoom(size_t max_queued, std::function<void()> ready) {
    {
      absl::MutexLock lock(&mu_);
      if (!closed() && queue_.size() >= max_queued) {
        room_max_ = max_queued;
        room_ = std::move(ready);
        return;
      }
    }
    ready();
  }

  // Finishes with `status` once the queued messages are written. Once.
  void Finish(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (closed()) return;
      final_status_ = std::move(status);
    }
    Pump();
  }

  // Drops what is queued and finishes with `status` (after the write in
  // flight, if any). Wins over an earlier Finish that has not gone out yet.
  void Cancel(grpc::Status status) {
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || detached_ || cancelled_) return;
      cancelled_ = true;
      first = true;
      final_status_ = std::move(status);
      // The front is the write in flight (if any): it stays until done.
      while (queue_.size() > (writing_ ? 1u : 0u)) queue_.pop_back();
      cancelling_ = ops_.on_cancel != nullptr;
    }
    if (first && ops_.on_cancel != nullptr) {
      ops_.on_cancel();  // the reactor cannot finish (and go away) meanwhile
      absl::MutexLock lock(&mu_);
      cancelling_ = false;
    }
    RunRoom();
    Pump();
  }

  // Reactor side: the write in flight completed (`ok` false: the stream is
  // broken, which cancels with CANCELLED "client went away").
  void OnWriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      if (!queue_.empty()) queue_.pop_front();
      writing_ = false;
    }
    if (!ok) Cancel(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    RunRoom();
    Pump();  // also when already cancelled: the finish may be due now
  }

  // Reactor side, from OnDone: the reactor is gone.
  void Detach() {
    {
      absl::MutexLock lock(&mu_);
      detached_ = true;
      queue_.clear();
    }
    RunRoom();
  }

  // True once Cancel ran (the client left or a write failed).
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // Messages queued (including the one being written).
  size_t queued() const {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  // No more messages accepted.
  bool closed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return detached_ || cancelled_ || finished_ || final_status_.has_value();
  }

  // Runs the WhenRoom callback if there is room now (or the stream closed).
  void RunRoom() {
    std::function<void()> ready;
    {
      absl::MutexLock lock(&mu_);
      if (room_ == nullptr || (!closed() && queue_.size() >= room_max_)) return;
      ready = std::move(room_);
      room_ = nullptr;
    }
    ready();
  }

  // Starts the next write or the finish (the gRPC call without the lock).
  void Pump() {
    const T* to_write = nullptr;
    std::optional<grpc::Status> to_finish;
    {
      absl::MutexLock lock(&mu_);
      if (detached_ || writing_ || finished_) return;
      if (!queue_.empty() && !cancelling_) {
        writing_ = true;
        to_write = &queue_.front();  // deque: stays put while others are pushed
      } else if (final_status_.has_value() && !cancelling_) {
        finished_ = true;
        to_finish = *final_status_;
      } else {
        return;
      }
    }
    // The reactor is alive: it is deleted only after its finish completed,
    // and only this path calls finish, once.
    if (to_write != nullptr) {
      ops_.start_write(to_write);
    } else {
      ops_.finish(*to_finish);
    }
  }

  const Ops ops_;
  mutable absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelling_ ABSL_GUARDED_BY(mu_) = false;  // on_cancel is running
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
  std::function<void()> room_ ABSL_GUARDED_BY(mu_);  // WhenRoom's
  size_t room_max_ ABSL_GUARDED_BY(mu_) = 0;
};

// A server-streaming reactor that writes through a StreamWriter. Subclasses
// produce with writer()->Write / Finish from any thread, and may override
// OnCancelled (the client cancelled or a write failed: stop the work; called
// once, possibly on a gRPC thread, never after OnStreamDone) and
// OnStreamDone (last call before the reactor deletes itself).
template <typename T>
class StreamingReactor : public grpc::ServerWriteReactor<T> {
 public:
  StreamingReactor()
      : writer_(std::make_shared<StreamWriter<T>>(typename StreamWriter<T>::Ops{
            [this](const T* m) { this->StartWrite(m); },
            [this](const grpc::Status& s) { this->grpc::ServerWriteReactor<T>::Finish(s); },
            [this] { OnCancelled(); }})) {}

  const std::shared_ptr<StreamWriter<T>>& writer() const { return writer_; }

  void OnWriteDone(bool ok) final { writer_->OnWriteDone(ok); }
  void OnCancel() final {
    writer_->Cancel(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() final {
    writer_->Detach();
    OnStreamDone();
    delete this;
  }

 protected:
  ~StreamingReactor() override = default;
  virtual void OnCancelled() {}
  virtual void OnStreamDone() {}

 private:
  std::shared_ptr<StreamWriter<T>> writer_;
};

}  // namespace swaserve::rpc
