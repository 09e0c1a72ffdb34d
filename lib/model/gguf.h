// GGUF files (version 3), the format llama.cpp and ggml load: a header, typed
// metadata key/values, tensor descriptors and the tensor data, each tensor
// aligned to `general.alignment` (32 when absent).
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64
// metadata count; per metadata entry a string key, u32 value type, value
// (arrays: u32 element type, u64 count, elements; strings: u64 length +
// bytes); per tensor a string name, u32 dimension count, u64 dimensions
// (innermost first: a row-major [rows, cols] matrix is {cols, rows}), u32
// ggml type, u64 offset into the data section; padding to the alignment; the
// data section.
//
// GgufWriter writes such a file; ParseGguf reads one back (the round trip of
// `swaserve export-gguf`, lib/model/gguf_export.h). The reader takes
// untrusted bytes: every count, length, dimension and offset is checked
// against the input before use (fuzzed: tests/fuzz/gguf_fuzzer.cc). Only the
// tensor types this project writes (F32, F16, BF16) are read; others are an
// error naming the tensor and the type.
//
// Value types; thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swaserve::model {

// GGUF metadata value types (the numbering of the file format).
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// ggml tensor element types this project reads and writes (ggml numbering).
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kBF16 = 30 };
// Bytes per element of `t`.
size_t GgmlTypeSize(GgmlType t);
absl::string_view GgmlTypeName(GgmlType t);  // "F32", "F16", "BF16"

// One metadata value: a scalar (one element) or an array of `elem` values.
// Integers and bools are held in `ints` (u64 bit patterns as int64), floats
// in `floats`, strings in `strings`; only the vector of the element type is
// used.
struct GgufValue {
  bool is_array = false;
  GgufType elem = GgufType::kUint32;  // the scalar's type or the elements'
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  static GgufValue U32(uint32_t v);
  static GgufValue F32(float v);
  static GgufValue Bool(bool v);
  static GgufValue Str(std::string v);
  static GgufValue I32Array(const std::vector<int32_t>& v);
  static GgufValue F32Array(const std::vector<float>& v);
  static GgufValue StrArray(std::vector<std::string> v);

  size_t size() const;  // elements (1 for a scalar)
  // Readable form for errors and tests: `u32 7`, `[i32 x 3: 1, 0, 1]`, ...
  std::string DebugString() const;
  bool operator==(const GgufValue&) const = default;
};

// Writes a GGUF file. Metadata and tensors are written in the order added.
// Not thread-safe.
class GgufWriter {
 public:
  // InvalidArgument for a duplicate or empty key, or a value whose vectors do
  // not match its type.
  absl::Status AddMetadata(const std::string& key, GgufValue value);
  // `fill` is called once during Write with a zeroed buffer of the tensor's
  // bytes (numel x GgmlTypeSize) and must fill it; its error aborts the
  // write. `ne` is innermost first (1 to 4 dimensions, each > 0).
  // InvalidArgument for a duplicate name or a bad shape.
  using FillFn = std::function<absl::Status(absl::Span<uint8_t> out)>;
  absl::Status AddTensor(const std::string& name, GgmlType type,
                         std::vector<int64_t> ne, FillFn fill);
  // Writes `path`.tmp and renames it to `path`.
  absl::Status Write(const std::string& path) const;

  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    FillFn fill;
    uint64_t bytes = 0;
  };
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;    // innermost first
  uint64_t offset = 0;        // into the data section
  absl::string_view data;     // the tensor's bytes within the parsed input
  int64_t numel() const;
};

struct GgufContents {
  uint32_t version = 0;
  uint32_t alignment = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata;  // file order
  std::vector<GgufTensorInfo> tensors;                      // file order

  const GgufValue* Find(absl::string_view key) const;
  const GgufTensorInfo* FindTensor(absl::string_view name) const;
};

// Limits the reader enforces on untrusted input (beyond fitting the input).
struct GgufReadLimits {
  uint64_t max_metadata = 1 << 16;     // metadata entries
  uint64_t max_tensors = 1 << 20;
  uint64_t max_array_elements = 1 << 26;
  uint64_t max_string_bytes = 1 << 24;
};

// Parses a whole GGUF file held in `bytes` (version 2 or 3). Tensor data
// views point into `bytes`, which must outlive the result. InvalidArgument
// naming what is wrong (and where: the key or tensor, the byte offset).
absl::StatusOr<GgufContents> ParseGguf(absl::string_view bytes,
                                       const GgufReadLimits& limits = {});

// A GGUF file read into memory and parsed; the bytes are owned here.
struct GgufFile {
  std::string bytes;
  GgufContents contents;
};
absl::StatusOr<std::unique_ptr<GgufFile>> ReadGgufFile(const std::string& path);

}  // namespace swaserve::model
