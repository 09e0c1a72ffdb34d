// router_capacity_bench: how many concurrent streaming requests one router
// replica holds, and what each costs.
//
// A real swaserve-router process (started like `swaserve up` starts it, with
// a real redis-server; tests/integration/router's LocalCluster) routes to a
// SimWorker (sim_worker.h: a TIMING SIMULATOR of the worker protocol, for
// benchmarks only) in this process. The load generator here opens --streams
// Generate streams over --channels gRPC connections, ramped over --ramp, each
// asking for --tokens tokens that the simulator sends one per --tpot. Once
// every stream streams, it measures for --window:
//   - the router's threads and RSS (/proc/<pid>/status), before the load
//     and with every stream open: memory per stream = ΔRSS / streams;
//   - the router's CPU (utime + stime of /proc/<pid>/stat) per token the
//     clients received in the window;
//   - each token's delivery latency, simulator -> client (the token ids are
//     the simulator's send timestamps), p50/p99; and the same load sent
//     straight to the simulator (no router: the load generator makes the
//     router's two calls itself; --no-direct skips it) for the added latency;
//   - the same streams over the OpenAI HTTP API (SSE, one connection each;
//     --no-http skips it): threads, RSS and CPU per token. RSS freed by one
//     phase stays with the router's allocator: --no-grpc measures HTTP alone.
// Every stream must end OK.
//
//   build-clang/bench/router/router_capacity_bench --streams 10000
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/common/bench_util.h"
#include "bench/router/sim_worker.h"
#include "swaserve/v1/router.grpc.pb.h"
#include "swaserve/v1/worker.grpc.pb.h"
#include "tests/integration/router/local_cluster.h"

namespace swaserve {
namespace {

using bench::Check;
using bench::Die;

struct Flags {
  int64_t streams = 10000;
  int64_t channels = 8;
  int64_t tokens = 60;
  int64_t prompt_tokens = 64;
  absl::Duration tpot = absl::Seconds(1);
  absl::Duration ramp = absl::Seconds(15);
  absl::Duration window = absl::Seconds(20);
  bool grpc = true;
  bool direct = true;
  bool http = true;
};

// Delivery latencies in 100 µs buckets up to the 131 ms the token ids can
// carry. Lock-free: every stream's callback records.
class LatencyHistogram {
 public:
  static constexpr int kBuckets = 1311;
  void Record(int64_t us) {
    if (!on_.load(std::memory_order_relaxed)) return;
    counts_[std::min<int64_t>(us / 100, kBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
    tokens_.fetch_add(1, std::memory_order_relaxed);
  }
  // Tokens whose latency is not known.
  void Count(int64_t n) {
    if (on_.load(std::memory_order_relaxed)) tokens_.fetch_add(n, std::memory_order_relaxed);
  }
  void Measure(bool on) { on_ = on; }
  int64_t tokens() const { return tokens_.load(); }
  double QuantileMs(double q) const {
    int64_t total = 0;
    for (const auto& c : counts_) total += c.load();
    int64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts_[i].load();
      if (total > 0 && seen >= q * total) return (i + 1) * 0.1;
    }
    return 0;
  }

 private:
  std::atomic<bool> on_{false};
  std::atomic<int64_t> tokens_{0};
  std::array<std::atomic<int64_t>, kBuckets> counts_{};
};

struct LoadStats {
  LatencyHistogram latency;
  std::atomic<int64_t> streaming{0};  // got a first token, not done
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> failed{0};
  absl::Mutex mu;
  std::string first_error ABSL_GUARDED_BY(mu);
  // A stream's tokens arrived: their latencies; the stream streams now.
  template <typename Ids>
  void Tokens(const Ids& ids, bool* first) {
    const int64_t now = bench::SteadyMicros();
    for (uint32_t t : ids) latency.Record(bench::SimTokenLatencyUs(t, now));
    if (!*first && !ids.empty()) {
      *first = true;
      streaming.fetch_add(1);
    }
  }
  // A stream ended.
  void End(const grpc::Status& s, bool first) {
    if (first) streaming.fetch_sub(1);
    if (!s.ok()) Fail(s);
    done.fetch_add(1);
  }
  void Fail(const grpc::Status& s) {
    failed.fetch_add(1);
    absl::MutexLock lock(&mu);
    if (first_error.empty()) first_error = absl::StrCat(s.error_code(), ": ", s.error_message());
  }
};

// One Generate stream through the router.
class RouterStream final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  RouterStream(v1::Router::Stub* stub, v1::GenerateRequest req, LoadStats* stats)
      : req_(std::move(req)), stats_(stats) {
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    stats_->Tokens(msg_.token_ids(), &first_);
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& s) override {
    stats_->End(s, first_);
    delete this;
  }

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse msg_;
  LoadStats* stats_;
  bool first_ = false;
};

// The same request straight to the simulator: Decode, then (after
// `accepted`) Prefill naming its transfer id, as the router does.
class DirectStream final : public grpc::ClientReadReactor<v1::DecodeResponse> {
 public:
  DirectStream(v1::Decode::Stub* decode, v1::Prefill::Stub* prefill, const std::string& id,
               int prompt_tokens, int tokens, LoadStats* stats)
      : prefill_(prefill), stats_(stats) {
    dreq_.set_request_id(id);
    for (int i = 0; i < prompt_tokens; ++i) dreq_.add_prompt_token_ids(1000 + i);
    dreq_.mutable_sampling()->set_max_tokens(tokens);
    preq_.set_request_id(id);
    *preq_.mutable_token_ids() = dreq_.prompt_token_ids();
    preq_.mutable_decode()->set_transfer_id(id);
    decode->async()->Decode(&ctx_, &dreq_, this);
    AddHold();  // the prefill call
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (msg_.has_accepted()) {
      prefill_->async()->Prefill(&pctx_, &preq_, &presp_, [this](grpc::Status s) {
        if (!s.ok()) stats_->Fail(s);
        RemoveHold();
      });
    } else {
      stats_->Tokens(msg_.tokens().token_ids(), &first_);
    }
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& s) override {
    stats_->End(s, first_);
    delete this;
  }

