#include "lib/transfer/transfer_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"
#include "lib/transfer/engine_state.h"
#include "lib/transfer/receiver.h"
#include "lib/transfer/ucx_util.h"

// The public TransferEngine and its progress thread (internal::Core). The
// protocol's parts live in engine_state.h (what the thread owns),
// sender.h, receiver.h, peer_table.h, registration_table.h, ucx_request.h,
// ucx_util.h, process_identity.h, transfer_metrics.h and wire.h.

namespace swaserve::transfer {

absl::string_view PrimitiveName(Primitive primitive) {
  switch (primitive) {
    case Primitive::kAuto:
      return "auto";
    case Primitive::kActiveMessage:
      return "am";
    case Primitive::kPut:
      return "put";
  }
  return "?";
}

absl::string_view TransportName(Transport transport) {
  switch (transport) {
    case Transport::kUnknown:
      return "unknown";
    case Transport::kSelf:
      return "self";
    case Transport::kSharedMemory:
      return "shm";
    case Transport::kTcp:
      return "tcp";
    case Transport::kRdma:
      return "rdma";
  }
  return "?";
}

Primitive AutoPrimitive(Transport transport, bool destination_ucx_allocated) {
  // Over shared memory a put into UCX-allocated memory is one memcpy by the
  // sender into the receiver's mapped segment: memcpy speed, the best
  // measured (bench/RESULTS.md, "KV transfer (UCX)").
  if (transport == Transport::kSharedMemory && destination_ucx_allocated) {
    return Primitive::kPut;
  }
  return AutoPrimitive(transport);
}

Primitive AutoPrimitive(Transport transport) {
  // Into ordinary memory (measured, UCX 1.13): the AM rendezvous beats puts
  // over shared memory (where UCP emulates them over AM bcopy) and by 4-6x
  // over tcp (where puts crawl). RDMA was not measured; the rendezvous is an
  // RDMA read there and keeps receiver-side validation, so it stays the
  // default.
  switch (transport) {
    case Transport::kUnknown:
    case Transport::kSelf:
    case Transport::kSharedMemory:
    case Transport::kTcp:
    case Transport::kRdma:
      return Primitive::kActiveMessage;
  }
  return Primitive::kActiveMessage;
}

namespace internal {

// The progress thread and its task queue; everything else it owns is the
// EngineState (engine_state.h). The public methods post work to the thread
// (and, where they return a value, wait for it); once the thread has
// stopped they run inline, one caller at a time under inline_mu_.
// Thread-safe. Shared by the TransferEngine and its Registrations.
class Core {
 public:
  static absl::StatusOr<std::shared_ptr<Core>> Create(
      const TransferEngineOptions& options);
  ~Core();

  const std::string& address() const { return state_->address(); }

  // Called by ~TransferEngine: cancels everything, stops the thread,
  // destroys the worker.
  void Shutdown();

  absl::StatusOr<std::unique_ptr<Registration>> Register(
      std::shared_ptr<Core> self, void* data, size_t size, bool allocate);
  void Deregister(uint64_t id);
  absl::StatusOr<Destination> ExpectTransfer(ReceiveRequest request,
                                             ReceiveCallback done);
  absl::Status CancelReceive(std::string transfer_id);
  uint64_t Send(SendRequest request, SendCallback done);
  void CancelSend(uint64_t id);
  EngineStats Stats() const { return state_->Stats(); }
  bool OnProgressThread() const {
    return std::this_thread::get_id() == thread_id_.load();
  }

 private:
  using Task = absl::AnyInvocable<void()>;

  explicit Core(std::unique_ptr<EngineState> state)
      : options_(state->context().options), state_(std::move(state)) {}
  absl::Status Init();

  // Runs `fn` on the progress thread and waits for it; inline when already
  // there or when the thread has stopped.
  template <typename F>
  auto RunSync(F fn) -> decltype(fn());
  bool Post(Task task);
  void Wake();

