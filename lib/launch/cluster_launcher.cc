#include "lib/launch/cluster_launcher.h"

#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include "lib/base/port_file.h"
#include "lib/base/status.h"
#include "lib/model/config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace swaserve::launch {
namespace fs = std::filesystem;

namespace {

// A host clients can connect to: a wildcard bind address means loopback.
std::string ConnectHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" ? "127.0.0.1" : host;
}

// The binary `name` next to the running executable, else `name` (PATH).
std::string DefaultBinary(const std::string& name) {
  const std::string dir = SelfDir();
  std::error_code ec;
  if (!dir.empty()) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0)
      return p.string();
  }
  return name;
}

}  // namespace

std::string ProcessInfo::metrics_url() const {
  if (role == "redis" || role == "prometheus" || metrics_port == 0) return "";
  return absl::StrCat("http://127.0.0.1:", metrics_port, "/metrics");
}

std::string DefaultRunDir() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  const std::string base = absl::StrCat("swaserve-run/", buf);
  std::error_code ec;
  std::string dir = base;
  for (int i = 2; fs::exists(dir, ec); ++i) dir = absl::StrCat(base, "-", i);
  return dir;
}

std::string SelfDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

absl::Status ValidateBucketBounds(const std::vector<int64_t>& bounds) {
  if (bounds.empty()) {
    return absl::InvalidArgumentError(
        "buckets: at least one bucket bound is required");
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buckets: bound ", bounds[i], " is not a positive token count"));
    }
    if (i > 0 && bounds[i] <= bounds[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("buckets: bounds must increase, got ", bounds[i - 1],
                       " then ", bounds[i]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseBucketBounds(absl::string_view text) {
  std::vector<int64_t> out;
  for (absl::string_view part :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("buckets: '", std::string(part), "' is not a number"));
    }
    out.push_back(v);
  }
  if (absl::Status s = ValidateBucketBounds(out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::unique_ptr<ClusterLauncher>> ClusterLauncher::Start(
    ClusterSpec spec) {
  std::unique_ptr<ClusterLauncher> c(new ClusterLauncher(std::move(spec)));
  absl::Status s = c->DoStart();
  if (!s.ok()) {
    c->Stop();
    return s;
  }
  return c;
}

ClusterLauncher::~ClusterLauncher() { Stop(); }

void ClusterLauncher::Progress(const std::string& line) const {
  if (spec_.on_progress) spec_.on_progress(line);
}

absl::Status ClusterLauncher::ChildFailed(const Child& child,
                                          absl::string_view what) const {
  return ProcessFailed(child.svc, what);
}

absl::StatusOr<ClusterLauncher::Child*> ClusterLauncher::Spawn(
    const std::string& name, const std::string& role,
    std::vector<std::string> argv, int nice_increment) {
  auto child = std::make_unique<Child>();
  child->info.name = name;
  child->info.role = role;
  ASSIGN_OR_RETURN(child->svc, SpawnService({.name = name,
                                             .argv = std::move(argv),
                                             .dir = spec_.run_dir,
                                             .stop_grace = spec_.stop_grace,
                                             .port_file = role != "redis" && role != "prometheus",
                                             .nice_increment = nice_increment}));
  child->info.log_path = child->svc.log_path;
  child->info.pid = child->svc.process->pid();
  children_.push_back(std::move(child));
  return children_.back().get();
}

absl::Status ClusterLauncher::WaitPortFile(Child& child, absl::Time deadline) {
  RETURN_IF_ERROR(WaitServing(child.svc, deadline, spec_.start_timeout));
  child.info.grpc_port = child.svc.grpc_port;
  child.info.metrics_port = child.svc.metrics_port;
  return absl::OkStatus();
}

absl::Status ClusterLauncher::WaitHealthy(Child& router, absl::Time deadline) {
  httplib::Client cli(ConnectHost(spec_.host), router.info.metrics_port);
  cli.set_connection_timeout(1, 0);
  cli.set_read_timeout(2, 0);
  std::string last = "no answer";
  while (true) {
    if (!router.svc.process->Running())
      return ChildFailed(router, "exited while starting");
    for (const auto& c : children_) {
      if (c.get() != &router && !c->svc.process->Running()) {
        return ChildFailed(*c, "exited while the router was starting");
      }
    }
    httplib::Result res = cli.Get("/health");
    if (res && res->status == 200) return absl::OkStatus();
    if (res) {
      last = absl::StrCat("HTTP ", res->status, ": ",
                          std::string(absl::StripAsciiWhitespace(res->body)));
    } else {
      last = httplib::to_string(res.error());
    }
    if (absl::Now() > deadline) {
      return ChildFailed(router,
                         absl::StrCat("/health not OK within ",
                                      absl::FormatDuration(spec_.start_timeout),
                                      " (last answer: ", last, ")"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::Status ClusterLauncher::StartRedis(const std::string& name, int fixed_port,
                                         const std::vector<std::string>& extra,
                                         std::string* address) {
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  absl::Status last;
  // A picked free port may be taken before redis binds it: retry.
  for (int attempt = 0; attempt < (fixed_port == 0 ? 5 : 1); ++attempt) {
    int port = fixed_port;
    if (port == 0) {
      absl::StatusOr<int> p = base::PickFreePort();
      if (!p.ok()) return p.status();
      port = *p;
    }
    Progress(absl::StrCat("starting ", name, " (", spec_.redis_server_bin, ") ..."));
    std::vector<std::string> argv = {spec_.redis_server_bin,
                                     "--port",
                                     absl::StrCat(port),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     fs::absolute(spec_.run_dir).string(),
                                     "--daemonize",
                                     "no",
                                     "--loglevel",
                                     "warning"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<Child*> child = Spawn(name, "redis", std::move(argv));
    if (!child.ok()) {
      return absl::Status(
          child.status().code(),
          absl::StrCat(child.status().message(),
                       " (install redis-server, e.g. apt-get install "
                       "redis-server, or pass --redis=HOST:PORT)"));
    }
    Child& c = **child;
    c.info.grpc_port = port;
    bool up = false;
    while (c.svc.process->Running() && absl::Now() < deadline) {
      if (base::WaitForTcpPort("127.0.0.1", port, absl::Milliseconds(100))
              .ok()) {
        up = c.svc.process->Running();
        break;
      }
    }
    if (up) {
      *address = absl::StrCat("127.0.0.1:", port);
      Progress(absl::StrCat(name, " ok (port ", port, ")"));
      return absl::OkStatus();
    }
    last = ChildFailed(c, absl::StrCat("did not start on port ", port));
    (void)c.svc.process->Stop();
    children_.pop_back();
  }
  return last;
}

namespace {

// MemTotal of /proc/meminfo in MiB, 0 when unreadable.
int64_t MemTotalMib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib >> 10;
    in.ignore(256, '\n');
  }
  return 0;
}

// 1 when the checkpoint has an encoder tower (model::EncoderTowersOf), else 0.
int HasEncoderTowers(const std::string& model) {
  const absl::StatusOr<model::EncoderTowers> towers = model::EncoderTowersOf(model);
  return towers.ok() && towers->any() ? 1 : 0;
}

}  // namespace

absl::Status ClusterLauncher::PlanKv() {
  absl::StatusOr<KvPlan> plan =
      PlanKvPoolsForModel(spec_.model, spec_.bucket_bounds, spec_.kv_mib, spec_.kv_fit_buckets,
                          spec_.prefill_flags, spec_.decode_flags);
  if (!plan.ok()) return plan.status();
  kv_plan_ = *std::move(plan);
  return absl::OkStatus();
}

void ClusterLauncher::ReportKvPlan() const {
  Progress(absl::StrCat("KV pools: ", kv_plan_.Describe(spec_.decode_workers)));
  const int64_t total = kv_plan_.TotalMib(spec_.decode_workers);
  const int64_t machine = MemTotalMib();
  if (machine > 0 && total > machine) {
    Progress(absl::StrCat("warning: the KV pools (prefill L2 tiers included) add up to ", total,
                          " MiB, more than this machine's ",
                          machine, " MiB; memory is used only as prompts fill them, but prompts "
                          "near the top of every bucket at once would not fit (--buckets or "
                          "--kv_fit_buckets=false --kv_mib=N to change)"));
  }
}

absl::Status ClusterLauncher::CheckSpec() {
  if (spec_.model.empty())
    return absl::InvalidArgumentError("model: a checkpoint is required");
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(spec_.model) / "config.json", ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: ", spec_.model, " is not a checkpoint (no config.json)"));
  }
  spec_.model = fs::absolute(spec_.model).lexically_normal().string();
  if (absl::Status s = ValidateBucketBounds(spec_.bucket_bounds); !s.ok())
    return s;
  if (spec_.decode_workers < 1) {
    return absl::InvalidArgumentError(
        "decode_workers: at least one decode worker is required");
  }
  if (spec_.prefill_nice_step < 0 || spec_.prefill_nice_step > 19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill_nice_step: ", spec_.prefill_nice_step, " is not in [0, 19]"));
  }
  if (spec_.http_port < 0 || spec_.http_port > 65535 || spec_.grpc_port < 0 ||
      spec_.grpc_port > 65535 || spec_.redis_port < 0 ||
      spec_.redis_port > 65535) {
    return absl::InvalidArgumentError("ports must be in [0, 65535]");
  }
  if (!(spec_.l3_write_through_near_bound >= 0 && spec_.l3_write_through_near_bound <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("l3_write_through_near_bound: ", spec_.l3_write_through_near_bound,
                     " is not in [0, 1] (a fraction of a bucket's bound)"));
  }
  if (spec_.l3_redis_mib < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("l3_redis_mib: ", spec_.l3_redis_mib, " is negative (0: no shared L3)"));
  }
  if (spec_.model_name.empty()) {
    spec_.model_name = fs::path(spec_.model).filename().string();
  }
  if (absl::Status s = PlanKv(); !s.ok()) return s;
  if (spec_.run_dir.empty()) spec_.run_dir = DefaultRunDir();
  fs::create_directories(spec_.run_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("run_dir: cannot create ",
                                            spec_.run_dir, ": ", ec.message()));
  }
  if (spec_.router_bin.empty())
    spec_.router_bin = DefaultBinary("swaserve-router");
  if (spec_.encoder_bin.empty()) spec_.encoder_bin = DefaultBinary("swaserve-encoder");
  return absl::OkStatus();
}

absl::Status ClusterLauncher::DoStart() {
  if (absl::Status s = CheckSpec(); !s.ok()) return s;
  endpoints_.model_name = spec_.model_name;
  endpoints_.run_dir = spec_.run_dir;
  const absl::Time deadline = absl::Now() + spec_.start_timeout;

  // 1. Redis.
  if (spec_.redis.empty()) {
    if (absl::Status s =
            StartRedis("redis", spec_.redis_port, spec_.redis_flags, &endpoints_.redis_address);
        !s.ok()) {
      return s;
    }
  } else {
    endpoints_.redis_address = spec_.redis;
    Progress(absl::StrCat("using redis at ", spec_.redis));
  }
  if (spec_.l3_redis_mib > 0) {
    // The prefill workers' shared L3 (ClusterSpec::l3_redis_mib).
    const std::vector<std::string> bound = {"--maxmemory", absl::StrCat(spec_.l3_redis_mib, "mb"),
                                            "--maxmemory-policy", "allkeys-lru"};
    if (absl::Status s = StartRedis("redis-l3", 0, bound, &endpoints_.l3_redis_address); !s.ok()) {
      return s;
    }
  }
  // 2. Workers: all at once (model loads overlap), then wait for each.
  if (absl::Status s = StartWorkers(deadline); !s.ok()) return s;
  // 3. The router.
  if (absl::Status s = StartRouter(deadline); !s.ok()) return s;
  if (spec_.prometheus) return StartPrometheus(deadline);
  return absl::OkStatus();
}

absl::Status ClusterLauncher::StartWorkers(absl::Time deadline) {
  // No worker_bin: each role's own binary (swaserve-prefill, swaserve-decode).
  const std::string prefill_bin =
      spec_.worker_bin.empty() ? DefaultBinary("swaserve-prefill") : spec_.worker_bin;
  const std::string decode_bin =
      spec_.worker_bin.empty() ? DefaultBinary("swaserve-decode") : spec_.worker_bin;
  // 0: every core for each worker (ClusterSpec::worker_threads).
  const int threads = spec_.worker_threads > 0
                          ? spec_.worker_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  ReportKvPlan();
  std::vector<Child*> workers;
  auto common = [&](const std::string& name, const std::string& role) {
    return WorkerArgv({.bin = role == "prefill" ? prefill_bin : decode_bin,
                       .model = spec_.model,
                       .role = role,
                       .worker_id = name,
                       .redis = endpoints_.redis_address,
                       .cluster = spec_.cluster,
                       .model_name = spec_.model_name,
                       .threads = threads});
  };

  for (size_t i = 0; i < spec_.bucket_bounds.size(); ++i) {
    const std::string name = absl::StrCat("prefill-", i);
    const int64_t lo = i == 0 ? 0 : spec_.bucket_bounds[i - 1];
    const int64_t hi = spec_.bucket_bounds[i];
    std::vector<std::string> argv = common(name, "prefill");
    argv.push_back(absl::StrCat("--bucket=", i));
    argv.push_back(absl::StrCat("--bucket_min_tokens=", lo));
    argv.push_back(absl::StrCat("--prefill.max_prompt_tokens=", hi));
    argv.push_back(absl::StrCat("--kv.prefill_mib=", kv_plan_.prefill_mib[i]));
    if (!endpoints_.l3_redis_address.empty()) {
      argv.push_back("--kv.l3=redis:" + endpoints_.l3_redis_address);
      if (i + 1 < spec_.bucket_bounds.size()) {  // a prompt here may grow into the next
        argv.push_back(absl::StrCat("--kv.l3_write_through_near_bound=",
                                    spec_.l3_write_through_near_bound));
      }
    }
    argv.insert(argv.end(), spec_.prefill_flags.begin(),
                spec_.prefill_flags.end());
    const int nice = static_cast<int>(
        std::clamp<int64_t>(int64_t{spec_.prefill_nice_step} * static_cast<int64_t>(i), 0, 19));
    Progress(absl::StrCat("starting ", name, " (bucket ", i, ": prompts of ", lo, " to ", hi,
                          " tokens", nice > 0 ? absl::StrCat("; nice +", nice) : "", ") ..."));
    absl::StatusOr<Child*> c = Spawn(name, "prefill", std::move(argv), nice);
    if (!c.ok()) return c.status();
    workers.push_back(*c);
  }
  for (int i = 0; i < spec_.decode_workers; ++i) {
    const std::string name = absl::StrCat("decode-", i);
    std::vector<std::string> argv = common(name, "decode");
    argv.push_back(absl::StrCat("--kv.decode_mib=", kv_plan_.decode_mib));
    argv.insert(argv.end(), spec_.decode_flags.begin(),
                spec_.decode_flags.end());
    Progress(absl::StrCat("starting ", name, " ..."));
    absl::StatusOr<Child*> c = Spawn(name, "decode", std::move(argv));
    if (!c.ok()) return c.status();
    workers.push_back(*c);
  }
  // Encoders: for a model with a vision or audio tower.
  const int encoders = spec_.encoders >= 0 ? spec_.encoders : HasEncoderTowers(spec_.model);
  for (int i = 0; i < encoders; ++i) {
    const std::string name = absl::StrCat("encoder-", i);
    std::vector<std::string> argv = {spec_.encoder_bin,
                                     "--model=" + spec_.model,
                                     "--model_name=" + spec_.model_name,
                                     "--encoder_id=" + name,
                                     "--listen=127.0.0.1:0",
                                     "--metrics.host=127.0.0.1",
                                     "--metrics.port=0",
                                     "--redis=" + endpoints_.redis_address,
                                     "--cluster=" + spec_.cluster};
    argv.insert(argv.end(), spec_.encoder_flags.begin(), spec_.encoder_flags.end());
    Progress(absl::StrCat("starting ", name, " ..."));
    absl::StatusOr<Child*> c = Spawn(name, "encoder", std::move(argv));
    if (!c.ok()) return c.status();
    workers.push_back(*c);
  }
  for (Child* w : workers) {
    if (absl::Status s = WaitPortFile(*w, deadline); !s.ok()) return s;
    Progress(absl::StrCat(w->info.name,
                          " ok (gRPC 127.0.0.1:", w->info.grpc_port,
                          ", metrics ", w->info.metrics_url(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ClusterLauncher::StartRouter(absl::Time deadline) {
  std::vector<std::string> argv = {
      spec_.router_bin,
      "--model=" + spec_.model,
      "--model_name=" + spec_.model_name,
      "--redis=" + endpoints_.redis_address,
      "--cluster=" + spec_.cluster,
      absl::StrCat("--listen=", spec_.host, ":", spec_.grpc_port),
      "--http.host=" + spec_.host,
      absl::StrCat("--http.port=", spec_.http_port),
      "--policy.bucket_bounds=" + absl::StrJoin(spec_.bucket_bounds, ",")};
  argv.insert(argv.end(), spec_.router_flags.begin(), spec_.router_flags.end());
  Progress(absl::StrCat("starting router (HTTP ", spec_.host, ":",
                        spec_.http_port, ", gRPC ", spec_.host, ":",
                        spec_.grpc_port, ") ..."));
  absl::StatusOr<Child*> router = Spawn("router", "router", std::move(argv));
  if (!router.ok()) return router.status();
  if (absl::Status s = WaitPortFile(**router, deadline); !s.ok()) return s;
  if (absl::Status s = WaitHealthy(**router, deadline); !s.ok()) return s;
  const std::string host = ConnectHost(spec_.host);
  endpoints_.http_port = (*router)->info.metrics_port;
  endpoints_.grpc_port = (*router)->info.grpc_port;
  endpoints_.http_url =
      absl::StrCat("http://", host, ":", endpoints_.http_port);
  endpoints_.grpc_address = absl::StrCat(host, ":", endpoints_.grpc_port);
  Progress(absl::StrCat("router ok (HTTP ", endpoints_.http_url, ", gRPC ",
                        endpoints_.grpc_address, "; /health 200)"));
  for (const auto& c : children_) {
    if (c->info.role == "router") {
      endpoints_.metrics_urls.emplace_back(
          c->info.name, absl::StrCat(endpoints_.http_url, "/metrics"));
    } else if (!c->info.metrics_url().empty()) {
      endpoints_.metrics_urls.emplace_back(c->info.name, c->info.metrics_url());
    }
  }
  return absl::OkStatus();
}

absl::Status ClusterLauncher::StartPrometheus(absl::Time deadline) {
  // One job per role (as deploy/prometheus/prometheus.yml names them on
  // Kubernetes), the process name as instance.
  std::string config = absl::StrCat(
      "# Written by swaserve up: scrapes every process of this cluster.\n"
      "global:\n  scrape_interval: 5s\n  scrape_timeout: 5s\n  evaluation_interval: 5s\n");
  if (!spec_.prometheus_rules.empty()) {
    absl::StrAppend(&config, "rule_files:\n  - '", spec_.prometheus_rules, "'\n");
  }
  absl::StrAppend(&config, "scrape_configs:\n");
  for (const auto& c : children_) {
    if (c->info.role == "redis" || c->info.metrics_port == 0) continue;
    absl::StrAppend(&config, "  - job_name: '", c->info.name, "'\n    static_configs:\n",
                    "      - targets: ['", ConnectHost(spec_.host), ":", c->info.metrics_port,
                    "']\n        labels: {job: 'swaserve-", c->info.role, "', instance: '",
                    c->info.name, "'}\n");
  }
  const std::string path = spec_.run_dir + "/prometheus.yml";
  {
    std::ofstream out(path);
    out << config;
    if (!out.good()) return absl::InternalError("cannot write " + path);
  }
  int port = spec_.prometheus_port;
  if (port == 0) {
    ASSIGN_OR_RETURN(port, base::PickFreePort());
  }
  Progress(absl::StrCat("starting prometheus (port ", port, ") ..."));
  absl::StatusOr<Child*> child = Spawn(
      "prometheus", "prometheus",
      {spec_.prometheus_bin, "--config.file=" + path,
       "--storage.tsdb.path=" + spec_.run_dir + "/prometheus-data",
       absl::StrCat("--web.listen-address=127.0.0.1:", port), "--log.level=warn"});
  if (!child.ok()) {
    return absl::Status(child.status().code(),
                        absl::StrCat(child.status().message(),
                                     " (install it, e.g. apt-get install prometheus)"));
  }
  Child& c = **child;
  c.info.grpc_port = port;
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(1);
  while (true) {
    if (!c.svc.process->Running()) return ChildFailed(c, "exited while starting");
    httplib::Result res = cli.Get("/-/ready");
    if (res && res->status == 200) break;
    if (absl::Now() > deadline) return ChildFailed(c, "not ready in time");
    absl::SleepFor(absl::Milliseconds(200));
  }
  endpoints_.prometheus_url = absl::StrCat("http://127.0.0.1:", port);
  Progress("prometheus ok (" + endpoints_.prometheus_url + ")");
  return absl::OkStatus();
}

std::vector<ProcessInfo> ClusterLauncher::processes() const {
  std::vector<ProcessInfo> out;
  for (const auto& c : children_) out.push_back(c->info);
  return out;
}

std::vector<ProcessExit> ClusterLauncher::Poll() {
  std::vector<ProcessExit> out;
  if (stopped_) return out;
  for (auto& c : children_) {
    if (c->reported || c->svc.process->Running()) continue;
    c->reported = true;
    absl::StatusOr<int> code = c->svc.process->Wait(absl::ZeroDuration());
    ProcessExit e{c->info.name, c->info.pid, code.ok() ? *code : -1,
                  TailFile(c->info.log_path, 20)};
    dead_.push_back(e);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<ProcessExit> ClusterLauncher::Dead() {
  (void)Poll();
  return dead_;
}

void ClusterLauncher::StopGroup(const std::vector<Child*>& group) {
  for (Child* c : group) (void)c->svc.process->Signal(SIGTERM);
  const absl::Time deadline = absl::Now() + spec_.stop_grace;
  for (Child* c : group) {
    if (!c->svc.process
             ->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()))
             .ok()) {
      (void)c->svc.process->Signal(SIGKILL);
      (void)c->svc.process->Wait(absl::Seconds(10));
    }
  }
}

void ClusterLauncher::Stop() {
  if (stopped_) return;
  (void)Poll();  // note deaths before the stop makes every child exit
  stopped_ = true;
  for (const char* role : {"prometheus", "router", "workers", "redis"}) {
    std::vector<Child*> group;
    for (auto& c : children_) {
      const std::string& r = c->info.role;
      const bool match = std::string(role) == "workers"
                             ? (r == "prefill" || r == "decode" || r == "encoder")
                             : r == role;
      if (match) group.push_back(c.get());
    }
    StopGroup(group);
  }
}

}  // namespace swaserve::launch
