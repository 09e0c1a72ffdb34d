#include "lib/transfer/transfer_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "lib/base/clock.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/metrics/buckets.h"
#include "lib/transfer/wire.h"

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
namespace {

int64_t NowNanos() { return base::MonotonicNanos(); }

int64_t DurationNanos(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

absl::Duration Since(int64_t start_ns) {
  return absl::Nanoseconds(NowNanos() - start_ns);
}

// Maps a UCX status to an absl::Status whose message starts with `context`.
absl::Status FromUcs(ucs_status_t status, absl::string_view context) {
  const std::string message =
      absl::StrCat(context, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_OK:
      return absl::OkStatus();
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return absl::DeadlineExceededError(message);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_REJECTED:
      return absl::UnavailableError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_UNSUPPORTED:
      return absl::UnimplementedError(message);
    default:
      return absl::InternalError(message);
  }
}

// A failed request or endpoint: the peer or the path to it failed, whatever
// UCX's code (a reset tcp connection reports "Endpoint timeout"), except a
// request we cancelled ourselves.
absl::Status PeerError(ucs_status_t status, absl::string_view context) {
  const std::string message =
      absl::StrCat(context, ": ", ucs_status_string(status));
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(message);
  return absl::UnavailableError(message);
}

Transport TransportOfName(absl::string_view tl) {
  if (tl == "self") return Transport::kSelf;
  if (tl == "tcp") return Transport::kTcp;
  if (tl == "posix" || tl == "sysv" || tl == "cma" || tl == "xpmem" ||
      tl == "knem") {
    return Transport::kSharedMemory;
  }
  if (absl::StartsWith(tl, "rc") || absl::StartsWith(tl, "dc") ||
      absl::StartsWith(tl, "ud")) {
    return Transport::kRdma;
  }
  return Transport::kUnknown;
}

// The transport of the endpoint's active-message lane, parsed from
// ucp_ep_print_info (UCX 1.13 has no query for it). Lines look like
//   "#  lane[0]:  3:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0"
Transport DetectTransport(ucp_ep_h ep) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return Transport::kUnknown;
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::string text(buffer, size);
  std::free(buffer);
  Transport first = Transport::kUnknown;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StrContains(line, "lane[")) continue;
    const size_t colon = line.find(':', line.find("lane["));
    if (colon == absl::string_view::npos) continue;
    absl::string_view rest =
        absl::StripLeadingAsciiWhitespace(line.substr(colon + 1));
    const size_t tl_start = rest.find(':');
    const size_t tl_end = rest.find('/');
    if (tl_start == absl::string_view::npos ||
        tl_end == absl::string_view::npos || tl_end < tl_start) {
      continue;
    }
    const Transport t =
        TransportOfName(rest.substr(tl_start + 1, tl_end - tl_start - 1));
    if (first == Transport::kUnknown) first = t;
    for (absl::string_view word : absl::StrSplit(rest, ' ')) {
      if (word == "am") return t;
    }
  }
  return first;
}

// Whether a UCX_TLS value (the option, else the environment) can select the
// posix/sysv transports; MM_ERROR_HANDLING is only set then (UCX warns about
// settings no loaded transport uses).
bool MayUseSharedMemory(const std::string& option) {
  std::string tls = option;
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env == nullptr ? "all" : env;
  }
  if (tls.empty() || tls == "all" || absl::StartsWith(tls, "^")) return true;
  for (absl::string_view t : absl::StrSplit(tls, ',')) {
    if (t == "posix" || t == "sysv" || t == "shm" || t == "sm" || t == "mm" ||
        t == "all") {
      return true;
    }
  }
  return false;
}

// Fields 3 (state) and 22 (start time) of /proc/<pid>/stat; false when the
// process does not exist.
bool ReadProcStat(uint64_t pid, char* state, uint64_t* start_time) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text;
  std::getline(in, text);
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return false;
  std::vector<absl::string_view> fields = absl::StrSplit(
      absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_time);
}

wire::ProcessIdentity SelfIdentity() {
  wire::ProcessIdentity id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  if (!boot_id.empty()) id.boot_id = base::Hash64(boot_id);
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) == 0) id.pid_namespace = st.st_ino;
  id.pid = static_cast<uint64_t>(getpid());
  char state = 0;
  if (!ReadProcStat(id.pid, &state, &id.start_time)) id.boot_id = 0;
  return id;
}

// True when `peer` runs on this host, in our pid namespace, and its process
// has exited (or is a zombie). False when that cannot be known (another
// host: UCX's own failure detection applies there).
bool ProcessGone(const wire::ProcessIdentity& peer,
                 const wire::ProcessIdentity& self) {
  if (peer.boot_id == 0 || peer.pid == 0 || peer.boot_id != self.boot_id ||
      peer.pid_namespace != self.pid_namespace) {
    return false;
  }
  char state = 0;
  uint64_t start = 0;
  if (!ReadProcStat(peer.pid, &state, &start)) return true;
  return start != peer.start_time || state == 'Z' || state == 'X';
}

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

// Reasons of swaserve_kv_transfer_failures_total.
enum class Reason : int {
  kTimeout,
  kPeerFailure,
  kRejected,
  kInvalid,
  kCancelled,
  kInternal,
  kCount
};
constexpr const char* kReasonNames[] = {"timeout", "peer_failure", "rejected",
                                        "invalid", "cancelled",    "internal"};

std::string UnknownTransferMessage(absl::string_view id) {
  return absl::StrCat(
      "the receiver expects no transfer '", id,
      "' (never announced, or finished longer ago than finished_linger): the "
      "decode worker must call ExpectTransfer first and hand out the "
      "KvDestination it returns");
}

}  // namespace

// One direction's metric children.
struct DirectionMetrics {
  metrics::Counter* bytes = nullptr;
  metrics::Counter* ok = nullptr;
  metrics::Counter* failed = nullptr;
  metrics::Histogram* seconds = nullptr;
  metrics::Gauge* in_flight = nullptr;
  metrics::Counter* reasons[static_cast<int>(Reason::kCount)] = {};
};

// Everything UCX; see the README in transfer_engine.h. All members below
// "progress-thread state" are touched only by the progress thread (or,
// after it stopped, by one caller at a time under inline_mu_).
class Core {
 public:
  static absl::StatusOr<std::shared_ptr<Core>> Create(
      const TransferEngineOptions& options);
  ~Core();

  const std::string& address() const { return framed_address_; }

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
  EngineStats Stats() const;
  bool OnProgressThread() const {
    return std::this_thread::get_id() == thread_id_.load();
  }

 private:
  struct RegionRec {
    uint64_t id = 0;
    uint8_t* data = nullptr;
    size_t size = 0;
    ucp_mem_h memh = nullptr;
    std::string ucx_rkey;
    bool allocated = false;  // by UCX (Allocate)
    int users = 0;
    bool releasing = false;
    absl::Notification* released = nullptr;
  };

  struct Peer {
    std::string blob;
    uint64_t engine_id = 0;
    wire::ProcessIdentity process;
    ucp_ep_h ep = nullptr;
    Transport transport = Transport::kUnknown;
    bool closing = false;
    absl::flat_hash_set<uint64_t> sends;
    Core* core = nullptr;
    // Unpacked rkeys by packed UCX rkey, with the sends using each. Unpacking
    // the rkey of UCX-allocated shared memory maps the whole segment, which
    // made every put transfer 100x slower when done per transfer; a few are
    // kept (a mapping keeps a freed segment's memory alive until evicted).
    struct CachedRkey {
      ucp_rkey_h handle = nullptr;
      int users = 0;
      int64_t last_used = 0;
    };
    absl::flat_hash_map<std::string, CachedRkey> rkeys;
  };
  static constexpr size_t kRkeyCacheSize = 4;

  struct BackEp {
    uint64_t engine_id = 0;
    wire::ProcessIdentity process;
    ucp_ep_h ep = nullptr;
    bool closing = false;
    Core* core = nullptr;
  };

  struct Message {
    const uint8_t* local = nullptr;
    uint64_t remote_address = 0;
    uint64_t bytes = 0;
    uint32_t region = 0;
    ucp_mem_h memh = nullptr;
  };

  // kBegin (puts only): BEGIN sent, waiting for the receiver's READY.
  enum class SendPhase { kBegin, kData, kFlush, kCommit, kAwaitAck };

  struct SendState {
    uint64_t id = 0;
    std::string transfer_id;
    std::string commit_payload;
    SendCallback done;
    std::shared_ptr<Peer> peer;
    Primitive primitive = Primitive::kActiveMessage;
    Transport transport = Transport::kUnknown;
    std::vector<Message> messages;
    std::vector<uint64_t> region_tags;
    std::vector<ucp_rkey_h> ucx_rkeys;  // owned by peer->rkeys
    std::vector<std::string> rkey_keys;
    std::vector<uint64_t> registrations;  // RegionRec ids used for memh
    size_t next = 0;
    int inflight = 0;
    uint64_t total_bytes = 0;
    uint64_t am_bytes_done = 0;
    uint64_t put_bytes_done = 0;
    SendPhase phase = SendPhase::kData;
    bool flush_posted = false;
    bool begin_posted = false;
    bool acked = false;
    bool failed = false;
    absl::Status error;
    Reason reason = Reason::kInternal;
    int64_t start_ns = 0;
    int64_t deadline_ns = 0;
  };

  struct Slot {
    uint8_t* data = nullptr;
    uint64_t length = 0;
    uint64_t tag = 0;
    ucp_mem_h memh = nullptr;
    uint64_t registration = 0;
  };

  struct ReceiveState {
    std::string id;
    std::vector<Slot> regions;
    uint64_t expected = 0;
    uint64_t received = 0;  // by data messages, completed
    int inflight = 0;
    ReceiveCallback done;
    bool finished = false;  // callback ran; kept as a tombstone
    absl::Status outcome;   // of a finished receive
    bool failed = false;
    absl::Status error;
    Reason reason = Reason::kInternal;
    bool committed = false;
    bool started = false;           // a message of this transfer arrived
    bool commit_receiving = false;  // commit payload arriving by rendezvous
    std::string payload;
    uint64_t declared_am_bytes = 0;
    uint64_t put_bytes = 0;
    uint64_t commit_engine = 0;
    uint64_t commit_send_id = 0;
    int64_t start_ns = 0;
    int64_t deadline_ns = 0;
    int64_t linger_until_ns = 0;
    absl::flat_hash_set<uint64_t> senders;
    // UCX's endpoints the data arrived on (reply_ep), force-closed when the
    // sender is gone or the deadline passed with receives outstanding.
    absl::flat_hash_set<ucp_ep_h> reply_eps;
  };

