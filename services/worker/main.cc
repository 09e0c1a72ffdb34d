// swaserve-worker: a prefill worker, a decode worker, or both in one process
// (--role=prefill|decode|both), serving swaserve.v1.Prefill / swaserve.v1.Decode
// over gRPC, moving KV over UCX, exporting Prometheus metrics.
//
//   swaserve-worker --model=DIR --role=both --listen=127.0.0.1:0
//                   --port_file=/tmp/w.json   # {"grpc_port": N, "metrics_port": M}
//
// Stops gracefully on SIGTERM/SIGINT: health goes NOT_SERVING, in-flight
// calls drain, then everything is freed. Exit 0 after a clean stop, 1 on a
// start-up error, 2 on bad flags.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/base/config.h"
#include "lib/base/status.h"
#include "lib/base/logging.h"
#include "lib/base/port_file.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/worker_registration.h"
#include "lib/kv/kv_metrics.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/metrics/http_server.h"
#include "lib/metrics/registry.h"
#include "lib/model/forward.h"
#include "lib/model/tokenizer.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/grpc_server.h"
#include "lib/rpc/termination_signal.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/engine_lock.h"
#include "lib/worker/prefill_core.h"
#include "services/worker/decode_service.h"
#include "services/worker/prefill_service.h"

namespace swaserve {
namespace {

struct WorkerConfig {
  std::string role = "both";
  std::string model;
  std::string worker_id;
  std::string listen = "127.0.0.1:0";
  std::string metrics_host = "127.0.0.1";
  int64_t metrics_port = 0;
  std::string port_file;
  std::string log_level;
  int64_t threads = 0;
  int64_t page_size = 16;
  int64_t prefill_kv_mib = 256;
  int64_t decode_kv_mib = 256;
  double swa_full_ratio = 0.25;
  std::string policy = "compute_aware";
  // Library defaults (lib/sched/prefill_scheduler.h); scale aging with the
  // worker's prefill throughput (about 0.1x tokens/s, bench/RESULTS.md).
  double aging_tokens_per_second = sched::PrefillSchedulerOptions{}.aging_tokens_per_second;
  int64_t max_partial_requests = sched::PrefillSchedulerOptions{}.max_partial_requests;
  double fcfs_wait_ratio = sched::PrefillSchedulerOptions{}.fcfs_wait_ratio;
  double context_cost_per_token = -1;  // < 0: from the model
  int64_t chunk_tokens = 512;
  int64_t step_token_budget = 2048;
  int64_t max_requests_per_step = 8;
  int64_t max_prompt_tokens = 0;
  int64_t max_batch_size = 32;
  int64_t default_max_tokens = 256;
  int64_t max_max_tokens = 1 << 20;
  absl::Duration commit_timeout = absl::Seconds(60);
  int64_t staging_arena_mib = 1024;
  int64_t staging_budget_mib = 4096;
  absl::Duration transfer_timeout = absl::Seconds(30);
  std::string ucx_tls;
  absl::Duration drain = absl::Seconds(10);
  std::string redis;
  std::string cluster = "default";
  std::string advertise_host = "127.0.0.1";
  std::string model_name = "swaserve";
  int64_t bucket = 0;
  int64_t bucket_min_tokens = 0;
};

// Forwards prefix-cache events to the registration once it exists (the
// cache is created first; at start-up it is empty, so nothing is lost).
class CacheEventForwarder {
 public:
  void Set(cluster::WorkerRegistration* reg) {
    absl::MutexLock lock(&mu_);
    reg_ = reg;
  }
  void operator()(const kv::CacheEvent& e) {
    absl::MutexLock lock(&mu_);
    if (reg_ == nullptr) return;
    // The router's index tracks full KV by chained page hash (a prefix walk
    // needs every page of the path); SWA tombstoning and healing only change
    // where a window-safe hit can end, which the worker settles at match
    // time, so they are not published.
    switch (e.type) {
      case kv::CacheEvent::Type::kStored:
        reg_->PublishCacheEvent(true, e.hashes);
        break;
      case kv::CacheEvent::Type::kRemoved:
        reg_->PublishCacheEvent(false, e.hashes);
        break;
      case kv::CacheEvent::Type::kSwaStored:
      case kv::CacheEvent::Type::kSwaRemoved:
        break;
    }
  }

