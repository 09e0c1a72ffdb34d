#include "lib/model/audio.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/tower_io.h"

namespace swaserve::model {
namespace {

using Json = nlohmann::json;

std::string Layer(int i, absl::string_view rest) {
  return absl::StrCat("audio_tower.layers.", i, ".", rest);
}

// LN per row: (x − mean) / sqrt(var + eps) · w + b (biased variance; sums in
// index order, in double).
void LayerNorm(const float* x, const std::vector<float>& w, const std::vector<float>& b,
               float* y, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < dim; ++j) mean += xr[j];
    mean /= static_cast<double>(dim);
    for (int64_t j = 0; j < dim; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<double>(dim);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < dim; ++j) {
      y[r * dim + j] = static_cast<float>((xr[j] - mean) * inv) * w[j] + b[j];
    }
  }
}

// Rows of a kernel-3, padding-1 Conv1d's input as [out_rows, channels·3]
// (index c·3 + k, as Conv1d's weight [out, in, 3] flattens), stride 1 or 2.
void Im2Col(const float* x, int64_t in_rows, int64_t channels, int stride, int64_t out_rows,
            float* col) {
  for (int64_t s = 0; s < out_rows; ++s) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int k = 0; k < 3; ++k) {
        const int64_t t = s * stride + k - 1;
        col[(s * channels + c) * 3 + k] = t >= 0 && t < in_rows ? x[t * channels + c] : 0.0f;
      }
    }
  }
}

absl::Status ReadField(const Json& o, const char* name, bool required, int* out,
                       absl::string_view source) {
  auto it = o.find(name);
  if (it == o.end()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": audio_config.", name, " is missing"));
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": audio_config.", name, " must be a non-negative integer"));
  }
  *out = it->get<int>();
  return absl::OkStatus();
}

}  // namespace

absl::Status AudioConfig::Validate() const {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("audio_config.", parts...));
  };
  if (num_mel_bins <= 0) return bad("num_mel_bins must be > 0");
  if (d_model <= 0 || d_model % 2 != 0 || d_model < 4) {
    return bad("d_model = ", d_model, " must be even and >= 4");
  }
  if (encoder_layers <= 0) return bad("encoder_layers must be > 0");
  if (encoder_attention_heads <= 0 || d_model % encoder_attention_heads != 0) {
    return bad("encoder_attention_heads = ", encoder_attention_heads, " must divide d_model = ",
               d_model);
  }
  if (encoder_ffn_dim <= 0) return bad("encoder_ffn_dim must be > 0");
  if (out_hidden_size <= 0) return bad("out_hidden_size must be > 0");
  if (merge_size <= 0) return bad("merge_size must be > 0");
  if (max_source_positions <= 0) return bad("max_source_positions must be > 0");
  if (!(layer_norm_eps > 0)) return bad("layer_norm_eps must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<AudioConfig> AudioConfig::FromConfigJson(absl::string_view json,
                                                        absl::string_view source) {
  Json root = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto it = root.find("audio_config");
  if (it == root.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(source, ": no audio_config"));
  }
  if (!it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": audio_config must be an object"));
  }
  const Json& o = *it;
  AudioConfig c;
  RETURN_IF_ERROR(ReadField(o, "num_mel_bins", false, &c.num_mel_bins, source));
  RETURN_IF_ERROR(ReadField(o, "d_model", true, &c.d_model, source));
  RETURN_IF_ERROR(ReadField(o, "encoder_layers", true, &c.encoder_layers, source));
  RETURN_IF_ERROR(
      ReadField(o, "encoder_attention_heads", true, &c.encoder_attention_heads, source));
  RETURN_IF_ERROR(ReadField(o, "encoder_ffn_dim", true, &c.encoder_ffn_dim, source));
  RETURN_IF_ERROR(ReadField(o, "out_hidden_size", true, &c.out_hidden_size, source));
  RETURN_IF_ERROR(ReadField(o, "merge_size", false, &c.merge_size, source));
  RETURN_IF_ERROR(ReadField(o, "max_source_positions", false, &c.max_source_positions, source));
  if (auto e = o.find("layer_norm_eps"); e != o.end()) {
    if (!e->is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": audio_config.layer_norm_eps must be a number"));
    }
    c.layer_norm_eps = e->get<double>();
  }
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return c;
}