  enum class OpKind {
    kHello,
    kData,
    kPut,
    kFlush,
    kCommit,
    kBegin,
    kReply,
    kRecvData,
    kRecvCommit,
    kClose
  };

  // user_data of every UCX request we wait for.
  struct OpCtx {
    Core* core = nullptr;
    OpKind kind = OpKind::kData;
    uint64_t send_id = 0;
    std::string receive_id;
    uint64_t bytes = 0;
    std::string header;
    std::string payload;
    wire::DecodedCommit commit;
    std::shared_ptr<Peer> peer;
    std::shared_ptr<BackEp> back;
  };

  struct PendingReply {
    uint64_t engine = 0;
    uint64_t send_id = 0;
    wire::ReplyKind kind = wire::ReplyKind::kAck;
    absl::Status status;
  };

  using Task = absl::AnyInvocable<void()>;

  explicit Core(const TransferEngineOptions& options) : options_(options) {}
  absl::Status Init();
  void InitMetrics();

  // Runs `fn` on the progress thread and waits for it; inline when already
  // there or when the thread has stopped.
  template <typename F>
  auto RunSync(F fn) -> decltype(fn());
  bool Post(Task task);
  void Wake();

  void Loop();
  void RunTasks();
  bool HasPendingWork();
  bool Busy() const;
  void ProcessDeferred();
  void CheckDeadlines(int64_t now);
  void Sleep(int64_t now);
  void BeginShutdown();
  bool Quiescent() const;

  // UCX request plumbing.
  OpCtx* NewOp(OpKind kind);
  void Track(OpCtx* ctx, ucs_status_ptr_t request);
  static void SendCallbackFn(void* request, ucs_status_t status,
                             void* user_data);
  static void RecvAmCallbackFn(void* request, ucs_status_t status,
                               size_t length, void* user_data);
  void OnOpDone(OpCtx* ctx, ucs_status_t status);

  // Sender side.
  void StartSend(uint64_t id, SendRequest request, SendCallback done);
  absl::Status PrepareSend(SendState& s, SendRequest& request);
  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const std::string& blob);
  void Pump(SendState& s);
  void PostMessage(SendState& s, const Message& m);
  void PostCommit(SendState& s);
  void FailSend(SendState& s, absl::Status status, Reason reason);
  void FinishSend(uint64_t id);
  void ClosePeer(const std::shared_ptr<Peer>& peer, const absl::Status& why);
  // Destroys unused cached rkeys beyond kRkeyCacheSize (every unused one
  // once the peer is closing), least recently used first.
  void TrimRkeyCache(Peer& peer);
  static void PeerErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status);
  ucp_mem_h FindMemh(const void* p, size_t n, uint64_t* registration);

  // Receiver side.
  static ucs_status_t AmHelloFn(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* p);
  static ucs_status_t AmDataFn(void* arg, const void* header,
                               size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* p);
  static ucs_status_t AmCommitFn(void* arg, const void* header,
                                 size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t AmBeginFn(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* p);
  void OnBegin(const void* header, size_t header_length,
               const ucp_am_recv_param_t* p);
  void PostBegin(SendState& s);
  static ucs_status_t AmReplyFn(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* p);
  ucs_status_t OnData(const void* header, size_t header_length, void* data,
                      size_t length, const ucp_am_recv_param_t* p);
  ucs_status_t OnCommit(const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* p);
  void OnReply(const void* header, size_t header_length, const void* data,
               size_t length, const ucp_am_recv_param_t* p);
  void ApplyCommit(ReceiveState& r, const wire::DecodedCommit& commit,
                   std::string payload);
  void CheckReceive(ReceiveState& r);
  void FailReceive(ReceiveState& r, absl::Status status, Reason reason);
  void FinishReceive(ReceiveState& r);
  void QueueReply(uint64_t engine, uint64_t send_id, wire::ReplyKind kind,
                  absl::Status status);
  void SendReply(const PendingReply& reply);
  void OpenBackEp(const wire::WorkerAddress& address);
  void CheckLiveness();
  void ForceCloseReplyEps(ReceiveState& r, const absl::Status& why);
  void CloseBackEp(const std::shared_ptr<BackEp>& back,
                   const absl::Status& why);
  static void BackEpErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status);
  void CloseEp(ucp_ep_h ep, std::shared_ptr<Peer> peer,
               std::shared_ptr<BackEp> back);

  void MarkSend(uint64_t id) { dirty_sends_.insert(id); }
  void MarkReceive(const std::string& id) { dirty_receives_.insert(id); }
  void CountFailure(bool send, Reason reason);
  void UpdateStats();

  const TransferEngineOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  uint64_t engine_id_ = 0;
  wire::ProcessIdentity self_process_;
  std::string framed_address_;
  int epoll_fd_ = -1;
  int event_fd_ = -1;
  int ucx_fd_ = -1;
  std::mt19937_64 rng_;

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

  DirectionMetrics send_metrics_;
  DirectionMetrics receive_metrics_;
  bool have_metrics_ = false;

  // Published copies of the counters for Stats().
  std::atomic<int64_t> stat_sends_{0};
  std::atomic<int64_t> stat_receives_{0};
  std::atomic<int64_t> stat_inflight_{0};
  std::atomic<int64_t> stat_registrations_{0};
  std::atomic<int64_t> stat_registered_bytes_{0};
  std::atomic<int64_t> stat_endpoints_{0};

  // --- progress-thread state ---
  bool shutting_down_ = false;
  int64_t shutdown_started_ns_ = 0;
  int64_t inflight_requests_ = 0;
  int64_t last_activity_ns_ = 0;
  int64_t next_deadline_check_ns_ = 0;
  int64_t next_liveness_check_ns_ = 0;
  int64_t next_deadline_ns_ = std::numeric_limits<int64_t>::max();
  absl::flat_hash_map<uint64_t, RegionRec> regions_;
  std::map<uintptr_t, uint64_t> regions_by_address_;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<BackEp>> back_eps_;
  int64_t closing_eps_ = 0;
  absl::flat_hash_set<ucp_ep_h> closed_this_round_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<SendState>> sends_;
  absl::flat_hash_map<std::string, std::unique_ptr<ReceiveState>> receives_;
  int64_t pending_receives_ = 0;
  // Pending receives that have seen a message from a sender.
  int64_t started_receives_ = 0;
  absl::flat_hash_set<uint64_t> dirty_sends_;
  absl::flat_hash_set<std::string> dirty_receives_;
  std::vector<wire::WorkerAddress> pending_hellos_;
  std::vector<PendingReply> pending_replies_;
  std::vector<std::pair<std::shared_ptr<Peer>, absl::Status>> peer_errors_;
  std::vector<std::pair<std::shared_ptr<BackEp>, absl::Status>> back_errors_;
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
  std::shared_ptr<Core> core(new Core(options));
  if (absl::Status s = core->Init(); !s.ok()) return s;
  return core;
}

absl::Status Core::Init() {
  std::random_device rd;
  rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
            static_cast<uint64_t>(NowNanos()));
  do {
    engine_id_ = rng_();
  } while (engine_id_ == 0);

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "reading the UCX configuration");
  if (!options_.ucx_tls.empty()) {
    st = ucp_config_modify(config, "TLS", options_.ucx_tls.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(absl::StrCat(
          "ucx_tls '", options_.ucx_tls,
          "' is not a valid UCX_TLS value: ", ucs_status_string(st)));
    }
  }
  // Shared-memory transports only take error-handling endpoints with this
  // (UCX 1.13); without it UCX would silently pick tcp over loopback.
  if (MayUseSharedMemory(options_.ucx_tls) &&
      ucp_config_modify(config, "MM_ERROR_HANDLING", "y") != UCS_OK) {
    SWA_LOG(debug, "UCX has no MM_ERROR_HANDLING setting; ignoring");
  }
  const std::string keepalive = absl::StrCat(
      std::max<int64_t>(1,
                        absl::ToInt64Microseconds(options_.keepalive_interval)),
      "us");
  if (ucp_config_modify(config, "KEEPALIVE_INTERVAL", keepalive.c_str()) !=
      UCS_OK) {
    SWA_LOG(warn, "UCX rejected KEEPALIVE_INTERVAL={}", keepalive);
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.name = options_.name.c_str();
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return FromUcs(st, "ucp_init");

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  st = ucp_worker_query(worker_, &attr);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_query");
  if (attr.max_am_header < wire::MaxHeaderBytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "UCX allows active-message headers of ", attr.max_am_header,
        " bytes; the transfer protocol needs ", wire::MaxHeaderBytes(),
        ": use transports with larger AM headers (UCX_TLS)"));
  }

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(worker_, &address, &address_length);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_address");
  wire::WorkerAddress wa;
  wa.engine_id = engine_id_;
  self_process_ = SelfIdentity();
  wa.process = self_process_;
  wa.ucx_address.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);
  framed_address_ = wire::PackWorkerAddress(wa);

  const std::pair<uint32_t, ucp_am_recv_callback_t> handlers[] = {
      {wire::kAmHello, &Core::AmHelloFn},
      {wire::kAmData, &Core::AmDataFn},
      {wire::kAmCommit, &Core::AmCommitFn},
      {wire::kAmReply, &Core::AmReplyFn},
      {wire::kAmBegin, &Core::AmBeginFn}};
  for (const auto& [id, cb] : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
        UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = id;
    hp.cb = cb;
    hp.arg = this;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler");
  }

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
  if (ucp_worker_get_efd(worker_, &ucx_fd_) == UCS_OK) {
    ev.data.fd = ucx_fd_;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ucx_fd_, &ev) != 0) ucx_fd_ = -1;
  } else {
    ucx_fd_ = -1;
    SWA_LOG(info, "UCX worker has no event fd; the progress thread polls");
  }

  InitMetrics();

  thread_running_ = true;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Core::InitMetrics() {
  metrics::Registry* reg = options_.registry;
  if (reg == nullptr) return;
  auto bytes = reg->AddCounter(
      "swaserve_kv_transfer_bytes_total",
      "KV bytes of successful transfers (committed and acknowledged: visible "
      "at the receiver), by direction",
      {"direction"});
  auto transfers = reg->AddCounter(
      "swaserve_kv_transfers_total",
      "KV transfers finished, by direction and result (ok: committed and "
      "acknowledged)",
      {"direction", "result"});
  auto buckets = metrics::ExponentialBuckets(1e-4, 2, 22);
  auto seconds = reg->AddHistogram(
      "swaserve_kv_transfer_seconds",
      "Duration of successful KV transfers: sender from Send to the commit "
      "acknowledgement, receiver from ExpectTransfer to the commit",
      {"direction"},
      buckets.ok() ? *buckets : metrics::DefaultLatencyBuckets());
  auto failures = reg->AddCounter(
      "swaserve_kv_transfer_failures_total",
      "Failed KV transfers by direction and reason (timeout, peer_failure, "
      "rejected, invalid, cancelled, internal)",
      {"direction", "reason"});
  auto in_flight =
      reg->AddGauge("swaserve_kv_transfers_in_flight",
                    "KV transfers in progress, by direction", {"direction"});
  if (!bytes.ok() || !transfers.ok() || !seconds.ok() || !failures.ok() ||
      !in_flight.ok()) {
    SWA_LOG(err,
            "transfer metrics not exported: a conflicting definition is "
            "registered");
    return;
  }
  for (bool send : {true, false}) {
    DirectionMetrics& m = send ? send_metrics_ : receive_metrics_;
    const absl::string_view dir = send ? "send" : "receive";
    m.bytes = &(*bytes)->WithLabels({dir});
    m.ok = &(*transfers)->WithLabels({dir, "ok"});
    m.failed = &(*transfers)->WithLabels({dir, "failed"});
    m.seconds = &(*seconds)->WithLabels({dir});
    m.in_flight = &(*in_flight)->WithLabels({dir});
    for (int i = 0; i < static_cast<int>(Reason::kCount); ++i) {
      m.reasons[i] = &(*failures)->WithLabels({dir, kReasonNames[i]});
    }
  }
  have_metrics_ = true;
}

