#include "services/worker/worker_server.h"

#include <cstdio>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/base/config.h"
#include "lib/base/logging.h"
#include "lib/base/serving.h"
#include "lib/base/port_file.h"
#include "lib/base/status.h"
#include "lib/base/hash.h"
#include "lib/base/malloc_tuning.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/redis_page_store.h"
#include "lib/cluster/worker_registration.h"
#include "lib/kv/file_page_store.h"
#include "lib/model/checkpoint_identity.h"
#include "lib/kv/kv_metrics.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"
#include "lib/metrics/http_server.h"
#include "lib/metrics/process.h"
#include "lib/metrics/registry.h"
#include "lib/model/forward.h"
#include "lib/model/tokenizer.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/grpc_server.h"
#include "lib/rpc/status_conversion.h"
#include "lib/rpc/termination_signal.h"
#include "lib/transfer/transfer_engine.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/engine_lock.h"
#include "lib/worker/kv_receiver.h"
#include "lib/worker/kv_sender.h"
#include "lib/worker/prefill_core.h"
#include "lib/worker/worker_options.h"
#include "services/worker/decode_service.h"
#include "services/worker/prefill_service.h"

namespace swaserve::worker_service {
namespace {

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
    // needs every page of the path) and which pages lost their SWA KV, so
    // that it can tell whether a match ends window-safe (its credit for a
    // match that needs a window restore is smaller).
    using Kind = cluster::CacheEventOp::Kind;
    switch (e.type) {
      case kv::CacheEvent::Type::kStored:
        reg_->PublishCacheEvent(Kind::kStored, e.hashes, e.depth, e.parent, e.anchor);
        break;
      case kv::CacheEvent::Type::kRemoved:
        reg_->PublishCacheEvent(Kind::kRemoved, e.hashes, e.depth, e.parent, e.anchor);
        break;
      case kv::CacheEvent::Type::kSwaStored:
        reg_->PublishCacheEvent(Kind::kSwaStored, e.hashes, e.depth, e.parent, e.anchor);
        break;
      case kv::CacheEvent::Type::kSwaRemoved:
        reg_->PublishCacheEvent(Kind::kSwaRemoved, e.hashes, e.depth, e.parent, e.anchor);
        break;
      case kv::CacheEvent::Type::kTierChanged:
        // Still cached; the router credits L2 pages less (policy.h).
        reg_->PublishCacheEvent(e.tier == 0 ? Kind::kTierUp : Kind::kTierDown, e.hashes,
                                 e.depth, e.parent, e.anchor);
        break;
    }
  }

 private:
  absl::Mutex mu_;
  cluster::WorkerRegistration* reg_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// Everything a running worker owns, declared in creation order (destroyed
// in reverse).
struct Worker {
  const worker::WorkerOptions& o;
  metrics::Registry& registry = metrics::DefaultRegistry();
  std::unique_ptr<model::Engine> engine;
  std::unique_ptr<worker::EngineLock> lock;
  kv::KvShape shape;
  std::unique_ptr<model::Tokenizer> tokenizer;
  // Structured output (null without a tokenizer).
  std::unique_ptr<worker::ConstraintFactory> constraints;
  std::unique_ptr<transfer::TransferEngine> transfer;
  CacheEventForwarder forwarder;
  std::unique_ptr<kv::KvPools> prefill_pools, decode_pools;
  std::unique_ptr<kv::KvPools> prefill_l2;  // may be null
  std::unique_ptr<kv::AsyncPageStore> prefill_l3;  // may be null
  std::unique_ptr<kv::PrefixCache> cache;
  std::unique_ptr<kv::KvMetrics> kv_metrics;
  std::unique_ptr<worker::PrefillCore> prefill_core;
  std::unique_ptr<worker::KvSender> sender;
  std::unique_ptr<PrefillService> prefill_service;
  std::unique_ptr<worker::DecodeCore> decode_core;
  std::unique_ptr<worker::KvReceiver> receiver;
  std::unique_ptr<DecodeService> decode_service;
  std::unique_ptr<rpc::GrpcServer> server;
  std::unique_ptr<metrics::MetricsHttpServer> http;
  std::unique_ptr<cluster::RedisClient> redis;
  std::unique_ptr<cluster::WorkerRegistration> registration;

