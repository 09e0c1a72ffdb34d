// MediaResolver: a request's images, audio and video on the router's path.
// For each GenerateRequest.multimodal item:
//   1. its bytes: `data`, or `url` — a data: URL decoded here, an http(s)
//      URL fetched by api::MediaFetcher (size, time, redirect and address
//      limits) when the router allows fetching;
//   2. its encoder: consistent hashing (cluster::HashRing with virtual
//      nodes) of XXH3-128 of the bytes over the registered encoders
//      (docs/architecture.md#request-path says "of the content hash"; that hash also covers
//      the encoder's preprocessing parameters, which the router does not
//      know, so the router keys placement by the bytes alone — the same item
//      gets the same key, which is all placement needs)
//      (ROLE_ENCODER), so the same item always reaches the same replica's
//      embedding cache and an encoder joining or leaving moves about 1/n of
//      the items. An encoder that fails (unreachable, draining, overloaded,
//      timed out) is skipped for this request and the item goes to the next
//      encoder on the ring (a cache miss there, never a lost request);
//   3. one Encode call per item, the items of a request in parallel (the
//      encoder batches items across calls, so per-item calls cost no batching
//      and let an encoder's answer name the item exactly);
//   4. the answer: content hash (the encoder's: bytes plus its preprocessing
//      parameters) and embeddings [num_tokens, hidden] F32 — inline, or
//      above inline_max_bytes by reference: the encoder keeps the values and
//      the prefill worker fetches them (Encoder.Fetch); when that fails the
//      router encodes the items again inline and retries (Router).
// The resolved items carry no bytes or URL any more; ExpandMarkers then puts
// each item's num_tokens placeholder tokens where the prompt's marker
// (lib/base/multimodal.h) was and fills token_offset / num_tokens.
//
// Errors: bad input (no bytes, a bad data URL, a failed fetch, an image the
// encoder cannot decode, too many items) is InvalidArgument naming the item
// ("multimodal[k] (image): ..."); no encoder registered, or every one tried
// failed, is Unavailable (retryable).
//
// Thread-safety: Resolve is thread-safe. Ownership: does not own the fetcher
// or the registry; owns the encoder clients (one per encoder incarnation).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/api/media_fetch.h"
#include "lib/cluster/hash_ring.h"
#include "lib/cluster/key_schema.h"
#include "lib/metrics/registry.h"
#include "lib/model/chat_template.h"
#include "swaserve/v1/encoder.grpc.pb.h"

namespace swaserve::router {

// The Encode call on one encoder: gRPC in the services
// (NewGrpcEncoderClient), fakes in unit tests. Thread-safe.
class EncoderClient {
 public:
  virtual ~EncoderClient() = default;
  virtual absl::StatusOr<v1::EncodeResponse> Encode(const v1::EncodeRequest& request,
                                                    absl::Time deadline) = 0;
};

// Over `channel` (the encoder's Encoder service).
std::unique_ptr<EncoderClient> NewGrpcEncoderClient(std::shared_ptr<grpc::Channel> channel);

struct MediaOptions {
  // Fetches http(s) URLs; nullptr: they are rejected (data: URLs and inline
  // bytes still work). Not owned.
  const api::MediaFetcher* fetcher = nullptr;
  // Largest data: URL payload (decoded bytes). Default 32 MiB.
  int64_t max_data_url_bytes = int64_t{32} << 20;
  // Items per request. Default 16.
  int max_items = 16;
  // Encoders tried per item (the owner, then its ring successors). Default 3.
  int encoder_attempts = 3;
  // Embeddings larger than this travel by reference: the encoder keeps them
  // and the prefill worker fetches them (MultimodalItem.embeddings_address,
  // Encoder.Fetch), so large ones cross the network once and no message
  // nears gRPC's size limit. 0: always inline. Default 4 MiB.
  uint64_t inline_max_bytes = uint64_t{4} << 20;
  // Deadline of one Encode call (also bounded by the request's). Default 120 s.
  absl::Duration encode_timeout = absl::Seconds(120);
  cluster::HashRingOptions ring;
  // The modalities the model accepts (ModalitiesFor its checkpoint); an
  // item of another is InvalidArgument naming the missing tower.
  // nullopt (default): any (the encoders decide).
  std::optional<std::vector<v1::Modality>> modalities;
  // Client per encoder; default: gRPC to its grpc_address.
  std::function<absl::StatusOr<std::shared_ptr<EncoderClient>>(const cluster::WorkerInfo&)>
      client_factory;
  // swaserve_router_media_* families; nullptr: no metrics. Not owned.
  metrics::Registry* registry = nullptr;
};

class MediaResolver {
 public:
  static absl::StatusOr<std::unique_ptr<MediaResolver>> Create(MediaOptions options);
  ~MediaResolver();