Core::~Core() {
  // Registrations are gone (they hold a reference); the worker is gone
  // (Shutdown) unless Init failed half-way.
  for (auto& [id, rec] : regions_) {
    if (rec.memh != nullptr) ucp_mem_unmap(context_, rec.memh);
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (event_fd_ >= 0) close(event_fd_);
}

void Core::Shutdown() {
  if (!thread_.joinable()) return;
  Post([this] { BeginShutdown(); });
  thread_.join();
  absl::MutexLock lock(&inline_mu_);
  // Registrations may still be alive; their memh stays valid (context-level).
  if (worker_ != nullptr) {
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
  }
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
  last_activity_ns_ = NowNanos();
  while (true) {
    closed_this_round_.clear();
    RunTasks();
    unsigned events = 0;
    if (worker_ != nullptr) events = ucp_worker_progress(worker_);
    ProcessDeferred();
    const int64_t now = NowNanos();
    if (now >= next_deadline_check_ns_ || now >= next_deadline_ns_) {
      CheckDeadlines(now);
    }
    if (shutting_down_) {
      if (Quiescent()) break;
      if (now - shutdown_started_ns_ > DurationNanos(absl::Seconds(10))) {
        SWA_LOG(err,
                "transfer engine '{}': {} UCX requests still outstanding 10 s "
                "after shutdown began; stopping anyway",
                options_.name, inflight_requests_);
        break;
      }
    }
    UpdateStats();
    if (events > 0) {
      last_activity_ns_ = now;
      continue;
    }
    if (HasPendingWork()) continue;
    if (Busy()) {
      // A transfer is moving: poll. UCX 1.13's shared-memory rendezvous
      // does not raise a wakeup event for every step, so sleeping on the
      // event fd here stalls a transfer until the sleep times out.
      if (options_.yield_while_polling) std::this_thread::yield();
      continue;
    }
    if (now - last_activity_ns_ < DurationNanos(options_.spin_before_sleep)) {
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
  ProcessDeferred();
  UpdateStats();
  thread_running_ = false;
  thread_id_ = std::thread::id();
}

bool Core::Busy() const { return !sends_.empty() || started_receives_ > 0; }

bool Core::HasPendingWork() {
  return task_pending_.load(std::memory_order_acquire) ||
         !dirty_sends_.empty() || !dirty_receives_.empty() ||
         !pending_hellos_.empty() || !pending_replies_.empty() ||
         !peer_errors_.empty() || !back_errors_.empty();
}

void Core::Sleep(int64_t now) {
  if (ucx_fd_ >= 0) {
    const ucs_status_t st = ucp_worker_arm(worker_);
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
  if (next_deadline_ns_ != std::numeric_limits<int64_t>::max()) {
    wait_ns = std::min(wait_ns, std::max<int64_t>(0, next_deadline_ns_ - now));
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
  last_activity_ns_ = NowNanos();
}

void Core::UpdateStats() {
  stat_sends_.store(static_cast<int64_t>(sends_.size()),
                    std::memory_order_relaxed);
  stat_receives_.store(pending_receives_, std::memory_order_relaxed);
  stat_inflight_.store(inflight_requests_, std::memory_order_relaxed);
  stat_endpoints_.store(
      static_cast<int64_t>(peers_.size() + back_eps_.size()) + closing_eps_,
      std::memory_order_relaxed);
}

EngineStats Core::Stats() const {
  EngineStats s;
  s.active_sends = stat_sends_.load(std::memory_order_relaxed);
  s.active_receives = stat_receives_.load(std::memory_order_relaxed);
  s.inflight_requests = stat_inflight_.load(std::memory_order_relaxed);
  s.registrations = stat_registrations_.load(std::memory_order_relaxed);
  s.registered_bytes = stat_registered_bytes_.load(std::memory_order_relaxed);
  s.endpoints = stat_endpoints_.load(std::memory_order_relaxed);
  return s;
}

bool Core::Quiescent() const {
  return inflight_requests_ == 0 && closing_eps_ == 0 && sends_.empty() &&
         pending_receives_ == 0 && dirty_sends_.empty() &&
         dirty_receives_.empty();
}

void Core::BeginShutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  shutdown_started_ns_ = NowNanos();
  const absl::Status why =
      absl::CancelledError("the transfer engine is shutting down");
  for (auto& [id, s] : sends_) FailSend(*s, why, Reason::kCancelled);
  std::vector<ReceiveState*> draining;
  for (auto& [id, r] : receives_) {
    if (!r->finished) FailReceive(*r, why, Reason::kCancelled);
    if (r->inflight > 0) draining.push_back(r.get());
  }
  for (ReceiveState* r : draining) ForceCloseReplyEps(*r, why);
  std::vector<std::shared_ptr<Peer>> peers;
  for (auto& [blob, p] : peers_) peers.push_back(p);
  for (auto& p : peers) ClosePeer(p, why);
  std::vector<std::shared_ptr<BackEp>> backs;
  for (auto& [id, b] : back_eps_) backs.push_back(b);
  for (auto& b : backs) CloseBackEp(b, why);
}

void Core::ProcessDeferred() {
  for (int round = 0; round < 4 && HasPendingWork(); ++round) {
    if (!peer_errors_.empty()) {
      auto errors = std::move(peer_errors_);
      peer_errors_.clear();
      for (auto& [peer, status] : errors) ClosePeer(peer, status);
    }
    if (!back_errors_.empty()) {
      auto errors = std::move(back_errors_);
      back_errors_.clear();
      for (auto& [back, status] : errors) CloseBackEp(back, status);
    }
    if (!pending_hellos_.empty()) {
      auto hellos = std::move(pending_hellos_);
      pending_hellos_.clear();
      for (const wire::WorkerAddress& address : hellos) OpenBackEp(address);
    }
    if (!pending_replies_.empty()) {
      auto replies = std::move(pending_replies_);
      pending_replies_.clear();
      for (const PendingReply& r : replies) SendReply(r);
    }
    if (!dirty_sends_.empty()) {
      auto dirty = std::move(dirty_sends_);
      dirty_sends_.clear();
      for (uint64_t id : dirty) {
        auto it = sends_.find(id);
        if (it != sends_.end()) Pump(*it->second);
      }
    }
    if (!dirty_receives_.empty()) {
      auto dirty = std::move(dirty_receives_);
      dirty_receives_.clear();
      for (const std::string& id : dirty) {
        auto it = receives_.find(id);
        if (it != receives_.end()) CheckReceive(*it->second);
      }
    }
  }
  // Registrations whose release waits for their users.
  for (auto it = regions_.begin(); it != regions_.end();) {
    RegionRec& rec = it->second;
    if (rec.releasing && rec.users == 0) {
      ucp_mem_unmap(context_, rec.memh);
      stat_registrations_.fetch_sub(1, std::memory_order_relaxed);
      stat_registered_bytes_.fetch_sub(static_cast<int64_t>(rec.size),
                                       std::memory_order_relaxed);
      regions_by_address_.erase(reinterpret_cast<uintptr_t>(rec.data));
      absl::Notification* n = rec.released;
      regions_.erase(it++);
      if (n != nullptr) n->Notify();
    } else {
      ++it;
    }
  }
}

void Core::CheckDeadlines(int64_t now) {
  next_deadline_check_ns_ = now + DurationNanos(absl::Milliseconds(5));
  if (now >= next_liveness_check_ns_) {
    next_liveness_check_ns_ = now + DurationNanos(options_.keepalive_interval);
    CheckLiveness();
  }
  next_deadline_ns_ = std::numeric_limits<int64_t>::max();
  std::vector<std::shared_ptr<Peer>> to_close;
  for (auto& [id, s] : sends_) {
    if (now >= s->deadline_ns) {
      if (s->failed) {
        // Failed (e.g. cancelled) with messages still outstanding past its
        // deadline: the peer is not draining them.
        if (s->inflight > 0 && s->peer != nullptr) to_close.push_back(s->peer);
        continue;
      }
      FailSend(*s,
               absl::DeadlineExceededError(absl::StrFormat(
                   "transfer '%s': no commit acknowledgement within %s "
                   "(%d of %d bytes written, phase %d): the receiver is dead, "
                   "overloaded or unreachable",
                   s->transfer_id, absl::FormatDuration(Since(s->start_ns)),
                   s->am_bytes_done + s->put_bytes_done, s->total_bytes,
                   static_cast<int>(s->phase))),
               Reason::kTimeout);
      if (s->inflight > 0 && s->peer != nullptr) to_close.push_back(s->peer);
    } else {
      next_deadline_ns_ = std::min(next_deadline_ns_, s->deadline_ns);
    }
  }
  for (auto& p : to_close) {
    if (p->closing) continue;
    ClosePeer(p, absl::UnavailableError(
                     "the endpoint to this receiver was closed because a "
                     "transfer on it timed out with data outstanding"));
  }
  std::vector<std::string> expired;
  for (auto& [id, r] : receives_) {
    if (r->finished) {
      if (now >= r->linger_until_ns && r->inflight == 0) expired.push_back(id);
      continue;
    }
    if (r->failed) {
      // Failed (cancelled, rejected) with receives still outstanding past
      // its deadline: stop waiting for the sender.
      if (r->inflight > 0 && now >= r->deadline_ns) {
        ForceCloseReplyEps(*r, r->error);
      }
      continue;
    }
    if (now >= r->deadline_ns) {
      FailReceive(
          *r,
          absl::DeadlineExceededError(absl::StrFormat(
              "transfer '%s' was not committed within %s (%d of %d bytes "
              "received, %d receives outstanding): the sender is slow, died, "
              "or never got the KvDestination",
              id, absl::FormatDuration(Since(r->start_ns)), r->received,
              r->expected, r->inflight)),
          Reason::kTimeout);
      if (r->inflight > 0) ForceCloseReplyEps(*r, r->error);
    } else {
      next_deadline_ns_ = std::min(next_deadline_ns_, r->deadline_ns);
    }
  }
  for (const std::string& id : expired) receives_.erase(id);
}

// --- Requests ----------------------------------------------------------------

Core::OpCtx* Core::NewOp(OpKind kind) {
  auto* ctx = new OpCtx;
  ctx->core = this;
  ctx->kind = kind;
  ++inflight_requests_;
  return ctx;
}

void Core::Track(OpCtx* ctx, ucs_status_ptr_t request) {
  if (request == nullptr) {
    OnOpDone(ctx, UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    OnOpDone(ctx, UCS_PTR_STATUS(request));
  }
  // Otherwise the callback completes it.
}

void Core::SendCallbackFn(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<OpCtx*>(user_data);
  ctx->core->OnOpDone(ctx, status);
  ucp_request_free(request);
}

void Core::RecvAmCallbackFn(void* request, ucs_status_t status, size_t length,
                            void* user_data) {
  auto* ctx = static_cast<OpCtx*>(user_data);
  if (status == UCS_OK && length != ctx->bytes)
    status = UCS_ERR_MESSAGE_TRUNCATED;
  ctx->core->OnOpDone(ctx, status);
  ucp_request_free(request);
}

void Core::OnOpDone(OpCtx* ctx, ucs_status_t status) {
  std::unique_ptr<OpCtx> owned(ctx);
  --inflight_requests_;
  last_activity_ns_ = NowNanos();
  switch (ctx->kind) {
    case OpKind::kHello:
    case OpKind::kReply:
      if (status != UCS_OK && status != UCS_ERR_CANCELED) {
        SWA_LOG(debug, "transfer control message failed: {}",
                ucs_status_string(status));
      }
      return;
    case OpKind::kClose:
      --closing_eps_;
      return;
    case OpKind::kData:
    case OpKind::kPut:
    case OpKind::kFlush:
    case OpKind::kBegin:
    case OpKind::kCommit: {
      auto it = sends_.find(ctx->send_id);
      if (it == sends_.end()) return;
      SendState& s = *it->second;
      --s.inflight;
      if (status == UCS_OK) {
        if (ctx->kind == OpKind::kData) {
          s.am_bytes_done += ctx->bytes;
        } else if (ctx->kind == OpKind::kPut) {
          s.put_bytes_done += ctx->bytes;
        } else if (ctx->kind == OpKind::kFlush) {
          s.phase = SendPhase::kCommit;
        }
      } else {
        const char* what = ctx->kind == OpKind::kCommit  ? "sending the commit"
                           : ctx->kind == OpKind::kFlush ? "flushing puts"
                                                         : "sending data";
        FailSend(s,
                 PeerError(status, absl::StrCat("transfer '", s.transfer_id,
                                                "': ", what)),
                 status == UCS_ERR_CANCELED ? Reason::kCancelled
                                            : Reason::kPeerFailure);
      }
      MarkSend(s.id);
      return;
    }
    case OpKind::kRecvData:
    case OpKind::kRecvCommit: {
      auto it = receives_.find(ctx->receive_id);
      if (it == receives_.end()) return;
      ReceiveState& r = *it->second;
      --r.inflight;
      if (ctx->kind == OpKind::kRecvData) {
        if (status == UCS_OK) {
          r.received += ctx->bytes;
        } else if (!r.finished) {
          FailReceive(r,
                      PeerError(status, absl::StrCat("transfer '", r.id,
                                                     "': receiving data")),
                      Reason::kPeerFailure);
        }
      } else {
        r.commit_receiving = false;
        if (status == UCS_OK && !r.finished && !r.failed) {
          ApplyCommit(r, ctx->commit, std::move(ctx->payload));
        } else if (status != UCS_OK && !r.finished) {
          FailReceive(
              r,
              PeerError(status, absl::StrCat("transfer '", r.id,
                                             "': receiving the commit")),
              Reason::kPeerFailure);
        }
      }
      MarkReceive(r.id);
      return;
    }
  }
}

// --- Registrations -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<Registration>> Core::Register(
    std::shared_ptr<Core> self, void* data, size_t size, bool allocate) {
  if ((data == nullptr && !allocate) || size == 0) {
    return absl::InvalidArgumentError(
        "Register needs a non-null address and a non-zero size");
  }
  const uint64_t id = next_registration_id_.fetch_add(1);
  absl::Status status = RunSync([&]() -> absl::Status {
    if (shutting_down_ || worker_ == nullptr) {
      return absl::FailedPreconditionError(
          "the transfer engine is shutting down");
    }
    ucp_mem_map_params_t mp{};
    mp.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = data;
    mp.length = size;
    if (allocate) {
      mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      mp.flags = UCP_MEM_MAP_ALLOCATE;
    }
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(context_, &mp, &memh);
    if (st != UCS_OK) {
      return FromUcs(
          st, allocate
                  ? absl::StrCat("allocating ", size, " bytes of UCX memory")
                  : absl::StrCat("registering ", size, " bytes at ",
                                 absl::StrFormat("%p", data)));
    }
    if (allocate) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      st = ucp_mem_query(memh, &attr);
      if (st != UCS_OK || attr.address == nullptr || attr.length < size) {
        ucp_mem_unmap(context_, memh);
        return FromUcs(st == UCS_OK ? UCS_ERR_NO_MEMORY : st,
                       "querying UCX-allocated memory");
      }
      data = attr.address;
    }
    void* rkey = nullptr;
    size_t rkey_size = 0;
    st = ucp_rkey_pack(context_, memh, &rkey, &rkey_size);
    if (st != UCS_OK) {
      ucp_mem_unmap(context_, memh);
      return FromUcs(st, "packing the rkey of a registration");
    }
    RegionRec rec;
    rec.id = id;
    rec.data = static_cast<uint8_t*>(data);
    rec.size = size;
    rec.memh = memh;
    rec.allocated = allocate;
    rec.ucx_rkey.assign(static_cast<const char*>(rkey), rkey_size);
    ucp_rkey_buffer_release(rkey);
    regions_by_address_[reinterpret_cast<uintptr_t>(data)] = id;
    regions_.emplace(id, std::move(rec));
    stat_registrations_.fetch_add(1, std::memory_order_relaxed);
    stat_registered_bytes_.fetch_add(static_cast<int64_t>(size),
                                     std::memory_order_relaxed);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return std::unique_ptr<Registration>(
      new Registration(std::move(self), id, data, size));
}

void Core::Deregister(uint64_t id) {
  absl::Notification released;
  const bool from_callback = OnProgressThread();
  const bool wait = RunSync([&]() -> bool {
    auto it = regions_.find(id);
    if (it == regions_.end()) return false;
    RegionRec& rec = it->second;
    if (!thread_running_ || rec.users == 0) {
      // Unused (or the engine has stopped): unmap now, so that a caller
      // that frees the memory right after (even inside a transfer callback)
      // never frees registered memory.
      ucp_mem_unmap(context_, rec.memh);
      regions_by_address_.erase(reinterpret_cast<uintptr_t>(rec.data));
      stat_registrations_.fetch_sub(1, std::memory_order_relaxed);
      stat_registered_bytes_.fetch_sub(static_cast<int64_t>(rec.size),
                                       std::memory_order_relaxed);
      regions_.erase(it);
      return false;
    }
    rec.releasing = true;
    // In use: fail its users; the loop unmaps it once they have drained.
    // From a callback we cannot wait for ourselves (documented: release a
    // registration from a callback only once its transfers are done).
    rec.released = from_callback ? nullptr : &released;
    if (rec.users > 0) {
      const absl::Status why = absl::CancelledError(
          "the registration holding this transfer's memory was released");
      for (auto& [rid, r] : receives_) {
        if (r->finished || r->failed) continue;
        for (const Slot& slot : r->regions) {
          if (slot.registration == id) {
            FailReceive(*r, why, Reason::kCancelled);
            break;
          }
        }
      }
      for (auto& [sid, s] : sends_) {
        if (std::find(s->registrations.begin(), s->registrations.end(), id) !=
            s->registrations.end()) {
          FailSend(*s, why, Reason::kCancelled);
        }
      }
    }
    Wake();
    return !from_callback;
  });
  if (wait) released.WaitForNotification();
}

ucp_mem_h Core::FindMemh(const void* p, size_t n, uint64_t* registration) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = regions_by_address_.upper_bound(addr);
  if (it == regions_by_address_.begin()) return nullptr;
  --it;
  auto rec = regions_.find(it->second);
  if (rec == regions_.end() || rec->second.releasing) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(rec->second.data);
  if (addr < base || addr - base > rec->second.size ||
      n > rec->second.size - (addr - base)) {
    return nullptr;
  }
  *registration = rec->second.id;
  return rec->second.memh;
}

// --- Sender
// --------------------------------------------------------------------

uint64_t Core::Send(SendRequest request, SendCallback done) {
  const uint64_t id = next_send_id_.fetch_add(1);
  auto task = [this, id, request = std::move(request),
               done = std::move(done)]() mutable {
    StartSend(id, std::move(request), std::move(done));
  };
  if (OnProgressThread()) {
    task();
  } else if (!Post(std::move(task))) {
    // Engine stopped; Post dropped the task (and the callback with it).
    // The engine's destructor has run, so the caller cannot be here.
  }
  return id;
}

void Core::StartSend(uint64_t id, SendRequest request, SendCallback done) {
  auto state = std::make_unique<SendState>();
  SendState& s = *state;
  s.id = id;
  s.done = std::move(done);
  s.transfer_id = request.destination.transfer_id;
  s.commit_payload = std::move(request.commit_payload);
  s.start_ns = NowNanos();
  const absl::Duration timeout = request.timeout > absl::ZeroDuration()
                                     ? request.timeout
                                     : options_.default_timeout;
  s.deadline_ns = s.start_ns + DurationNanos(timeout);
  next_deadline_ns_ = std::min(next_deadline_ns_, s.deadline_ns);
  sends_.emplace(id, std::move(state));
  if (have_metrics_) send_metrics_.in_flight->Increment();
  if (shutting_down_) {
    FailSend(s, absl::CancelledError("the transfer engine is shutting down"),
             Reason::kCancelled);
  } else if (absl::Status st = PrepareSend(s, request); !st.ok()) {
    FailSend(s, st,
             absl::IsUnavailable(st) ? Reason::kPeerFailure : Reason::kInvalid);
  }
  MarkSend(id);
}

absl::Status Core::PrepareSend(SendState& s, SendRequest& request) {
  const Destination& d = request.destination;
  if (d.transfer_id.empty() ||
      d.transfer_id.size() > wire::kMaxTransferIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer id must be 1..", wire::kMaxTransferIdBytes,
                     " bytes, got ", d.transfer_id.size()));
  }
  if (d.regions.empty() || d.regions.size() > wire::kMaxRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", d.transfer_id, "': the destination has ",
        d.regions.size(), " regions; 1..", wire::kMaxRegions, " are allowed"));
  }
  absl::StatusOr<wire::WorkerAddress> address =
      wire::UnpackWorkerAddress(d.worker_address);
  if (!address.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", d.transfer_id, "': ", address.status().message()));
  }
  std::vector<wire::Rkey> rkeys;
  for (size_t i = 0; i < d.regions.size(); ++i) {
    const RemoteRegion& region = d.regions[i];
    absl::StatusOr<wire::Rkey> rkey = wire::UnpackRkey(region.rkey);
    if (!rkey.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer '", d.transfer_id, "': region ", i, ": ",
                       rkey.status().message()));
    }
    if (rkey->base_address != region.base_address ||
        rkey->length != region.length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transfer '%s': the rkey of region %d was issued for [0x%x, +%d) "
          "but the region says [0x%x, +%d): the destination mixes regions of "
          "different transfers; use the KvDestination ExpectTransfer "
          "returned, unmodified",
          d.transfer_id, i, rkey->base_address, rkey->length,
          region.base_address, region.length));
    }
    s.region_tags.push_back(rkey->tag);
    rkeys.push_back(*std::move(rkey));
  }
  // Messages: merge adjacent copies, split long ones.
  for (size_t i = 0; i < request.copies.size(); ++i) {
    const PageCopy& c = request.copies[i];
    if (c.bytes == 0) continue;
    if (c.local == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer '", d.transfer_id, "': copy ", i,
          " has a null local pointer (metadata-only KV pools cannot be sent)"));
    }
    if (c.region >= d.regions.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer '", d.transfer_id, "': copy ", i, " names region ",
          c.region, " but the destination has ", d.regions.size()));
    }
    const uint64_t length = d.regions[c.region].length;
    if (c.offset > length || c.bytes > length - c.offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transfer '%s': copy %d (%d bytes at offset %d) does not fit region "
          "%d (%d bytes): the page list and the destination disagree on the "
          "layout; plan the copies from this KvDestination",
          d.transfer_id, i, c.bytes, c.offset, c.region, length));
    }
    const auto* local = static_cast<const uint8_t*>(c.local);
    uint64_t remote = d.regions[c.region].base_address + c.offset;
    uint64_t left = c.bytes;
    while (left > 0) {
      if (!s.messages.empty()) {
        Message& last = s.messages.back();
        if (last.region == c.region && last.local + last.bytes == local &&
            last.remote_address + last.bytes == remote &&
            last.bytes < options_.max_message_bytes) {
          const uint64_t take =
              std::min<uint64_t>(left, options_.max_message_bytes - last.bytes);
          last.bytes += take;
          local += take;
          remote += take;
          left -= take;
          continue;
        }
      }
      const uint64_t take =
          std::min<uint64_t>(left, options_.max_message_bytes);
      s.messages.push_back(Message{local, remote, take, c.region, nullptr});
      local += take;
      remote += take;
      left -= take;
    }
    s.total_bytes += c.bytes;
  }
  for (Message& m : s.messages) {
    uint64_t reg = 0;
    m.memh = FindMemh(m.local, m.bytes, &reg);
    if (m.memh != nullptr &&
        std::find(s.registrations.begin(), s.registrations.end(), reg) ==
            s.registrations.end()) {
      s.registrations.push_back(reg);
      ++regions_[reg].users;
    }
  }

  absl::StatusOr<std::shared_ptr<Peer>> peer = GetPeer(d.worker_address);
  if (!peer.ok()) {
    return base::Annotate(peer.status(),
                          absl::StrCat("transfer '", d.transfer_id, "'"));
  }
  s.peer = *peer;
  s.peer->sends.insert(s.id);
  s.transport = s.peer->transport;
  bool all_allocated = true;
  for (const wire::Rkey& k : rkeys) {
    all_allocated = all_allocated && (k.flags & wire::kRkeyUcxAllocated);
  }
  s.primitive = request.primitive != Primitive::kAuto ? request.primitive
                : options_.primitive != Primitive::kAuto
                    ? options_.primitive
                    : AutoPrimitive(s.transport, all_allocated);
  if (s.primitive == Primitive::kPut) {
    for (size_t i = 0; i < rkeys.size(); ++i) {
      auto cached = s.peer->rkeys.find(rkeys[i].ucx_rkey);
      if (cached == s.peer->rkeys.end()) {
        ucp_rkey_h handle = nullptr;
        const ucs_status_t st =
            ucp_ep_rkey_unpack(s.peer->ep, rkeys[i].ucx_rkey.data(), &handle);
        if (st != UCS_OK) {
          return FromUcs(st, absl::StrCat("transfer '", d.transfer_id,
                                          "': UCX cannot unpack the rkey of "
                                          "region ",
                                          i));
        }
        cached = s.peer->rkeys
                     .emplace(rkeys[i].ucx_rkey, Peer::CachedRkey{handle, 0, 0})
                     .first;
      }
      ++cached->second.users;
      cached->second.last_used = NowNanos();
      s.ucx_rkeys.push_back(cached->second.handle);
      s.rkey_keys.push_back(rkeys[i].ucx_rkey);
    }
    // Puts land without the receiver looking: first let it check the
    // transfer id and the rkeys (BEGIN -> READY).
    if (!s.messages.empty()) s.phase = SendPhase::kBegin;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Core::Peer>> Core::GetPeer(
    const std::string& blob) {
  auto it = peers_.find(blob);
  if (it != peers_.end()) return it->second;
  absl::StatusOr<wire::WorkerAddress> address = wire::UnpackWorkerAddress(blob);
  if (!address.ok()) return address.status();
  auto peer = std::make_shared<Peer>();
  peer->blob = blob;
  peer->engine_id = address->engine_id;
  peer->process = address->process;
  peer->core = this;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address =
      reinterpret_cast<const ucp_address_t*>(address->ucx_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Core::PeerErrorFn;
  ep.err_handler.arg = peer.get();
  const ucs_status_t st = ucp_ep_create(worker_, &ep, &peer->ep);
  if (st != UCS_OK) {
    // Whatever UCX's reason (unreachable, a vanished shared-memory segment,
    // a refused connection), the peer cannot be reached.
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the receiver (engine ", Hex(address->engine_id),
        "): ", ucs_status_string(st),
        ": it exited, or UCX_TLS leaves the two sides no common transport"));
  }
  peer->transport = DetectTransport(peer->ep);
  peers_.emplace(blob, peer);
  // HELLO: our address, so the receiver can answer.
  wire::HelloHeader h;
  h.sender_engine = engine_id_;
  OpCtx* ctx = NewOp(OpKind::kHello);
  ctx->header = wire::EncodeHello(h);
  ctx->payload = framed_address_;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                    UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_EAGER;
  rp.cb.send = &Core::SendCallbackFn;
  rp.user_data = ctx;
  Track(ctx, ucp_am_send_nbx(peer->ep, wire::kAmHello, ctx->header.data(),
                             ctx->header.size(), ctx->payload.data(),
                             ctx->payload.size(), &rp));
  SWA_LOG(debug, "transfer engine '{}': endpoint to engine {} over {}",
          options_.name, Hex(peer->engine_id),
          std::string(TransportName(peer->transport)));
  return peer;
}

void Core::PeerErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  Core* core = peer->core;
  auto it = core->peers_.find(peer->blob);
  if (it == core->peers_.end() || it->second.get() != peer) return;
  core->peer_errors_.emplace_back(
      it->second,
      PeerError(status, absl::StrCat("the endpoint to receiver engine ",
                                     Hex(peer->engine_id), " failed")));
}