std::string AudioConfig::ToJson() const {
  return Json{{"num_mel_bins", num_mel_bins},
              {"d_model", d_model},
              {"encoder_layers", encoder_layers},
              {"encoder_attention_heads", encoder_attention_heads},
              {"encoder_ffn_dim", encoder_ffn_dim},
              {"out_hidden_size", out_hidden_size},
              {"merge_size", merge_size},
              {"max_source_positions", max_source_positions},
              {"layer_norm_eps", layer_norm_eps}}
      .dump();
}

AudioConfig TinyAudioConfig(int out_hidden) {
  return AudioConfig{.num_mel_bins = 80,
                     .d_model = 64,
                     .encoder_layers = 2,
                     .encoder_attention_heads = 4,
                     .encoder_ffn_dim = 128,
                     .out_hidden_size = out_hidden,
                     .merge_size = 2};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> AudioTensorShapes(
    const AudioConfig& c) {
  const int64_t d = c.d_model, f = c.encoder_ffn_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {
      {"audio_tower.conv1.weight", {d, c.num_mel_bins, 3}},
      {"audio_tower.conv1.bias", {d}},
      {"audio_tower.conv2.weight", {d, d, 3}},
      {"audio_tower.conv2.bias", {d}}};
  for (int i = 0; i < c.encoder_layers; ++i) {
    for (const char* ln : {"self_attn_layer_norm", "final_layer_norm"}) {
      out.push_back({Layer(i, absl::StrCat(ln, ".weight")), {d}});
      out.push_back({Layer(i, absl::StrCat(ln, ".bias")), {d}});
    }
    for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      out.push_back({Layer(i, absl::StrCat("self_attn.", p, ".weight")), {d, d}});
      if (std::string(p) != "k_proj") {
        out.push_back({Layer(i, absl::StrCat("self_attn.", p, ".bias")), {d}});
      }
    }
    out.push_back({Layer(i, "fc1.weight"), {f, d}});
    out.push_back({Layer(i, "fc1.bias"), {f}});
    out.push_back({Layer(i, "fc2.weight"), {d, f}});
    out.push_back({Layer(i, "fc2.bias"), {d}});
  }
  out.push_back({"audio_tower.layer_norm.weight", {d}});
  out.push_back({"audio_tower.layer_norm.bias", {d}});
  out.push_back({"audio_tower.proj.weight", {c.out_hidden_size, d}});
  out.push_back({"audio_tower.proj.bias", {c.out_hidden_size}});
  return out;
}

absl::Status WriteRandomAudioTower(const AudioConfig& config, uint64_t seed,
                                   const std::string& dir) {
  RETURN_IF_ERROR(config.Validate());
  return WriteRandomTower(dir, "audio.safetensors", AudioTensorShapes(config), seed,
                          "audio_config", config.ToJson());
}

struct AudioTower::Weights {
  struct LayerW {
    std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b, q_b, v_b, o_b, fc1_b, fc2_b;
    PackedWeight q, k, v, o, fc1, fc2;
  };
  PackedWeight conv1, conv2, proj;
  std::vector<float> conv1_b, conv2_b, ln_w, ln_b, proj_b;
  std::vector<LayerW> layers;
};

AudioTower::AudioTower(AudioConfig config, std::unique_ptr<Weights> weights)
    : config_(std::move(config)), w_(std::move(weights)) {}
AudioTower::~AudioTower() = default;

