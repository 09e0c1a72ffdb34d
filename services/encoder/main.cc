// swaserve-encoder: the multimodal encoder service:
// swaserve.v1.Encoder over gRPC (lib/encoder EncoderCore: images, audio and video
// through the model's vision and audio towers, batched across requests, an
// in-process embedding cache), Prometheus /metrics, and a ROLE_ENCODER
// record in Redis so routers find it (they place items on encoders by
// consistent hashing of the content hash). `--help` lists the options.
//
//   swaserve-encoder --model=DIR --listen=127.0.0.1:0 --redis=127.0.0.1:6379
//
// Stops on SIGTERM/SIGINT: health NOT_SERVING, the record leaves Redis, new
// calls get UNAVAILABLE, calls in flight finish within --drain.
// Exit codes: 0 after a clean stop, 1 on a start-up error, 2 on bad flags.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/base/config.h"
#include "lib/base/logging.h"
#include "lib/base/serving.h"
#include "lib/base/port_file.h"
#include "lib/base/status.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/worker_registration.h"
#include "lib/encoder/encoder_core.h"
#include "lib/metrics/http_server.h"
#include "lib/metrics/process.h"
#include "lib/metrics/registry.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/grpc_server.h"
#include "lib/rpc/termination_signal.h"
#include "services/encoder/encoder_service.h"

namespace swaserve::encoder_service {
namespace {

struct Flags {
  std::string model;
  std::string model_name;
  std::string encoder_id;
  std::string listen = "127.0.0.1:0";
  std::string advertise_host = "127.0.0.1";
  std::string redis;
  std::string redis_password_file;
  std::string redis_username;
  std::string cluster = "default";
  std::string metrics_host = "127.0.0.1";
  int64_t metrics_port = 0;
  std::string port_file;
  std::string log_level = "info";
  absl::Duration drain = absl::Seconds(10);
  absl::Duration batch_window = encoder::DynamicBatcherOptions{}.batch_window;
  int64_t batch_max_items = encoder::DynamicBatcherOptions{}.max_batch_items;
  int64_t batch_max_queued = encoder::DynamicBatcherOptions{}.max_queued_items;
  int64_t cache_mib = 1024;
  int64_t fetch_chunk_bytes = int64_t{4} << 20;
  int64_t image_max_pixels = media::ImagePreprocessOptions{}.max_pixels;
  double audio_max_seconds = media::WavDecodeOptions{}.max_duration_seconds;
  double video_sample_fps = media::VideoDecodeOptions{}.sample_fps;
  int64_t video_decode_threads = 2;
};

struct Encoder {
  metrics::Registry registry;
  std::unique_ptr<encoder::EncoderCore> core;
  std::unique_ptr<EncoderService> service;
  std::unique_ptr<rpc::GrpcServer> server;
  std::unique_ptr<metrics::MetricsHttpServer> http;
  std::unique_ptr<cluster::RedisClient> redis;
  std::unique_ptr<cluster::WorkerRegistration> registration;