void Core::ClosePeer(const std::shared_ptr<Peer>& peer,
                     const absl::Status& why) {
  if (peer->closing) return;
  peer->closing = true;
  auto it = peers_.find(peer->blob);
  if (it != peers_.end() && it->second == peer) peers_.erase(it);
  for (uint64_t id : peer->sends) {
    auto s = sends_.find(id);
    if (s == sends_.end()) continue;
    FailSend(
        *s->second,
        base::Annotate(why,
                       absl::StrCat("transfer '", s->second->transfer_id, "'")),
        absl::IsCancelled(why) ? Reason::kCancelled : Reason::kPeerFailure);
    MarkSend(id);
  }
  TrimRkeyCache(*peer);
  CloseEp(peer->ep, peer, nullptr);
  peer->ep = nullptr;
}

void Core::TrimRkeyCache(Peer& peer) {
  const size_t keep = peer.closing ? 0 : kRkeyCacheSize;
  while (peer.rkeys.size() > keep) {
    auto victim = peer.rkeys.end();
    for (auto it = peer.rkeys.begin(); it != peer.rkeys.end(); ++it) {
      if (it->second.users > 0) continue;
      if (victim == peer.rkeys.end() ||
          it->second.last_used < victim->second.last_used) {
        victim = it;
      }
    }
    if (victim == peer.rkeys.end()) return;  // all in use
    ucp_rkey_destroy(victim->second.handle);
    peer.rkeys.erase(victim);
  }
}