absl::StatusOr<std::unique_ptr<AudioTower>> AudioTower::FromTensors(
    const AudioConfig& config,
    const std::vector<std::pair<std::string, std::vector<float>>>& tensors) {
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(const TowerTensors t,
                   TowerTensors::Create(AudioTensorShapes(config), tensors, "audio tower"));
  auto w = std::make_unique<Weights>();
  w->conv1 = t.Packed("audio_tower.conv1.weight");
  w->conv1_b = t.Vec("audio_tower.conv1.bias");
  w->conv2 = t.Packed("audio_tower.conv2.weight");
  w->conv2_b = t.Vec("audio_tower.conv2.bias");
  for (int i = 0; i < config.encoder_layers; ++i) {
    Weights::LayerW l;
    l.ln1_w = t.Vec(Layer(i, "self_attn_layer_norm.weight"));
    l.ln1_b = t.Vec(Layer(i, "self_attn_layer_norm.bias"));
    l.ln2_w = t.Vec(Layer(i, "final_layer_norm.weight"));
    l.ln2_b = t.Vec(Layer(i, "final_layer_norm.bias"));
    l.q = t.Packed(Layer(i, "self_attn.q_proj.weight"));
    l.q_b = t.Vec(Layer(i, "self_attn.q_proj.bias"));
    l.k = t.Packed(Layer(i, "self_attn.k_proj.weight"));
    l.v = t.Packed(Layer(i, "self_attn.v_proj.weight"));
    l.v_b = t.Vec(Layer(i, "self_attn.v_proj.bias"));
    l.o = t.Packed(Layer(i, "self_attn.out_proj.weight"));
    l.o_b = t.Vec(Layer(i, "self_attn.out_proj.bias"));
    l.fc1 = t.Packed(Layer(i, "fc1.weight"));
    l.fc1_b = t.Vec(Layer(i, "fc1.bias"));
    l.fc2 = t.Packed(Layer(i, "fc2.weight"));
    l.fc2_b = t.Vec(Layer(i, "fc2.bias"));
    w->layers.push_back(std::move(l));
  }
  w->ln_w = t.Vec("audio_tower.layer_norm.weight");
  w->ln_b = t.Vec("audio_tower.layer_norm.bias");
  w->proj = t.Packed("audio_tower.proj.weight");
  w->proj_b = t.Vec("audio_tower.proj.bias");
  return std::unique_ptr<AudioTower>(new AudioTower(config, std::move(w)));
}

absl::StatusOr<std::unique_ptr<AudioTower>> AudioTower::Load(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string text, ReadConfigJsonText(dir));
  ASSIGN_OR_RETURN(AudioConfig config, AudioConfig::FromConfigJson(text, dir + "/config.json"));
  ASSIGN_OR_RETURN(auto tensors, LoadTensorsF32(dir, "audio_tower."));
  return FromTensors(config, tensors);
}

int64_t AudioTower::Tokens(int frames) const {
  const int64_t after_conv = (int64_t{frames} + 1) / 2;
  return (after_conv + config_.merge_size - 1) / config_.merge_size;
}

