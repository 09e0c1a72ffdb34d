#include "lib/model/vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/tower_io.h"

namespace swaserve::model {
namespace {

using Json = nlohmann::json;

absl::Status ReadInt(const Json& o, const char* name, bool required, int* out,
                     absl::string_view source) {
  auto it = o.find(name);
  if (it == o.end()) {
    if (required) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": vision_config.", name, " is missing"));
    }
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": vision_config.", name, " must be an integer"));
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": vision_config.", name, " = ", v, " is out of range"));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ReadDouble(const Json& o, const char* name, double* out, absl::string_view source) {
  auto it = o.find(name);
  if (it == o.end()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": vision_config.", name, " must be a number"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

std::string Block(int i, absl::string_view rest) { return absl::StrCat("visual.blocks.", i, ".", rest); }

// NeoX rotation of each head's dims (j, j + d/2) by angle[j].
void Rotate(float* v, int heads, int d, const float* cos, const float* sin) {
  const int half = d / 2;
  for (int h = 0; h < heads; ++h) {
    float* x = v + static_cast<int64_t>(h) * d;
    for (int j = 0; j < half; ++j) {
      const float x1 = x[j], x2 = x[j + half];
      x[j] = x1 * cos[j] - x2 * sin[j];
      x[j + half] = x2 * cos[j] + x1 * sin[j];
    }
  }
}

// Bidirectional attention of every image's patches (vision.h, step 3): over
// the image, or the query's window (keys in row-major order).
void Attend(const VisionConfig& c, absl::Span<const VisionInput> inputs,
            const std::vector<int64_t>& row0, bool full, const std::vector<float>& qkv,
            std::vector<float>* o) {
  const int64_t D = c.hidden_size;
  const int ws = c.window_patches();
  std::vector<float> scores;
  std::vector<int64_t> keys;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int gh = inputs[i].grid_h, gw = inputs[i].grid_w;
    for (int qy = 0; qy < gh; ++qy) {
      for (int qx = 0; qx < gw; ++qx) {
        const int y0 = full ? 0 : qy / ws * ws, y1 = full ? gh : std::min(gh, y0 + ws);
        const int x0 = full ? 0 : qx / ws * ws, x1 = full ? gw : std::min(gw, x0 + ws);
        keys.clear();
        for (int ky = y0; ky < y1; ++ky) {
          for (int kx = x0; kx < x1; ++kx) keys.push_back(row0[i] + int64_t{ky} * gw + kx);
        }
        const int64_t qr = row0[i] + int64_t{qy} * gw + qx;
        AttendRows(qkv.data(), D, c.num_heads, c.head_dim(), qr, keys, o->data() + qr * D,
                   &scores);
      }
    }
  }
}

}  // namespace

bool VisionConfig::IsFullAttention(int block) const {
  return window_patches() <= 0 ||
         std::find(fullatt_block_indexes.begin(), fullatt_block_indexes.end(), block) !=
             fullatt_block_indexes.end();
}

