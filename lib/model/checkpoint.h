// Safetensors checkpoints: parse, mmap, validate against a ModelConfig, and
// write (for `swaserve make-model`).
//
// File format: u64 little-endian header length N, N bytes of JSON
// {"__metadata__": {...}?, "<name>": {"dtype": "F32|BF16|F16|...",
// "shape": [...], "data_offsets": [begin, end]}, ...}, then the data; offsets
// are relative to byte 8 + N, half-open, must lie inside the file, must not
// overlap, and end - begin must equal numel * sizeof(dtype). A sharded
// checkpoint has model.safetensors.index.json {"weight_map": {name: file}}.
//
// Checkpoint and SafetensorsFile are immutable after Open and thread-safe to
// read. Tensor data points into the mmap, valid while the object lives.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/kv/kv_shape.h"
#include "lib/model/config.h"
#include "lib/model/cpu_kernels.h"

namespace swaserve::model {

enum class TensorDType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kOther };

struct TensorInfo {
  std::string name;
  TensorDType dtype = TensorDType::kF32;
  std::string dtype_name;        // as written in the header
  std::vector<int64_t> shape;
  uint64_t begin = 0;            // offsets relative to the data section
  uint64_t end = 0;
  const uint8_t* data = nullptr; // set once the file is mapped
  int64_t numel() const;
};

// Parses a safetensors header. `header` is the JSON (N bytes), `data_size`
// the number of bytes after it. Every rule above is checked; errors name the
// tensor and the rule. Fuzzed (tests/fuzz/safetensors_fuzzer.cc).
absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
    absl::string_view header, uint64_t data_size);

// One mmapped .safetensors file.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(absl::string_view name) const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// The names and shapes a checkpoint for `config` must hold (HF naming:
// model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ...,
// model.mtp.layers.{k}.eh_proj.weight, lm_head.weight). Shapes are
// [out_features, in_features] for projections.
std::map<std::string, std::vector<int64_t>> ExpectedTensors(
    const ModelConfig& config);

// A checkpoint directory: config.json + model.safetensors or shards with
// model.safetensors.index.json (+ tokenizer.json, optional).
class Checkpoint {
 public:
  // Opens and validates: every expected tensor present with the expected
  // shape, no unexpected tensors, each in a dtype its role allows (errors
  // name the tensor and the file). With an FP8 quantization_config, each
  // quantized projection (weights.h) must be F8_E4M3 with an F32
  // `<name>_scale_inv` of shape [ceil(out / block_out), ceil(in /
  // block_in)]; every other tensor F32, BF16 or F16.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& dir);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  // Tensors left out by IsSkippedTensor (logged once at Open).
  const std::vector<std::string>& skipped_tensors() const { return skipped_; }
  const TensorInfo* Find(absl::string_view name) const;
  // A 2-D projection weight as stored, for PackedWeight::Pack: its format,
  // data in the mapping and, for FP8, its `<name>_scale_inv` block scales
  // (weights.cc). NotFound / InvalidArgument naming the tensor.
  absl::StatusOr<WeightPart> Weight(absl::string_view name) const;
  // The tensor converted to f32 (bf16 and f16 widened); NotFound or
  // InvalidArgument (shape mismatch against `shape` when non-empty; FP8).
  absl::StatusOr<std::vector<float>> ReadF32(
      absl::string_view name, absl::Span<const int64_t> shape = {}) const;

 private:
  Checkpoint() = default;
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*, std::less<>> index_;
  std::vector<std::string> skipped_;
};