void Core::CloseEp(ucp_ep_h ep, std::shared_ptr<Peer> peer,
                   std::shared_ptr<BackEp> back) {
  // An endpoint can be reached twice in one round (as a sender's reply_ep of
  // two receives, and as our own endpoint back): close it once. Cleared every
  // loop iteration, so a handle UCX reuses later is not mistaken for it.
  if (ep == nullptr || !closed_this_round_.insert(ep).second) return;
  OpCtx* ctx = NewOp(OpKind::kClose);
  ctx->peer = std::move(peer);  // keeps the err_handler arg alive
  ctx->back = std::move(back);
  ++closing_eps_;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                    UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  rp.cb.send = &Core::SendCallbackFn;
  rp.user_data = ctx;
  Track(ctx, ucp_ep_close_nbx(ep, &rp));
}

void Core::Pump(SendState& s) {
  if (s.failed) {
    if (s.inflight == 0) FinishSend(s.id);
    return;
  }
  if (s.phase == SendPhase::kBegin) {
    if (!s.begin_posted) {
      s.begin_posted = true;
      PostBegin(s);
    }
    return;  // OnReply(kReady) moves it on
  }
  if (s.phase == SendPhase::kData) {
    while (s.next < s.messages.size() &&
           s.inflight < options_.max_inflight_messages && !s.failed) {
      PostMessage(s, s.messages[s.next++]);
    }
    if (s.failed) {
      if (s.inflight == 0) FinishSend(s.id);
      return;
    }
    if (s.next < s.messages.size() || s.inflight > 0) return;
    s.phase = s.put_bytes_done > 0 ? SendPhase::kFlush : SendPhase::kCommit;
  }
  if (s.phase == SendPhase::kFlush) {
    if (!s.flush_posted) {
      s.flush_posted = true;
      OpCtx* ctx = NewOp(OpKind::kFlush);
      ctx->send_id = s.id;
      ++s.inflight;
      ucp_request_param_t rp{};
      rp.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      rp.cb.send = &Core::SendCallbackFn;
      rp.user_data = ctx;
      Track(ctx, ucp_ep_flush_nbx(s.peer->ep, &rp));
    }
    if (s.phase == SendPhase::kFlush) return;  // OnOpDone moves it on
  }
  if (s.phase == SendPhase::kCommit) {
    PostCommit(s);
    s.phase = SendPhase::kAwaitAck;
  }
  if (s.phase == SendPhase::kAwaitAck && s.acked && s.inflight == 0) {
    FinishSend(s.id);
  }
}

