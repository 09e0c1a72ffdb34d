#include "lib/sched/prefill_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
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
  return std::tie(a->info.priority, a->key, a->info.arrival_ns, a->add_seq) <
         std::tie(b->info.priority, b->key, b->info.arrival_ns, b->add_seq);
}

bool PrefillScheduler::ArrivalLess::operator()(const Request* a,
                                               const Request* b) const {
  return std::tie(a->info.arrival_ns, a->add_seq) <
         std::tie(b->info.arrival_ns, b->add_seq);
}

bool PrefillScheduler::DeadlineLess::operator()(const Request* a,
                                                const Request* b) const {
  return std::tie(a->deadline, a->info.arrival_ns, a->add_seq) <
         std::tie(b->deadline, b->info.arrival_ns, b->add_seq);
}

absl::StatusOr<std::unique_ptr<PrefillScheduler>> PrefillScheduler::Create(
    const PrefillSchedulerOptions& options) {
  if (!(options.aging_tokens_per_second >= 0) ||
      !std::isfinite(options.aging_tokens_per_second)) {
    return absl::InvalidArgumentError(
        absl::StrCat("aging_tokens_per_second must be finite and >= 0, got ",
                     options.aging_tokens_per_second));
  }
  if (!(options.context_cost_per_token >= 0) ||
      !std::isfinite(options.context_cost_per_token)) {
    return absl::InvalidArgumentError(
        absl::StrCat("context_cost_per_token must be finite and >= 0, got ",
                     options.context_cost_per_token));
  }
  if (!(options.fcfs_wait_ratio >= 0) ||
      !std::isfinite(options.fcfs_wait_ratio)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fcfs_wait_ratio must be finite and >= 0, got ",
                     options.fcfs_wait_ratio));
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
  std::unique_ptr<PrefillScheduler> s(new PrefillScheduler(options, metrics));
  if (s->guard_on()) {
    PrefillSchedulerOptions shadow = options;
    shadow.policy = PrefillSchedulerOptions::Policy::kFcfs;
    shadow.registry = nullptr;
    ASSIGN_OR_RETURN(s->shadow_, Create(shadow));
  }
  return s;
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
  r->add_seq = next_add_seq_++;
  r->next_token = info.cached_tokens;
  if (options_.policy == PrefillSchedulerOptions::Policy::kComputeAware) {
    // uncached - aging * (now - arrival) ordered the same for every now.
    r->key = info.uncached_tokens() +
             options_.aging_tokens_per_second * (info.arrival_ns * 1e-9);
  }
  r->cost = Cost(info.cached_tokens, info.uncached_tokens());
  if (shadow_ != nullptr) {
    // The shadow FCFS scheduler sees the same request under a fresh id (the
    // caller may reuse an id once its request left this scheduler).
    r->shadow_id = next_shadow_id_++;
    r->add_clock = work_clock_;
    // The step in flight when it arrived was handed out before: the wait
    // counts from arrival, up to that step's work before add_clock.
    r->arrival_slack = last_step_cost_;
    r->shadow_add_clock = shadow_->work_clock();
    PrefillRequestInfo shadow_info = info;
    shadow_info.id = absl::StrCat(r->shadow_id);
    if (absl::Status st = shadow_->Add(shadow_info); !st.ok()) return st;
    by_shadow_id_.emplace(r->shadow_id, r.get());
    TrackUnshadowed(r.get(), true);
  }
  queue_.insert(r.get());
  by_arrival_.insert(r.get());
  queued_uncached_tokens_ += info.uncached_tokens();
  pending_cost_ += r->cost;
  not_started_cost_ += r->cost;
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
  pending_cost_ -= Cost(r->next_token, remaining);
  if (shadow_ != nullptr) shadow_->Cancel(absl::StrCat(r->shadow_id));
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
  if (r->has_deadline) by_deadline_.erase(r);
  if (shadow_ != nullptr && by_shadow_id_.erase(r->shadow_id) > 0) {
    TrackUnshadowed(r, false);
  }
  not_started_cost_ -= r->cost;
}

double PrefillScheduler::GuardFloor() const {
  return options_.fcfs_wait_floor_tokens >= 0 ? options_.fcfs_wait_floor_tokens
                                              : options_.step_token_budget;
}

double PrefillScheduler::DeadlineFor(const Request& r,
                                     double fcfs_wait) const {
  return r.add_clock +
         std::max(options_.fcfs_wait_ratio * std::max(fcfs_wait, GuardFloor()) -
                      r.arrival_slack,
                  0.0);
}

