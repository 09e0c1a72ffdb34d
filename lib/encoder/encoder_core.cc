#include "lib/encoder/encoder_core.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "lib/base/status.h"
#include "lib/media/content_hash.h"
#include "lib/model/audio.h"
#include "lib/model/tower_io.h"
#include "lib/model/vision.h"

namespace swaserve::encoder {
namespace {

// A preprocessed image: its patches (shared by a video's samples of one
// frame) and grid.
struct ImageInput {
  std::shared_ptr<const std::vector<float>> patches;
  int grid_h = 0;
  int grid_w = 0;
};
// A preprocessed clip: its log-mel frames.
struct AudioInput {
  std::vector<float> mel;
  int frames = 0;
};

// Splits a tower's concatenated output into per-item embeddings.
std::vector<ItemEmbedding> Split(const std::vector<float>& out, const std::vector<int64_t>& tokens,
                                 int hidden) {
  std::vector<ItemEmbedding> r;
  size_t at = 0;
  for (int64_t n : tokens) {
    ItemEmbedding e{.num_tokens = static_cast<int>(n), .hidden = hidden};
    e.values.assign(out.begin() + at, out.begin() + at + static_cast<size_t>(n) * hidden);
    at += static_cast<size_t>(n) * hidden;
    r.push_back(std::move(e));
  }
  return r;
}

absl::string_view ModalityName(Modality m) {
  switch (m) {
    case Modality::kImage:
      return "image";
    case Modality::kAudio:
      return "audio";
    case Modality::kVideo:
      return "video";
  }
  return "?";
}

}  // namespace

struct EncoderCore::Impl {
  EncoderCoreOptions options;
  std::unique_ptr<model::VisionTower> vision;
  std::unique_ptr<model::AudioTower> audio;
  std::unique_ptr<media::MelFilterbank> mel;
  std::unique_ptr<EmbeddingCache> cache;
  std::unique_ptr<DynamicBatcher<ImageInput, ItemEmbedding>> image_batcher;
  std::unique_ptr<DynamicBatcher<AudioInput, ItemEmbedding>> audio_batcher;
  std::unique_ptr<DynamicBatcher<ImageInput, ItemEmbedding>> video_batcher;
  std::string image_params, audio_params, video_params;
  metrics::Histogram* image_seconds = nullptr;
  metrics::Histogram* audio_seconds = nullptr;
  metrics::Histogram* video_seconds = nullptr;
  int hidden = 0;
  std::unique_ptr<DecodedBytesBudget> budget;

  // EncoderCore::DecodedBytes; `unknown` set for a video without a duration.
  absl::StatusOr<int64_t> DecodedBytes(size_t index, const EncodeItem& item,
                                       bool* unknown) const;
  absl::StatusOr<ImageInput> PrepareImage(size_t index, const std::string& data);
  absl::StatusOr<AudioInput> PrepareAudio(size_t index, const std::string& data);
  absl::StatusOr<std::vector<ImageInput>> PrepareVideo(size_t index, const std::string& data);
  // A video's frames through the video batcher, in groups the queue bound
  // admits; one embedding, the frames' in order.
  absl::StatusOr<ItemEmbedding> EncodeVideo(std::vector<ImageInput> frames);
};

namespace {

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

absl::Status Named(size_t index, absl::string_view what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("item ", index, " (", what, "): ", s.message()));
}

}  // namespace

