// Checkpoint I/O and small kernels shared by the multimodal towers (vision.h,
// audio.h). I/O: their
// config objects live in config.json beside the language model's fields, and
// their tensors under their own name prefix in any *.safetensors file of the
// directory (the language model's loader skips those prefixes,
// weights.cc IsSkippedTensor).
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/model/cpu_kernels.h"

namespace swaserve::model {

// <dir>/config.json as text; NotFound when unreadable.
absl::StatusOr<std::string> ReadConfigJsonText(const std::string& dir);

// Every tensor whose name starts with `prefix` in <dir>/*.safetensors (files
// in name order), widened to f32 (f32, bf16 or f16 stored; InvalidArgument
// naming the tensor otherwise).
absl::StatusOr<std::vector<std::pair<std::string, std::vector<float>>>> LoadTensorsF32(
    const std::string& dir, const std::string& prefix);

// Seeded random f32 tensors (a SplitMix64 stream per name, Box-Muller
// normals: the same bytes on every platform): 2-D and 3-D weights
// normal(0, 1/sqrt(fan_in)) (fan_in = the product of the dims after the
// first), names ending in `.bias` 0.02·normal, other 1-D tensors (norm
// weights) 1 + 0.1·normal. Written to <dir>/<file>; then config.json gets
// `config_key` = `config_object_json` (config.json must exist).
absl::Status WriteRandomTower(
    const std::string& dir, const std::string& file,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes, uint64_t seed,
    const std::string& config_key, const std::string& config_object_json);

// A tower's tensors checked against the shapes it expects.
class TowerTensors {
 public:
  // InvalidArgument "<what>: tensor X is missing" / "... has N values,
  // expected M" (extra tensors are ignored). Keeps pointers into `tensors`,
  // which must outlive the object.
  static absl::StatusOr<TowerTensors> Create(
      const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
      const std::vector<std::pair<std::string, std::vector<float>>>& tensors,
      const std::string& what);
  // A tensor's values (a copy).
  std::vector<float> Vec(const std::string& name) const;
  // A weight [out, in...] prepared for MatMul as [out, Π in].
  PackedWeight Packed(const std::string& name) const;

 private:
  std::map<std::string, const std::vector<float>*> values_;
  std::map<std::string, std::vector<int64_t>> shapes_;
};

// GELU, exact erf form: 0.5·x·(1 + erf(x / sqrt(2))).
float GeluErf(float x);

// y[r][j] += b[j] for r < rows, j < b.size().
void AddBias(float* y, int64_t rows, const std::vector<float>& b);

// One query row's bidirectional attention: qkv rows are [q | k | v] of D =
// heads·hd floats each; for every head, out[h·hd ..] = softmax(q·k^T /
// sqrt(hd)) · v over `key_rows` (in that order: the sums run in it).
// `scores` is scratch.
void AttendRows(const float* qkv, int64_t D, int heads, int hd, int64_t q_row,
                absl::Span<const int64_t> key_rows, float* out, std::vector<float>* scores);

}  // namespace swaserve::model
