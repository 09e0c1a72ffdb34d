#include "lib/sched/prefill_scheduler.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::sched {

int PrefillStep::total_tokens() const {
  int total = 0;
  for (const PrefillChunk& c : chunks) total += c.num_tokens;
  return total;
}

bool PrefillScheduler::PriorityLess::operator()(const Request* a,
                                                const Request* b) const {
  return std::tie(a->key, a->info.arrival_ns, a->info.id) <
         std::tie(b->key, b->info.arrival_ns, b->info.id);
}

bool PrefillScheduler::ArrivalLess::operator()(const Request* a,
                                               const Request* b) const {
  return std::tie(a->info.arrival_ns, a->info.id) <
         std::tie(b->info.arrival_ns, b->info.id);
}

absl::StatusOr<std::unique_ptr<PrefillScheduler>> PrefillScheduler::Create(
    const PrefillSchedulerOptions& options) {
  if (!(options.aging_tokens_per_second >= 0) ||
      !std::isfinite(options.aging_tokens_per_second)) {
    return absl::InvalidArgumentError(
        absl::StrCat("aging_tokens_per_second must be finite and >= 0, got ",
                     options.aging_tokens_per_second));
  }
  if (options.chunk_tokens <= 0 || options.step_token_budget <= 0 ||
      options.max_requests_per_step <= 0 || options.max_partial_requests <= 0 ||
      options.max_refusals_per_step <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_tokens, step_token_budget, max_requests_per_step, "
        "max_partial_requests and max_refusals_per_step must be > 0, got ",
        options.chunk_tokens, ", ", options.step_token_budget, ", ",
        options.max_requests_per_step, ", ", options.max_partial_requests, ", ",
        options.max_refusals_per_step));
  }
  if (!(options.refusal_block_after_seconds >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("refusal_block_after_seconds must be >= 0, got ",
                     options.refusal_block_after_seconds));
  }
  ASSIGN_OR_RETURN(SchedMetrics metrics,
                   SchedMetrics::Create(options.registry, "prefill"));
  return std::unique_ptr<PrefillScheduler>(
      new PrefillScheduler(options, metrics));
}

PrefillScheduler::PrefillScheduler(const PrefillSchedulerOptions& options,
                                   SchedMetrics metrics)
    : options_(options), metrics_(metrics) {}

PrefillScheduler::~PrefillScheduler() {
  metrics_.AddQueued(-queued_requests(),
                     -static_cast<double>(queued_uncached_tokens_));
  metrics_.AddRunning(-in_progress_requests());
}

absl::Status PrefillScheduler::Add(const PrefillRequestInfo& info) {
  if (info.id.empty()) return absl::InvalidArgumentError("empty request id");
  if (info.prompt_tokens <= 0 || info.cached_tokens < 0 ||
      info.cached_tokens >= info.prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", info.id, ": need 0 <= cached_tokens < prompt_tokens, got ",
        info.cached_tokens, " cached of ", info.prompt_tokens));
  }
  auto [it, inserted] = requests_.try_emplace(info.id);
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", info.id, " is already scheduled"));
  }
  auto r = std::make_unique<Request>();
  r->info = info;
  r->next_token = info.cached_tokens;
  if (options_.policy == PrefillSchedulerOptions::Policy::kComputeAware) {
    // uncached - aging * (now - arrival) ordered the same for every now.
    r->key = info.uncached_tokens() +
             options_.aging_tokens_per_second * (info.arrival_ns * 1e-9);
  }
  queue_.insert(r.get());
  by_arrival_.insert(r.get());
  queued_uncached_tokens_ += info.uncached_tokens();
  metrics_.AddQueued(1, info.uncached_tokens());
  it->second = std::move(r);
  return absl::OkStatus();
}

bool PrefillScheduler::Cancel(absl::string_view id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request* r = it->second.get();
  const int remaining = r->info.prompt_tokens - r->next_token;
  queued_uncached_tokens_ -= remaining;
  if (r->start_seq == 0) {
    Unqueue(r);
    metrics_.AddQueued(-1, -remaining);
  } else {
    in_progress_.erase(r->start_seq);
    metrics_.AddQueued(0, -remaining);
    metrics_.AddRunning(-1);
  }
  metrics_.CountCancelled();
  requests_.erase(it);
  return true;
}