absl::StatusOr<int64_t> EncoderCore::Impl::DecodedBytes(size_t index, const EncodeItem& item,
                                                        bool* unknown) const {
  const absl::string_view what = ModalityName(item.modality);
  if (item.modality == Modality::kAudio) {
    if (audio == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", index, " (audio): the model has no audio tower"));
    }
    absl::StatusOr<media::WavInfo> w = media::ProbeWav(Bytes(item.data), options.wav);
    if (!w.ok()) return Named(index, what, w.status());
    // Mono floats at the file's rate and at the model's, and the log-mel.
    const int64_t out = static_cast<int64_t>(
        static_cast<double>(w->frames) * options.mel.sample_rate / w->sample_rate) + 1;
    return (w->frames + out) * 4 + (out / std::max(1, options.mel.hop_length) + 1) *
                                       options.mel.n_mels * 4;
  }
  if (vision == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("item ", index, " (", what, "): the model has no vision tower"));
  }
  if (item.modality == Modality::kImage) {
    absl::StatusOr<media::ImageHeader> h = media::ReadImageHeader(Bytes(item.data),
                                                                  options.image_decode);
    if (!h.ok()) return Named(index, what, h.status());
    absl::StatusOr<media::ImageSize> t = media::TargetImageSize(h->width, h->height, options.image);
    if (!t.ok()) return Named(index, what, t.status());
    // RGB8 at its size; floats resized and cut into patches at the model's.
    return int64_t{h->width} * h->height * 3 + int64_t{t->width} * t->height * 3 * 4 * 2;
  }
  absl::StatusOr<media::VideoInfo> v = media::ProbeVideoMemory(Bytes(item.data), options.video);
  if (!v.ok()) return Named(index, what, v.status());
  if (v->samples == 0) *unknown = true;
  // The decode's own bytes, and each sample's patches.
  return v->decoded_bytes + v->samples * v->frame_width * v->frame_height * 3 * 4;
}

absl::StatusOr<ImageInput> EncoderCore::Impl::PrepareImage(size_t index,
                                                           const std::string& data) {
  if (vision == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("item ", index, " (image): the model has no vision tower"));
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<media::ImageRgb8> img = media::DecodeImage(Bytes(data), options.image_decode);
  if (!img.ok()) return Named(index, "image", img.status());
  absl::StatusOr<media::ImagePatches> p = media::PreprocessImage(*img, options.image);
  if (!p.ok()) return Named(index, "image", p.status());
  if (image_seconds != nullptr) image_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - t0));
  return ImageInput{.patches = std::make_shared<const std::vector<float>>(std::move(p->data)),
                    .grid_h = p->grid_height, .grid_w = p->grid_width};
}

absl::StatusOr<AudioInput> EncoderCore::Impl::PrepareAudio(size_t index,
                                                           const std::string& data) {
  if (audio == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("item ", index, " (audio): the model has no audio tower"));
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<media::AudioMono> wav = media::DecodeWav(Bytes(data), options.wav);
  if (!wav.ok()) return Named(index, "audio", wav.status());
  absl::StatusOr<media::MelSpectrogram> m = mel->Compute(wav->samples);
  if (!m.ok()) return Named(index, "audio", m.status());
  const int64_t after_conv = (int64_t{m->frames} + 1) / 2;
  if (after_conv > audio->config().max_source_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "item ", index, " (audio): too long: ", wav->duration_seconds(), " s, at most ",
        2.0 * audio->config().max_source_positions * options.mel.hop_length /
            options.mel.sample_rate,
        " s"));
  }
  if (audio_seconds != nullptr) audio_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - t0));
  return AudioInput{.mel = std::move(m->data), .frames = m->frames};
}

absl::StatusOr<std::vector<ImageInput>> EncoderCore::Impl::PrepareVideo(size_t index,
                                                                       const std::string& data) {
  if (vision == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("item ", index, " (video): the model has no vision tower"));
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<media::VideoFrames> v = media::DecodeVideoMemory(Bytes(data), options.video);
  if (!v.ok()) return Named(index, "video", v.status());
  std::vector<ImageInput> frames;
  for (size_t k = 0; k < v->frames.size(); ++k) {
    if (k > 0 && v->frames[k] == v->frames[k - 1]) {  // the same decoded frame
      frames.push_back(frames.back());
      continue;
    }
    absl::StatusOr<media::ImagePatches> p = media::PreprocessImage(*v->frames[k], options.image);
    if (!p.ok()) return Named(index, "video", p.status());
    frames.push_back({.patches = std::make_shared<const std::vector<float>>(std::move(p->data)),
                      .grid_h = p->grid_height, .grid_w = p->grid_width});
  }
  if (video_seconds != nullptr) video_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - t0));
  return frames;
}