absl::StatusOr<std::vector<float>> AudioTower::Encode(absl::Span<const AudioInput> inputs) const {
  const AudioConfig& c = config_;
  const int64_t D = c.d_model, M = c.num_mel_bins, F = c.encoder_ffn_dim;
  // Per clip: its first row after conv2 and its row count T'.
  std::vector<int64_t> row0 = {0}, in_row0 = {0};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const AudioInput& a = inputs[i];
    if (a.frames <= 0 || static_cast<int64_t>(a.mel.size()) != int64_t{a.frames} * M) {
      return absl::InvalidArgumentError(absl::StrCat("audio input ", i, ": ", a.mel.size(),
                                                     " values for ", a.frames, " frames of ",
                                                     M, " mel bins"));
    }
    const int64_t t2 = (int64_t{a.frames} + 1) / 2;
    if (t2 > c.max_source_positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "audio input ", i, " is too long: ", a.frames, " mel frames, at most ",
          2 * int64_t{c.max_source_positions}, " (max_source_positions ",
          c.max_source_positions, ")"));
    }
    row0.push_back(row0.back() + t2);
    in_row0.push_back(in_row0.back() + a.frames);
  }
  const int64_t rows = row0.back();
  if (rows == 0) return std::vector<float>{};
  // conv1 (stride 1) and conv2 (stride 2), each clip padded on its own.
  std::vector<float> col(static_cast<size_t>(in_row0.back()) * std::max(M, D) * 3);
  std::vector<float> y1(static_cast<size_t>(in_row0.back()) * D), h(rows * D);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Im2Col(inputs[i].mel.data(), inputs[i].frames, M, 1, inputs[i].frames,
           col.data() + in_row0[i] * M * 3);
  }
  MatMul(col.data(), in_row0.back(), w_->conv1, y1.data());
  AddBias(y1.data(), in_row0.back(), w_->conv1_b);
  for (float& v : y1) v = GeluErf(v);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Im2Col(y1.data() + in_row0[i] * D, inputs[i].frames, D, 2, row0[i + 1] - row0[i],
           col.data() + row0[i] * D * 3);
  }
  MatMul(col.data(), rows, w_->conv2, h.data());
  AddBias(h.data(), rows, w_->conv2_b);
  for (float& v : h) v = GeluErf(v);
  const int64_t half = D / 2;
  const double step = std::log(10000.0) / static_cast<double>(half - 1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (int64_t s = 0; s < row0[i + 1] - row0[i]; ++s) {
      float* r = h.data() + (row0[i] + s) * D;
      for (int64_t j = 0; j < half; ++j) {
        const double a = static_cast<double>(s) * std::exp(-static_cast<double>(j) * step);
        r[j] += static_cast<float>(std::sin(a));
        r[j + half] += static_cast<float>(std::cos(a));
      }
    }
  }
  std::vector<float> a(rows * D), qkv(rows * 3 * D), o(rows * D), t(rows * D), f(rows * F);
  std::vector<float> scores;
  std::vector<int64_t> keys;
  for (const Weights::LayerW& l : w_->layers) {
    LayerNorm(h.data(), l.ln1_w, l.ln1_b, a.data(), rows, D, c.layer_norm_eps);
    MatMul(a.data(), rows, l.q, qkv.data(), 3 * D);
    MatMul(a.data(), rows, l.k, qkv.data() + D, 3 * D);
    MatMul(a.data(), rows, l.v, qkv.data() + 2 * D, 3 * D);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < D; ++j) {
        qkv[r * 3 * D + j] += l.q_b[j];
        qkv[r * 3 * D + 2 * D + j] += l.v_b[j];
      }
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      keys.clear();
      for (int64_t r = row0[i]; r < row0[i + 1]; ++r) keys.push_back(r);
      for (int64_t r = row0[i]; r < row0[i + 1]; ++r) {
        AttendRows(qkv.data(), D, c.encoder_attention_heads, c.head_dim(), r, keys,
                   o.data() + r * D, &scores);
      }
    }
    MatMul(o.data(), rows, l.o, t.data());
    AddBias(t.data(), rows, l.o_b);
    for (int64_t k = 0; k < rows * D; ++k) h[k] += t[k];
    LayerNorm(h.data(), l.ln2_w, l.ln2_b, a.data(), rows, D, c.layer_norm_eps);
    MatMul(a.data(), rows, l.fc1, f.data());
    AddBias(f.data(), rows, l.fc1_b);
    for (float& v : f) v = GeluErf(v);
    MatMul(f.data(), rows, l.fc2, t.data());
    AddBias(t.data(), rows, l.fc2_b);
    for (int64_t k = 0; k < rows * D; ++k) h[k] += t[k];
  }
  LayerNorm(h.data(), w_->ln_w, w_->ln_b, a.data(), rows, D, c.layer_norm_eps);
  // Pool merge_size rows per token (a clip's last token may pool fewer).
  std::vector<float> pooled;
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (int64_t s = row0[i]; s < row0[i + 1]; s += c.merge_size) {
      const int64_t e = std::min(row0[i + 1], s + c.merge_size);
      for (int64_t j = 0; j < D; ++j) {
        float sum = 0;
        for (int64_t r = s; r < e; ++r) sum += a[r * D + j];
        pooled.push_back(sum / static_cast<float>(e - s));
      }
    }
  }
  const int64_t tokens = static_cast<int64_t>(pooled.size()) / D;
  std::vector<float> out(tokens * c.out_hidden_size);
  MatMul(pooled.data(), tokens, w_->proj, out.data());
  AddBias(out.data(), tokens, w_->proj_b);
  return out;
}

}  // namespace swaserve::model