void Core::PostMessage(SendState& s, const Message& m) {
  const bool put = s.primitive == Primitive::kPut;
  OpCtx* ctx = NewOp(put ? OpKind::kPut : OpKind::kData);
  ctx->send_id = s.id;
  ctx->bytes = m.bytes;
  ++s.inflight;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = &Core::SendCallbackFn;
  rp.user_data = ctx;
  if (m.memh != nullptr) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = m.memh;
  }
  if (put) {
    Track(ctx, ucp_put_nbx(s.peer->ep, m.local, m.bytes, m.remote_address,
                           s.ucx_rkeys[m.region], &rp));
    return;
  }
  wire::DataHeader h;
  h.sender_engine = engine_id_;
  h.send_id = s.id;
  h.rkey_tag = s.region_tags[m.region];
  h.remote_address = m.remote_address;
  h.length = m.bytes;
  h.region = m.region;
  ctx->header = wire::EncodeData(h, s.transfer_id);
  rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY;
  Track(ctx, ucp_am_send_nbx(s.peer->ep, wire::kAmData, ctx->header.data(),
                             ctx->header.size(), m.local, m.bytes, &rp));
}

void Core::PostBegin(SendState& s) {
  wire::CommitHeader h;
  h.sender_engine = engine_id_;
  h.send_id = s.id;
  OpCtx* ctx = NewOp(OpKind::kBegin);
  ctx->send_id = s.id;
  ctx->header = wire::EncodeBegin(h, s.region_tags, s.transfer_id);
  ++s.inflight;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                    UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  rp.cb.send = &Core::SendCallbackFn;
  rp.user_data = ctx;
  Track(ctx, ucp_am_send_nbx(s.peer->ep, wire::kAmBegin, ctx->header.data(),
                             ctx->header.size(), nullptr, 0, &rp));
}

void Core::PostCommit(SendState& s) {
  wire::CommitHeader h;
  h.sender_engine = engine_id_;
  h.send_id = s.id;
  h.am_bytes = s.am_bytes_done;
  h.put_bytes = s.put_bytes_done;
  h.messages = s.messages.size();
  OpCtx* ctx = NewOp(OpKind::kCommit);
  ctx->send_id = s.id;
  ctx->header = wire::EncodeCommit(h, s.region_tags, s.transfer_id);
  ctx->payload = std::move(s.commit_payload);
  ++s.inflight;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                    UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY;
  rp.cb.send = &Core::SendCallbackFn;
  rp.user_data = ctx;
  Track(ctx, ucp_am_send_nbx(s.peer->ep, wire::kAmCommit, ctx->header.data(),
                             ctx->header.size(), ctx->payload.data(),
                             ctx->payload.size(), &rp));
}

void Core::FailSend(SendState& s, absl::Status status, Reason reason) {
  if (s.failed) return;
  s.failed = true;
  s.error = std::move(status);
  s.reason = reason;
  MarkSend(s.id);
}

void Core::FinishSend(uint64_t id) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;
  std::unique_ptr<SendState> s = std::move(it->second);
  sends_.erase(it);
  if (s->peer != nullptr) {
    for (const std::string& key : s->rkey_keys) {
      auto it = s->peer->rkeys.find(key);
      if (it != s->peer->rkeys.end()) --it->second.users;
    }
    TrimRkeyCache(*s->peer);
  }
  for (uint64_t reg : s->registrations) {
    auto r = regions_.find(reg);
    if (r != regions_.end()) --r->second.users;
  }
  if (s->peer != nullptr) s->peer->sends.erase(id);
  const absl::Duration elapsed = Since(s->start_ns);
  if (have_metrics_) {
    send_metrics_.in_flight->Decrement();
    if (s->failed) {
      send_metrics_.failed->Increment();
      send_metrics_.reasons[static_cast<int>(s->reason)]->Increment();
    } else {
      send_metrics_.ok->Increment();
      send_metrics_.bytes->Increment(
          static_cast<double>(s->am_bytes_done + s->put_bytes_done));
      send_metrics_.seconds->Observe(absl::ToDoubleSeconds(elapsed));
    }
  }
  UpdateStats();
  if (s->done == nullptr) return;
  if (s->failed) {
    s->done(s->error);
  } else {
    SendResult r;
    r.bytes = s->am_bytes_done + s->put_bytes_done;
    r.messages = s->messages.size();
    r.elapsed = elapsed;
    r.primitive = s->primitive;
    r.transport = s->transport;
    s->done(r);
  }
}

void Core::CancelSend(uint64_t id) {
  Post([this, id] {
    auto it = sends_.find(id);
    if (it == sends_.end()) return;
    SendState& s = *it->second;
    FailSend(s,
             absl::CancelledError(absl::StrCat(
                 "transfer '", s.transfer_id, "' was cancelled by the sender")),
             Reason::kCancelled);
    // Outstanding messages drain normally; if the peer does not drain them
    // by the send's deadline, CheckDeadlines closes the endpoint.
  });
}

// --- Receiver ----------------------------------------------------------------

absl::StatusOr<Destination> Core::ExpectTransfer(ReceiveRequest request,
                                                 ReceiveCallback done) {
  if (request.transfer_id.empty() ||
      request.transfer_id.size() > wire::kMaxTransferIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer id must be 1..", wire::kMaxTransferIdBytes,
                     " bytes, got ", request.transfer_id.size()));
  }
  if (request.regions.empty() || request.regions.size() > wire::kMaxRegions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", request.transfer_id, "' has ", request.regions.size(),
        " regions; 1..", wire::kMaxRegions, " are allowed"));
  }
  uint64_t capacity = 0;
  for (size_t i = 0; i < request.regions.size(); ++i) {
    const LocalRegion& lr = request.regions[i];
    if (lr.registration == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transfer '", request.transfer_id, "': region ", i,
          " has no registration (Register the staging memory first)"));
    }
    if (lr.offset > lr.registration->size() ||
        lr.length > lr.registration->size() - lr.offset || lr.length == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "transfer '%s': region %d [%d, +%d) is empty or outside its "
          "registration of %d bytes",
          request.transfer_id, i, lr.offset, lr.length,
          lr.registration->size()));
    }
    capacity += lr.length;
  }
  if (request.expected_bytes > capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "transfer '%s' expects %d bytes but its regions hold only %d",
        request.transfer_id, request.expected_bytes, capacity));
  }
  return RunSync([&]() -> absl::StatusOr<Destination> {
    if (shutting_down_) {
      return absl::FailedPreconditionError(
          "the transfer engine is shutting down");
    }
    auto existing = receives_.find(request.transfer_id);
    if (existing != receives_.end()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "transfer id '", request.transfer_id, "' is ",
          existing->second->finished ? "recently finished" : "already pending",
          " on this engine: transfer ids must be unique"));
    }
    auto r = std::make_unique<ReceiveState>();
    r->id = request.transfer_id;
    r->expected = request.expected_bytes;
    r->done = std::move(done);
    r->start_ns = NowNanos();
    const absl::Duration timeout = request.timeout > absl::ZeroDuration()
                                       ? request.timeout
                                       : options_.default_timeout;
    r->deadline_ns = r->start_ns + DurationNanos(timeout);
    Destination dest;
    dest.transfer_id = request.transfer_id;
    dest.worker_address = framed_address_;
    for (size_t i = 0; i < request.regions.size(); ++i) {
      const LocalRegion& lr = request.regions[i];
      auto rec = regions_.find(lr.registration->id_);
      if (rec == regions_.end() || rec->second.releasing ||
          lr.registration->core_.get() != this) {
        return absl::InvalidArgumentError(absl::StrCat(
            "transfer '", request.transfer_id, "': region ", i,
            " uses a registration of another engine or one being released"));
      }
      Slot slot;
      slot.data = rec->second.data + lr.offset;
      slot.length = lr.length;
      do {
        slot.tag = rng_();
      } while (slot.tag == 0);
      slot.memh = rec->second.memh;
      slot.registration = rec->second.id;
      r->regions.push_back(slot);
      RemoteRegion rr;
      rr.pool = lr.pool;
      rr.base_address = reinterpret_cast<uint64_t>(slot.data);
      rr.length = slot.length;
      rr.rkey = wire::PackRkey(
          wire::Rkey{slot.tag, rr.base_address, rr.length, rec->second.ucx_rkey,
                     rec->second.allocated ? wire::kRkeyUcxAllocated : 0});
      dest.regions.push_back(std::move(rr));
    }
    for (const Slot& slot : r->regions) ++regions_[slot.registration].users;
    next_deadline_ns_ = std::min(next_deadline_ns_, r->deadline_ns);
    receives_.emplace(r->id, std::move(r));
    ++pending_receives_;
    if (have_metrics_) receive_metrics_.in_flight->Increment();
    UpdateStats();
    return dest;
  });
}