 private:
  absl::Mutex mu_;
  cluster::WorkerRegistration* reg_ ABSL_GUARDED_BY(mu_) = nullptr;
};


int Run(int argc, char** argv) {
  auto signal = rpc::TerminationSignal::Create();  // first: before any thread
  if (!signal.ok()) {
    std::fprintf(stderr, "swaserve-worker: %s\n", signal.status().ToString().c_str());
    return 1;
  }
  WorkerConfig c;
  base::Config config("swaserve-worker",
                      "A swaserve prefill and/or decode worker (gRPC + UCX + Prometheus).");
  config.Add("role", &c.role, "prefill, decode or both (monolithic)")
      .Add("model", &c.model, "checkpoint directory (config.json + safetensors); required")
      .Add("worker_id", &c.worker_id, "registry id (default: <role>-<host>-<pid>)")
      .Add("listen", &c.listen, "gRPC listen address host:port (port 0: any free port)")
      .Add("metrics.host", &c.metrics_host, "Prometheus /metrics bind host")
      .Add("metrics.port", &c.metrics_port, "Prometheus /metrics port (0: any free port)")
      .Add("port_file", &c.port_file, "write the bound ports here as JSON once serving")
      .Add("log_level", &c.log_level, "trace, debug, info, warn, error")
      .Add("threads", &c.threads, "kernel threads (0: all cores)")
      .Add("kv.page_size", &c.page_size, "tokens per KV page")
      .Add("kv.prefill_mib", &c.prefill_kv_mib, "KV pool bytes of the prefill side (MiB)")
      .Add("kv.decode_mib", &c.decode_kv_mib, "KV pool bytes of the decode side (MiB)")
      .Add("kv.swa_full_ratio", &c.swa_full_ratio, "SWA pool tokens per full pool token")
      .Add("prefill.policy", &c.policy, "compute_aware or fcfs")
      .Add("prefill.aging_tokens_per_second", &c.aging_tokens_per_second,
           "wait-time credit of compute-aware scheduling")
      .Add("prefill.fcfs_wait_ratio", &c.fcfs_wait_ratio,
           "compute_aware: start every request before this x its wait under FCFS (0: no guard)")
      .Add("prefill.context_cost_per_token", &c.context_cost_per_token,
           "work per key of attention context relative to a token (< 0: from the model)")
      .Add("prefill.max_partial_requests", &c.max_partial_requests,
           "prompts that may be half-done at once (a long prompt starts only below this)")
      .Add("prefill.chunk_tokens", &c.chunk_tokens, "most tokens of one request per step")
      .Add("prefill.step_token_budget", &c.step_token_budget, "most tokens per step")
      .Add("prefill.max_requests_per_step", &c.max_requests_per_step, "most requests per step")
      .Add("prefill.max_prompt_tokens", &c.max_prompt_tokens,
           "largest prompt accepted (the length bucket's upper bound; 0: any that fits)")
      .Add("decode.max_batch_size", &c.max_batch_size, "most requests per decode iteration")
      .Add("decode.default_max_tokens", &c.default_max_tokens, "max_tokens when a request has 0")
      .Add("decode.max_max_tokens", &c.max_max_tokens, "largest max_tokens accepted")
      .Add("decode.commit_timeout", &c.commit_timeout,
           "bound on one KV transfer, from the prefill worker asking for staging (it is "
           "about to ship) to the commit; the wait for the prefill leg before that is bounded "
           "by the router keeping the stream open, not by a timer")
      .Add("decode.staging_budget_mib", &c.staging_budget_mib,
           "host memory (MiB) all staged requests may hold at once, arena and heap together; "
           "past it prefill workers ready to ship wait in line "
           "(swaserve_decode_staging_budget_bytes)")
      .Add("decode.staging_arena_mib", &c.staging_arena_mib,
           "host memory (MiB) for staged KV, allocated once by UCX at start-up (shared memory: "
           "single-copy puts from prefill workers on this host); requests that do not fit are "
           "staged in heap memory; 0: always heap. Blocks of failed transfers stay unused for "
           "--transfer.timeout")
      .Add("transfer.timeout", &c.transfer_timeout, "deadline of one KV transfer")
      .Add("transfer.ucx_tls", &c.ucx_tls, "UCX transports (UCX_TLS syntax; empty: default)")
      .Add("drain", &c.drain, "how long in-flight calls may finish on SIGTERM")
      .Add("redis", &c.redis, "Redis host:port for cluster membership (empty: standalone)")
      .Add("cluster", &c.cluster, "cluster name (Redis key prefix)")
      .Add("advertise_host", &c.advertise_host, "host other processes reach this worker at")
      .Add("model_name", &c.model_name, "served model name (registry record)")
      .Add("bucket", &c.bucket, "length bucket index of this prefill worker")
      .Add("bucket_min_tokens", &c.bucket_min_tokens,
           "smallest prompt of this worker's bucket (the largest is prefill.max_prompt_tokens)");
  base::ParseConfigOrExit(config, argc, argv);
  const bool prefill = c.role == "prefill" || c.role == "both";
  const bool decode = c.role == "decode" || c.role == "both";
  auto bad = [&](const std::string& msg) {
    std::fprintf(stderr, "swaserve-worker: %s (see --help)\n", msg.c_str());
    return 2;
  };
  if (!prefill && !decode) return bad("--role must be prefill, decode or both, got " + c.role);
  if (c.model.empty()) return bad("--model is required");
  if (c.policy != "compute_aware" && c.policy != "fcfs") {
    return bad("--prefill.policy must be compute_aware or fcfs, got " + c.policy);
  }
  if (c.staging_arena_mib < 0) {
    return bad("--decode.staging_arena_mib must be >= 0, got " + std::to_string(c.staging_arena_mib));
  }
  if (c.staging_budget_mib <= 0) {
    return bad("--decode.staging_budget_mib must be > 0, got " +
               std::to_string(c.staging_budget_mib));
  }
  // Unique across hosts and restarts (a registry id names one live process;
  // WorkerRegistration refuses an id a live worker holds).
  if (c.worker_id.empty()) c.worker_id = cluster::DefaultWorkerId(c.role);
  if (absl::Status s = base::InitLogging({c.log_level, "worker"}); !s.ok()) return bad(s.ToString());
  SWA_LOG(info, "swaserve-worker {} starting: role {}, model {}", c.worker_id, c.role, c.model);

  auto fail = [](const absl::Status& s) {
    SWA_LOG(err, "start-up failed: {}", s.ToString());
    return 1;
  };
  metrics::Registry& registry = metrics::DefaultRegistry();
  auto engine = model::Engine::Create({c.model, static_cast<int>(c.threads)});
  if (!engine.ok()) return fail(engine.status());
  worker::EngineLock lock(engine->get());
  const kv::KvShape shape = (*engine)->KvShapeFor(static_cast<int>(c.page_size));
  std::unique_ptr<model::Tokenizer> tokenizer;
  if (std::filesystem::exists(c.model + "/tokenizer.json")) {
    auto t = model::Tokenizer::Load(c.model + "/tokenizer.json");
    if (!t.ok()) return fail(t.status());
    tokenizer = std::move(*t);
  }
  transfer::TransferEngineOptions to;
  to.name = c.worker_id;
  to.ucx_tls = c.ucx_tls;
  to.default_timeout = c.transfer_timeout;
  to.registry = &registry;
  auto transfer = transfer::TransferEngine::Create(to);
  if (!transfer.ok()) return fail(transfer.status());

  CacheEventForwarder forwarder;
  std::unique_ptr<kv::KvPools> prefill_pools, decode_pools;
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<kv::KvMetrics> kv_metrics;
  std::unique_ptr<worker::PrefillCore> prefill_core;
  std::unique_ptr<worker::DecodeCore> decode_core;
  std::unique_ptr<worker_service::PrefillService> prefill_service;
  std::unique_ptr<worker_service::DecodeService> decode_service;
  std::vector<grpc::Service*> services;
  if (prefill) {
    auto pools = kv::KvPools::CreateForBudget(shape, c.prefill_kv_mib << 20, c.swa_full_ratio);
    if (!pools.ok()) return fail(pools.status());
    prefill_pools = std::move(*pools);
    auto pc = kv::PrefixCache::Create(
        {prefill_pools.get(), [&forwarder](const kv::CacheEvent& e) { forwarder(e); }});
    if (!pc.ok()) return fail(pc.status());
    cache = std::move(*pc);
    // KV metrics describe the prefill side's pools and prefix cache (the
    // cache hit rate an SRE watches); in monolithic mode the decode pools
    // show in swaserve_decode_* and the load reports.
    auto km = kv::KvMetrics::Create(&registry, prefill_pools.get(), cache.get());
    if (!km.ok()) return fail(km.status());
    kv_metrics = std::move(*km);
    worker::PrefillCoreOptions po;
    po.engine = &lock;
    po.pools = prefill_pools.get();
    po.cache = cache.get();
    po.scheduler.policy = c.policy == "fcfs" ? sched::PrefillSchedulerOptions::Policy::kFcfs
                                             : sched::PrefillSchedulerOptions::Policy::kComputeAware;
    po.scheduler.aging_tokens_per_second = c.aging_tokens_per_second;
    po.scheduler.chunk_tokens = static_cast<int>(c.chunk_tokens);
    po.scheduler.step_token_budget = static_cast<int>(c.step_token_budget);
    po.scheduler.max_requests_per_step = static_cast<int>(c.max_requests_per_step);
    po.scheduler.max_partial_requests = static_cast<int>(c.max_partial_requests);
    po.scheduler.fcfs_wait_ratio = c.fcfs_wait_ratio;
    po.scheduler.context_cost_per_token = c.context_cost_per_token >= 0
                                              ? c.context_cost_per_token
                                              : model::ContextCostPerToken((*engine)->config());
    po.max_prompt_tokens = static_cast<int>(c.max_prompt_tokens);
    po.registry = &registry;
    auto core = worker::PrefillCore::Create(po);
    if (!core.ok()) return fail(core.status());
    prefill_core = std::move(*core);
    auto svc = worker_service::PrefillService::Create(
        {c.worker_id, prefill_core.get(), transfer->get(), prefill_pools.get(),
         c.transfer_timeout, &registry});
    if (!svc.ok()) return fail(svc.status());
    prefill_service = std::move(*svc);
    services.push_back(prefill_service.get());
  }
  if (decode) {
    auto pools = kv::KvPools::CreateForBudget(shape, c.decode_kv_mib << 20, c.swa_full_ratio);
    if (!pools.ok()) return fail(pools.status());
    decode_pools = std::move(*pools);
    if (!prefill) {
      // A decode worker's own pools (swaserve_kv_pages): what an operator
      // watches for leaks and capacity. (Monolithic: the prefill side's.)
      auto km = kv::KvMetrics::Create(&registry, decode_pools.get(), nullptr);
      if (!km.ok()) return fail(km.status());
      kv_metrics = std::move(*km);
    }
    worker::DecodeCoreOptions dopt;
    dopt.engine = &lock;
    dopt.pools = decode_pools.get();
    dopt.tokenizer = tokenizer.get();
    dopt.max_batch_size = static_cast<int>(c.max_batch_size);
    dopt.registry = &registry;
    auto core = worker::DecodeCore::Create(dopt);
    if (!core.ok()) return fail(core.status());
    decode_core = std::move(*core);
    worker_service::DecodeServiceOptions so;
    so.worker_id = c.worker_id;
    so.core = decode_core.get();
    so.transfer = transfer->get();
    so.pools = decode_pools.get();
    for (int id : (*engine)->config().eos_token_ids) so.eos_ids.push_back(static_cast<uint32_t>(id));
    so.default_max_tokens = static_cast<int>(c.default_max_tokens);
    so.max_max_tokens = static_cast<int>(c.max_max_tokens);
    so.commit_timeout = c.commit_timeout;
    so.staging_arena_bytes = static_cast<size_t>(c.staging_arena_mib) << 20;
    so.staging_budget_bytes = static_cast<size_t>(c.staging_budget_mib) << 20;
    // Prefill workers' puts into a failed transfer's block stop by their
    // transfer timeout (the cluster's workers share it).
    so.staging_quarantine = c.transfer_timeout;
    so.registry = &registry;
    auto svc = worker_service::DecodeService::Create(so);
    if (!svc.ok()) return fail(svc.status());
    decode_service = std::move(*svc);
    if (const worker::StagingArena* arena = decode_service->staging_arena(); arena != nullptr) {
      SWA_LOG(info, "{}: KV staging in a {} MiB UCX-allocated arena (heap staging when full)",
              c.worker_id, arena->capacity() >> 20);
    } else {
      SWA_LOG(info, "{}: KV staging in heap memory registered per request "
              "(--decode.staging_arena_mib=0)", c.worker_id);
    }
    services.push_back(decode_service.get());
  }
  std::unique_ptr<cluster::RedisClient> redis;
  std::unique_ptr<cluster::WorkerRegistration> registration;
  rpc::GrpcServerOptions go;
  // Leave the registry first, so routers stop sending while calls drain.
  go.on_drain_start = [&] {
    // New calls are refused with ERROR_CODE_DRAINING (the router retries
    // them elsewhere); calls in flight finish until the drain deadline, then
    // the router migrates the decode streams that are left.
    if (prefill_service != nullptr) prefill_service->StartDraining();
    if (decode_service != nullptr) decode_service->StartDraining();
    forwarder.Set(nullptr);
    if (registration != nullptr) registration->Stop();
  };
  go.listen_address = c.listen;
  go.services = services;
  if (prefill) go.health_service_names.push_back("swaserve.v1.Prefill");
  if (decode) go.health_service_names.push_back("swaserve.v1.Decode");
  go.drain_deadline = c.drain;
  auto server = rpc::GrpcServer::Create(go);
  if (!server.ok()) return fail(server.status());
  metrics::MetricsHttpServerOptions mo;
  mo.host = c.metrics_host;
  mo.port = static_cast<int>(c.metrics_port);
  mo.registry = &registry;
  auto http = metrics::MetricsHttpServer::Create(mo);
  if (!http.ok()) return fail(http.status());
  SWA_LOG(info, "{} serving gRPC on port {}, metrics on {}:{}", c.worker_id, (*server)->port(),
          c.metrics_host, (*http)->port());
  if (!c.port_file.empty()) {
    if (absl::Status s = base::WritePortFile(
            c.port_file, {{"grpc_port", (*server)->port()}, {"metrics_port", (*http)->port()}});
        !s.ok()) {
      return fail(s);
    }
  }
  // Cluster membership (optional): the record, load reports, cache events.
  if (!c.redis.empty()) {
    cluster::RedisOptions ro;
    if (absl::Status s = cluster::ParseRedisAddress(c.redis, &ro); !s.ok()) {
      return fail(base::Annotate(s, "--redis"));
    }
    ro.metrics = &registry;
    auto rc = cluster::RedisClient::Create(ro);
    if (!rc.ok()) return fail(rc.status());
    redis = std::move(*rc);
    cluster::WorkerRegistrationOptions wo;
    wo.redis = redis.get();
    wo.cluster = c.cluster;
    wo.info.id = c.worker_id;
    wo.info.role = prefill && decode ? v1::ROLE_BOTH : prefill ? v1::ROLE_PREFILL : v1::ROLE_DECODE;
    wo.info.model = c.model_name;
    wo.info.bucket = static_cast<int32_t>(c.bucket);
    wo.info.bucket_min_tokens = c.bucket_min_tokens;
    wo.info.bucket_max_tokens = c.max_prompt_tokens;
    wo.info.grpc_address = absl::StrCat(c.advertise_host, ":", (*server)->port());
    wo.info.ucx_address = (*transfer)->worker_address();
    wo.info.page_size = static_cast<int32_t>(c.page_size);
    const kv::KvPools* pools = prefill ? prefill_pools.get() : decode_pools.get();
    wo.info.full_pages = pools->full().num_pages();
    wo.info.swa_pages = pools->swa().num_pages();
    wo.info.max_running_requests = static_cast<int32_t>(c.max_batch_size);
    wo.load_fn = [&]() {
      // A monolithic worker reports prefill's queue and decode's batch.
      v1::WorkerLoad l = prefill ? prefill_service->Load() : decode_service->Load();
      if (prefill && decode) {
        const v1::WorkerLoad d = decode_service->Load();
        l.set_running_requests(l.running_requests() + d.running_requests());
        l.set_staged_requests(d.staged_requests());
      }
      return l;
    };
    wo.metrics = &registry;
    // A record of this id at another address belongs to a live worker if
    // that address answers a health check: then this one must not start.
    wo.is_live = [](const cluster::WorkerInfo& other) {
      absl::StatusOr<std::shared_ptr<grpc::Channel>> ch = rpc::CreateChannel(other.grpc_address);
      if (!ch.ok()) return false;
      absl::StatusOr<rpc::HealthStatus> h = rpc::CheckHealth(*ch, "", absl::Milliseconds(500));
      return h.ok() && *h == rpc::HealthStatus::kServing;
    };
    auto reg = cluster::WorkerRegistration::Create(std::move(wo));
    if (!reg.ok()) return fail(reg.status());
    registration = std::move(*reg);
    forwarder.Set(registration.get());
    const bool done = registration->WaitRegistered(absl::Seconds(5));
    if (absl::Status refused = registration->refused(); !refused.ok()) {
      SWA_LOG(err, "{}", refused.ToString());
      registration.reset();
      return 1;
    }
    if (!done) {
      SWA_LOG(warn, "{}: Redis at {} not reachable yet; serving, will register when it is",
              c.worker_id, c.redis);
    }
  }
  const int signo = rpc::ServeUntilTerminated(**server, **signal);
  SWA_LOG(info, "{} stopping (signal {})", c.worker_id, signo);
  forwarder.Set(nullptr);
  if (registration != nullptr) registration->Stop();  // idempotent
  // Cores first (their callbacks reach the services' streams), then the rest
  // in reverse order of creation.
  if (prefill_core != nullptr) prefill_core->Stop();
  if (decode_core != nullptr) decode_core->Stop();
  (*http)->Stop();
  return signo >= 0 ? 0 : 1;
}

}  // namespace
}  // namespace swaserve

int main(int argc, char** argv) { return swaserve::Run(argc, argv); }