// Writes one .safetensors file the way the reference (Rust/Python)
// safetensors writer does, so HF tooling reads it too: the header is padded
// with spaces so the data starts 8-byte aligned, carries
// {"__metadata__": {"format": "pt"}}, and the data is contiguous with no
// gaps, tensors ordered by element size (largest first) then by name, so that
// every tensor starts aligned to its element size. Write() goes to
// `path`.tmp and renames, so a reader never sees a half-written file.
// Not thread-safe.
class SafetensorsWriter {
 public:
  // `data` is the tensor in `dtype` (little-endian), numel * size bytes.
  // InvalidArgument for kOther, a duplicate name, a negative dim or a size
  // mismatch.
  absl::Status Add(const std::string& name, TensorDType dtype,
                   std::vector<int64_t> shape, std::string data);
  // Like Add, but the bytes are produced during Write(): `fill` is called
  // once, in file order, with a zeroed buffer of numel * size bytes. Lets
  // files larger than memory be written one tensor at a time.
  using FillFn = std::function<void(absl::Span<uint8_t> out)>;
  absl::Status AddLazy(const std::string& name, TensorDType dtype,
                       std::vector<int64_t> shape, FillFn fill);
  // `progress` (optional) is called after each tensor with bytes written so
  // far and the total data bytes.
  using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;
  absl::Status Write(const std::string& path,
                     const ProgressFn& progress = nullptr) const;

 private:
  struct Entry {
    TensorDType dtype;
    std::vector<int64_t> shape;
    std::string data;
    FillFn fill;  // set for AddLazy entries (data then empty)
  };
  std::map<std::string, Entry> entries_;
};

// Bytes per element of F32/BF16/F16/F8_E4M3 (0 for kOther).
size_t TensorDTypeSize(TensorDType dtype);
// "F32", "BF16", "F16" (the safetensors spelling; "?" for kOther).
absl::string_view TensorDTypeName(TensorDType dtype);
TensorDType ToTensorDType(kv::DType dtype);

// f32 <-> bf16 / f16 conversion (round to nearest even).
uint16_t F32ToBf16(float x);
float Bf16ToF32(uint16_t x);
uint16_t F32ToF16(float x);
float F16ToF32(uint16_t x);

// Writes a checkpoint of seeded random weights for `config` into `dir`
// (config.json, model.safetensors in config.dtype; copies `tokenizer_json`
// when non-empty). Deterministic for a given config and seed. Weights are
// scaled so activations stay O(1) (normal(0, 1/sqrt(fan_in)); norms near 1;
// router bias small).
absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed,
                                   const std::string& dir,
                                   const std::string& tokenizer_json = "");
// The same, reporting progress (bytes of model.safetensors written so far,
// total) after each tensor.
absl::Status WriteRandomCheckpoint(
    const ModelConfig& config, uint64_t seed, const std::string& dir,
    const std::string& tokenizer_json,
    const SafetensorsWriter::ProgressFn& progress);

// Options of the general WriteRandomCheckpoint.
struct RandomCheckpointOptions {
  // Copied as tokenizer.json (with its tokenizer_config.json) when set.
  std::string tokenizer_json;
  // Called after each tensor (bytes written so far, total); may be empty.
  SafetensorsWriter::ProgressFn progress;
  // > 0 (both): quantizable projections (IsQuantizableProjection) that the
  // config does not store as FP8 are rounded to the E4M3 grid with
  // power-of-two scales over blocks of this size, exactly as an FP8 config
  // with this weight_block_size writes them; the checkpoint then holds the
  // very weights of its FP8 twin (same seed), in config.dtype. 0: plain
  // random values.
  int fp8_grid_block_out = 0;
  int fp8_grid_block_in = 0;
  // With fp8_grid on a split (q/k/v_proj) config: round q/k/v on the grid
  // of the fused qkv_proj instead (its groups, ModelConfig::qkv_groups,
  // each on blocks of their own), so the checkpoint holds the weights of its
  // fused FP8 twin. A fused config always draws qkv_proj from the q/k/v_proj
  // values of the same seed, group by group.
  bool fused_qkv_grid = false;
  // Write config.json in the transformers-native format
  // (ModelConfig::ToNativeJson) instead of the hub format.
  bool native_config = false;
};
// The general form. With an FP8 quantization_config, quantized projections
// are written as F8_E4M3 with power-of-two block scales (`<name>_scale_inv`,
// F32) from the same random values.
absl::Status WriteRandomCheckpoint(const ModelConfig& config, uint64_t seed,
                                   const std::string& dir,
                                   const RandomCheckpointOptions& options);