 private:
  v1::Prefill::Stub* prefill_;
  grpc::ClientContext ctx_, pctx_;
  v1::DecodeRequest dreq_;
  v1::PrefillRequest preq_;
  v1::PrefillResponse presp_;
  v1::DecodeResponse msg_;
  LoadStats* stats_;
  bool first_ = false;
};

// The OpenAI HTTP API under the same load: one connection per stream (as
// clients of the HTTP API have), SSE frames counted as they arrive, on one
// libevent loop of the load generator's own. The frames carry text, not
// the simulator's token ids, so HTTP mode measures threads, memory and CPU,
// not latency.
class HttpLoad {
 public:
  explicit HttpLoad(int port) : port_(port), base_(NewThreadSafeBase()) {
    // A timer keeps the loop running while no connection exists.
    keepalive_ = event_new(base_, -1, EV_PERSIST, [](evutil_socket_t, short, void*) {}, nullptr);
    timeval tv{1, 0};
    event_add(keepalive_, &tv);
    thread_ = std::thread([this] { event_base_dispatch(base_); });
  }
  ~HttpLoad() {
    event_base_loopbreak(base_);
    thread_.join();
    event_free(keepalive_);
    for (evhttp_connection* c : conns_) evhttp_connection_free(c);
    event_base_free(base_);
  }
  // Starts stream `i` (from any thread: it runs on the load's loop).
  void Start(std::string body, LoadStats* stats) {
    auto* s = new Stream{this, std::move(body), stats};
    event_base_once(base_, -1, EV_TIMEOUT, &HttpLoad::Open, s, nullptr);
  }