  void Loop();
  void RunTasks();
  bool HasPendingWork() const {
    return task_pending_.load(std::memory_order_acquire) ||
           state_->HasPendingWork();
  }
  void Sleep(int64_t now);

  const TransferEngineOptions& options_;
  // Progress-thread state (engine_state.h).
  const std::unique_ptr<EngineState> state_;
  int epoll_fd_ = -1;
  int event_fd_ = -1;
  int ucx_fd_ = -1;  // progress-thread state once the thread runs

  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> thread_running_{false};

  absl::Mutex task_mu_;
  std::vector<Task> tasks_ ABSL_GUARDED_BY(task_mu_);
  bool accepting_ ABSL_GUARDED_BY(task_mu_) = true;
  std::atomic<bool> task_pending_{false};
  // Serializes inline execution once the thread has stopped.
  absl::Mutex inline_mu_;

  std::atomic<uint64_t> next_send_id_{1};
  std::atomic<uint64_t> next_registration_id_{1};

  // Progress-thread state.
  int64_t shutdown_started_ns_ = 0;
};

// --- Construction ----------------------------------------------------------

absl::StatusOr<std::shared_ptr<Core>> Core::Create(
    const TransferEngineOptions& options) {
  if (options.max_message_bytes == 0) {
    return absl::InvalidArgumentError("max_message_bytes must be > 0");
  }
  if (options.max_inflight_messages <= 0) {
    return absl::InvalidArgumentError("max_inflight_messages must be > 0");
  }
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_timeout must be > 0");
  }
  absl::StatusOr<std::unique_ptr<EngineState>> state =
      EngineState::Create(options);
  if (!state.ok()) return state.status();
  std::shared_ptr<Core> core(new Core(*std::move(state)));
  if (absl::Status s = core->Init(); !s.ok()) return s;
  return core;
}

absl::Status Core::Init() {
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (event_fd_ < 0 || epoll_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("eventfd/epoll_create1: ", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = event_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  if (ucp_worker_get_efd(state_->worker(), &ucx_fd_) == UCS_OK) {
    ev.data.fd = ucx_fd_;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ucx_fd_, &ev) != 0) ucx_fd_ = -1;
  } else {
    ucx_fd_ = -1;
    SWA_LOG(info, "UCX worker has no event fd; the progress thread polls");
  }

  state_->context().metrics.Export(options_.registry);

  thread_running_ = true;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

Core::~Core() {
  // The EngineState unmaps what is left and destroys the worker (unless
  // Shutdown did) and the context.
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (event_fd_ >= 0) close(event_fd_);
}

void Core::Shutdown() {
  if (!thread_.joinable()) return;
  Post([this] {
    if (!state_->context().shutting_down) shutdown_started_ns_ = NowNanos();
    state_->BeginShutdown();
  });
  thread_.join();
  absl::MutexLock lock(&inline_mu_);
  // Registrations may still be alive; their memh stays valid (context-level).
  state_->DestroyWorker();
}

// --- Task plumbing ---------------------------------------------------------

void Core::Wake() {
  const uint64_t one = 1;
  ssize_t ignored = write(event_fd_, &one, sizeof(one));
  (void)ignored;
}

bool Core::Post(Task task) {
  {
    absl::MutexLock lock(&task_mu_);
    if (!accepting_) return false;
    tasks_.push_back(std::move(task));
    task_pending_.store(true, std::memory_order_release);
  }
  Wake();
  return true;
}

template <typename F>
auto Core::RunSync(F fn) -> decltype(fn()) {
  using R = decltype(fn());
  if (OnProgressThread()) return fn();
  std::optional<R> result;
  absl::Notification done;
  const bool posted = Post([&] {
    result.emplace(fn());
    done.Notify();
  });
  if (!posted) {
    absl::MutexLock lock(&inline_mu_);
    return fn();
  }
  done.WaitForNotification();
  return *std::move(result);
}

void Core::RunTasks() {
  if (!task_pending_.load(std::memory_order_acquire)) return;
  std::vector<Task> tasks;
  {
    absl::MutexLock lock(&task_mu_);
    tasks.swap(tasks_);
    task_pending_.store(false, std::memory_order_relaxed);
  }
  for (Task& t : tasks) t();
}

// --- The progress loop -----------------------------------------------------

void Core::Loop() {
  thread_id_ = std::this_thread::get_id();
  EngineContext& ctx = state_->context();
  ctx.last_activity_ns = NowNanos();
  while (true) {
    state_->NewRound();
    RunTasks();
    const unsigned events = state_->Progress();
    state_->ProcessDeferred();
    const int64_t now = NowNanos();
    if (state_->DeadlineCheckDue(now)) state_->CheckDeadlines(now);
    if (ctx.shutting_down) {
      if (state_->Quiescent()) break;
      if (now - shutdown_started_ns_ > DurationNanos(absl::Seconds(10))) {
        SWA_LOG(err,
                "transfer engine '{}': {} UCX requests still outstanding 10 s "
                "after shutdown began; stopping anyway",
                options_.name, ctx.requests.inflight());
        break;
      }
    }
    state_->PublishStats();
    if (events > 0) {
      ctx.last_activity_ns = now;
      continue;
    }
    if (HasPendingWork()) continue;
    if (state_->Busy()) {
      // A transfer is moving: poll. UCX 1.13's shared-memory rendezvous
      // does not raise a wakeup event for every step, so sleeping on the
      // event fd here stalls a transfer until the sleep times out.
      if (options_.yield_while_polling) std::this_thread::yield();
      continue;
    }
    if (now - ctx.last_activity_ns <
        DurationNanos(options_.spin_before_sleep)) {
      continue;
    }
    Sleep(now);
  }
  absl::MutexLock inline_lock(&inline_mu_);
  {
    absl::MutexLock lock(&task_mu_);
    accepting_ = false;
  }
  RunTasks();  // tasks posted before accepting_ turned false
  state_->ProcessDeferred();
  state_->PublishStats();
  thread_running_ = false;
  thread_id_ = std::thread::id();
}

void Core::Sleep(int64_t now) {
  if (ucx_fd_ >= 0) {
    const ucs_status_t st = ucp_worker_arm(state_->worker());
    if (st == UCS_ERR_BUSY) return;  // events pending: progress again
    if (st != UCS_OK) {
      SWA_LOG(info, "ucp_worker_arm: {}; the progress thread polls instead",
              ucs_status_string(st));
      ucx_fd_ = -1;
    }
  }
  // Bounded: UCX 1.13 does not raise an event for every arrival (see Busy),
  // so an idle engine still looks every few milliseconds.
  int64_t wait_ns = DurationNanos(absl::Milliseconds(5));
  if (ucx_fd_ < 0) wait_ns = DurationNanos(absl::Milliseconds(1));
  const int64_t next_deadline_ns = state_->context().next_deadline_ns;
  if (next_deadline_ns != std::numeric_limits<int64_t>::max()) {
    wait_ns = std::min(wait_ns, std::max<int64_t>(0, next_deadline_ns - now));
  }
  const int timeout_ms = static_cast<int>((wait_ns + 999'999) / 1'000'000);
  epoll_event events[2];
  const int n = epoll_wait(epoll_fd_, events, 2, timeout_ms);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == event_fd_) {
      uint64_t value;
      ssize_t ignored = read(event_fd_, &value, sizeof(value));
      (void)ignored;
    }
  }
  state_->context().last_activity_ns = NowNanos();
}

// --- Operations ------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Registration>> Core::Register(
    std::shared_ptr<Core> self, void* data, size_t size, bool allocate) {
  if ((data == nullptr && !allocate) || size == 0) {
    return absl::InvalidArgumentError(
        "Register needs a non-null address and a non-zero size");
  }
  const uint64_t id = next_registration_id_.fetch_add(1);
  absl::StatusOr<void*> mapped = RunSync([&]() -> absl::StatusOr<void*> {
    return state_->Register(id, data, size, allocate);
  });
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<Registration>(
      new Registration(std::move(self), id, *mapped, size));
}

void Core::Deregister(uint64_t id) {
  absl::Notification released;
  const bool from_callback = OnProgressThread();
  const bool wait = RunSync([&]() -> bool {
    // From a callback we cannot wait for ourselves (documented: release a
    // registration from a callback only once its transfers are done).
    if (!state_->Release(id, /*unmap_now=*/!thread_running_,
                         from_callback ? nullptr : &released)) {
      return false;
    }
    Wake();
    return !from_callback;
  });
  if (wait) released.WaitForNotification();
}

absl::StatusOr<Destination> Core::ExpectTransfer(ReceiveRequest request,
                                                 ReceiveCallback done) {
  if (absl::Status s = Receiver::Validate(request); !s.ok()) return s;
  std::vector<RegionRef> refs;
  for (const LocalRegion& lr : request.regions) {
    refs.push_back(
        RegionRef{lr.registration->id_, lr.registration->core_.get() == this});
  }
  return RunSync([&]() -> absl::StatusOr<Destination> {
    return state_->receiver().Expect(request, refs, std::move(done));
  });
}

absl::Status Core::CancelReceive(std::string transfer_id) {
  return RunSync(
      [&]() -> absl::Status { return state_->receiver().Cancel(transfer_id); });
}

uint64_t Core::Send(SendRequest request, SendCallback done) {
  const uint64_t id = next_send_id_.fetch_add(1);
  auto task = [this, id, request = std::move(request),
               done = std::move(done)]() mutable {
    state_->sender().Start(id, std::move(request), std::move(done));
  };
  if (OnProgressThread()) {
    task();
  } else if (!Post(std::move(task))) {
    // Engine stopped; Post dropped the task (and the callback with it).
    // The engine's destructor has run, so the caller cannot be here.
  }
  return id;
}

void Core::CancelSend(uint64_t id) {
  Post([this, id] { state_->sender().Cancel(id); });
}

}  // namespace internal