  absl::Status LoadModel();
  absl::Status BuildPrefill();
  absl::Status OpenL3();
  absl::Status BuildDecode();
  absl::Status StartServers();
  absl::Status Register();
  v1::WorkerLoad Load() const;
  void Stop();
};

absl::Status Worker::LoadModel() {
  ASSIGN_OR_RETURN(engine, model::Engine::Create({o.model, static_cast<int>(o.threads)}));
  lock = std::make_unique<worker::EngineLock>(engine.get());
  shape = engine->KvShapeFor(static_cast<int>(o.page_size));
  if (std::filesystem::exists(o.model + "/tokenizer.json")) {
    ASSIGN_OR_RETURN(tokenizer, model::Tokenizer::Load(o.model + "/tokenizer.json"));
    std::vector<uint32_t> eos;
    for (int id : engine->config().eos_token_ids) eos.push_back(static_cast<uint32_t>(id));
    ASSIGN_OR_RETURN(constraints, worker::ConstraintFactory::Create(*tokenizer, eos));
  }
  transfer::TransferEngineOptions to;
  to.name = o.worker_id;
  to.ucx_tls = o.ucx_tls;
  to.default_timeout = o.transfer_timeout;
  to.registry = &registry;
  ASSIGN_OR_RETURN(transfer, transfer::TransferEngine::Create(to));
  return absl::OkStatus();
}

absl::Status Worker::OpenL3() {
  std::unique_ptr<kv::PageStore> backend;
  std::shared_ptr<const kv::PageBlobMac> mac;
  if (!o.l3_mac_key_file.empty()) {
    ASSIGN_OR_RETURN(mac, kv::PageBlobMac::FromFile(o.l3_mac_key_file));
    SWA_LOG(info, "prefill L3: pages carry a MAC (key from {})", o.l3_mac_key_file);
  }
  if (absl::StartsWith(o.l3, "file:")) {
    ASSIGN_OR_RETURN(std::unique_ptr<kv::FilePageStore> file,
                     kv::FilePageStore::Open({.dir = o.l3.substr(5),
                                              .capacity_bytes = o.l3_mib << 20,
                                              .mac = mac}));
    SWA_LOG(info, "prefill L3: file store {} ({} MiB bound, {} blobs on disk)", o.l3.substr(5),
            o.l3_mib, file->entries());
    backend = std::move(file);
  } else {
    cluster::RedisPageStoreOptions ro;
    RETURN_IF_ERROR(cluster::ParseRedisAddress(o.l3.substr(6), &ro.redis));
    ro.redis.password_file = o.l3_redis_password_file;
    if (!o.l3_redis_username.empty()) ro.redis.username = o.l3_redis_username;
    ro.redis.pool_size = 2;  // the prefetcher and the write-behind thread
    ro.cluster = o.cluster;
    ro.mac = mac;
    {
      // Refused credentials stop the start (the store's own client would
      // read every page as a miss); an L3 not up yet does not.
      ASSIGN_OR_RETURN(std::unique_ptr<cluster::RedisClient> probe,
                       cluster::RedisClient::Create(ro.redis));
      RETURN_IF_ERROR(base::Annotate(probe->CheckCredentials(), "--kv.l3"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<cluster::RedisPageStore> redis_store,
                     cluster::RedisPageStore::Create(ro));
    SWA_LOG(info, "prefill L3: Redis store at {}", o.l3.substr(6));
    backend = std::move(redis_store);
  }
  prefill_l3 = std::make_unique<kv::AsyncPageStore>(
      std::move(backend), kv::AsyncPageStoreOptions{.max_queued_bytes = o.l3_queue_mib << 20});
  return absl::OkStatus();
}

absl::Status Worker::BuildPrefill() {
  ASSIGN_OR_RETURN(prefill_pools,
                   kv::KvPools::CreateForBudget(shape, o.prefill_kv_mib << 20, o.swa_full_ratio));
  RETURN_IF_ERROR(worker::CheckPrefillPoolHoldsBucket(o, shape));
  if (!o.l3.empty()) RETURN_IF_ERROR(OpenL3());
  if (o.l2_ratio > 0) {
    ASSIGN_OR_RETURN(prefill_l2,
                     kv::KvPools::CreateForBudget(
                         shape, static_cast<int64_t>(o.l2_ratio * (o.prefill_kv_mib << 20)),
                         o.l2_swa_full_ratio));
  }
  uint64_t l3_identity = 0;
  if (prefill_l3 != nullptr) {
    ASSIGN_OR_RETURN(l3_identity, model::CheckpointIdentity(o.model));
  }
  ASSIGN_OR_RETURN(cache, kv::PrefixCache::Create(
                              {.pools = prefill_pools.get(),
                               .on_event = [this](const kv::CacheEvent& e) { forwarder(e); },
                               // Full KV whose window was evicted is worth
                               // keeping only where windows are restored.
                               .keep_restorable_tombstones = o.window_restore_min_saved_work >= 0,
                               .cold_superseded_windows = o.window_restore_min_saved_work >= 0 &&
                                                          o.cold_superseded_windows,
                               .l2 = prefill_l2.get(),
                               .l3 = prefill_l3.get(),
                               .l3_model_identity = l3_identity,
                               .l3_write_through_hits = static_cast<int>(o.l3_write_through_hits),
                               .l3_write_through_from_tokens = worker::L3WriteThroughFromTokens(o),
                               // A sharded index (Redis Cluster) maps events
                               // by their anchor page (index_shard_mapper.h);
                               // cheap, so set whenever the worker has Redis.
                               .event_anchor_page = o.redis.empty()
                                                        ? 0
                                                        : cluster::PrefixIndexOptions{}.anchor_page}));
  // KV metrics describe the prefill side's pools and prefix cache (the
  // cache hit rate an SRE watches); in monolithic mode the decode pools
  // show in swaserve_decode_* and the load reports.
  ASSIGN_OR_RETURN(kv_metrics, kv::KvMetrics::Create(&registry, prefill_pools.get(), cache.get(),
                                                         prefill_l3.get()));
  worker::PrefillCoreOptions po;
  po.engine = lock.get();
  po.pools = prefill_pools.get();
  po.cache = cache.get();
  po.scheduler.policy = o.policy == "fcfs" ? sched::PrefillSchedulerOptions::Policy::kFcfs
                                           : sched::PrefillSchedulerOptions::Policy::kComputeAware;
  po.scheduler.aging_tokens_per_second = o.aging_tokens_per_second;
  po.scheduler.chunk_tokens = static_cast<int>(o.chunk_tokens);
  po.scheduler.step_token_budget = static_cast<int>(o.step_token_budget);
  po.scheduler.max_requests_per_step = static_cast<int>(o.max_requests_per_step);
  po.scheduler.max_partial_requests = static_cast<int>(o.max_partial_requests);
  po.scheduler.fcfs_wait_ratio = o.fcfs_wait_ratio;
  po.scheduler.context_cost_per_token = o.context_cost_per_token >= 0
                                            ? o.context_cost_per_token
                                            : model::ContextCostPerToken(engine->config());
  po.max_prompt_tokens = static_cast<int>(o.max_prompt_tokens);
  po.window_restore_min_saved_work = o.window_restore_min_saved_work;
  po.window_restore_pyramid = o.window_restore_pyramid;
  po.keep_cancelled_chunks = o.keep_cancelled_chunks;
  po.l3_checkpoint_tokens = static_cast<int>(o.l3_checkpoint_tokens);
  po.cache_pin_max_fraction = o.cache_pin_max_fraction;
  po.window_restore_from_window_safe = o.window_restore_from_window_safe;
  po.swa_checkpoint_tokens = static_cast<int>(o.swa_checkpoint_tokens);
  po.swa_checkpoints_yield = o.swa_checkpoints_yield;
  po.load_back_min_tokens = static_cast<int>(o.load_back_min_tokens);
  po.async_load_back_min_bytes = o.async_load_back_min_bytes;
  po.l3 = prefill_l3.get();
  po.l3_prefetch_min_tokens = static_cast<int>(o.l3_prefetch_min_tokens);
  po.l3_prefetch_max_wait_ms = o.l3_prefetch_max_wait_ms;
  po.l3_prefetch_wait_fraction = o.l3_prefetch_wait_fraction;
  po.l3_prefetch_assumed_tokens_per_second = o.l3_prefetch_assumed_tokens_per_second;
  po.registry = &registry;
  ASSIGN_OR_RETURN(prefill_core, worker::PrefillCore::Create(po));
  worker::KvSenderOptions so;
  so.transfer = transfer.get();
  so.pools = prefill_pools.get();
  so.transfer_timeout = o.transfer_timeout;
  so.registry = &registry;
  ASSIGN_OR_RETURN(sender, worker::KvSender::Create(so));
  ASSIGN_OR_RETURN(prefill_service,
                   PrefillService::Create({.worker_id = o.worker_id,
                                           .core = prefill_core.get(),
                                           .sender = sender.get(),
                                           .pools = prefill_pools.get(),
                                           .constraints = constraints.get(),
                                           .hidden_size = engine->config().hidden_size}));
  return absl::OkStatus();
}

absl::Status Worker::BuildDecode() {
  ASSIGN_OR_RETURN(decode_pools,
                   kv::KvPools::CreateForBudget(shape, o.decode_kv_mib << 20, o.swa_full_ratio));
  if (!worker::HasPrefill(o)) {
    // A decode worker's own pools (swaserve_kv_pages): what an operator
    // watches for leaks and capacity. (Monolithic: the prefill side's.)
    ASSIGN_OR_RETURN(kv_metrics, kv::KvMetrics::Create(&registry, decode_pools.get(), nullptr));
  }
  worker::DecodeCoreOptions dopt;
  dopt.engine = lock.get();
  dopt.pools = decode_pools.get();
  dopt.tokenizer = tokenizer.get();
  dopt.max_batch_size = static_cast<int>(o.max_batch_size);
  dopt.mtp.draft_tokens = static_cast<int>(o.mtp_draft_tokens);
  dopt.mtp.adaptive = o.mtp_adaptive;
  dopt.mtp.draft_cost = o.mtp_draft_cost;
  dopt.mtp.draft_vocab_tokens = static_cast<int>(o.mtp_draft_vocab_tokens);
  dopt.registry = &registry;
  ASSIGN_OR_RETURN(decode_core, worker::DecodeCore::Create(dopt));
  worker::KvReceiverOptions ro;
  ro.worker_id = o.worker_id;
  ro.transfer = transfer.get();
  ro.pools = decode_pools.get();
  ro.commit_timeout = o.commit_timeout;
  ro.staging_arena_bytes = static_cast<size_t>(o.staging_arena_mib) << 20;
  ro.staging_budget_bytes = static_cast<size_t>(o.staging_budget_mib) << 20;
  // Prefill workers' puts into a failed transfer's block stop by their
  // transfer timeout (the cluster's workers share it).
  ro.staging_quarantine = o.transfer_timeout;
  // The MTP layers' first draft step reads SWA KV that many tokens earlier.
  ro.mtp_lookback = o.mtp_draft_tokens != 0 ? engine->config().num_mtp_layers : 0;
  ro.registry = &registry;
  ASSIGN_OR_RETURN(receiver, worker::KvReceiver::Create(ro));
  if (const worker::StagingArena* arena = receiver->staging_arena(); arena != nullptr) {
    SWA_LOG(info, "{}: KV staging in a {} MiB UCX-allocated arena (heap staging when full)",
            o.worker_id, arena->capacity() >> 20);
  } else {
    SWA_LOG(info, "{}: KV staging in heap memory registered per request "
            "(--decode.staging_arena_mib=0)", o.worker_id);
  }
  DecodeServiceOptions so;
  so.worker_id = o.worker_id;
  so.core = decode_core.get();
  so.receiver = receiver.get();
  so.pools = decode_pools.get();
  so.constraints = constraints.get();
  for (int id : engine->config().eos_token_ids) so.eos_ids.push_back(static_cast<uint32_t>(id));
  so.default_max_tokens = static_cast<int>(o.default_max_tokens);
  so.max_max_tokens = static_cast<int>(o.max_max_tokens);
  so.registry = &registry;
  ASSIGN_OR_RETURN(decode_service, DecodeService::Create(so));
  return absl::OkStatus();
}

absl::Status Worker::StartServers() {
  rpc::GrpcServerOptions go;
  // Leave the registry first, so routers stop sending while calls drain.
  go.on_drain_start = [this] {
    // New calls are refused with ERROR_CODE_DRAINING (the router retries
    // them elsewhere); calls in flight finish until the drain deadline, then
    // the router migrates the decode streams that are left.
    if (prefill_service != nullptr) prefill_service->StartDraining();
    if (decode_service != nullptr) decode_service->StartDraining();
    forwarder.Set(nullptr);
    if (registration != nullptr) registration->Stop();
  };
  go.listen_address = o.listen;
  if (prefill_service != nullptr) {
    go.services.push_back(prefill_service.get());
    go.health_service_names.push_back("swaserve.v1.Prefill");
  }
  if (decode_service != nullptr) {
    go.services.push_back(decode_service.get());
    go.health_service_names.push_back("swaserve.v1.Decode");
  }
  go.drain_deadline = o.drain;
  if (prefill_core != nullptr && o.drain_handback > absl::ZeroDuration()) {
    go.before_drain_deadline_margin = o.drain_handback;
    go.before_drain_deadline = [this](absl::Duration left) {
      prefill_core->EndAllForDrain(
          rpc::ErrorWithDetail(absl::StatusCode::kUnavailable, v1::ERROR_CODE_DRAINING,
                               absl::StrCat("prefill worker ", o.worker_id,
                                            " is draining: it handed back the prefill before "
                                            "its drain deadline (the computed chunks are in its "
                                            "prefix cache and L3)"),
                               o.worker_id, /*retryable=*/true),
          // Three quarters of the time left before the deadline.
          left * 3 / 4);
    };
  }
  ASSIGN_OR_RETURN(server, rpc::GrpcServer::Create(go));
  metrics::MetricsHttpServerOptions mo;
  mo.host = o.metrics_host;
  mo.port = static_cast<int>(o.metrics_port);
  mo.registry = &registry;
  RETURN_IF_ERROR(metrics::RegisterProcessMetrics(&registry));
  ASSIGN_OR_RETURN(http, metrics::MetricsHttpServer::Create(mo));
  SWA_LOG(info, "{} serving gRPC on port {}, metrics on {}:{}", o.worker_id, server->port(),
          o.metrics_host, http->port());
  if (o.port_file.empty()) return absl::OkStatus();
  return base::WritePortFile(o.port_file,
                             {{"grpc_port", server->port()}, {"metrics_port", http->port()}});
}

v1::WorkerLoad Worker::Load() const {
  // A monolithic worker reports prefill's queue and decode's batch.
  if (prefill_service == nullptr) return decode_service->Load();
  v1::WorkerLoad l = prefill_service->Load();
  if (decode_service != nullptr) {
    const v1::WorkerLoad d = decode_service->Load();
    l.set_running_requests(l.running_requests() + d.running_requests());
    l.set_staged_requests(d.staged_requests());
  }
  return l;
}

// Cluster membership: the record, load reports, cache events.
absl::Status Worker::Register() {
  cluster::RedisOptions ro;
  RETURN_IF_ERROR(base::Annotate(cluster::ParseRedisAddress(o.redis, &ro), "--redis"));
  ro.password_file = o.redis_password_file;
  if (!o.redis_username.empty()) ro.username = o.redis_username;
  ro.metrics = &registry;
  ASSIGN_OR_RETURN(redis, cluster::RedisClient::Create(ro));
  RETURN_IF_ERROR(redis->CheckCredentials());
  const bool prefill = worker::HasPrefill(o), decode = worker::HasDecode(o);
  cluster::WorkerRegistrationOptions wo;
  wo.redis = redis.get();
  wo.cluster = o.cluster;
  wo.info.id = o.worker_id;
  wo.info.role = prefill && decode ? v1::ROLE_BOTH : prefill ? v1::ROLE_PREFILL : v1::ROLE_DECODE;
  wo.info.model = o.model_name;
  wo.info.bucket = static_cast<int32_t>(o.bucket);
  wo.info.bucket_min_tokens = o.bucket_min_tokens;
  wo.info.bucket_max_tokens = o.max_prompt_tokens;
  wo.info.grpc_address = absl::StrCat(o.advertise_host, ":", server->port());
  wo.info.ucx_address = transfer->worker_address();
  wo.info.page_size = static_cast<int32_t>(o.page_size);
  const kv::KvPools* pools = prefill ? prefill_pools.get() : decode_pools.get();
  wo.info.full_pages = pools->full().num_pages();
  wo.info.swa_pages = pools->swa().num_pages();
  wo.info.max_running_requests = static_cast<int32_t>(o.max_batch_size);
  wo.info.sliding_window = engine->config().sliding_window;
  wo.info.swa_chain_layers = engine->config().num_swa_layers() + engine->config().num_mtp_layers;
  wo.info.window_restore = prefill && o.window_restore_min_saved_work >= 0;
  if (wo.info.window_restore && o.window_restore_pyramid) {
    wo.info.window_restore_work = kv::WindowRestoreWorkPerRestore(
        engine->config().sliding_window, static_cast<int>(o.page_size),
        engine->config().swa_layer_mask(), engine->config().num_mtp_layers);
  }
  wo.load_fn = [this] { return Load(); };
  wo.metrics = &registry;
  // A record of this id at another address belongs to a live worker if
  // that address answers a health check: then this one must not start.
  wo.is_live = [](const cluster::WorkerInfo& other) {
    return rpc::IsServing(other.grpc_address);
  };

  ASSIGN_OR_RETURN(registration, cluster::WorkerRegistration::Create(std::move(wo)));
  forwarder.Set(registration.get());
  const bool done = registration->WaitRegistered(absl::Seconds(5));
  if (absl::Status refused = registration->refused(); !refused.ok()) {
    forwarder.Set(nullptr);
    registration.reset();
    return refused;
  }
  if (!done) {
    SWA_LOG(warn, "{}: Redis at {} not reachable yet; serving, will register when it is",
            o.worker_id, o.redis);
  }
  return absl::OkStatus();
}

void Worker::Stop() {
  forwarder.Set(nullptr);
  if (registration != nullptr) registration->Stop();  // idempotent
  // Cores first (their callbacks reach the services' streams), then the rest
  // in reverse order of creation.
  if (prefill_core != nullptr) prefill_core->Stop();
  if (decode_core != nullptr) decode_core->Stop();
  if (prefill_l3 != nullptr && cache != nullptr) {
    // Write back what L3 does not hold yet (queued, bounded; the store's
    // destructor finishes the queue), so a restart with a file store comes
    // back warm.
    cache->Clear();
    SWA_LOG(info, "prefill L3: {} pages written back on shutdown ({} KiB queued)",
            cache->stats().l3_written_pages.load(), prefill_l3->queued_bytes() >> 10);
  }
  if (http != nullptr) http->Stop();
}

}  // namespace

int WorkerMain(const WorkerMainSpec& spec, int argc, char** argv) {
  // L3 fetches and KV staging allocate and free buffers of hundreds of MiB:
  // keep freed memory for reuse instead of paying page faults each time.
  base::KeepFreedMemory(size_t{1} << 30);
  auto signal = rpc::TerminationSignal::Create();  // first: before any thread
  if (!signal.ok()) {
    std::fprintf(stderr, "%s: %s\n", spec.program.c_str(), signal.status().ToString().c_str());
    return 1;
  }
  worker::WorkerOptions o;
  if (!spec.fixed_role.empty()) o.role = spec.fixed_role;
  base::Config config(spec.program, spec.description);
  worker::AddWorkerFlags(&config, &o);
  base::ParseConfigOrExit(config, argc, argv);
  auto bad = [&](const std::string& msg) {
    std::fprintf(stderr, "%s: %s (see --help)\n", spec.program.c_str(), msg.c_str());
    return 2;
  };
  if (!spec.fixed_role.empty() && o.role != spec.fixed_role) {
    return bad(absl::StrCat("serves the ", spec.fixed_role, " role only (--role=", o.role,
                            "; swaserve-worker --role serves any)"));
  }
  if (absl::Status s = worker::FinishWorkerOptions(&o); !s.ok()) {
    return bad(std::string(s.message()));
  }
  // Unique across hosts and restarts (a registry id names one live process;
  // WorkerRegistration refuses an id a live worker holds).
  if (o.worker_id.empty()) o.worker_id = cluster::DefaultWorkerId(o.role);
  base::TuneForServing();
  if (absl::Status s = base::InitLogging({o.log_level, "worker"}); !s.ok()) return bad(s.ToString());
  SWA_LOG(info, "{} {} starting: role {}, model {}", spec.program, o.worker_id, o.role, o.model);
  Worker w{o};
  absl::Status st = w.LoadModel();
  if (st.ok() && worker::HasPrefill(o)) st = w.BuildPrefill();
  if (st.ok() && worker::HasDecode(o)) st = w.BuildDecode();
  if (st.ok()) st = w.StartServers();
  if (st.ok() && !o.redis.empty()) st = w.Register();
  if (!st.ok()) {
    SWA_LOG(err, "start-up failed: {}", st.ToString());
    w.Stop();
    return 1;
  }
  const int signo = rpc::ServeUntilTerminated(*w.server, **signal);
  SWA_LOG(info, "{} stopping (signal {})", o.worker_id, signo);
  w.Stop();
  return signo >= 0 ? 0 : 1;
}

}  // namespace swaserve::worker_service