 private:
  // Start posts to the loop from the benchmark's thread.
  static event_base* NewThreadSafeBase() {
    evthread_use_pthreads();
    return event_base_new();
  }
  struct Stream {
    HttpLoad* load;
    std::string body;
    LoadStats* stats;
    std::string tail;  // the end of the last chunk (a frame marker may span two)
    bool first = false;
    int64_t frames = 0;
  };
  static void Open(evutil_socket_t, short, void* arg) {
    auto* s = static_cast<Stream*>(arg);
    evhttp_connection* c = evhttp_connection_base_new(s->load->base_, nullptr, "127.0.0.1",
                                                      static_cast<uint16_t>(s->load->port_));
    evhttp_connection_set_timeout(c, 600);
    s->load->conns_.push_back(c);
    evhttp_request* req = evhttp_request_new(&HttpLoad::Done, s);
    evhttp_request_set_chunked_cb(req, &HttpLoad::Chunk);
    evkeyvalq* h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", "127.0.0.1");
    evhttp_add_header(h, "Content-Type", "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(req), s->body.data(), s->body.size());
    evhttp_make_request(c, req, EVHTTP_REQ_POST, "/v1/completions");
  }
  static void Chunk(evhttp_request* req, void* arg) {
    auto* s = static_cast<Stream*>(arg);
    evbuffer* in = evhttp_request_get_input_buffer(req);
    std::string data = s->tail;
    const size_t old = data.size();
    data.resize(old + evbuffer_get_length(in));
    evbuffer_copyout(in, data.data() + old, data.size() - old);
    int64_t n = 0;
    for (size_t at = data.find("data: {"); at != std::string::npos;
         at = data.find("data: {", at + 1)) {
      if (at + 7 > old) ++n;  // not counted with the last chunk
    }
    s->tail = data.substr(data.size() > 6 ? data.size() - 6 : 0);
    s->frames += n;
    // Each frame carries one token (the simulator sends one per message).
    s->stats->latency.Count(n);
    if (!s->first && n > 0) {
      s->first = true;
      s->stats->streaming.fetch_add(1);
    }
  }
  static void Done(evhttp_request* req, void* arg) {
    std::unique_ptr<Stream> s(static_cast<Stream*>(arg));
    const int code = req != nullptr ? evhttp_request_get_response_code(req) : 0;
    s->stats->End(code == 200 ? grpc::Status::OK
                              : grpc::Status(grpc::StatusCode::UNKNOWN,
                                             absl::StrCat("HTTP status ", code)),
                  s->first);
  }

  const int port_;
  event_base* const base_;
  event* keepalive_ = nullptr;
  std::vector<evhttp_connection*> conns_;  // loop thread
  std::thread thread_;
};

struct ProcStats {
  int64_t threads = 0;
  int64_t rss_kib = 0;
  double cpu_seconds = 0;
};

ProcStats ReadProc(pid_t pid) {
  ProcStats p;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) p.threads = std::atoll(line.c_str() + 8);
    if (line.rfind("VmRSS:", 0) == 0) p.rss_kib = std::atoll(line.c_str() + 6);
  }
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(all.substr(close + 2));
    std::vector<std::string> f;
    std::string tok;
    while (rest >> tok) f.push_back(tok);
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after ") ".
    if (f.size() > 12) {
      p.cpu_seconds =
          static_cast<double>(std::atoll(f[11].c_str()) + std::atoll(f[12].c_str())) /
          static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return p;
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& target, int n) {
  std::vector<std::shared_ptr<grpc::Channel>> out;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection each
    args.SetInt("swaserve.bench.channel", i);
    out.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  }
  return out;
}

struct Result {
  std::string name;
  int64_t streams = 0;
  double ramp_s = 0;
  ProcStats before, during;
  double router_cpu_s = 0, self_cpu_s = 0, window_s = 0;
  double idle_cpu_fraction = 0;  // of a core
  int64_t tokens = 0;
  double p50_ms = 0, p99_ms = 0;
  bool latency_measured = true;
  int64_t failed = 0;
  std::string first_error;
};

// Opens the streams (start(i) starts stream i), waits until all stream,
// measures for the window, waits for the end.
template <typename StartFn>
Result Run(const std::string& name, const Flags& f, pid_t router_pid, StartFn start) {
  LoadStats stats;
  Result r;
  r.name = name;
  r.streams = f.streams;
  if (router_pid > 0) {
    // The idle router's own CPU (registry refresh, metrics, gRPC polling),
    // subtracted from the per-token figure.
    const ProcStats i0 = ReadProc(router_pid);
    absl::SleepFor(absl::Seconds(3));
    r.before = ReadProc(router_pid);
    r.idle_cpu_fraction = (r.before.cpu_seconds - i0.cpu_seconds) / 3.0;
  }
  const absl::Time t0 = absl::Now();
  for (int64_t i = 0; i < f.streams; ++i) {
    start(i, &stats);
    const absl::Time due = t0 + f.ramp * (static_cast<double>(i + 1) / f.streams);
    if (absl::Now() < due) absl::SleepFor(due - absl::Now());
  }
  const absl::Time all_by = absl::Now() + f.tpot * 3 + absl::Seconds(30);
  while (stats.streaming.load() + stats.done.load() < f.streams && absl::Now() < all_by) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  r.ramp_s = absl::ToDoubleSeconds(absl::Now() - t0);
  std::printf("%s: %lld of %lld streams open after %.1f s (%lld done, %lld failed)\n",
              name.c_str(), static_cast<long long>(stats.streaming.load()),
              static_cast<long long>(f.streams), r.ramp_s,
              static_cast<long long>(stats.done.load()), static_cast<long long>(stats.failed.load()));
  std::fflush(stdout);
  const ProcStats p0 = router_pid > 0 ? ReadProc(router_pid) : ProcStats{};
  const double s0 = SelfCpuSeconds();
  const absl::Time w0 = absl::Now();
  stats.latency.Measure(true);
  absl::SleepFor(f.window / 2);
  if (router_pid > 0) r.during = ReadProc(router_pid);
  const int64_t open_mid = stats.streaming.load();
  absl::SleepFor(f.window / 2);
  stats.latency.Measure(false);
  r.window_s = absl::ToDoubleSeconds(absl::Now() - w0);
  const ProcStats p1 = router_pid > 0 ? ReadProc(router_pid) : ProcStats{};
  r.router_cpu_s = p1.cpu_seconds - p0.cpu_seconds;
  r.self_cpu_s = SelfCpuSeconds() - s0;
  r.tokens = stats.latency.tokens();
  r.p50_ms = stats.latency.QuantileMs(0.5);
  r.p99_ms = stats.latency.QuantileMs(0.99);
  std::printf("%s: window %.1f s with %lld streams open (mid-window), %lld tokens received\n",
              name.c_str(), r.window_s, static_cast<long long>(open_mid),
              static_cast<long long>(r.tokens));
  const absl::Time end_by = absl::Now() + f.tpot * (f.tokens + 5) + absl::Seconds(60);
  while (stats.done.load() < f.streams && absl::Now() < end_by) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  r.failed = stats.failed.load() + (f.streams - stats.done.load());
  absl::MutexLock lock(&stats.mu);
  r.first_error = stats.first_error;
  return r;
}

void Print(const Result& r) {
  std::printf("\n== %s: %lld concurrent streams ==\n", r.name.c_str(),
              static_cast<long long>(r.streams));
  if (r.before.threads > 0) {
    std::printf("router threads: %lld idle -> %lld with every stream open\n",
                static_cast<long long>(r.before.threads),
                static_cast<long long>(r.during.threads));
    std::printf("router RSS: %.1f MiB idle -> %.1f MiB (%.1f KiB per stream)\n",
                r.before.rss_kib / 1024.0, r.during.rss_kib / 1024.0,
                static_cast<double>(r.during.rss_kib - r.before.rss_kib) / r.streams);
    const double net = r.router_cpu_s - r.idle_cpu_fraction * r.window_s;
    std::printf("router CPU: %.2f s in %.1f s = %.1f%% of a core (idle: %.1f%%); %.1f us per "
                "streamed token (%.1f us net of idle)\n",
                r.router_cpu_s, r.window_s, 100.0 * r.router_cpu_s / r.window_s,
                100.0 * r.idle_cpu_fraction, r.tokens > 0 ? r.router_cpu_s * 1e6 / r.tokens : 0.0,
                r.tokens > 0 ? net * 1e6 / r.tokens : 0.0);
  }
  std::printf("tokens: %lld in the window (%.0f/s); load generator + simulator CPU %.1f us/token\n",
              static_cast<long long>(r.tokens), r.tokens / r.window_s,
              r.tokens > 0 ? r.self_cpu_s * 1e6 / r.tokens : 0.0);
  if (r.latency_measured) {
    std::printf("token delivery latency (simulator -> client): p50 %.1f ms, p99 %.1f ms\n",
                r.p50_ms, r.p99_ms);
  }
  std::printf("failed streams: %lld%s%s\n", static_cast<long long>(r.failed),
              r.first_error.empty() ? "" : " (first: ", r.first_error.empty() ? "" : ")");
  if (!r.first_error.empty()) std::printf("  first error: %s\n", r.first_error.c_str());
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  bench::SetProgramName("router_capacity_bench");
  Flags f;
  for (bench::FlagReader r(argc, argv); r.Next();) {
    const std::string& a = r.flag();
    auto positive = [&](int64_t* v) {
      r.Integer(v);
      if (*v <= 0) Die("bad value for " + a);
    };
    auto dur = [&](absl::Duration* d) {
      if (!absl::ParseDuration(r.Value(), d) || *d <= absl::ZeroDuration()) {
        Die("bad value for " + a);
      }
    };
    if (a == "--streams") {
      positive(&f.streams);
    } else if (a == "--channels") {
      positive(&f.channels);
    } else if (a == "--tokens") {
      positive(&f.tokens);
    } else if (a == "--prompt-tokens") {
      positive(&f.prompt_tokens);
    } else if (a == "--tpot") {
      dur(&f.tpot);
    } else if (a == "--ramp") {
      dur(&f.ramp);
    } else if (a == "--window") {
      dur(&f.window);
    } else if (a == "--no-grpc") {
      f.grpc = false;
    } else if (a == "--no-direct") {
      f.direct = false;
    } else if (a == "--no-http") {
      f.http = false;
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.tpot * f.tokens < f.ramp + f.window + absl::Seconds(5)) {
    Die("--tokens x --tpot must outlast --ramp + --window + 5 s (every stream open while "
        "measuring)");
  }
  testing::LocalClusterOptions co;
  co.cli_bin = SWASERVE_CLI_BIN;
  co.router_bin = SWASERVE_ROUTER_BIN;
  std::unique_ptr<testing::LocalCluster> cluster =
      Check(testing::LocalCluster::Create(co), "local cluster");
  bench::SimWorkerOptions so;
  so.redis = cluster->redis_address();
  so.tpot = f.tpot;
  std::unique_ptr<bench::SimWorker> sim = Check(bench::SimWorker::Start(so), "simulator");
  testing::LocalProcess* router = Check(
      cluster->StartRouter("r0", {"--max_inflight=0", "--log_level=warn",
                                  "--shed_backlog_seconds=0"}),
      "router");
  Check(cluster->WaitHealthy("r0", absl::Seconds(30)), "router health");
  const pid_t pid = router->process->pid();
  std::printf("router pid %d at %s; simulator at %s (tpot %s, %lld tokens per stream)\n",
              static_cast<int>(pid), router->grpc_address().c_str(),
              sim->grpc_address().c_str(), absl::FormatDuration(f.tpot).c_str(),
              static_cast<long long>(f.tokens));
  std::fflush(stdout);

  auto channels = Channels(router->grpc_address(), static_cast<int>(f.channels));
  std::vector<std::unique_ptr<v1::Router::Stub>> stubs;
  for (auto& c : channels) stubs.push_back(v1::Router::NewStub(c));
  Result via;
  if (f.grpc) via = Run("via router", f, pid, [&](int64_t i, LoadStats* stats) {
    v1::GenerateRequest req;
    for (int t = 0; t < f.prompt_tokens; ++t) {
      req.mutable_token_ids()->add_ids(static_cast<uint32_t>(1000 + (i * 7 + t) % 50000));
    }
    req.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(f.tokens));
    new RouterStream(stubs[i % stubs.size()].get(), std::move(req), stats);
  });
  if (f.grpc) Print(via);
  bool ok = via.failed == 0;
  if (f.http) {
    HttpLoad load(router->http_port);
    Result http = Run("HTTP (OpenAI API, SSE) via router", f, pid,
                            [&](int64_t i, LoadStats* stats) {
                              std::vector<uint32_t> prompt;
                              for (int t = 0; t < f.prompt_tokens; ++t) {
                                prompt.push_back(static_cast<uint32_t>(1000 + (i * 7 + t) % 50000));
                              }
                              load.Start(nlohmann::json{{"model", "tiny"},
                                                        {"prompt", prompt},
                                                        {"max_tokens", f.tokens},
                                                        {"stream", true}}
                                             .dump(),
                                         stats);
                            });
    http.latency_measured = false;
    Print(http);
    ok = ok && http.failed == 0;
  }
  if (f.direct) {
    auto sim_channels = Channels(sim->grpc_address(), static_cast<int>(f.channels));
    std::vector<std::unique_ptr<v1::Decode::Stub>> ds;
    std::vector<std::unique_ptr<v1::Prefill::Stub>> ps;
    for (auto& c : sim_channels) {
      ds.push_back(v1::Decode::NewStub(c));
      ps.push_back(v1::Prefill::NewStub(c));
    }
    const Result direct = Run("direct to the simulator (no router)", f, 0,
                              [&](int64_t i, LoadStats* stats) {
                                const size_t c = i % ds.size();
                                new DirectStream(ds[c].get(), ps[c].get(),
                                                 absl::StrCat("direct-", i),
                                                 static_cast<int>(f.prompt_tokens),
                                                 static_cast<int>(f.tokens), stats);
                              });
    Print(direct);
    if (f.grpc) {
      std::printf("\nadded by the router: p50 %+.1f ms, p99 %+.1f ms per token\n",
                  via.p50_ms - direct.p50_ms, via.p99_ms - direct.p99_ms);
    }
    ok = ok && direct.failed == 0;
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace swaserve

int main(int argc, char** argv) { return swaserve::Main(argc, argv); }