void PrefillScheduler::Unqueue(Request* r) {
  queue_.erase(r);
  by_arrival_.erase(r);
}

bool PrefillScheduler::TakeChunk(Request* r, int n, bool first,
                                 PrefillStep* step) {
  const bool last = r->next_token + n == r->info.prompt_tokens;
  step->chunks.push_back({r->info.id, r->next_token, n, first, last});
  r->next_token += n;
  queued_uncached_tokens_ -= n;
  metrics_.AddQueued(0, -n);
  return last;
}

PrefillStep PrefillScheduler::NextStep(int64_t now_ns) {
  return NextStep(now_ns, [](const PrefillRequestInfo&) { return true; });
}

PrefillStep PrefillScheduler::NextStep(int64_t now_ns, CanStartFn can_start) {
  PrefillStep step;
  int budget = options_.step_token_budget;
  const size_t max_requests =
      static_cast<size_t>(options_.max_requests_per_step);
  std::vector<Request*> done;

  // 1. Requests in progress, oldest start first.
  for (auto& [seq, r] : in_progress_) {
    if (budget == 0 || step.chunks.size() == max_requests) break;
    const int n = std::min(
        {options_.chunk_tokens, r->info.prompt_tokens - r->next_token, budget});
    budget -= n;
    if (TakeChunk(r, n, /*first=*/false, &step)) done.push_back(r);
  }

  // 2. New requests in policy order.
  int refusals = 0;
  bool stop = false;
  const double block_after_ns = options_.refusal_block_after_seconds * 1e9;
  auto room = [&] {
    return !stop && budget > 0 && step.chunks.size() < max_requests;
  };
  // Requests that stay partial after this step.
  int partial = static_cast<int>(in_progress_.size() - done.size());
  // Tries to start queued `r`; sets `stop` when no other may be tried.
  auto try_start = [&](Request* r) {
    const int n =
        std::min({options_.chunk_tokens, r->info.uncached_tokens(), budget});
    const bool stays_partial = n < r->info.uncached_tokens();
    if (stays_partial && partial >= options_.max_partial_requests) return;
    if (!can_start(r->info)) {
      if (static_cast<double>(now_ns - r->info.arrival_ns) >= block_after_ns ||
          ++refusals >= options_.max_refusals_per_step) {
        stop = true;
      }
      return;
    }
    Unqueue(r);
    r->start_seq = next_start_seq_++;
    metrics_.AddQueued(-1, 0);
    metrics_.AddRunning(1);
    metrics_.CountAdmitted();
    metrics_.ObserveWait(r->info.arrival_ns, now_ns);
    budget -= n;
    if (stays_partial) ++partial;
    if (TakeChunk(r, n, /*first=*/true, &step)) {
      done.push_back(r);
    } else {
      in_progress_.emplace(r->start_seq, r);
    }
  };
  for (auto it = queue_.begin(); it != queue_.end() && room();) {
    try_start(*it++);  // advance first: starting erases the request
  }

  for (Request* r : done) {
    in_progress_.erase(r->start_seq);
    metrics_.AddRunning(-1);
    requests_.erase(requests_.find(r->info.id));  // destroys *r
  }
  if (!step.empty())
    metrics_.ObserveBatch(static_cast<int>(step.chunks.size()));
  return step;
}

std::optional<int64_t> PrefillScheduler::oldest_arrival_ns() const {
  if (by_arrival_.empty()) return std::nullopt;
  return (*by_arrival_.begin())->info.arrival_ns;
}

int64_t PrefillScheduler::OldestWaitNs(int64_t now_ns) const {
  std::optional<int64_t> oldest = oldest_arrival_ns();
  return oldest.has_value() ? std::max<int64_t>(0, now_ns - *oldest) : 0;
}

bool PrefillScheduler::Contains(absl::string_view id) const {
  return requests_.contains(id);
}

}  // namespace swaserve::sched
