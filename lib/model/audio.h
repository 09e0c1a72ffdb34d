// The audio tower: a Whisper-style encoder that turns
// a clip's log-mel spectrogram (lib/media/mel.h, [frames, n_mels]) into
// placeholder-token embeddings of the language model's hidden size, as
// Qwen2-Audio's encoder does. Every formula is written here so the PyTorch
// reference (tools/reference/audio_reference.py) reproduces it independently:
//
// Input: x [T, n_mels] (T frames).
// 1. conv1: y1[t][o] = b1[o] + Σ_{c, k<3} W1[o][c][k] · x[t + k − 1][c] (zeros
//    outside [0, T)), then GELU (exact erf form). audio_tower.conv1.weight
//    [D, n_mels, 3], .bias [D].
// 2. conv2, stride 2: y2[s][o] = b2[o] + Σ_{c, k<3} W2[o][c][k] · y1[2s + k − 1][c]
//    for s < T' = ceil(T / 2), then GELU. audio_tower.conv2.* [D, D, 3], [D].
// 3. h[s] = y2[s] + P[s]: Whisper's sinusoids, P[s][i] = sin(s · e^(−i · ln(10000)
//    / (D/2 − 1))) for i < D/2 and cos(s · e^(−(i − D/2) · ln(10000) / (D/2 − 1)))
//    for i >= D/2.
// 4. Layers i < encoder_layers (audio_tower.layers.{i}.*), pre-norm:
//      a = LN(h, self_attn_layer_norm); q = a·Wq^T + bq, k = a·Wk^T (no
//      bias), v = a·Wv^T + bv (self_attn.q_proj / k_proj / v_proj [D, D]);
//      per head, o = softmax(q·k^T / sqrt(d)) · v over all T' frames
//      (bidirectional); h += o · Wo^T + bo (self_attn.out_proj);
//      b = LN(h, final_layer_norm); h += GELU(b·W1^T + b1) · W2^T + b2
//      (fc1 [F, D], fc2 [D, F]).
// 5. u = LN(h, audio_tower.layer_norm); token j (of ceil(T' / m), m =
//    merge_size) is the mean of u's rows [j·m, min(T', (j + 1)·m)); out =
//    token · Wp^T + bp (audio_tower.proj [out_hidden, D]).
// LN(x) = (x − mean) / sqrt(var + eps) · weight + bias (biased variance).
// Token count: media::AudioPlaceholderTokens with conv_stride 2 and this
// merge_size.
//
// Thread-safety: a loaded AudioTower is immutable; Encode is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swaserve::model {

// config.json "audio_config" (Whisper / Qwen2-Audio field names).
struct AudioConfig {
  int num_mel_bins = 80;
  int d_model = 0;                  // D
  int encoder_layers = 0;
  int encoder_attention_heads = 0;
  int encoder_ffn_dim = 0;          // F
  int out_hidden_size = 0;          // the language model's hidden size
  int merge_size = 1;               // frames pooled per token after conv2
  int max_source_positions = 1500;  // most frames after conv2 (30 s)
  double layer_norm_eps = 1e-5;

  int head_dim() const {
    return encoder_attention_heads > 0 ? d_model / encoder_attention_heads : 0;
  }
  absl::Status Validate() const;
  // The "audio_config" object of config.json text; NotFound when absent.
  static absl::StatusOr<AudioConfig> FromConfigJson(absl::string_view json,
                                                    absl::string_view source);
  std::string ToJson() const;
  bool operator==(const AudioConfig&) const = default;
};

// A tiny tower for tests (make-model --audio): 80 mels, D 64, 2 layers of 4
// heads, F 128, merge 2, projecting to `out_hidden`.
AudioConfig TinyAudioConfig(int out_hidden);

std::vector<std::pair<std::string, std::vector<int64_t>>> AudioTensorShapes(
    const AudioConfig& config);

// Seeded random weights (tower_io.h WriteRandomTower): <dir>/audio.safetensors
// and config.json's audio_config.
absl::Status WriteRandomAudioTower(const AudioConfig& config, uint64_t seed,
                                   const std::string& dir);

// One clip's log-mel frames for Encode.
struct AudioInput {
  absl::Span<const float> mel;  // [frames, num_mel_bins]
  int frames = 0;
};

class AudioTower {
 public:
  // From a checkpoint directory: config.json's audio_config and the
  // audio_tower.* tensors of its *.safetensors files. NotFound without an
  // audio_config; InvalidArgument naming a missing or misshaped tensor.
  static absl::StatusOr<std::unique_ptr<AudioTower>> Load(const std::string& dir);
  static absl::StatusOr<std::unique_ptr<AudioTower>> FromTensors(
      const AudioConfig& config,
      const std::vector<std::pair<std::string, std::vector<float>>>& tensors);
  ~AudioTower();

  const AudioConfig& config() const { return config_; }
  // Placeholder tokens of a clip of `frames` mel frames.
  int64_t Tokens(int frames) const;
  // Embeddings of every clip, concatenated: [Σ tokens, out_hidden]. Clips go
  // through each linear layer as one matrix; each clip's rows are computed
  // as when it is encoded alone (batch-invariant kernels). InvalidArgument
  // for an empty clip, a size mismatch, or a clip longer than
  // max_source_positions after conv2 ("audio too long").
  absl::StatusOr<std::vector<float>> Encode(absl::Span<const AudioInput> inputs) const;

 private:
  struct Weights;
  AudioTower(AudioConfig config, std::unique_ptr<Weights> weights);
  AudioConfig config_;
  std::unique_ptr<Weights> w_;
};

}  // namespace swaserve::model
