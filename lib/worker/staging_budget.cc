#include "lib/worker/staging_budget.h"

#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace swaserve::worker {

struct StagingBudget::Reservation::State : std::enable_shared_from_this<State> {
  struct Waiter {
    std::string key;
    size_t bytes = 0;
    Grant grant;
  };
  struct Ready {
    Grant grant;
    std::unique_ptr<Reservation> reservation;
  };
  const size_t capacity;
  mutable absl::Mutex mu;
  size_t in_use ABSL_GUARDED_BY(mu) = 0;
  size_t waiting_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t waited_total ABSL_GUARDED_BY(mu) = 0;
  std::deque<Waiter> waiters ABSL_GUARDED_BY(mu);

  explicit State(size_t c) : capacity(c) {}

  // Grants the waiters at the head that fit now (FIFO: stops at the first
  // that does not).
  std::vector<Ready> TakeGrantable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<Ready> ready;
    while (!waiters.empty() && in_use + waiters.front().bytes <= capacity) {
      Waiter w = std::move(waiters.front());
      waiters.pop_front();
      waiting_bytes -= w.bytes;
      in_use += w.bytes;
      ++waited_total;
      ready.push_back(
          {std::move(w.grant), std::unique_ptr<Reservation>(new Reservation(
                                   shared_from_this(), w.bytes))});
    }
    return ready;
  }

  static void Run(std::vector<Ready> ready) {
    for (Ready& r : ready) r.grant(std::move(r.reservation));
  }

  void Release(size_t bytes) {
    std::vector<Ready> ready;
    {
      absl::MutexLock lock(&mu);
      in_use -= bytes;
      ready = TakeGrantable();
    }
    Run(std::move(ready));
  }
};

StagingBudget::Reservation::~Reservation() {
  if (state_ != nullptr) state_->Release(bytes_);
}

StagingBudget::StagingBudget(size_t capacity_bytes)
    : state_(std::make_shared<Reservation::State>(capacity_bytes)) {}

StagingBudget::~StagingBudget() = default;

absl::Status StagingBudget::Acquire(const std::string& key, size_t bytes,
                                    Grant grant) {
  Reservation::State& s = *state_;
  if (bytes > s.capacity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request's KV staging needs ", bytes >> 20,
        " MiB, more than this decode worker's whole staging budget of ",
        s.capacity >> 20, " MiB (--decode.staging_budget_mib)"));
  }
  std::unique_ptr<Reservation> now;
  {
    absl::MutexLock lock(&s.mu);
    for (const auto& w : s.waiters) {
      if (w.key == key)
        return absl::AlreadyExistsError(
            absl::StrCat(key, " is already waiting"));
    }
    if (s.waiters.empty() && s.in_use + bytes <= s.capacity) {
      s.in_use += bytes;
      now.reset(new Reservation(state_, bytes));
    } else {
      s.waiters.push_back({key, bytes, std::move(grant)});
      s.waiting_bytes += bytes;
      return absl::OkStatus();
    }
  }
  grant(std::move(now));
  return absl::OkStatus();
}

bool StagingBudget::Cancel(const std::string& key) {
  Reservation::State& s = *state_;
  std::vector<Reservation::State::Ready> ready;
  bool found = false;
  {
    absl::MutexLock lock(&s.mu);
    for (auto it = s.waiters.begin(); it != s.waiters.end(); ++it) {
      if (it->key != key) continue;
      s.waiting_bytes -= it->bytes;
      s.waiters.erase(it);
      found = true;
      break;
    }
    // A large waiter leaving the head may let smaller ones behind it in.
    if (found) ready = s.TakeGrantable();
  }
  Reservation::State::Run(std::move(ready));
  return found;
}

size_t StagingBudget::capacity() const { return state_->capacity; }
size_t StagingBudget::in_use() const {
  absl::MutexLock lock(&state_->mu);
  return state_->in_use;
}
size_t StagingBudget::waiting_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->waiting_bytes;
}
int StagingBudget::waiters() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int>(state_->waiters.size());
}
int64_t StagingBudget::waited_total() const {
  absl::MutexLock lock(&state_->mu);
  return state_->waited_total;
}

}  // namespace swaserve::worker