absl::Status Core::CancelReceive(std::string transfer_id) {
  return RunSync([&]() -> absl::Status {
    auto it = receives_.find(transfer_id);
    if (it == receives_.end() || it->second->finished) {
      return absl::NotFoundError(
          absl::StrCat("no pending transfer '", transfer_id, "'"));
    }
    FailReceive(
        *it->second,
        absl::CancelledError(absl::StrCat("transfer '", transfer_id,
                                          "' was cancelled by the receiver")),
        Reason::kCancelled);
    return absl::OkStatus();
  });
}

ucs_status_t Core::AmHelloFn(void* arg, const void* header,
                             size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* p) {
  auto* core = static_cast<Core*>(arg);
  absl::StatusOr<wire::HelloHeader> h =
      wire::DecodeHello(header, header_length);
  if (!h.ok() || (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    SWA_LOG(warn, "transfer engine '{}': dropped a malformed hello",
            core->options_.name);
    return UCS_OK;
  }
  absl::StatusOr<wire::WorkerAddress> address = wire::UnpackWorkerAddress(
      absl::string_view(static_cast<const char*>(data), length));
  if (!address.ok() || address->engine_id != h->sender_engine) {
    SWA_LOG(warn, "transfer engine '{}': dropped a hello with a bad address",
            core->options_.name);
    return UCS_OK;
  }
  core->pending_hellos_.push_back(*std::move(address));
  return UCS_OK;
}

void Core::OpenBackEp(const wire::WorkerAddress& address) {
  if (shutting_down_) return;
  const uint64_t engine = address.engine_id;
  const std::string& ucx_address = address.ucx_address;
  // A second hello means the sender opened a new endpoint (it closed the old
  // one, e.g. after a timeout): the old connection back is dead too.
  if (auto it = back_eps_.find(engine); it != back_eps_.end()) {
    CloseBackEp(it->second,
                absl::CancelledError("the sender opened a new endpoint"));
  }
  auto back = std::make_shared<BackEp>();
  back->engine_id = engine;
  back->process = address.process;
  back->core = this;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(ucx_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Core::BackEpErrorFn;
  ep.err_handler.arg = back.get();
  const ucs_status_t st = ucp_ep_create(worker_, &ep, &back->ep);
  if (st != UCS_OK) {
    SWA_LOG(warn,
            "transfer engine '{}': cannot open an endpoint back to sender {}: "
            "{}; its transfers will time out",
            options_.name, Hex(engine), ucs_status_string(st));
    return;
  }
  back_eps_.emplace(engine, std::move(back));
}

void Core::BackEpErrorFn(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* back = static_cast<BackEp*>(arg);
  Core* core = back->core;
  auto it = core->back_eps_.find(back->engine_id);
  if (it == core->back_eps_.end() || it->second.get() != back) return;
  core->back_errors_.emplace_back(
      it->second,
      PeerError(status, absl::StrCat("sender engine ", Hex(back->engine_id),
                                     " failed mid-transfer")));
}

void Core::CloseBackEp(const std::shared_ptr<BackEp>& back,
                       const absl::Status& why) {
  if (back->closing) return;
  back->closing = true;
  auto it = back_eps_.find(back->engine_id);
  if (it != back_eps_.end() && it->second == back) back_eps_.erase(it);
  const ucp_ep_h ep = back->ep;
  back->ep = nullptr;
  if (!absl::IsCancelled(why)) {
    std::vector<ReceiveState*> failed;
    for (auto& [id, r] : receives_) {
      if (r->finished || r->failed || !r->senders.contains(back->engine_id)) {
        continue;
      }
      FailReceive(*r, base::Annotate(why, absl::StrCat("transfer '", id, "'")),
                  Reason::kPeerFailure);
      failed.push_back(r.get());
    }
    for (ReceiveState* r : failed) {
      r->reply_eps.erase(ep);
      if (r->inflight > 0) ForceCloseReplyEps(*r, r->error);
    }
  }
  for (auto& [id, r] : receives_) r->reply_eps.erase(ep);
  CloseEp(ep, nullptr, back);
}

ucs_status_t Core::AmDataFn(void* arg, const void* header, size_t header_length,
                            void* data, size_t length,
                            const ucp_am_recv_param_t* p) {
  return static_cast<Core*>(arg)->OnData(header, header_length, data, length,
                                         p);
}

ucs_status_t Core::OnData(const void* header, size_t header_length, void* data,
                          size_t length, const ucp_am_recv_param_t* p) {
  last_activity_ns_ = NowNanos();
  absl::StatusOr<wire::DecodedData> d = wire::DecodeData(header, header_length);
  if (!d.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a data message: {}",
            options_.name, d.status().ToString());
    return UCS_OK;
  }
  const wire::DataHeader& h = d->header;
  auto reject = [&](absl::Status status) {
    QueueReply(h.sender_engine, h.send_id, wire::ReplyKind::kReject,
               std::move(status));
    return UCS_OK;  // drops the data; the sender's request completes
  };
  auto it = receives_.find(d->transfer_id);
  if (it == receives_.end()) {
    return reject(absl::NotFoundError(UnknownTransferMessage(d->transfer_id)));
  }
  ReceiveState& r = *it->second;
  if (r.finished) {
    return reject(r.outcome.ok()
                      ? absl::FailedPreconditionError(absl::StrCat(
                            "transfer '", r.id,
                            "' is already complete; data after the commit is "
                            "not accepted"))
                      : r.outcome);
  }
  if (r.failed) return reject(r.error);
  absl::Status invalid;
  if (h.region >= r.regions.size()) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("transfer '", r.id, "': a data message names region ",
                     h.region, " but the transfer has ", r.regions.size()));
  } else if (h.rkey_tag != r.regions[h.region].tag) {
    invalid = absl::InvalidArgumentError(absl::StrCat(
        "transfer '", r.id, "': the rkey of region ", h.region,
        " does not belong to this transfer (tag mismatch): the sender used a "
        "stale or foreign KvDestination; fetch it again from the decode "
        "worker"));
  } else if (h.length != length) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat("transfer '", r.id, "': a data message declares ",
                     h.length, " bytes but carries ", length));
  } else {
    const Slot& slot = r.regions[h.region];
    const uint64_t base = reinterpret_cast<uint64_t>(slot.data);
    if (h.remote_address < base || h.remote_address - base > slot.length ||
        length > slot.length - (h.remote_address - base)) {
      invalid = absl::InvalidArgumentError(absl::StrFormat(
          "transfer '%s': a data message writes [0x%x, +%d), outside region "
          "%d [0x%x, +%d): the sender's page list does not match the "
          "destination",
          r.id, h.remote_address, length, h.region, base, slot.length));
    }
  }
  if (!invalid.ok()) {
    FailReceive(r, invalid, Reason::kRejected);
    return reject(invalid);
  }
  r.senders.insert(h.sender_engine);
  if ((p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
      p->reply_ep != nullptr) {
    r.reply_eps.insert(p->reply_ep);
  }
  if (!r.started) {
    r.started = true;
    ++started_receives_;
  }
  const Slot& slot = r.regions[h.region];
  auto* dst = reinterpret_cast<void*>(h.remote_address);
  if (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    OpCtx* ctx = NewOp(OpKind::kRecvData);
    ctx->receive_id = r.id;
    ctx->bytes = length;
    ++r.inflight;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_MEMH;
    rp.cb.recv_am = &Core::RecvAmCallbackFn;
    rp.user_data = ctx;
    rp.memh = slot.memh;
    Track(ctx, ucp_am_recv_data_nbx(worker_, data, dst, length, &rp));
    return UCS_INPROGRESS;
  }
  std::memcpy(dst, data, length);
  r.received += length;
  return UCS_OK;
}

ucs_status_t Core::AmCommitFn(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* p) {
  return static_cast<Core*>(arg)->OnCommit(header, header_length, data, length,
                                           p);
}

ucs_status_t Core::OnCommit(const void* header, size_t header_length,
                            void* data, size_t length,
                            const ucp_am_recv_param_t* p) {
  last_activity_ns_ = NowNanos();
  absl::StatusOr<wire::DecodedCommit> c =
      wire::DecodeCommit(header, header_length);
  if (!c.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a commit: {}", options_.name,
            c.status().ToString());
    return UCS_OK;
  }
  const wire::CommitHeader& h = c->header;
  auto ack = [&](absl::Status status) {
    QueueReply(h.sender_engine, h.send_id, wire::ReplyKind::kAck,
               std::move(status));
    return UCS_OK;
  };
  auto it = receives_.find(c->transfer_id);
  if (it == receives_.end()) {
    return ack(absl::NotFoundError(UnknownTransferMessage(c->transfer_id)));
  }
  ReceiveState& r = *it->second;
  if (r.finished) {
    return ack(r.outcome.ok() ? absl::FailedPreconditionError(absl::StrCat(
                                    "transfer '", r.id,
                                    "' was already committed by another send"))
                              : r.outcome);
  }
  if (r.failed) return ack(r.error);
  if (r.committed || r.commit_receiving) {
    return ack(absl::FailedPreconditionError(
        absl::StrCat("transfer '", r.id, "' was already committed")));
  }
  bool tags_ok = c->region_tags.size() == r.regions.size();
  for (size_t i = 0; tags_ok && i < r.regions.size(); ++i) {
    tags_ok = c->region_tags[i] == r.regions[i].tag;
  }
  if (!tags_ok) {
    absl::Status invalid = absl::InvalidArgumentError(absl::StrCat(
        "transfer '", r.id,
        "': the commit carries rkeys that do not belong to this transfer: the "
        "sender used a stale or foreign KvDestination; fetch it again from "
        "the decode worker"));
    FailReceive(r, invalid, Reason::kRejected);
    r.commit_engine = h.sender_engine;
    r.commit_send_id = h.send_id;
    r.committed = true;  // so FinishReceive acks the error
    return UCS_OK;
  }
  r.senders.insert(h.sender_engine);
  if (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    if ((p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
        p->reply_ep != nullptr) {
      r.reply_eps.insert(p->reply_ep);
    }
    OpCtx* ctx = NewOp(OpKind::kRecvCommit);
    ctx->receive_id = r.id;
    ctx->bytes = length;
    ctx->payload.resize(length);
    ctx->commit = *std::move(c);
    ++r.inflight;
    r.commit_receiving = true;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = &Core::RecvAmCallbackFn;
    rp.user_data = ctx;
    Track(ctx, ucp_am_recv_data_nbx(worker_, data, ctx->payload.data(), length,
                                    &rp));
    return UCS_INPROGRESS;
  }
  ApplyCommit(r, *c,
              std::string(static_cast<const char*>(data), data ? length : 0));
  return UCS_OK;
}