// --- Public wrappers
// -----------------------------------------------------------

Registration::~Registration() {
  if (core_ != nullptr) core_->Deregister(id_);
}

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    const TransferEngineOptions& options) {
  absl::StatusOr<std::shared_ptr<internal::Core>> core =
      internal::Core::Create(options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<TransferEngine>(
      new TransferEngine(options, *std::move(core)));
}

TransferEngine::TransferEngine(const TransferEngineOptions& options,
                               std::shared_ptr<internal::Core> core)
    : options_(options), core_(std::move(core)) {}

TransferEngine::~TransferEngine() { core_->Shutdown(); }

const std::string& TransferEngine::worker_address() const {
  return core_->address();
}

absl::StatusOr<std::unique_ptr<Registration>> TransferEngine::Register(
    void* data, size_t size) {
  return core_->Register(core_, data, size, /*allocate=*/false);
}

absl::StatusOr<std::unique_ptr<Registration>> TransferEngine::Allocate(
    size_t size) {
  return core_->Register(core_, nullptr, size, /*allocate=*/true);
}

absl::StatusOr<Destination> TransferEngine::ExpectTransfer(
    ReceiveRequest request, ReceiveCallback done) {
  return core_->ExpectTransfer(std::move(request), std::move(done));
}

absl::Status TransferEngine::CancelReceive(absl::string_view transfer_id) {
  return core_->CancelReceive(std::string(transfer_id));
}

uint64_t TransferEngine::Send(SendRequest request, SendCallback done) {
  return core_->Send(std::move(request), std::move(done));
}

absl::StatusOr<SendResult> TransferEngine::SendAndWait(SendRequest request) {
  if (core_->OnProgressThread()) {
    return absl::FailedPreconditionError(
        "SendAndWait called from a transfer callback would deadlock; use Send");
  }
  Completion<SendResult> c;
  Send(std::move(request), c.Callback());
  return c.Wait();
}

void TransferEngine::CancelSend(uint64_t send_id) {
  core_->CancelSend(send_id);
}

EngineStats TransferEngine::Stats() const { return core_->Stats(); }

}  // namespace swaserve::transfer