absl::Status VisionConfig::Validate() const {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("vision_config.", parts...));
  };
  if (patch_size <= 0) return bad("patch_size must be > 0");
  if (merge_size <= 0) return bad("spatial_merge_size must be > 0");
  if (hidden_size <= 0) return bad("hidden_size must be > 0");
  if (depth <= 0) return bad("depth must be > 0");
  if (num_heads <= 0 || hidden_size % num_heads != 0) {
    return bad("num_heads = ", num_heads, " must divide hidden_size = ", hidden_size);
  }
  if (head_dim() % 4 != 0) return bad("head dim ", head_dim(), " must be a multiple of 4");
  if (intermediate_size <= 0) return bad("intermediate_size must be > 0");
  if (out_hidden_size <= 0) return bad("out_hidden_size must be > 0");
  if (window_size < 0 || (window_size > 0 && window_size % patch_size != 0)) {
    return bad("window_size = ", window_size, " must be a multiple of patch_size = ", patch_size);
  }
  for (int i : fullatt_block_indexes) {
    if (i < 0 || i >= depth) return bad("fullatt_block_indexes: ", i, " is not a block");
  }
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps must be > 0");
  if (!(rope_theta > 0)) return bad("rope_theta must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<VisionConfig> VisionConfig::FromConfigJson(absl::string_view json,
                                                          absl::string_view source) {
  Json root = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto it = root.find("vision_config");
  if (it == root.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(source, ": no vision_config"));
  }
  if (!it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": vision_config must be an object"));
  }
  const Json& o = *it;
  VisionConfig c;
  RETURN_IF_ERROR(ReadInt(o, "patch_size", true, &c.patch_size, source));
  RETURN_IF_ERROR(ReadInt(o, "spatial_merge_size", false, &c.merge_size, source));
  RETURN_IF_ERROR(ReadInt(o, "hidden_size", true, &c.hidden_size, source));
  RETURN_IF_ERROR(ReadInt(o, "depth", true, &c.depth, source));
  RETURN_IF_ERROR(ReadInt(o, "num_heads", true, &c.num_heads, source));
  RETURN_IF_ERROR(ReadInt(o, "intermediate_size", true, &c.intermediate_size, source));
  RETURN_IF_ERROR(ReadInt(o, "out_hidden_size", true, &c.out_hidden_size, source));
  RETURN_IF_ERROR(ReadInt(o, "window_size", false, &c.window_size, source));
  RETURN_IF_ERROR(ReadDouble(o, "rms_norm_eps", &c.rms_norm_eps, source));
  RETURN_IF_ERROR(ReadDouble(o, "rope_theta", &c.rope_theta, source));
  if (auto f = o.find("fullatt_block_indexes"); f != o.end()) {
    if (!f->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": vision_config.fullatt_block_indexes must be an array"));
    }
    for (const Json& v : *f) {
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": vision_config.fullatt_block_indexes must hold integers"));
      }
      c.fullatt_block_indexes.push_back(v.get<int>());
    }
  }
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return c;
}

std::string VisionConfig::ToJson() const {
  Json o = {{"patch_size", patch_size},
            {"spatial_merge_size", merge_size},
            {"hidden_size", hidden_size},
            {"depth", depth},
            {"num_heads", num_heads},
            {"intermediate_size", intermediate_size},
            {"out_hidden_size", out_hidden_size},
            {"window_size", window_size},
            {"fullatt_block_indexes", fullatt_block_indexes},
            {"rms_norm_eps", rms_norm_eps},
            {"rope_theta", rope_theta}};
  return o.dump();
}

