#include "lib/worker/kv_receiver.h"

#include <atomic>
#include <deque>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/clock.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/metrics/buckets.h"
#include "lib/rpc/status_conversion.h"
#include "lib/transfer/kv_destination.h"
#include "lib/worker/convert.h"
#include "lib/worker/kv_staging.h"
#include "lib/worker/staging_budget.h"

namespace swaserve::worker {
namespace {

constexpr char kArenaBytesMetric[] = "swaserve_decode_staging_arena_bytes";
constexpr char kBudgetBytesMetric[] = "swaserve_decode_staging_budget_bytes";
constexpr size_t kArenaAlign = 4096;

// A GetDestination call, answered once: when the budget grants its bytes,
// when it gives up (CancelDestination), or when the stream ends (Forget).
class DestinationCall {
 public:
  explicit DestinationCall(KvDestinationFn done) : done_(std::move(done)) {}
  // False if it had already been answered.
  bool Finish(absl::StatusOr<v1::KvDestination> dest) {
    KvDestinationFn done;
    {
      absl::MutexLock lock(&mu_);
      if (done_ == nullptr) return false;
      done = std::move(done_);
      done_ = nullptr;
    }
    done(std::move(dest));
    return true;
  }

 private:
  absl::Mutex mu_;
  KvDestinationFn done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

struct KvReceiver::Shared {
  struct Pending {
    std::string transfer_id;
    transfer::KvStagingPlan plan;
    StagedKvLayout layout;
    DecodeJob job;  // moved out when the commit arrives
    ReceivedFn on_received;
    std::atomic<bool> receiving{false};  // the transfer is armed
    // Guarded by Shared::mu.
    bool acquiring = false;  // a GetDestination waits for the budget
    std::optional<v1::KvDestination> destination;
    std::shared_ptr<DestinationCall> call;
  };

  KvReceiverOptions options;
  kv::KvShape shape;
  mutable absl::Mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<Pending>> pending ABSL_GUARDED_BY(mu);
  std::unique_ptr<StagingBudget> budget;
  metrics::Histogram* wait_commit = nullptr;
  metrics::Counter* staging_fallback = nullptr;
  metrics::Counter* staging_waits = nullptr;

  // The staging arena (null: none) and the registration of its memory (the
  // arena keeps it alive too; this is what transfers name).
  std::shared_ptr<transfer::Registration> arena_registration;
  std::shared_ptr<StagingArena> arena;
  // Arena stagings whose transfer failed, out of use until `until_ns`
  // (deadlines in order: the quarantine is one fixed duration).
  struct Quarantined {
    int64_t until_ns = 0;
    std::unique_ptr<KvStaging> staging;
  };
  std::deque<Quarantined> quarantine ABSL_GUARDED_BY(mu);
  std::atomic<size_t> quarantined_bytes{0};

  void Quarantine(std::unique_ptr<KvStaging> staging) {
    quarantined_bytes += staging->arena_block_bytes();
    absl::MutexLock lock(&mu);
    quarantine.push_back(
        {base::MonotonicNanos() + absl::ToInt64Nanoseconds(options.staging_quarantine),
         std::move(staging)});
  }

  // Returns quarantined blocks whose time is up to the arena.
  void ReleaseQuarantined() {
    std::vector<std::unique_ptr<KvStaging>> done;
    {
      absl::MutexLock lock(&mu);
      const int64_t now = base::MonotonicNanos();
      while (!quarantine.empty() && quarantine.front().until_ns <= now) {
        done.push_back(std::move(quarantine.front().staging));
        quarantine.pop_front();
      }
    }
    for (const auto& d : done) quarantined_bytes -= d->arena_block_bytes();
  }  // `done` returns the blocks here, outside mu