void PrefillScheduler::TrackUnshadowed(Request* r, bool insert) {
  // DeadlineFor(r, W) >= max(ratio * W + A, ratio * floor + B) with
  // A = add_clock - arrival_slack - ratio * shadow_add_clock and
  // B = add_clock - arrival_slack, W measured from shadow_add_clock.
  const double b = r->add_clock - r->arrival_slack;
  const double a = b - options_.fcfs_wait_ratio * r->shadow_add_clock;
  if (insert) {
    unshadowed_a_.emplace(a, r->shadow_id);
    unshadowed_b_.emplace(b, r->shadow_id);
  } else {
    unshadowed_a_.erase({a, r->shadow_id});
    unshadowed_b_.erase({b, r->shadow_id});
  }
}

bool PrefillScheduler::ShadowBehind(double target) const {
  const double shadow_clock = shadow_->work_clock();
  if (shadow_clock < target) return true;
  if (unshadowed_a_.empty()) return false;
  // A request the shadow has not started has waited there at least
  // shadow_clock - shadow_add_clock, so its deadline will be at least
  // max(ratio * shadow_clock + A, ratio * floor + B) (TrackUnshadowed).
  // The least A and the least B over those requests give a lower bound of
  // every such deadline (not always attained: the shadow may then run a
  // step more than needed, never less), in O(1).
  const double ratio = options_.fcfs_wait_ratio;
  return ratio * shadow_clock + unshadowed_a_.begin()->first < target &&
         ratio * GuardFloor() + unshadowed_b_.begin()->first < target;
}

void PrefillScheduler::AdvanceShadow(int64_t now_ns, double target) {
  while (ShadowBehind(target)) {
    // A request's FCFS start is the start of the shadow step holding its
    // first chunk (as its wait is measured up to the step it starts in).
    const double at = shadow_->work_clock();
    const PrefillStep step = shadow_->NextStep(now_ns);
    if (step.empty()) break;
    for (const PrefillChunk& c : step.chunks) {
      if (c.first) {
        uint64_t shadow_id = 0;
        auto it = absl::SimpleAtoi(c.id, &shadow_id)
                      ? by_shadow_id_.find(shadow_id)
                      : by_shadow_id_.end();
        if (it != by_shadow_id_.end()) {
          // Still queued here: its FCFS wait is now known.
          Request* r = it->second;
          r->fcfs_wait = at - r->shadow_add_clock;
          r->deadline = DeadlineFor(*r, r->fcfs_wait);
          r->has_deadline = true;
          by_deadline_.insert(r);
          by_shadow_id_.erase(it);
          TrackUnshadowed(r, false);
        }
      }
    }
  }
}

double PrefillWork(double context_cost_per_token, int64_t start, int64_t n) {
  // Sum over the tokens of 1 + k * (keys each attends to): for tokens
  // [start, start + n), n + k * n * (start + n / 2).
  const double nd = static_cast<double>(n);
  return nd + context_cost_per_token * nd * (static_cast<double>(start) + 0.5 * nd);
}

WindowRestoreChoice ChooseWindowRestore(const WindowRestoreInputs& in) {
  WindowRestoreChoice c;
  c.compute_from = in.window_safe_tokens;
  if (in.full_tokens <= in.window_safe_tokens || in.restore_from < in.window_safe_tokens ||
      in.restore_from >= in.full_tokens) {
    return c;
  }
  const double recompute = PrefillWork(in.context_cost_per_token, in.window_safe_tokens,
                                       in.full_tokens - in.window_safe_tokens);
  const double tokens = in.restore_tokens >= 0
                           ? std::min<double>(in.restore_tokens, in.full_tokens - in.restore_from)
                           : in.full_tokens - in.restore_from;
  const int64_t n = std::llround(tokens);
  const double restore = PrefillWork(in.context_cost_per_token, in.full_tokens - n, n);
  const double saved = recompute - restore;
  if (saved <= 0 || saved < in.min_saved_work) return c;
  c.restore = true;
  c.compute_from = in.restore_from;
  c.saved_work = saved;
  return c;
}

double PrefillScheduler::Cost(int start, int n) const {
  return PrefillWork(options_.context_cost_per_token, start, n);
}

double PrefillScheduler::StepWorkEstimate() const {
  // The chunks the requests in progress would take (exact), then the rest
  // of the budget at a new chunk's average context, but no more than the
  // work queued (the step is not filled beyond it), and at least the last
  // step's work (a long-context step is followed by more of them). An
  // estimate floored at the budget, as this was before, ran twice the real
  // steps on the CPU cluster (~700 tokens a step): more requests came due
  // early, which cost P90 for about as many requests over 2x
  // (bench/RESULTS.md).
  const int budget = options_.step_token_budget;
  double work = 0;
  int tokens = 0;
  int chunks = 0;
  for (const auto& [seq, r] : in_progress_) {
    if (tokens >= budget || chunks >= options_.max_requests_per_step) break;
    const int n = std::min({options_.chunk_tokens,
                            r->info.prompt_tokens - r->next_token,
                            budget - tokens});
    work += Cost(r->next_token, n);
    tokens += n;
    ++chunks;
  }
  work += std::min<double>(
      (budget - tokens) * (1 + options_.context_cost_per_token * 0.5 * options_.chunk_tokens),
      not_started_cost_);
  return std::max(work, last_step_cost_);
}

