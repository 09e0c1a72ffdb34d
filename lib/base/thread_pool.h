// A fixed-size pool of worker threads running queued closures in FIFO order.
//
// Owns its threads; the destructor finishes every queued task, then joins.
// Thread-safe: Schedule and WaitIdle may be called from any thread, including
// from tasks (but WaitIdle from a task deadlocks: don't).
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace swaserve::base {

class ThreadPool {
 public:
  // num_threads <= 0 uses std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads, std::string name = "pool");
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`. After the destructor has started, tasks are rejected
  // (returns false); otherwise returns true.
  bool Schedule(std::function<void()> task);

  // Blocks until the queue is empty and no task is running.
  void WaitIdle();

  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkerLoop();

  const std::string name_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace swaserve::base
