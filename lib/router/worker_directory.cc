#include "lib/router/worker_directory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/rpc/channel.h"

namespace swaserve::router {

CircuitBreakers::CircuitBreakers(const CircuitBreakerOptions& options, base::Clock* clock)
    : options_(options), clock_(clock != nullptr ? clock : base::Clock::Real()) {}

WorkerDirectory::WorkerDirectory(const WorkerDirectoryOptions& options)
    : options_(options), breakers_(options.breaker, options.clock) {}

absl::StatusOr<std::unique_ptr<WorkerDirectory>> WorkerDirectory::Create(
    const WorkerDirectoryOptions& options) {
  if (options.view == nullptr) return absl::InvalidArgumentError("WorkerDirectory needs a view");
  if (options.refresh_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("refresh_interval must be positive");
  }
  if (options.breaker.failures_to_open < 1) {
    return absl::InvalidArgumentError("breaker.failures_to_open must be >= 1");
  }
  std::unique_ptr<WorkerDirectory> d(new WorkerDirectory(options));
  absl::Status first = d->Refresh();  // best effort: Workers() retries
  if (!first.ok()) SWA_LOG(warn, "worker registry not readable yet: {}", first.ToString());
  if (options.background_refresh) d->thread_ = std::thread([p = d.get()] { p->RefreshLoop(); });
  return d;
}

WorkerDirectory::~WorkerDirectory() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void WorkerDirectory::RefreshLoop() {
  bool warned = false;
  while (!stop_.WaitForNotificationWithTimeout(options_.refresh_interval)) {
    absl::Status s = Refresh();
    if (!s.ok() && !warned) SWA_LOG(warn, "worker registry refresh failed: {}", s.ToString());
    if (s.ok() && warned) SWA_LOG(info, "worker registry readable again");
    warned = !s.ok();
  }
}

absl::Status WorkerDirectory::Refresh() {
  ASSIGN_OR_RETURN(std::vector<cluster::WorkerInfo> infos, options_.view->ListWorkers());
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const WorkerEndpoint>> next;
  next.reserve(infos.size());
  for (cluster::WorkerInfo& info : infos) {
    // Keep the old endpoint (and its connection) when nothing that matters
    // changed.
    auto it = std::find_if(workers_.begin(), workers_.end(), [&](const auto& w) {
      return w->info.id == info.id && w->info.incarnation == info.incarnation &&
             w->info.grpc_address == info.grpc_address;
    });
    if (it != workers_.end()) {
      if ((*it)->info == info) {
        next.push_back(*it);
        continue;
      }
    } else {
      breakers_.Reset(info.id);  // new worker or new incarnation: closed breaker
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        rpc::CreateChannel(info.grpc_address, options_.channel);
    if (!channel.ok()) {
      SWA_LOG(warn, "worker {}: bad address {}: {}", info.id, info.grpc_address,
              channel.status().ToString());
      continue;
    }
    auto e = std::make_shared<WorkerEndpoint>();
    e->client = NewGrpcWorkerClient(*channel);
    e->info = std::move(info);
    next.push_back(std::move(e));
  }
  breakers_.Retain(next);
  workers_ = std::move(next);
  refreshed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<const WorkerEndpoint>>> WorkerDirectory::Workers() {
  {
    absl::MutexLock lock(&mu_);
    if (refreshed_) return workers_;
  }
  RETURN_IF_ERROR(Refresh());
  absl::MutexLock lock(&mu_);
  return workers_;
}

void CircuitBreakers::Retain(const std::vector<std::shared_ptr<const WorkerEndpoint>>& live) {
  absl::MutexLock lock(&mu_);
  for (auto it = breakers_.begin(); it != breakers_.end();) {
    const bool keep = std::any_of(live.begin(), live.end(),
                                  [&](const auto& w) { return w->info.id == it->first; });
    if (keep) {
      ++it;
    } else {
      breakers_.erase(it++);
    }
  }
}

void CircuitBreakers::Reset(absl::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  breakers_.erase(worker_id);
}

bool CircuitBreakers::Healthy(absl::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = breakers_.find(worker_id);
  if (it == breakers_.end()) return true;
  Breaker& b = it->second;
  if (b.consecutive_failures < options_.failures_to_open) return true;
  // Half-open (the period is over): offered to the policy; the trial is
  // taken only when the policy picks this worker (Pick).
  return clock_->Now() >= b.open_until;
}

bool CircuitBreakers::Pick(absl::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = breakers_.find(worker_id);
  if (it == breakers_.end()) return true;
  Breaker& b = it->second;
  if (b.consecutive_failures < options_.failures_to_open) return true;
  const absl::Time now = clock_->Now();
  if (now < b.open_until) return false;  // another request took the trial
  b.open_until = now + options_.open_for;  // one trial per period
  ++b.trials;
  return true;
}

void CircuitBreakers::ReportSuccess(absl::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  breakers_.erase(worker_id);
}

void CircuitBreakers::ReportFailure(absl::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  Breaker& b = breakers_[worker_id];
  ++b.consecutive_failures;
  if (b.consecutive_failures >= options_.failures_to_open) {
    if (b.consecutive_failures == options_.failures_to_open) {
      SWA_LOG(warn, "worker {}: circuit breaker open after {} failures", std::string(worker_id),
              b.consecutive_failures);
    }
    b.open_until = clock_->Now() + options_.open_for;
  }
}

int CircuitBreakers::Open() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  int n = 0;
  for (const auto& [id, b] : breakers_) {
    if (b.consecutive_failures >= options_.failures_to_open && now < b.open_until) ++n;
  }
  return n;
}

}  // namespace swaserve::router
