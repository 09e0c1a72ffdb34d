// EncoderCore: the multimodal encoder service's logic, without
// gRPC: a request's items (encoded image or WAV bytes) are hashed,
// looked up in the embedding cache, decoded and preprocessed on the calling
// thread (so preprocessing runs in parallel across requests), then encoded by
// the model's tower through a DynamicBatcher per modality — items of
// concurrent requests share one forward — and split back per item. Results
// go into the cache.
//
//   content hash  media::ContentHash(bytes, the modality's preprocessing
//                 parameters): the cache key and the value the router mixes
//                 into prefix-cache page hashes.
//   image         media::DecodeImage (PNG, JPEG) -> PreprocessImage with the
//                 vision tower's patch and merge size -> VisionTower.
//   audio         media::DecodeWav (any rate, resampled to 16 kHz) -> log-mel
//                 (the tower's num_mel_bins) -> AudioTower.
//   video         media::DecodeVideoMemory (frames sampled at video.sample_fps,
//                 chunked parallel decode, each frame converted straight to
//                 the vision tower's input size) -> each frame preprocessed
//                 as an image (a frame shared by consecutive samples once)
//                 -> VisionTower, frames batched like images (their own
//                 batcher, modality label "video"); the item's embedding is
//                 the frames' embeddings in order.
// Decoded-bytes budgets: before anything is decoded, each cache-missing
// item's decoded bytes are estimated from its header (DecodedBytes: pixels
// or samples times their bytes, the preprocessed floats, a video's frames
// and decoder working set). A request over max_request_decoded_bytes is
// InvalidArgument naming the budget; otherwise it reserves its bytes in the
// encoder's DecodedBytesBudget (max_decoded_bytes_in_flight) for as long as
// it decodes and encodes, waiting up to decoded_bytes_wait for room, then
// ResourceExhausted ("encoder busy"). A video whose header declares no
// duration reserves the whole per-request budget, and its decode is held to
// it while decoding.
// Bad input (corrupt, truncated, unsupported format, zero size, huge
// dimensions, audio too long, a modality the model has no tower for) is
// InvalidArgument naming the item and the problem; nothing is cached for it.
//
// Thread-safety: Encode may be called from many threads at once (that is
// what batches items across requests). Ownership: owns its towers, batchers
// and cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/base/hash.h"
#include "lib/encoder/batcher.h"
#include "lib/encoder/decoded_bytes_budget.h"
#include "lib/encoder/embedding_cache.h"
#include "lib/media/audio.h"
#include "lib/media/image.h"
#include "lib/media/image_preprocess.h"
#include "lib/media/mel.h"
#include "lib/media/video.h"
#include "lib/metrics/registry.h"

namespace swaserve::encoder {

enum class Modality { kImage, kAudio, kVideo };

struct EncoderCoreOptions {
  // Checkpoint directory whose config.json has vision_config and/or
  // audio_config (model::VisionTower / AudioTower). Required; a model with
  // neither tower is an error.
  std::string model_dir;
  // Batching per modality (modality label and registry are set by Create).
  DynamicBatcherOptions batcher;
  EmbeddingCacheOptions cache;
  media::ImageDecodeOptions image_decode;
  // Resize and normalisation; patch_size and merge_size are taken from the
  // vision tower.
  media::ImagePreprocessOptions image;
  media::WavDecodeOptions wav;
  // n_mels is taken from the audio tower.
  media::MelOptions mel;
  // Frame sampling and decode threads (frames are preprocessed with `image`;
  // model_input is set from it, and max_decoded_bytes is capped at
  // max_request_decoded_bytes).
  media::VideoDecodeOptions video;
  // Decoded bytes one request's items may declare. Default 1 GiB.
  int64_t max_request_decoded_bytes = int64_t{1} << 30;
  // Decoded bytes of all requests in flight (at least
  // max_request_decoded_bytes). Default 4 GiB.
  int64_t max_decoded_bytes_in_flight = int64_t{4} << 30;
  // How long a request waits for room in that budget. Default 5 s.
  absl::Duration decoded_bytes_wait = absl::Seconds(5);
  // Not owned; null: no metrics.
  metrics::Registry* registry = nullptr;
};

struct EncodeItem {
  Modality modality = Modality::kImage;
  std::string data;  // the encoded bytes (PNG, JPEG, WAV)
};

struct EncodedItem {
  base::Hash128 content_hash;
  std::shared_ptr<const ItemEmbedding> embedding;
  bool cache_hit = false;
};

class EncoderCore {
 public:
  static absl::StatusOr<std::unique_ptr<EncoderCore>> Create(const EncoderCoreOptions& options);
  ~EncoderCore();

  // One result per item, in order. InvalidArgument for bad input (names
  // item index and problem) and for a request over the per-request
  // decoded-bytes budget; ResourceExhausted when the batch queue is full or
  // the encoder's decoded-bytes budget has no room in time.
  absl::StatusOr<std::vector<EncodedItem>> Encode(absl::Span<const EncodeItem> items);

  // The cached embedding of `content_hash` (what Fetch serves), or null.
  std::shared_ptr<const ItemEmbedding> Cached(const base::Hash128& content_hash) const;
  // The content hash Encode keys `item` by (the router computes the same).
  base::Hash128 ContentHash(const EncodeItem& item) const;
  bool has_vision() const;
  bool has_audio() const;
  // The language model's hidden size the embeddings have.
  int hidden_size() const;
  EmbeddingCacheStats cache_stats() const;
  // Decoded bytes reserved by requests in flight now.
  int64_t decoded_bytes_in_flight() const;
  // The decoded bytes `item` declares (its header read, nothing decoded);
  // the bad-input errors Encode would give.
  absl::StatusOr<int64_t> DecodedBytes(const EncodeItem& item) const;

 private:
  struct Impl;
  explicit EncoderCore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace swaserve::encoder