absl::StatusOr<ItemEmbedding> EncoderCore::Impl::EncodeVideo(std::vector<ImageInput> frames) {
  ItemEmbedding all{.num_tokens = 0, .hidden = hidden};
  const size_t group = static_cast<size_t>(std::max(1, options.batcher.max_queued_items / 2));
  for (size_t at = 0; at < frames.size(); at += group) {
    std::vector<ImageInput> part(std::make_move_iterator(frames.begin() + at),
                                 std::make_move_iterator(frames.begin() +
                                                         std::min(frames.size(), at + group)));
    ASSIGN_OR_RETURN(std::vector<ItemEmbedding> r, video_batcher->Encode(std::move(part)));
    for (const ItemEmbedding& e : r) {
      all.num_tokens += e.num_tokens;
      all.values.insert(all.values.end(), e.values.begin(), e.values.end());
    }
  }
  return all;
}

EncoderCore::EncoderCore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EncoderCore::~EncoderCore() = default;

absl::StatusOr<std::unique_ptr<EncoderCore>> EncoderCore::Create(
    const EncoderCoreOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  Impl& s = *impl;
  // A checkpoint without config.json is an error of its own (the towers'
  // loaders read a missing tower as NotFound).
  RETURN_IF_ERROR(model::ReadConfigJsonText(options.model_dir).status());
  absl::StatusOr<std::unique_ptr<model::VisionTower>> v = model::VisionTower::Load(options.model_dir);
  if (v.ok()) {
    s.vision = *std::move(v);
  } else if (!absl::IsNotFound(v.status())) {
    return v.status();
  }
  absl::StatusOr<std::unique_ptr<model::AudioTower>> a = model::AudioTower::Load(options.model_dir);
  if (a.ok()) {
    s.audio = *std::move(a);
  } else if (!absl::IsNotFound(a.status())) {
    return a.status();
  }
  if (s.vision == nullptr && s.audio == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.model_dir, ": the model has neither a vision_config nor an audio_config"));
  }
  if (s.vision != nullptr) {
    s.options.image.patch_size = s.vision->config().patch_size;
    s.options.image.merge_size = s.vision->config().merge_size;
    s.hidden = s.vision->config().out_hidden_size;
  }
  if (s.audio != nullptr) {
    if (s.hidden != 0 && s.hidden != s.audio->config().out_hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.model_dir, ": vision out_hidden_size ", s.hidden, " != audio out_hidden_size ",
          s.audio->config().out_hidden_size));
    }
    s.hidden = s.audio->config().out_hidden_size;
    s.options.mel.n_mels = s.audio->config().num_mel_bins;
    s.options.wav.target_sample_rate = s.options.mel.sample_rate;
    ASSIGN_OR_RETURN(s.mel, media::MelFilterbank::Create(s.options.mel));
  }
  if (options.max_request_decoded_bytes < 1 ||
      options.max_decoded_bytes_in_flight < options.max_request_decoded_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "encoder: max_request_decoded_bytes (", options.max_request_decoded_bytes,
        ") must be >= 1 and <= max_decoded_bytes_in_flight (",
        options.max_decoded_bytes_in_flight, ")"));
  }
  s.budget = std::make_unique<DecodedBytesBudget>(DecodedBytesBudgetOptions{
      .capacity = options.max_decoded_bytes_in_flight, .max_wait = options.decoded_bytes_wait});
  if (s.vision != nullptr) s.options.video.model_input = s.options.image;
  s.options.video.max_decoded_bytes =
      std::min(s.options.video.max_decoded_bytes, options.max_request_decoded_bytes);
  s.image_params = media::ImageHashParams(s.options.image_decode, s.options.image);
  s.audio_params = media::AudioHashParams(s.options.wav, s.options.mel);
  s.video_params = media::VideoHashParams(s.options.video, s.options.image);
  EmbeddingCacheOptions co = options.cache;
  co.registry = options.registry;
  ASSIGN_OR_RETURN(s.cache, EmbeddingCache::Create(co));
  DynamicBatcherOptions bo = options.batcher;
  bo.registry = options.registry;
  if (options.registry != nullptr) {
    ASSIGN_OR_RETURN(metrics::HistogramFamily * pre,
                     options.registry->AddHistogram(
                         "swaserve_encoder_preprocess_seconds",
                         "Decode and preprocessing time of one item, by modality.", {"modality"},
                         metrics::DefaultLatencyBuckets()));
    s.image_seconds = &pre->WithLabels({"image"});
    s.audio_seconds = &pre->WithLabels({"audio"});
    s.video_seconds = &pre->WithLabels({"video"});
  }
  Impl* p = impl.get();
  if (s.vision != nullptr) {
    auto encode_images =
        [p](absl::Span<const ImageInput> batch) -> absl::StatusOr<std::vector<ItemEmbedding>> {
      std::vector<model::VisionInput> in;
      std::vector<int64_t> tokens;
      for (const ImageInput& x : batch) {
        in.push_back({.patches = *x.patches, .grid_h = x.grid_h, .grid_w = x.grid_w});
        tokens.push_back(p->vision->Tokens(x.grid_h, x.grid_w));
      }
      ASSIGN_OR_RETURN(std::vector<float> out, p->vision->Encode(in));
      return Split(out, tokens, p->hidden);
    };
    bo.modality = "image";
    ASSIGN_OR_RETURN(s.image_batcher,
                     (DynamicBatcher<ImageInput, ItemEmbedding>::Create(bo, encode_images)));
    bo.modality = "video";
    ASSIGN_OR_RETURN(s.video_batcher,
                     (DynamicBatcher<ImageInput, ItemEmbedding>::Create(bo, encode_images)));
  }
  if (s.audio != nullptr) {
    bo.modality = "audio";
    ASSIGN_OR_RETURN(
        s.audio_batcher,
        (DynamicBatcher<AudioInput, ItemEmbedding>::Create(
            bo, [p](absl::Span<const AudioInput> batch) -> absl::StatusOr<std::vector<ItemEmbedding>> {
              std::vector<model::AudioInput> in;
              std::vector<int64_t> tokens;
              for (const AudioInput& x : batch) {
                in.push_back({.mel = x.mel, .frames = x.frames});
                tokens.push_back(p->audio->Tokens(x.frames));
              }
              ASSIGN_OR_RETURN(std::vector<float> out, p->audio->Encode(in));
              return Split(out, tokens, p->hidden);
            })));
  }
  return std::unique_ptr<EncoderCore>(new EncoderCore(std::move(impl)));
}