// Parameter counts of `config` (from ExpectedTensors).
struct ParamCounts {
  int64_t total = 0;  // every weight, MTP layers included
  // What one token of the main model uses: embeddings, lm_head, attention,
  // norms, dense MLPs, routers and num_experts_per_tok routed experts per MoE
  // layer (MTP layers excluded).
  int64_t active = 0;
  int64_t mtp = 0;  // in MTP layers (part of total)
};
ParamCounts CountParams(const ModelConfig& config);

// The two built-in shapes of `swaserve make-model`: "tiny" (6 layers of both
// types, W = 16, 4 experts top-2, 2 MTP layers, small dims) and
// "mimo-v2.5-pro-mini" (70 layers = 10 full + 60 SWA, W = 128, 8 KV heads on
// both types, K 192 / V 128, scaled-down hidden size and experts).
absl::StatusOr<ModelConfig> BuiltinConfig(absl::string_view name,
                                          int vocab_size);

// Quantized weights (weights.cc).
// Whether `name` is the weight of a linear projection that FP8 checkpoints
// quantize: self_attn.{q,k,v,qkv,o}_proj, mlp.{gate,up,down}_proj (dense
// and experts) and eh_proj. The MoE router (mlp.gate), embeddings, lm_head,
// norms and sinks stay in torch_dtype, as in DeepSeek-V3-style FP8
// checkpoints.
bool IsQuantizableProjection(absl::string_view name);
// Whether `config` says `name` is stored FP8 (a quantizable projection not
// in ignored_layers, with an FP8 quantization_config).
bool ExpectFp8(const ModelConfig& config, absl::string_view name);
bool IsScaleTensor(absl::string_view name);  // "*.weight_scale_inv"
// The rule for tensors outside the text model: names under visual.,
// vision_tower., audio., audio_encoder. or audio_tower. (also below
// "model.") belong to MiMo-V2.5's vision and audio encoders, which this
// engine does not run; Checkpoint::Open skips them (and logs how many).
// Every other tensor ExpectedTensors does not list is an error.
bool IsSkippedTensor(absl::string_view name);
// The rows of one group of a fused qkv_proj (ModelConfig::qkv_groups) for
// attention geometry `a`: q, k and v rows, in that order.
struct QkvGroupRows {
  int64_t q = 0;
  int64_t k = 0;
  int64_t v = 0;
  int64_t total() const { return q + k + v; }
};
QkvGroupRows FusedQkvGroupRows(const ModelConfig& config, const AttentionConfig& a);
// A stored fused qkv_proj split into the Q, K and V projections, each as the
// G runs of rows it has in the groups (for PackedWeight::Pack, which stacks
// them back in head order). FP8 parts keep their rows' original block scales
// (each group's scale rows; a part may start inside a block), so nothing is
// requantized. InvalidArgument when the rows do not match the layout.
struct FusedQkvParts {
  std::vector<WeightPart> q, k, v;
};
absl::StatusOr<FusedQkvParts> SplitFusedQkv(const ModelConfig& config,
                                            const AttentionConfig& a,
                                            const WeightPart& fused);
// Adds `<w>_scale_inv` [ceil(out / block_out), ceil(in / block_in)] for
// every weight `w` of `expected` that ExpectFp8 (a fused qkv_proj: [G x
// ceil(group rows / block_out), ...], its groups padded to whole blocks).
void AddScaleTensors(const ModelConfig& config,
                     std::map<std::string, std::vector<int64_t>>* expected);
// What is wrong with `t`'s dtype for tensor `name` under `config` ("" when
// nothing): e.g. "is BF16, but quantization_config makes it F8_E4M3 (list
// the module in ignored_layers to keep it unquantized)".
std::string DTypeProblem(const ModelConfig& config, absl::string_view name,
                         const TensorInfo& t);

}  // namespace swaserve::model