double PrefillScheduler::WorkAhead() const {
  // Handed out, plus what the requests in progress still need (they
  // continue first): where the next queued request's work would start.
  return work_clock_ + (pending_cost_ - not_started_cost_);
}

bool PrefillScheduler::guard_on() const {
  return options_.policy == PrefillSchedulerOptions::Policy::kComputeAware &&
         options_.fcfs_wait_ratio > 0;
}

bool PrefillScheduler::LayOutDeadlines() {
  if (by_deadline_.empty()) return false;
  const double ahead = WorkAhead();
  // Whatever the order, no queued request starts later than `ahead` plus all
  // the other queued work: if the earliest deadline is beyond that, every
  // candidate is allowed.
  if ((*by_deadline_.begin())->deadline >= ahead + not_started_cost_) {
    return false;
  }
  double start = ahead;
  double least = std::numeric_limits<double>::infinity();
  for (Request* r : by_deadline_) {
    r->slack_before = least;
    least = std::min(least, r->deadline - start);
    start += r->cost;
  }
  // Requests the shadow has not started have no deadline yet; theirs will
  // not fall before the next step (AdvanceShadow ran until every such one
  // was known), so a candidate among them counts as latest: starting it
  // must leave every known deadline on time.
  least_slack_ = least;
  return true;
}

bool PrefillScheduler::TakeChunk(Request* r, int n, bool first,
                                 PrefillStep* step) {
  const bool last = r->next_token + n == r->info.prompt_tokens;
  step->chunks.push_back({r->info.id, r->next_token, n, first, last, -1, false});
  r->next_token += n;
  const double cost = Cost(r->next_token - n, n);
  work_clock_ += cost;
  pending_cost_ -= cost;
  queued_uncached_tokens_ -= n;
  metrics_.AddQueued(0, -n);
  return last;
}

PrefillStep PrefillScheduler::NextStep(int64_t now_ns) {
  return NextStep(now_ns, [](const PrefillRequestInfo&) { return true; });
}

struct PrefillScheduler::StepState {
  StepState(int64_t now, CanStartFn can, int budget_tokens, size_t max_req)
      : now_ns(now), can_start(can), budget(budget_tokens), max_requests(max_req) {}
  const int64_t now_ns;
  const CanStartFn can_start;
  double clock_before = 0;
  // With the guard, the next step starts about here on the work clock.
  double next_boundary = 0;
  int budget;
  const size_t max_requests;
  PrefillStep step;
  std::vector<Request*> done;  // finish with this step
  int refusals = 0;
  bool stop = false;
  // Requests that stay partial after this step.
  int partial = 0;
  bool room() const { return !stop && budget > 0 && step.chunks.size() < max_requests; }
};

void PrefillScheduler::ContinueInProgress(StepState& s, int reserve, size_t slots) {
  for (auto& [seq, r] : in_progress_) {
    if (s.budget <= reserve || s.step.chunks.size() >= slots) break;
    const int n = std::min({options_.chunk_tokens, r->info.prompt_tokens - r->next_token,
                            s.budget - reserve});
    s.budget -= n;
    if (TakeChunk(r, n, /*first=*/false, &s.step)) s.done.push_back(r);
  }
}

bool PrefillScheduler::TryStart(StepState& s, Request* r, bool urgent) {
  const int n = std::min({options_.chunk_tokens, r->info.uncached_tokens(), s.budget});
  const bool stays_partial = n < r->info.uncached_tokens();
  if (stays_partial && s.partial >= options_.max_partial_requests && !urgent) {
    return false;
  }
  if (!s.can_start(r->info)) {
    const double block_after_ns = options_.refusal_block_after_seconds * 1e9;
    if (static_cast<double>(s.now_ns - r->info.arrival_ns) >= block_after_ns ||
        ++s.refusals >= options_.max_refusals_per_step) {
      s.stop = true;
    }
    return false;
  }
  Unqueue(r);
  r->start_seq = next_start_seq_++;
  metrics_.AddQueued(-1, 0);
  metrics_.AddRunning(1);
  metrics_.CountAdmitted();
  metrics_.ObserveWait(r->info.arrival_ns, s.now_ns);
  double ratio = -1;
  bool late = false;
  if (r->has_deadline) {
    // The guard's own check: its wait on the work clock (counted from up
    // to one step before Add, as the deadline is) against its FCFS wait,
    // or, when larger, the floor or the step in flight at its arrival
    // (which no order could shorten: started at the first step after
    // Add, the ratio is at most 1). On time implies
    // <= max(fcfs_wait_ratio, 1).
    ratio = (s.clock_before - r->add_clock + r->arrival_slack) /
            std::max({r->fcfs_wait, GuardFloor(), r->arrival_slack});
    metrics_.ObserveFcfsWaitRatio(ratio);
    late = s.clock_before > r->deadline;
    if (late) {
      ++late_starts_;
      metrics_.CountLateStart();
    }
  }
  s.budget -= n;
  if (stays_partial) ++s.partial;
  const bool finishes = TakeChunk(r, n, /*first=*/true, &s.step);
  s.step.chunks.back().fcfs_wait_ratio = ratio;
  s.step.chunks.back().late = late;
  if (finishes) {
    s.done.push_back(r);
  } else {
    in_progress_.emplace(r->start_seq, r);
  }
  return true;
}