  void Stop() {
    if (registration != nullptr) registration->Stop();
    if (http != nullptr) http->Stop();
  }
};

absl::Status Start(const Flags& f, Encoder* e) {
  encoder::EncoderCoreOptions co;
  co.model_dir = f.model;
  co.batcher.batch_window = f.batch_window;
  co.batcher.max_batch_items = static_cast<int>(f.batch_max_items);
  co.batcher.max_queued_items = static_cast<int>(f.batch_max_queued);
  co.cache.max_bytes = f.cache_mib << 20;
  co.image.max_pixels = f.image_max_pixels;
  co.wav.max_duration_seconds = f.audio_max_seconds;
  co.video.sample_fps = f.video_sample_fps;
  co.video.num_threads = static_cast<int>(f.video_decode_threads);
  co.video.num_chunks = static_cast<int>(f.video_decode_threads);
  co.registry = &e->registry;
  ASSIGN_OR_RETURN(e->core, encoder::EncoderCore::Create(co));
  e->service = std::make_unique<EncoderService>(
      e->core.get(), static_cast<size_t>(std::max<int64_t>(1, f.fetch_chunk_bytes)));
  rpc::GrpcServerOptions go;
  go.listen_address = f.listen;
  go.services.push_back(e->service.get());
  go.health_service_names.push_back("swaserve.v1.Encoder");
  go.drain_deadline = f.drain;
  go.on_drain_start = [e] {
    e->service->StartDraining();
    if (e->registration != nullptr) e->registration->Stop();
  };
  ASSIGN_OR_RETURN(e->server, rpc::GrpcServer::Create(go));
  metrics::MetricsHttpServerOptions mo;
  mo.host = f.metrics_host;
  mo.port = static_cast<int>(f.metrics_port);
  mo.registry = &e->registry;
  RETURN_IF_ERROR(metrics::RegisterProcessMetrics(&e->registry));
  ASSIGN_OR_RETURN(e->http, metrics::MetricsHttpServer::Create(mo));
  SWA_LOG(info, "{} serving gRPC on port {} (vision {}, audio {}, hidden {}), metrics on {}:{}",
          f.encoder_id, e->server->port(), e->core->has_vision(), e->core->has_audio(),
          e->core->hidden_size(), f.metrics_host, e->http->port());
  if (!f.port_file.empty()) {
    RETURN_IF_ERROR(base::WritePortFile(
        f.port_file, {{"grpc_port", e->server->port()}, {"metrics_port", e->http->port()}}));
  }
  if (f.redis.empty()) return absl::OkStatus();
  cluster::RedisOptions ro;
  RETURN_IF_ERROR(base::Annotate(cluster::ParseRedisAddress(f.redis, &ro), "--redis"));
  ro.password_file = f.redis_password_file;
  if (!f.redis_username.empty()) ro.username = f.redis_username;
  ro.metrics = &e->registry;
  ASSIGN_OR_RETURN(e->redis, cluster::RedisClient::Create(ro));
  RETURN_IF_ERROR(e->redis->CheckCredentials());
  cluster::WorkerRegistrationOptions wo;
  wo.redis = e->redis.get();
  wo.cluster = f.cluster;
  wo.info.id = f.encoder_id;
  wo.info.role = v1::ROLE_ENCODER;
  wo.info.model = f.model_name;
  wo.info.grpc_address = absl::StrCat(f.advertise_host, ":", e->server->port());
  wo.metrics = &e->registry;
  wo.is_live = [](const cluster::WorkerInfo& other) {
    return rpc::IsServing(other.grpc_address);
  };

  ASSIGN_OR_RETURN(e->registration, cluster::WorkerRegistration::Create(std::move(wo)));
  if (!e->registration->WaitRegistered(absl::Seconds(5))) {
    if (absl::Status refused = e->registration->refused(); !refused.ok()) return refused;
    SWA_LOG(warn, "{}: Redis at {} not reachable yet; serving, will register when it is",
            f.encoder_id, f.redis);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  auto signal = rpc::TerminationSignal::Create();  // first: before any thread
  if (!signal.ok()) {
    std::fprintf(stderr, "swaserve-encoder: %s\n", signal.status().ToString().c_str());
    return 1;
  }
  Flags f;
  base::Config config("swaserve-encoder",
                      "The swaserve multimodal encoder service (gRPC swaserve.v1.Encoder + "
                      "Prometheus).");
  config.Add("model", &f.model, "checkpoint directory with vision_config and/or audio_config")
      .Add("model_name", &f.model_name, "served model name (registry record; default: dir name)")
      .Add("encoder_id", &f.encoder_id, "registry id (default: encoder-<host>-<pid>)")
      .Add("listen", &f.listen, "gRPC listen address host:port (port 0: any free port)")
      .Add("advertise_host", &f.advertise_host, "host other processes reach this encoder at")
      .Add("redis", &f.redis, "Redis host:port for cluster membership (empty: standalone)")
      .Add("redis_password_file", &f.redis_password_file,
           "file holding the Redis password (AUTH on every connection; re-read on reconnect; "
           "empty: none, or the one in a redis:// address)")
      .Add("redis_username", &f.redis_username,
           "Redis ACL user for AUTH (empty: the default user)")
      .Add("cluster", &f.cluster, "cluster name (Redis key prefix)")
      .Add("metrics.host", &f.metrics_host, "Prometheus /metrics bind host")
      .Add("metrics.port", &f.metrics_port, "Prometheus /metrics port (0: any free port)")
      .Add("port_file", &f.port_file, "write the bound ports here as JSON once serving")
      .Add("log_level", &f.log_level, "trace, debug, info, warn, error")
      .Add("drain", &f.drain, "how long in-flight calls may finish on SIGTERM")
      .Add("batch.window", &f.batch_window, "how long a batch's first item waits for others")
      .Add("batch.max_items", &f.batch_max_items, "most items per forward")
      .Add("batch.max_queued", &f.batch_max_queued,
           "items queued before new calls get RESOURCE_EXHAUSTED")
      .Add("cache_mib", &f.cache_mib, "embedding cache budget (MiB; 0: no cache)")
      .Add("fetch_chunk_bytes", &f.fetch_chunk_bytes,
           "most bytes per Fetch message (by-reference embeddings; whole rows)")
      .Add("image.max_pixels", &f.image_max_pixels, "pixel budget of a resized image")
      .Add("audio.max_seconds", &f.audio_max_seconds, "longest audio accepted (seconds)")
      .Add("video.sample_fps", &f.video_sample_fps, "video frames sampled per second")
      .Add("video.decode_threads", &f.video_decode_threads,
           "threads (and chunks) decoding one video in parallel");
  base::ParseConfigOrExit(config, argc, argv);
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "swaserve-encoder: %s (see --help)\n", msg.c_str());
    return 2;
  };
  if (f.model.empty()) return bad("--model is required");
  if (f.batch_max_items < 1 || f.batch_max_queued < 1 || f.cache_mib < 0 ||
      f.video_decode_threads < 1 || !(f.video_sample_fps > 0)) {
    return bad("--batch.max_items, --batch.max_queued and --video.decode_threads must be >= 1, "
               "--cache_mib >= 0, --video.sample_fps > 0");
  }
  if (f.model_name.empty()) {
    f.model_name = std::filesystem::path(f.model).lexically_normal().filename().string();
    if (f.model_name.empty()) {
      f.model_name = std::filesystem::path(f.model).parent_path().filename().string();
    }
  }
  if (f.encoder_id.empty()) f.encoder_id = cluster::DefaultWorkerId("encoder");
  base::TuneForServing();
  if (absl::Status s = base::InitLogging({f.log_level, "encoder"}); !s.ok()) return bad(s.ToString());
  SWA_LOG(info, "swaserve-encoder {} starting: model {}", f.encoder_id, f.model);
  Encoder e;
  if (absl::Status s = Start(f, &e); !s.ok()) {
    SWA_LOG(err, "start-up failed: {}", s.ToString());
    e.Stop();
    return 1;
  }
  const int signo = rpc::ServeUntilTerminated(*e.server, **signal);
  SWA_LOG(info, "{} stopping (signal {})", f.encoder_id, signo);
  e.Stop();
  return signo >= 0 ? 0 : 1;
}

}  // namespace
}  // namespace swaserve::encoder_service

int main(int argc, char** argv) { return swaserve::encoder_service::Main(argc, argv); }