base::Hash128 EncoderCore::ContentHash(const EncodeItem& item) const {
  const std::string& params = item.modality == Modality::kAudio   ? impl_->audio_params
                              : item.modality == Modality::kVideo ? impl_->video_params
                                                                  : impl_->image_params;
  return media::ContentHash(Bytes(item.data), params);
}

absl::StatusOr<std::vector<EncodedItem>> EncoderCore::Encode(absl::Span<const EncodeItem> items) {
  std::vector<EncodedItem> out(items.size());
  // Cache misses: their decoded bytes declared by their headers, checked
  // against the request's budget and reserved in the encoder's before any
  // is decoded.
  std::vector<size_t> misses;
  int64_t declared = 0;
  bool unknown = false;
  std::string each;  // "item 0 (video) N bytes, ..."
  for (size_t i = 0; i < items.size(); ++i) {
    const EncodeItem& it = items[i];
    if (it.data.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, " (", ModalityName(it.modality), "): no data"));
    }
    out[i].content_hash = ContentHash(it);
    if (auto hit = impl_->cache->Get(out[i].content_hash)) {
      out[i].embedding = std::move(hit);
      out[i].cache_hit = true;
      continue;
    }
    ASSIGN_OR_RETURN(const int64_t bytes, impl_->DecodedBytes(i, it, &unknown));
    declared += bytes;
    absl::StrAppend(&each, each.empty() ? "" : ", ", "item ", i, " (", ModalityName(it.modality),
                    ") ", bytes);
    misses.push_back(i);
  }
  const int64_t limit = impl_->options.max_request_decoded_bytes;
  if (declared > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request's media would decode to ", declared,
        " bytes, over the per-request decoded-bytes budget of ", limit, " bytes (", each, ")"));
  }
  ASSIGN_OR_RETURN(const DecodedBytesBudget::Reservation reservation,
                   impl_->budget->Acquire(unknown ? limit : declared));
  // Preprocessed here (in parallel across requests), then encoded together
  // per modality (batched with other requests' items).
  std::vector<ImageInput> images;
  std::vector<AudioInput> clips;
  std::vector<size_t> image_at, clip_at, video_at;
  std::vector<std::vector<ImageInput>> videos;
  for (const size_t i : misses) {
    const EncodeItem& it = items[i];
    if (it.modality == Modality::kVideo) {
      ASSIGN_OR_RETURN(std::vector<ImageInput> f, impl_->PrepareVideo(i, it.data));
      videos.push_back(std::move(f));
      video_at.push_back(i);
    } else if (it.modality == Modality::kImage) {
      ASSIGN_OR_RETURN(ImageInput x, impl_->PrepareImage(i, it.data));
      images.push_back(std::move(x));
      image_at.push_back(i);
    } else {
      ASSIGN_OR_RETURN(AudioInput x, impl_->PrepareAudio(i, it.data));
      clips.push_back(std::move(x));
      clip_at.push_back(i);
    }
  }
  auto store = [&](const std::vector<size_t>& at, std::vector<ItemEmbedding> r) {
    for (size_t k = 0; k < at.size(); ++k) {
      auto shared = std::make_shared<const ItemEmbedding>(std::move(r[k]));
      impl_->cache->Put(out[at[k]].content_hash, shared);
      out[at[k]].embedding = std::move(shared);
    }
  };
  if (!images.empty()) {
    ASSIGN_OR_RETURN(std::vector<ItemEmbedding> r, impl_->image_batcher->Encode(std::move(images)));
    store(image_at, std::move(r));
  }
  if (!clips.empty()) {
    ASSIGN_OR_RETURN(std::vector<ItemEmbedding> r, impl_->audio_batcher->Encode(std::move(clips)));
    store(clip_at, std::move(r));
  }
  for (size_t k = 0; k < videos.size(); ++k) {
    ASSIGN_OR_RETURN(ItemEmbedding e, impl_->EncodeVideo(std::move(videos[k])));
    std::vector<ItemEmbedding> one;
    one.push_back(std::move(e));
    store({video_at[k]}, std::move(one));
  }
  return out;
}

bool EncoderCore::has_vision() const { return impl_->vision != nullptr; }
bool EncoderCore::has_audio() const { return impl_->audio != nullptr; }
int EncoderCore::hidden_size() const { return impl_->hidden; }
std::shared_ptr<const ItemEmbedding> EncoderCore::Cached(const base::Hash128& content_hash) const {
  return impl_->cache->Peek(content_hash);
}

EmbeddingCacheStats EncoderCore::cache_stats() const { return impl_->cache->stats(); }

int64_t EncoderCore::decoded_bytes_in_flight() const { return impl_->budget->in_flight(); }

absl::StatusOr<int64_t> EncoderCore::DecodedBytes(const EncodeItem& item) const {
  bool unknown = false;
  return impl_->DecodedBytes(0, item, &unknown);
}

}  // namespace swaserve::encoder