void PrefillScheduler::StartGuarded(StepState& s, const std::vector<Request*>& due) {
  // Due requests first, then: each start re-lays the deadlines out (the
  // started request's work moves ahead of everyone); requests tried and
  // skipped in this step are not tried again.
  absl::flat_hash_set<const Request*> tried;
  for (Request* r : due) {
    if (!s.room()) break;
    const bool overtakes = r != *queue_.begin();
    if (TryStart(s, r, /*urgent=*/true) && overtakes) {
      ++guarded_starts_;
      metrics_.CountGuarded();
    }
    tried.insert(r);
  }
  bool started = true;
  while (started && s.room()) {
    started = false;
    const bool laid_out = LayOutDeadlines();
    bool guard_skipped = false;
    for (auto it = queue_.begin(); it != queue_.end() && s.room();) {
      Request* r = *it++;
      if (tried.contains(r)) continue;
      if (laid_out && (r->has_deadline ? r->slack_before : least_slack_) < r->cost) {
        guard_skipped = true;  // would push an earlier deadline past it
        continue;
      }
      // A request due before the next step may start beyond the partial
      // cap (the FCFS run would not have had the same requests in
      // progress).
      const bool urgent = r->has_deadline && r->deadline < s.next_boundary;
      if (TryStart(s, r, urgent)) {
        if (guard_skipped) {
          ++guarded_starts_;
          metrics_.CountGuarded();
        }
        started = true;
        break;
      }
      tried.insert(r);
    }
  }
}

PrefillStep PrefillScheduler::NextStep(int64_t now_ns, CanStartFn can_start) {
  StepState s(now_ns, can_start, options_.step_token_budget,
              static_cast<size_t>(options_.max_requests_per_step));
  // With the guard, the next step starts about `next_boundary` on the work
  // clock: a request due before it must start in this step. The shadow runs
  // until every deadline before it is known, so that it is known before
  // this step is decided, not after.
  s.clock_before = work_clock_;
  s.next_boundary = s.clock_before;
  if (shadow_ != nullptr) {
    s.next_boundary += StepWorkEstimate();
    AdvanceShadow(now_ns, s.next_boundary);
  }

  // 1. Requests in progress, oldest start first. With the guard, queued
  // requests due before the next step (in deadline order) come first: the
  // requests in progress leave them room for their first chunks.
  std::vector<Request*> due;
  int reserve = 0;
  if (guard_on()) {
    for (Request* r : by_deadline_) {
      if (r->deadline >= s.next_boundary || due.size() >= s.max_requests ||
          reserve >= s.budget) {
        break;
      }
      reserve += std::min({options_.chunk_tokens, r->info.uncached_tokens(), s.budget - reserve});
      due.push_back(r);
    }
  }
  ContinueInProgress(s, reserve, s.max_requests - due.size());

  // 2. New requests in policy order.
  s.partial = static_cast<int>(in_progress_.size() - s.done.size());
  if (!guard_on()) {
    for (auto it = queue_.begin(); it != queue_.end() && s.room();) {
      TryStart(s, *it++, false);  // advance first: starting erases it
    }
  } else {
    StartGuarded(s, due);
  }

  // Due requests that could not start (their memory is not there) must not
  // keep the budget they reserved from the requests in progress: an empty
  // step with work in progress would wait for an event that only that work
  // can produce (found by tests/unit/worker/prefill_admission_test.cc).
  if (s.step.chunks.empty() && !in_progress_.empty()) {
    s.budget = options_.step_token_budget;
    ContinueInProgress(s, /*reserve=*/0, s.max_requests);
  }

  for (Request* r : s.done) {
    in_progress_.erase(r->start_seq);
    metrics_.AddRunning(-1);
    requests_.erase(requests_.find(r->info.id));  // destroys *r
  }
  last_step_cost_ = work_clock_ - s.clock_before;
  if (!s.step.empty()) metrics_.ObserveBatch(static_cast<int>(s.step.chunks.size()));
  return std::move(s.step);
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