VisionConfig TinyVisionConfig(int out_hidden) {
  return VisionConfig{.patch_size = 14,
                      .merge_size = 2,
                      .hidden_size = 64,
                      .depth = 4,
                      .num_heads = 4,
                      .intermediate_size = 128,
                      .out_hidden_size = out_hidden,
                      .window_size = 112,
                      .fullatt_block_indexes = {1, 3}};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> VisionTensorShapes(
    const VisionConfig& c) {
  const int64_t d = c.hidden_size, in = 3 * c.patch_size * c.patch_size, ff = c.intermediate_size;
  const int64_t md = d * c.merge_size * c.merge_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {
      {"visual.patch_embed.proj.weight", {d, in}}};
  for (int i = 0; i < c.depth; ++i) {
    out.push_back({Block(i, "norm1.weight"), {d}});
    out.push_back({Block(i, "norm2.weight"), {d}});
    out.push_back({Block(i, "attn.qkv.weight"), {3 * d, d}});
    out.push_back({Block(i, "attn.qkv.bias"), {3 * d}});
    out.push_back({Block(i, "attn.proj.weight"), {d, d}});
    out.push_back({Block(i, "attn.proj.bias"), {d}});
    for (const char* p : {"gate_proj", "up_proj"}) {
      out.push_back({Block(i, absl::StrCat("mlp.", p, ".weight")), {ff, d}});
      out.push_back({Block(i, absl::StrCat("mlp.", p, ".bias")), {ff}});
    }
    out.push_back({Block(i, "mlp.down_proj.weight"), {d, ff}});
    out.push_back({Block(i, "mlp.down_proj.bias"), {d}});
  }
  out.push_back({"visual.merger.ln_q.weight", {d}});
  out.push_back({"visual.merger.mlp.0.weight", {md, md}});
  out.push_back({"visual.merger.mlp.0.bias", {md}});
  out.push_back({"visual.merger.mlp.2.weight", {c.out_hidden_size, md}});
  out.push_back({"visual.merger.mlp.2.bias", {c.out_hidden_size}});
  return out;
}

struct VisionTower::Weights {
  struct Layer {
    std::vector<float> norm1, norm2, qkv_b, proj_b, gate_b, up_b, down_b;
    PackedWeight qkv, proj, gate, up, down;
  };
  PackedWeight patch;
  std::vector<Layer> layers;
  std::vector<float> ln_q, m0_b, m2_b;
  PackedWeight m0, m2;
};

VisionTower::VisionTower(VisionConfig config, std::unique_ptr<Weights> weights)
    : config_(std::move(config)), w_(std::move(weights)) {}
VisionTower::~VisionTower() = default;

absl::StatusOr<std::unique_ptr<VisionTower>> VisionTower::FromTensors(
    const VisionConfig& config,
    const std::vector<std::pair<std::string, std::vector<float>>>& tensors) {
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(const TowerTensors t,
                   TowerTensors::Create(VisionTensorShapes(config), tensors, "vision tower"));
  auto vec = [&](const std::string& n) { return t.Vec(n); };
  auto packed = [&](const std::string& n) { return t.Packed(n); };
  auto w = std::make_unique<Weights>();
  w->patch = packed("visual.patch_embed.proj.weight");
  for (int i = 0; i < config.depth; ++i) {
    Weights::Layer l;
    l.norm1 = vec(Block(i, "norm1.weight"));
    l.norm2 = vec(Block(i, "norm2.weight"));
    l.qkv = packed(Block(i, "attn.qkv.weight"));
    l.qkv_b = vec(Block(i, "attn.qkv.bias"));
    l.proj = packed(Block(i, "attn.proj.weight"));
    l.proj_b = vec(Block(i, "attn.proj.bias"));
    l.gate = packed(Block(i, "mlp.gate_proj.weight"));
    l.gate_b = vec(Block(i, "mlp.gate_proj.bias"));
    l.up = packed(Block(i, "mlp.up_proj.weight"));
    l.up_b = vec(Block(i, "mlp.up_proj.bias"));
    l.down = packed(Block(i, "mlp.down_proj.weight"));
    l.down_b = vec(Block(i, "mlp.down_proj.bias"));
    w->layers.push_back(std::move(l));
  }
  w->ln_q = vec("visual.merger.ln_q.weight");
  w->m0 = packed("visual.merger.mlp.0.weight");
  w->m0_b = vec("visual.merger.mlp.0.bias");
  w->m2 = packed("visual.merger.mlp.2.weight");
  w->m2_b = vec("visual.merger.mlp.2.bias");
  return std::unique_ptr<VisionTower>(new VisionTower(config, std::move(w)));
}

absl::StatusOr<std::unique_ptr<VisionTower>> VisionTower::Load(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string text, ReadConfigJsonText(dir));
  ASSIGN_OR_RETURN(VisionConfig config,
                   VisionConfig::FromConfigJson(text, dir + "/config.json"));
  ASSIGN_OR_RETURN(auto tensors, LoadTensorsF32(dir, "visual."));
  return FromTensors(config, tensors);
}

int64_t VisionTower::Tokens(int grid_h, int grid_w) const {
  const int m = config_.merge_size;
  return static_cast<int64_t>(grid_h / m) * (grid_w / m);
}

