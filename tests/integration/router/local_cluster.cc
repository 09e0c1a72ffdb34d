#include "tests/integration/router/local_cluster.h"

#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <sstream>


#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "lib/launch/service_process.h"
#include "lib/base/status.h"
#include "gtest/gtest.h"
#include "lib/rpc/channel.h"

namespace swaserve::testing {

std::string LocalProcess::grpc_address() const { return absl::StrCat(host, ":", grpc_port); }

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Create(
    const LocalClusterOptions& options) {
  absl::StatusOr<std::string> dir = base::MakeTempDir("local-cluster");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<LocalCluster> c(new LocalCluster(options, *dir));
  c->model_dir_ = options.model_dir.empty() ? *dir + "/model" : options.model_dir;
  if (options.model_dir.empty()) {
    std::vector<std::string> argv = {options.cli_bin, "make-model", "--shape=tiny",
                                     "--out=" + c->model_dir_};
    argv.insert(argv.end(), options.model_flags.begin(), options.model_flags.end());
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(argv, &out, absl::Seconds(120));
    if (!rc.ok()) return rc.status();
    if (*rc != 0) return absl::InternalError(absl::StrCat("make-model failed: ", out));
  }
  cluster::testing::RedisServerOptions ro;
  if (options.network != nullptr) {
    absl::StatusOr<const HostNetwork::Host*> host = options.network->AddHost("redis");
    if (!host.ok()) return host.status();
    ro.bind = (*host)->address;
    ro.command_prefix = options.network->Wrap("redis", {});
  }
  absl::StatusOr<std::unique_ptr<cluster::testing::RedisServer>> redis =
      cluster::testing::RedisServer::Start(std::move(ro));
  if (!redis.ok()) return redis.status();
  c->redis_ = std::move(*redis);
  return c;
}

LocalCluster::~LocalCluster() {
  // Routers first (they call workers), then workers, then Redis.
  for (auto& [id, p] : procs_) {
    if (p->is_router && p->process != nullptr) {
      (void)p->process->Stop();
    }
  }
  // A suite's cluster is destroyed in TearDownTestSuite, where HasFailure()
  // no longer sees the failed tests: ask the UnitTest too. On failure every
  // process's log tail goes to stderr, so CI output shows what the processes
  // saw (the directory itself goes with the CI machine).
  const bool failed = ::testing::Test::HasFailure() ||
                      ::testing::UnitTest::GetInstance()->failed_test_count() > 0;
  std::vector<std::pair<std::string, std::string>> logs;
  for (const auto& [id, p] : procs_) logs.emplace_back(id, p->log_path);
  procs_.clear();
  redis_.reset();
  std::error_code ec;
  if (failed) {
    for (const auto& [id, path] : logs) {
      std::fprintf(stderr, "---- LocalCluster: last lines of %s (%s)\n%s\n", id.c_str(),
                   path.c_str(), launch::TailFile(path, 80).c_str());
    }
    std::fprintf(stderr, "LocalCluster: logs kept in %s\n", dir_.c_str());
  } else {
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string LocalCluster::redis_address() const {
  return absl::StrCat(redis_->host(), ":", redis_->port());
}

absl::StatusOr<std::string> LocalCluster::PlaceOnHost(const std::string& id,
                                                      std::vector<std::string>& argv) {
  if (o_.network == nullptr) return std::string("127.0.0.1");
  // A process started again with the same id keeps its host.
  const HostNetwork::Host* host = o_.network->Get(id);
  if (host == nullptr) {
    ASSIGN_OR_RETURN(host, o_.network->AddHost(id));
  }
  for (std::string& arg : argv) {
    for (const char* flag : {"--listen=", "--metrics.host=", "--http.host=", "--advertise_host="}) {
      if (absl::StartsWith(arg, flag)) {
        absl::StrReplaceAll({{"127.0.0.1", host->address}}, &arg);
      }
    }
  }
  argv = o_.network->Wrap(id, std::move(argv));
  return host->address;
}

LocalProcess* LocalCluster::Get(const std::string& id) {
  auto it = procs_.find(id);
  return it == procs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<LocalProcess*> LocalCluster::Start(const std::string& id,
                                                  std::vector<std::string> argv, bool is_router) {
  ASSIGN_OR_RETURN(const std::string address, PlaceOnHost(id, argv));
  ASSIGN_OR_RETURN(launch::ServiceProcess svc,
                   launch::SpawnService({.name = id, .argv = std::move(argv), .dir = dir_}));
  RETURN_IF_ERROR(launch::WaitServing(svc, absl::Now() + absl::Seconds(90), absl::Seconds(90)));
  auto p = std::make_unique<LocalProcess>();
  p->id = id;
  p->log_path = svc.log_path;
  p->process = std::move(svc.process);
  p->grpc_port = svc.grpc_port;
  p->http_port = svc.metrics_port;  // routers: their HTTP port
  p->is_router = is_router;
  p->host = address;
  LocalProcess* raw = p.get();
  procs_[id] = std::move(p);
  return raw;
}

absl::StatusOr<LocalProcess*> LocalCluster::StartWorker(const std::string& role,
                                                        const std::string& id,
                                                        std::vector<std::string> extra) {
  std::vector<std::string> argv = launch::WorkerArgv(
      {.bin = o_.worker_bin, .model = model_dir_, .role = role, .worker_id = id,
       .redis = redis_address(), .threads = 1});
  for (const char* f : {"--kv.prefill_mib=32", "--kv.decode_mib=32", "--drain=2s",
                        "--transfer.timeout=10s", "--decode.commit_timeout=30s"}) {
    argv.push_back(f);
  }
  argv.push_back("--advertise_host=127.0.0.1");  // the default; its host's address on one
  argv.insert(argv.end(), o_.worker_flags.begin(), o_.worker_flags.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<LocalProcess*> p = Start(id, std::move(argv), false);
  if (!p.ok()) return p;
  // Registered: its record is in Redis (the router's directory sees it on
  // its next refresh).
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (Metric(id, "swaserve_cluster_registered") == 1) return p;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(id, " did not register in Redis; log:\n",
                                                  (*p)->process->ReadLog()));
}

absl::StatusOr<LocalProcess*> LocalCluster::StartEncoder(const std::string& id) {
  if (o_.encoder_bin.empty()) return absl::FailedPreconditionError("no encoder_bin");
  return Start(id,
               {o_.encoder_bin, "--model=" + model_dir_, "--model_name=tiny",
                "--encoder_id=" + id, "--redis=" + redis_address(), "--listen=127.0.0.1:0",
                "--metrics.host=127.0.0.1", "--metrics.port=0", "--drain=2s"},
               false);
}

absl::StatusOr<LocalProcess*> LocalCluster::StartRouter(const std::string& id,
                                                        std::vector<std::string> extra) {
  std::vector<std::string> argv = {o_.router_bin,          "--model=" + model_dir_,
                                   "--model_name=tiny",    "--redis=" + redis_address(),
                                   "--listen=127.0.0.1:0", "--http.host=127.0.0.1",
                                   "--http.port=0",        "--refresh_interval=200ms",
                                   "--drain=2s"};
  argv.insert(argv.end(), o_.router_flags.begin(), o_.router_flags.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Start(id, std::move(argv), true);
}

absl::Status LocalCluster::Signal(const std::string& id, int signo) {
  LocalProcess* p = Get(id);
  if (p == nullptr) return absl::NotFoundError(id);
  return p->process->Signal(signo);
}

absl::Status LocalCluster::Kill(const std::string& id) {
  LocalProcess* p = Get(id);
  if (p == nullptr) return absl::NotFoundError(id);
  absl::Status s = p->process->Signal(SIGKILL);
  (void)p->process->Wait(absl::Seconds(10));
  return s;
}

absl::Status LocalCluster::Terminate(const std::string& id, absl::Duration timeout) {
  LocalProcess* p = Get(id);
  if (p == nullptr) return absl::NotFoundError(id);
  RETURN_IF_ERROR(p->process->Signal(SIGTERM));
  return p->process->Wait(timeout).status();
}

absl::Status LocalCluster::WaitHealthy(const std::string& router_id, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < deadline) {
    absl::StatusOr<HttpResult> r = Http(router_id, "GET", "/health");
    if (r.ok() && r->status == 200) return absl::OkStatus();
    last = r.ok() ? absl::StrCat(r->status, " ", r->body) : r.status().ToString();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(router_id, " not healthy: ", last));
}

absl::StatusOr<LocalCluster::HttpResult> LocalCluster::Http(
    const std::string& router_id, const std::string& method, const std::string& path,
    const std::string& body, const std::vector<std::pair<std::string, std::string>>& headers) {
  LocalProcess* p = Get(router_id);
  if (p == nullptr) return absl::NotFoundError(router_id);
  httplib::Client cli(p->host, p->http_port);
  cli.set_read_timeout(120, 0);
  httplib::Headers h;
  for (const auto& [k, v] : headers) h.emplace(k, v);
  httplib::Result res = method == "GET" ? cli.Get(path.c_str(), h)
                                        : cli.Post(path.c_str(), h, body, "application/json");
  if (!res) {
    return absl::UnavailableError(
        absl::StrCat("HTTP ", method, " ", path, ": ", httplib::to_string(res.error())));
  }
  HttpResult out{res->status, res->body, {}};
  for (const auto& [k, v] : res->headers) out.headers[absl::AsciiStrToLower(k)] = v;
  return out;
}

double LocalCluster::Metric(const std::string& id, const std::string& line_prefix) {
  LocalProcess* p = Get(id);
  if (p == nullptr || p->http_port == 0) return -1;
  httplib::Client cli(p->host, p->http_port);
  cli.set_read_timeout(10, 0);
  httplib::Result res = cli.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream in(res->body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(line_prefix + " ", 0) == 0) return std::stod(line.substr(line_prefix.size() + 1));
  }
  return -1;
}

std::unique_ptr<v1::Router::Stub> LocalCluster::RouterStub(const std::string& router_id) {
  LocalProcess* p = Get(router_id);
  if (p == nullptr) return nullptr;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ch = rpc::CreateChannel(p->grpc_address());
  if (!ch.ok()) return nullptr;
  return v1::Router::NewStub(*ch);
}

}  // namespace swaserve::testing
