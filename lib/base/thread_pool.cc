#include "lib/base/thread_pool.h"

#include <pthread.h>

namespace swaserve::base {

ThreadPool::ThreadPool(int num_threads, std::string name)
    : name_(std::move(name)) {
  if (num_threads <= 0) {
    num_threads = std::max(1u, std::thread::hardware_concurrency());
  }
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this, i] {
      // Linux limits thread names to 15 characters.
      std::string thread_name = (name_ + "-" + std::to_string(i)).substr(0, 15);
      pthread_setname_np(pthread_self(), thread_name.c_str());
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void ThreadPool::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
        return p->queue_.empty() && p->running_ == 0;
      },
      this));
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return !p->queue_.empty() || p->stopping_;
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace swaserve::base