  absl::Status InitArena();
  absl::Status InitMetrics(const std::shared_ptr<Shared>& self);
  static absl::StatusOr<v1::KvDestination> Stage(const std::shared_ptr<Shared>& self,
                                                 const std::shared_ptr<Pending>& pending,
                                                 std::unique_ptr<StagingBudget::Reservation> res);
  static void OnTransferDone(const std::shared_ptr<Shared>& self,
                             const std::shared_ptr<Pending>& pending,
                             std::unique_ptr<transfer::Registration> reg, int64_t t0,
                             absl::StatusOr<transfer::ReceivedTransfer> got);
};

using Shared = KvReceiver::Shared;
using Pending = Shared::Pending;

absl::Status Shared::InitArena() {
  const size_t bytes = options.staging_arena_bytes / kArenaAlign * kArenaAlign;
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV staging arena of ", options.staging_arena_bytes, " bytes is below one page"));
  }
  absl::StatusOr<std::unique_ptr<transfer::Registration>> reg = options.transfer->Allocate(bytes);
  if (!reg.ok()) {
    return base::Annotate(reg.status(),
                          absl::StrCat("allocating the ", bytes >> 20,
                                       " MiB KV staging arena (a smaller "
                                       "--decode.staging_arena_mib, or 0 for heap staging)"));
  }
  arena_registration = *std::move(reg);
  StagingArenaOptions ao;
  ao.base = arena_registration->data();
  ao.size = arena_registration->size();
  ao.alignment = kArenaAlign;
  ao.owner = arena_registration;
  ASSIGN_OR_RETURN(arena, StagingArena::Create(ao));
  return absl::OkStatus();
}

absl::Status Shared::InitMetrics(const std::shared_ptr<Shared>& self) {
  metrics::Registry* r = options.registry;
  ASSIGN_OR_RETURN(auto* wc, r->AddHistogram("swaserve_decode_commit_wait_seconds",
                                             "Decode stream start to the KV commit (or its "
                                             "failure).",
                                             {}, metrics::DefaultLatencyBuckets()));
  wait_commit = &wc->WithLabels();
  ASSIGN_OR_RETURN(auto* waits,
                   r->AddCounter("swaserve_decode_staging_waits_total",
                                 "KV stagings that had to wait because the staging budget "
                                 "was full when the prefill worker was ready to ship."));
  staging_waits = &waits->WithLabels();
  // Reads only the budget (its own lock): never calls into the registry.
  RETURN_IF_ERROR(r->AddCallbackGauge(
      kBudgetBytesMetric,
      "KV staging budget bytes: in_use (staged or being received), waiting (requests "
      "in line for the budget), capacity (--decode.staging_budget_mib).",
      {"state"}, [b = budget.get()] {
        return std::vector<metrics::CallbackSample>{
            {{"in_use"}, static_cast<double>(b->in_use())},
            {{"waiting"}, static_cast<double>(b->waiting_bytes())},
            {{"capacity"}, static_cast<double>(b->capacity())}};
      }));
  if (arena == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto* fallback,
                   r->AddCounter("swaserve_decode_staging_fallback_total",
                                 "Requests whose KV staging went to heap memory registered "
                                 "per request because the staging arena had no room.",
                                 {}));
  staging_fallback = &fallback->WithLabels();
  // Reads only the arena and an atomic: never calls into the registry.
  return r->AddCallbackGauge(
      kArenaBytesMetric,
      "KV staging arena bytes by state: in_use (requests waiting for or holding staged "
      "KV), quarantined (after a failed transfer), free; they sum to the capacity.",
      {"state"}, [a = arena, s = self.get()] {
        const double used = static_cast<double>(a->bytes_in_use());
        const double quarantined = static_cast<double>(s->quarantined_bytes.load());
        return std::vector<metrics::CallbackSample>{
            {{"in_use"}, used - quarantined},
            {{"quarantined"}, quarantined},
            {{"free"}, static_cast<double>(a->capacity()) - used}};
      });
}

absl::StatusOr<std::unique_ptr<KvReceiver>> KvReceiver::Create(const KvReceiverOptions& options) {
  if (options.transfer == nullptr || options.pools == nullptr) {
    return absl::InvalidArgumentError("KvReceiver needs a transfer engine and pools");
  }
  if (options.staging_budget_bytes == 0) {
    return absl::InvalidArgumentError("the KV staging budget must be > 0 bytes");
  }
  auto shared = std::make_shared<Shared>();
  shared->options = options;
  shared->shape = options.pools->shape();
  shared->budget = std::make_unique<StagingBudget>(options.staging_budget_bytes);
  if (options.staging_arena_bytes > 0) RETURN_IF_ERROR(shared->InitArena());
  if (options.registry != nullptr) RETURN_IF_ERROR(shared->InitMetrics(shared));
  return std::unique_ptr<KvReceiver>(new KvReceiver(std::move(shared)));
}

KvReceiver::~KvReceiver() {
  // The gauges' callbacks read shared_: stop them first.
  if (metrics::Registry* r = shared_->options.registry; r != nullptr) {
    (void)r->RemoveCallback(kBudgetBytesMetric);
    if (shared_->arena != nullptr) (void)r->RemoveCallback(kArenaBytesMetric);
  }
}

const StagingArena* KvReceiver::staging_arena() const { return shared_->arena.get(); }
size_t KvReceiver::staging_budget_bytes() const { return shared_->budget->capacity(); }
size_t KvReceiver::pending() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->pending.size();
}

absl::Status KvReceiver::Expect(const std::string& transfer_id, DecodeJob job,
                                ReceivedFn on_received) {
  const KvReceiverOptions& o = shared_->options;
  const int n = static_cast<int>(job.prompt.size());
  if (transfer_id.empty()) return absl::InvalidArgumentError("transfer_id is required");
  if (n == 0) return absl::InvalidArgumentError("prompt_token_ids is required");
  // Requests that could never run here fail now, before any prefill
  // compute: the prompt plus its first token must fit the pools, and its
  // staging the budget. Request errors: no breaker counts them.
  const int ps = shared_->shape.page_size;
  const int64_t pages = (static_cast<int64_t>(n) + 1 + ps - 1) / ps;
  if (pages > o.pools->full().num_pages()) {
    return rpc::ErrorWithDetail(
        absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_TOO_LARGE_FOR_WORKER,
        absl::StrCat("prompt of ", n, " tokens needs ", pages, " full KV pages; decode worker ",
                     o.worker_id, " has ", o.pools->full().num_pages()),
        o.worker_id, /*retryable=*/false);
  }
  auto pending = std::make_shared<Pending>();
  pending->transfer_id = transfer_id;
  ASSIGN_OR_RETURN(pending->plan, transfer::PlanStaging(shared_->shape, n, o.mtp_lookback));
  pending->layout = StagedKvLayout::For(shared_->shape, n, pending->plan.first_swa_token);
  if (pending->layout.total_bytes() > shared_->budget->capacity()) {
    return rpc::ErrorWithDetail(
        absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_TOO_LARGE_FOR_WORKER,
        absl::StrCat("prompt of ", n, " tokens needs ", pending->layout.total_bytes() >> 20,
                     " MiB of KV staging; decode worker ", o.worker_id,
                     "'s staging budget is ", shared_->budget->capacity() >> 20, " MiB"),
        o.worker_id, /*retryable=*/false);
  }
  pending->job = std::move(job);
  pending->on_received = std::move(on_received);
  absl::MutexLock lock(&shared_->mu);
  if (!shared_->pending.emplace(transfer_id, std::move(pending)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer ", transfer_id, " is already pending here"));
  }
  return absl::OkStatus();
}

void KvReceiver::Forget(const std::string& transfer_id, absl::string_view why) {
  std::shared_ptr<DestinationCall> call;
  // Released outside the lock: its staging's budget reservation may grant
  // a waiter, whose callback takes shared.mu.
  std::shared_ptr<Pending> gone;
  {
    absl::MutexLock lock(&shared_->mu);
    auto it = shared_->pending.find(transfer_id);
    if (it == shared_->pending.end()) return;
    gone = std::move(it->second);
    call = std::move(gone->call);
    shared_->pending.erase(it);
  }
  if (gone->receiving.load()) (void)shared_->options.transfer->CancelReceive(transfer_id);
  if (call != nullptr) {
    shared_->budget->Cancel(transfer_id);
    call->Finish(absl::NotFoundError(absl::StrCat("transfer ", transfer_id, ": ", why)));
  }
}

void KvReceiver::CancelDestination(const std::string& transfer_id) {
  std::shared_ptr<DestinationCall> call;
  if (shared_->budget->Cancel(transfer_id)) {
    absl::MutexLock lock(&shared_->mu);
    auto it = shared_->pending.find(transfer_id);
    if (it != shared_->pending.end()) {
      it->second->acquiring = false;
      call = std::move(it->second->call);
    }
  }
  if (call != nullptr) call->Finish(absl::CancelledError("GetKvDestination cancelled"));
}

void KvReceiver::GetDestination(const std::string& transfer_id, KvDestinationFn done) {
  auto call = std::make_shared<DestinationCall>(std::move(done));
  std::shared_ptr<Pending> pending;
  {
    absl::ReleasableMutexLock lock(&shared_->mu);
    auto it = shared_->pending.find(transfer_id);
    if (it == shared_->pending.end()) {
      lock.Release();
      call->Finish(absl::NotFoundError(absl::StrCat("no pending transfer ", transfer_id,
                                                    " on decode worker ",
                                                    shared_->options.worker_id,
                                                    " (its decode stream ended)")));
      return;
    }
    pending = it->second;
    if (pending->destination.has_value()) {  // already staged: idempotent
      v1::KvDestination dest = *pending->destination;
      lock.Release();
      call->Finish(std::move(dest));
      return;
    }
    if (pending->acquiring) {
      lock.Release();
      call->Finish(
          absl::AbortedError(absl::StrCat("transfer ", transfer_id, " is already being staged")));
      return;
    }
    pending->acquiring = true;
    pending->call = call;
  }
  const size_t bytes = pending->layout.total_bytes();
  if (shared_->budget->in_use() + bytes > shared_->budget->capacity() &&
      shared_->staging_waits != nullptr) {
    shared_->staging_waits->Increment();
  }
  std::shared_ptr<Shared> shared = shared_;
  absl::Status st = shared_->budget->Acquire(
      transfer_id, bytes,
      [shared, pending, call](std::unique_ptr<StagingBudget::Reservation> res) {
        {
          absl::ReleasableMutexLock lock(&shared->mu);
          pending->acquiring = false;
          pending->call.reset();
          // The stream ended meanwhile: the reservation goes back.
          auto it = shared->pending.find(pending->transfer_id);
          if (it == shared->pending.end() || it->second != pending) {
            lock.Release();
            call->Finish(absl::NotFoundError(
                absl::StrCat("transfer ", pending->transfer_id, ": the decode stream ended")));
            return;
          }
        }
        absl::StatusOr<v1::KvDestination> dest = Shared::Stage(shared, pending, std::move(res));
        if (dest.ok()) {
          absl::MutexLock lock(&shared->mu);
          pending->destination = *dest;
        }
        if (!call->Finish(dest) && dest.ok()) {
          // The caller is gone: nobody will send; the stream's own end
          // (router cancel) cancels the receive and frees the staging.
          SWA_LOG(debug, "transfer {} staged for a caller that left", pending->transfer_id);
        }
      });
  if (!st.ok()) {
    {
      absl::MutexLock lock(&shared_->mu);
      pending->acquiring = false;
      pending->call.reset();
    }
    call->Finish(st);
  }
}

absl::StatusOr<v1::KvDestination> Shared::Stage(const std::shared_ptr<Shared>& self,
                                                const std::shared_ptr<Pending>& pending,
                                                std::unique_ptr<StagingBudget::Reservation> res) {
  const KvReceiverOptions& o = self->options;
  std::unique_ptr<KvStaging> staging;
  if (self->arena != nullptr) {
    self->ReleaseQuarantined();
    absl::StatusOr<std::unique_ptr<KvStaging>> in =
        KvStaging::CreateIn(pending->layout, self->arena);
    if (in.ok()) {
      staging = *std::move(in);
    } else if (in.status().code() == absl::StatusCode::kResourceExhausted) {
      if (self->staging_fallback != nullptr) self->staging_fallback->Increment();
      SWA_LOG(debug, "transfer {}: {}; staging in heap memory", pending->transfer_id,
              std::string(in.status().message()));
    } else {
      return in.status();
    }
  }
  std::unique_ptr<transfer::Registration> reg;
  if (staging == nullptr) {
    ASSIGN_OR_RETURN(staging, KvStaging::Create(pending->layout));
    ASSIGN_OR_RETURN(reg, o.transfer->Register(staging->data(), staging->size()));
  }
  if (staging->size() != pending->plan.total_bytes()) {
    return absl::InternalError("KV staging and transfer plan disagree on the size");
  }
  staging->set_reservation(std::move(res));
  transfer::KvReceiveOptions ro;
  ro.transfer_id = pending->transfer_id;
  ro.shape = self->shape;
  ro.num_tokens = static_cast<int>(pending->job.prompt.size());
  ro.swa_slack = o.mtp_lookback;  // the plan the layout was made from
  ro.staging = reg != nullptr ? reg.get() : self->arena_registration.get();
  ro.offset = staging->arena_offset();
  ro.timeout = o.commit_timeout;
  pending->job.staging = std::move(staging);
  pending->receiving = true;
  const int64_t t0 = base::MonotonicNanos();
  // The callback owns the registration (heap staging) until UCX is done.
  auto reg_holder = std::make_shared<std::unique_ptr<transfer::Registration>>(std::move(reg));
  absl::StatusOr<v1::KvDestination> dest = transfer::ExpectKvTransfer(
      *o.transfer, ro,
      [self, pending, reg_holder, t0](absl::StatusOr<transfer::ReceivedTransfer> got) {
        OnTransferDone(self, pending, std::move(*reg_holder), t0, std::move(got));
      });
  if (!dest.ok()) {
    pending->receiving = false;
    pending->job.staging.reset();
  }
  return dest;
}

void Shared::OnTransferDone(const std::shared_ptr<Shared>& self,
                            const std::shared_ptr<Pending>& pending,
                            std::unique_ptr<transfer::Registration> reg, int64_t t0,
                            absl::StatusOr<transfer::ReceivedTransfer> got) {
  pending->receiving = false;
  reg.reset();  // UCX no longer touches the staging
  if (self->wait_commit != nullptr) {
    self->wait_commit->Observe(static_cast<double>(base::MonotonicNanos() - t0) * 1e-9);
  }
  ReceivedFn on_received = std::move(pending->on_received);
  if (on_received == nullptr) return;
  if (!got.ok()) {
    // A sender may still put into an arena block (see the header).
    if (pending->job.staging != nullptr && pending->job.staging->arena() != nullptr) {
      self->Quarantine(std::move(pending->job.staging));
    }
    on_received(rpc::ErrorWithDetail(
        got.status().code(), v1::ERROR_CODE_TRANSFER_FAILED,
        absl::StrCat("KV transfer ", pending->transfer_id, " failed: ", got.status().message()),
        self->options.worker_id, /*retryable=*/true));
    return;
  }
  absl::StatusOr<v1::CommitKvRequest> commit = transfer::DecodeCommitPayload(got->commit_payload);
  if (!commit.ok()) {
    on_received(commit.status());
    return;
  }
  ReceivedKv received;
  received.job = std::move(pending->job);
  received.job.first_token = FromProto(commit->first_token_logprob());
  received.job.first_token.token = commit->first_token();
  const v1::Tensor& tail = commit->tail_hidden_states();
  if (tail.data().size() % sizeof(float) == 0) {
    received.job.tail_hidden.resize(tail.data().size() / sizeof(float));
    std::memcpy(received.job.tail_hidden.data(), tail.data().data(), tail.data().size());
  }
  // What the prefill worker actually reused (usage reports it, never the
  // router's estimate).
  received.job.cached_tokens = static_cast<int>(commit->cached_tokens());
  received.prefill_queue_seconds = commit->prefill_queue_seconds();
  on_received(std::move(received));
}

}  // namespace swaserve::worker