void Core::ApplyCommit(ReceiveState& r, const wire::DecodedCommit& commit,
                       std::string payload) {
  r.committed = true;
  r.payload = std::move(payload);
  r.declared_am_bytes = commit.header.am_bytes;
  r.put_bytes = commit.header.put_bytes;
  r.commit_engine = commit.header.sender_engine;
  r.commit_send_id = commit.header.send_id;
  MarkReceive(r.id);
}

void Core::CheckReceive(ReceiveState& r) {
  if (r.finished) return;
  if (r.failed) {
    if (r.inflight == 0) FinishReceive(r);
    return;
  }
  if (!r.committed || r.inflight > 0) return;
  if (r.declared_am_bytes != r.received) {
    FailReceive(r,
                absl::FailedPreconditionError(absl::StrFormat(
                    "transfer '%s': the sender committed %d bytes of data "
                    "messages but %d arrived",
                    r.id, r.declared_am_bytes, r.received)),
                Reason::kRejected);
  } else if (r.received + r.put_bytes != r.expected) {
    FailReceive(r,
                absl::FailedPreconditionError(absl::StrFormat(
                    "transfer '%s': the sender wrote %d bytes but the "
                    "receiver expects %d: both sides must plan from the same "
                    "KvDestination (token count, page size, window)",
                    r.id, r.received + r.put_bytes, r.expected)),
                Reason::kRejected);
  }
  FinishReceive(r);
}

void Core::FailReceive(ReceiveState& r, absl::Status status, Reason reason) {
  if (r.finished || r.failed) return;
  r.failed = true;
  r.error = std::move(status);
  r.reason = reason;
  MarkReceive(r.id);
}

void Core::FinishReceive(ReceiveState& r) {
  if (r.finished) return;
  r.finished = true;
  --pending_receives_;
  if (r.started) --started_receives_;
  r.linger_until_ns = NowNanos() + DurationNanos(options_.finished_linger);
  for (const Slot& slot : r.regions) {
    auto rec = regions_.find(slot.registration);
    if (rec != regions_.end()) --rec->second.users;
  }
  r.regions.clear();
  r.reply_eps.clear();
  const absl::Duration elapsed = Since(r.start_ns);
  r.outcome = r.failed ? r.error : absl::OkStatus();
  if (r.committed) {
    QueueReply(r.commit_engine, r.commit_send_id, wire::ReplyKind::kAck,
               r.outcome);
  }
  if (have_metrics_) {
    receive_metrics_.in_flight->Decrement();
    if (r.failed) {
      receive_metrics_.failed->Increment();
      receive_metrics_.reasons[static_cast<int>(r.reason)]->Increment();
    } else {
      receive_metrics_.ok->Increment();
      receive_metrics_.bytes->Increment(
          static_cast<double>(r.received + r.put_bytes));
      receive_metrics_.seconds->Observe(absl::ToDoubleSeconds(elapsed));
    }
  }
  UpdateStats();
  ReceiveCallback done = std::move(r.done);
  r.done = nullptr;
  if (done == nullptr) return;
  if (r.failed) {
    done(r.error);
  } else {
    ReceivedTransfer t;
    t.transfer_id = r.id;
    t.bytes = r.received + r.put_bytes;
    t.commit_payload = std::move(r.payload);
    t.elapsed = elapsed;
    done(std::move(t));
  }
}

void Core::CheckLiveness() {
  std::vector<std::shared_ptr<Peer>> dead_peers;
  for (auto& [blob, p] : peers_) {
    if (ProcessGone(p->process, self_process_)) dead_peers.push_back(p);
  }
  for (auto& p : dead_peers) {
    ClosePeer(
        p, absl::UnavailableError(absl::StrCat("the receiver's process (pid ",
                                               p->process.pid, ") exited")));
  }
  std::vector<std::shared_ptr<BackEp>> dead_backs;
  for (auto& [engine, b] : back_eps_) {
    if (ProcessGone(b->process, self_process_)) dead_backs.push_back(b);
  }
  for (auto& b : dead_backs) {
    CloseBackEp(b, absl::UnavailableError(
                       absl::StrCat("the sender's process (pid ",
                                    b->process.pid, ") exited mid-transfer")));
  }
}

void Core::ForceCloseReplyEps(ReceiveState& r, const absl::Status& why) {
  std::vector<ucp_ep_h> eps(r.reply_eps.begin(), r.reply_eps.end());
  // Forget them everywhere first, so that closing one (which may fail other
  // receives and force-close theirs) never reaches them again.
  for (auto& [id, other] : receives_) {
    for (ucp_ep_h ep : eps) other->reply_eps.erase(ep);
  }
  for (ucp_ep_h ep : eps) {
    // The endpoint may be one we own (UCX pairs our endpoint back to a
    // sender, or to a receiver we send to, with the sender's connection).
    std::shared_ptr<BackEp> back;
    for (auto& [engine, b] : back_eps_) {
      if (b->ep == ep) back = b;
    }
    std::shared_ptr<Peer> peer;
    for (auto& [blob, p] : peers_) {
      if (p->ep == ep) peer = p;
    }
    if (back != nullptr) {
      CloseBackEp(back, why);
    } else if (peer != nullptr) {
      ClosePeer(peer, why);
    } else {
      SWA_LOG(debug,
              "transfer engine '{}': force-closing the endpoint of transfer "
              "'{}' ({} receives outstanding): {}",
              options_.name, r.id, r.inflight, why.ToString());
      CloseEp(ep, nullptr, nullptr);
    }
  }
}

void Core::QueueReply(uint64_t engine, uint64_t send_id, wire::ReplyKind kind,
                      absl::Status status) {
  pending_replies_.push_back(PendingReply{engine, send_id, kind, status});
}

void Core::SendReply(const PendingReply& reply) {
  auto it = back_eps_.find(reply.engine);
  if (it == back_eps_.end() || it->second->ep == nullptr) {
    SWA_LOG(warn,
            "transfer engine '{}': no endpoint back to sender {} (its hello "
            "was lost or it failed); it will time out",
            options_.name, Hex(reply.engine));
    return;
  }
  wire::ReplyHeader h;
  h.send_id = reply.send_id;
  h.code = static_cast<uint32_t>(reply.status.code());
  h.reply_kind = static_cast<uint8_t>(reply.kind);
  OpCtx* ctx = NewOp(OpKind::kReply);
  ctx->header = wire::EncodeReply(h);
  ctx->payload = std::string(reply.status.message().substr(0, 2048));
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                    UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_EAGER;
  rp.cb.send = &Core::SendCallbackFn;
  rp.user_data = ctx;
  ctx->back = it->second;
  Track(ctx, ucp_am_send_nbx(it->second->ep, wire::kAmReply, ctx->header.data(),
                             ctx->header.size(), ctx->payload.data(),
                             ctx->payload.size(), &rp));
}

ucs_status_t Core::AmBeginFn(void* arg, const void* header,
                             size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* p) {
  static_cast<Core*>(arg)->OnBegin(header, header_length, p);
  return UCS_OK;
}

void Core::OnBegin(const void* header, size_t header_length,
                   const ucp_am_recv_param_t* p) {
  last_activity_ns_ = NowNanos();
  absl::StatusOr<wire::DecodedCommit> b =
      wire::DecodeBegin(header, header_length);
  if (!b.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a begin: {}", options_.name,
            b.status().ToString());
    return;
  }
  const wire::CommitHeader& h = b->header;
  auto reply = [&](wire::ReplyKind kind, absl::Status status) {
    QueueReply(h.sender_engine, h.send_id, kind, std::move(status));
  };
  auto it = receives_.find(b->transfer_id);
  if (it == receives_.end()) {
    reply(wire::ReplyKind::kReject,
          absl::NotFoundError(UnknownTransferMessage(b->transfer_id)));
    return;
  }
  ReceiveState& r = *it->second;
  if (r.finished) {
    reply(wire::ReplyKind::kReject,
          r.outcome.ok() ? absl::FailedPreconditionError(absl::StrCat(
                               "transfer '", r.id, "' is already complete"))
                         : r.outcome);
    return;
  }
  if (r.failed) {
    reply(wire::ReplyKind::kReject, r.error);
    return;
  }
  bool tags_ok = b->region_tags.size() == r.regions.size();
  for (size_t i = 0; tags_ok && i < r.regions.size(); ++i) {
    tags_ok = b->region_tags[i] == r.regions[i].tag;
  }
  if (!tags_ok) {
    absl::Status invalid = absl::InvalidArgumentError(absl::StrCat(
        "transfer '", r.id,
        "': the sender's rkeys do not belong to this transfer: it used a "
        "stale or foreign KvDestination; fetch it again from the decode "
        "worker"));
    FailReceive(r, invalid, Reason::kRejected);
    reply(wire::ReplyKind::kReject, invalid);
    return;
  }
  r.senders.insert(h.sender_engine);
  if ((p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
      p->reply_ep != nullptr) {
    r.reply_eps.insert(p->reply_ep);
  }
  if (!r.started) {
    r.started = true;
    ++started_receives_;
  }
  reply(wire::ReplyKind::kReady, absl::OkStatus());
}

ucs_status_t Core::AmReplyFn(void* arg, const void* header,
                             size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* p) {
  static_cast<Core*>(arg)->OnReply(header, header_length, data, length, p);
  return UCS_OK;
}

void Core::OnReply(const void* header, size_t header_length, const void* data,
                   size_t length, const ucp_am_recv_param_t* p) {
  last_activity_ns_ = NowNanos();
  absl::StatusOr<wire::ReplyHeader> h =
      wire::DecodeReply(header, header_length);
  if (!h.ok()) {
    SWA_LOG(warn, "transfer engine '{}': dropped a reply: {}", options_.name,
            h.status().ToString());
    return;
  }
  auto it = sends_.find(h->send_id);
  if (it == sends_.end()) return;  // already finished (e.g. timed out)
  SendState& s = *it->second;
  std::string message;
  if (!(p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) && data != nullptr) {
    message.assign(static_cast<const char*>(data), length);
  }
  const auto code = static_cast<absl::StatusCode>(h->code);
  if (h->reply_kind == static_cast<uint8_t>(wire::ReplyKind::kAck) &&
      code == absl::StatusCode::kOk) {
    if (s.phase == SendPhase::kAwaitAck) s.acked = true;
  } else if (h->reply_kind == static_cast<uint8_t>(wire::ReplyKind::kReady) &&
             code == absl::StatusCode::kOk) {
    if (s.phase == SendPhase::kBegin) s.phase = SendPhase::kData;
  } else {
    FailSend(
        s,
        absl::Status(
            code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : code,
            absl::StrCat("receiver rejected the transfer: ", message)),
        Reason::kRejected);
  }
  MarkSend(s.id);
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
