#include "lib/sched/decode_scheduler.h"

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::sched {

absl::StatusOr<std::unique_ptr<DecodeScheduler>> DecodeScheduler::Create(
    const DecodeSchedulerOptions& options) {
  if (options.max_batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_batch_size must be > 0, got ", options.max_batch_size));
  }
  ASSIGN_OR_RETURN(SchedMetrics metrics,
                   SchedMetrics::Create(options.registry, "decode"));
  return std::unique_ptr<DecodeScheduler>(
      new DecodeScheduler(options, metrics));
}

DecodeScheduler::DecodeScheduler(const DecodeSchedulerOptions& options,
                                 SchedMetrics metrics)
    : options_(options), metrics_(metrics) {}

DecodeScheduler::~DecodeScheduler() {
  double waiting_tokens = 0;
  for (const auto& [key, r] : waiting_)
    waiting_tokens += r->info.context_tokens;
  metrics_.AddQueued(-waiting_requests(), -waiting_tokens);
  metrics_.AddRunning(-running_requests());
}

absl::Status DecodeScheduler::Stage(const DecodeRequestInfo& info) {
  if (info.id.empty()) return absl::InvalidArgumentError("empty request id");
  if (info.context_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", info.id, ": context_tokens must be > 0, got ",
                     info.context_tokens));
  }
  auto [it, inserted] = requests_.try_emplace(info.id);
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", info.id, " is already scheduled"));
  }
  auto r = std::make_unique<Request>();
  r->info = info;
  r->staged_seq = next_staged_seq_++;
  waiting_.emplace(r->wait_key(), r.get());
  metrics_.AddQueued(1, info.context_tokens);
  it->second = std::move(r);
  return absl::OkStatus();
}

DecodeIteration DecodeScheduler::NextIteration(int64_t now_ns,
                                               CanAdmitFn can_admit) {
  DecodeIteration out;
  while (!waiting_.empty() &&
         running_.size() < static_cast<size_t>(options_.max_batch_size)) {
    Request* r = waiting_.begin()->second;
    if (!can_admit(r->info)) break;
    waiting_.erase(waiting_.begin());
    if (r->admission == 0) r->admission = next_admission_++;
    r->running = true;
    running_.emplace(r->admission, r);
    ++admitted_total_;
    metrics_.AddQueued(-1, -r->info.context_tokens);
    metrics_.AddRunning(1);
    metrics_.CountAdmitted();
    metrics_.ObserveWait(r->info.ready_ns, now_ns);
    out.admitted.push_back(r->info.id);
  }
  out.batch.reserve(running_.size());
  for (const auto& [admission, r] : running_) out.batch.push_back(r->info.id);
  if (!out.batch.empty()) {
    metrics_.ObserveBatch(static_cast<int>(out.batch.size()));
  }
  return out;
}

std::optional<std::string> DecodeScheduler::ChoosePreemptionVictim() const {
  if (running_.empty()) return std::nullopt;
  return running_.rbegin()->second->info.id;
}

absl::Status DecodeScheduler::Preempt(absl::string_view id, int context_tokens,
                                      int64_t now_ns) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->running) {
    return absl::NotFoundError(
        absl::StrCat("request ", std::string(id), " is not running"));
  }
  if (context_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", std::string(id),
                     ": context_tokens must be > 0, got ", context_tokens));
  }
  Request* r = it->second.get();
  running_.erase(r->admission);
  r->running = false;
  r->info.context_tokens = context_tokens;
  r->info.ready_ns = now_ns;
  waiting_.emplace(r->wait_key(), r);
  ++preempted_total_;
  metrics_.AddRunning(-1);
  metrics_.AddQueued(1, context_tokens);
  metrics_.CountPreempted();
  return absl::OkStatus();
}

absl::Status DecodeScheduler::Finish(absl::string_view id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->running) {
    return absl::NotFoundError(
        absl::StrCat("request ", std::string(id), " is not running"));
  }
  running_.erase(it->second->admission);
  metrics_.AddRunning(-1);
  requests_.erase(it);
  return absl::OkStatus();
}

bool DecodeScheduler::Cancel(absl::string_view id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request* r = it->second.get();
  if (r->running) {
    running_.erase(r->admission);
    metrics_.AddRunning(-1);
  } else {
    waiting_.erase(r->wait_key());
    metrics_.AddQueued(-1, -r->info.context_tokens);
  }
  metrics_.CountCancelled();
  requests_.erase(it);
  return true;
}

bool DecodeScheduler::IsRunning(absl::string_view id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second->running;
}

bool DecodeScheduler::IsWaiting(absl::string_view id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && !it->second->running;
}

}  // namespace swaserve::sched