absl::StatusOr<std::vector<float>> VisionTower::Encode(
    absl::Span<const VisionInput> inputs) const {
  const VisionConfig& c = config_;
  const int64_t D = c.hidden_size, in_dim = 3 * c.patch_size * c.patch_size;
  const int m = c.merge_size, heads = c.num_heads, hd = c.head_dim();
  // Rows of every image, stacked.
  std::vector<int64_t> row0 = {0};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const VisionInput& x = inputs[i];
    if (x.grid_h <= 0 || x.grid_w <= 0 || x.grid_h % m != 0 || x.grid_w % m != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vision input ", i, ": grid ", x.grid_h, " x ", x.grid_w,
          " must be positive multiples of spatial_merge_size ", m));
    }
    const int64_t n = int64_t{x.grid_h} * x.grid_w;
    if (static_cast<int64_t>(x.patches.size()) != n * in_dim) {
      return absl::InvalidArgumentError(absl::StrCat("vision input ", i, ": ", x.patches.size(),
                                                     " values for ", n, " patches of ", in_dim));
    }
    row0.push_back(row0.back() + n);
  }
  const int64_t rows = row0.back();
  if (rows == 0) return std::vector<float>{};
  std::vector<float> x(rows * in_dim);
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::copy(inputs[i].patches.begin(), inputs[i].patches.end(), x.begin() + row0[i] * in_dim);
  }
  std::vector<float> h(rows * D);
  MatMul(x.data(), rows, w_->patch, h.data());
  // Rotary cos/sin per row (2-D positions), half = hd / 2 angles.
  const int half = hd / 2, f = hd / 4;
  std::vector<float> cosv(rows * half), sinv(rows * half);
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (int gy = 0; gy < inputs[i].grid_h; ++gy) {
      for (int gx = 0; gx < inputs[i].grid_w; ++gx) {
        const int64_t r = row0[i] + int64_t{gy} * inputs[i].grid_w + gx;
        for (int j = 0; j < half; ++j) {
          const int k = j < f ? j : j - f;
          const float inv = static_cast<float>(std::pow(c.rope_theta, -static_cast<double>(k) / f));
          const float a = static_cast<float>(j < f ? gy : gx) * inv;
          cosv[r * half + j] = std::cos(a);
          sinv[r * half + j] = std::sin(a);
        }
      }
    }
  }
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> a(rows * D), qkv(rows * 3 * D), o(rows * D), t(rows * D);
  std::vector<float> g(rows * c.intermediate_size), u(rows * c.intermediate_size);
  for (int li = 0; li < c.depth; ++li) {
    const Weights::Layer& l = w_->layers[li];
    RmsNorm(h.data(), l.norm1.data(), a.data(), rows, D, eps);
    MatMul(a.data(), rows, l.qkv, qkv.data());
    AddBias(qkv.data(), rows, l.qkv_b);
    for (int64_t r = 0; r < rows; ++r) {
      Rotate(&qkv[r * 3 * D], heads, hd, &cosv[r * half], &sinv[r * half]);
      Rotate(&qkv[r * 3 * D + D], heads, hd, &cosv[r * half], &sinv[r * half]);
    }
    Attend(c, inputs, row0, c.IsFullAttention(li), qkv, &o);
    MatMul(o.data(), rows, l.proj, t.data());
    AddBias(t.data(), rows, l.proj_b);
    for (int64_t k = 0; k < rows * D; ++k) h[k] += t[k];
    RmsNorm(h.data(), l.norm2.data(), a.data(), rows, D, eps);
    MatMul(a.data(), rows, l.gate, g.data());
    AddBias(g.data(), rows, l.gate_b);
    MatMul(a.data(), rows, l.up, u.data());
    AddBias(u.data(), rows, l.up_b);
    for (size_t k = 0; k < g.size(); ++k) g[k] = Silu(g[k]) * u[k];
    MatMul(g.data(), rows, l.down, t.data());
    AddBias(t.data(), rows, l.down_b);
    for (int64_t k = 0; k < rows * D; ++k) h[k] += t[k];
  }
  // Merger.
  RmsNorm(h.data(), w_->ln_q.data(), a.data(), rows, D, eps);
  const int64_t tokens = rows / (m * m), md = D * m * m;
  std::vector<float> cat(tokens * md);
  int64_t tok = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int gh = inputs[i].grid_h, gw = inputs[i].grid_w;
    for (int by = 0; by < gh / m; ++by) {
      for (int bx = 0; bx < gw / m; ++bx, ++tok) {
        for (int dy = 0; dy < m; ++dy) {
          for (int dx = 0; dx < m; ++dx) {
            const int64_t r = row0[i] + int64_t{by * m + dy} * gw + (bx * m + dx);
            std::copy(&a[r * D], &a[r * D] + D, &cat[tok * md + (dy * m + dx) * D]);
          }
        }
      }
    }
  }
  std::vector<float> mid(tokens * md), out(tokens * c.out_hidden_size);
  MatMul(cat.data(), tokens, w_->m0, mid.data());
  AddBias(mid.data(), tokens, w_->m0_b);
  for (float& v : mid) v = GeluErf(v);
  MatMul(mid.data(), tokens, w_->m2, out.data());
  AddBias(out.data(), tokens, w_->m2_b);
  return out;
}

absl::Status WriteRandomVisionTower(const VisionConfig& config, uint64_t seed,
                                    const std::string& dir) {
  RETURN_IF_ERROR(config.Validate());
  return WriteRandomTower(dir, "visual.safetensors", VisionTensorShapes(config), seed,
                          "vision_config", config.ToJson());
}

}  // namespace swaserve::model