  // The items with bytes turned into content_hash + embeddings (num_tokens
  // set, token_offset not; embeddings' rows are the item's token count;
  // above inline_max_bytes only dtype and shape, with embeddings_address),
  // in order. `encoders`: the registered encoders (ROLE_ENCODER records).
  // `force_inline`: every embedding inline (the retry after a by-reference
  // one could not be fetched).
  absl::StatusOr<std::vector<v1::MultimodalItem>> Resolve(
      absl::Span<const v1::MultimodalItem> items, absl::Span<const cluster::WorkerInfo> encoders,
      const std::string& model, const std::string& request_id, absl::Time deadline,
      bool force_inline = false);
  // MediaOptions::modalities.
  const std::optional<std::vector<v1::Modality>>& modalities() const {
    return options_.modalities;
  }

 private:
  struct Metrics;
  explicit MediaResolver(MediaOptions options);
  absl::StatusOr<v1::MultimodalItem> ResolveOne(const v1::MultimodalItem& item, int index,
                                                absl::Span<const cluster::WorkerInfo> encoders,
                                                const std::string& model,
                                                const std::string& request_id,
                                                absl::Time deadline, bool force_inline);
  // The ring over `encoders` (rebuilt when the set changes).
  std::shared_ptr<const cluster::HashRing> Ring(absl::Span<const cluster::WorkerInfo> encoders);
  absl::StatusOr<std::shared_ptr<EncoderClient>> Client(const cluster::WorkerInfo& encoder);

  const MediaOptions options_;
  std::unique_ptr<Metrics> metrics_;
  absl::Mutex mu_;
  std::vector<std::string> ring_nodes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const cluster::HashRing> ring_ ABSL_GUARDED_BY(mu_);
  // By "<id>/<incarnation>/<address>".
  absl::flat_hash_map<std::string, std::shared_ptr<EncoderClient>> clients_ ABSL_GUARDED_BY(mu_);
};

// The placeholder token id of each modality (what the prompt holds where an
// item's embeddings go; the prefill worker replaces their embeddings, so the
// id only names the position).
struct MediaTokenIds {
  uint32_t image = 0;
  uint32_t video = 0;
  uint32_t audio = 0;
};

// The ids of checkpoint directory `model_dir`: config.json's image_token_id,
// video_token_id and audio_token_id (Qwen2.5-VL / Qwen2.5-Omni names;
// audio_token_index accepted too); a missing one is the tokenizer's id of
// the marker text when it is a token, else 0 (any id works: its embedding is
// always replaced). NotFound / InvalidArgument for an unreadable config.
absl::StatusOr<MediaTokenIds> MediaTokenIdsFor(const std::string& model_dir,
                                               const model::Tokenizer& tokenizer);

// The modalities checkpoint directory `model_dir` accepts besides text
// (model::EncoderTowersOf): image and video with a vision tower, audio with
// an audio tower. NotFound / InvalidArgument for an unreadable config.
absl::StatusOr<std::vector<v1::Modality>> ModalitiesFor(const std::string& model_dir);

// The markers of the three modalities, in the order MarkerCut::marker uses
// (0 image, 1 video, 2 audio).
const std::vector<std::string>& MediaMarkers();

// InvalidArgument when the markers (cuts) and the items differ in number or
// in modality, naming both.
absl::Status CheckMarkers(absl::Span<const model::MarkerCut> cuts,
                          absl::Span<const v1::MultimodalItem> items);

// Builds the prompt from ids cut at the markers (model::*WithMarkers) and the
// resolved items: item k's num_tokens placeholder ids go where cut k was;
// sets each item's token_offset and num_tokens. CheckMarkers' errors.
absl::StatusOr<std::vector<uint32_t>> ExpandMarkers(absl::Span<const uint32_t> ids,
                                                    absl::Span<const model::MarkerCut> cuts,
                                                    const MediaTokenIds& token_ids,
                                                    std::vector<v1::MultimodalItem>* items);

}  // namespace swaserve::router
