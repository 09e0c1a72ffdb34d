#include "lib/model/gguf.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/status.h"

namespace swaserve::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF is written little-endian from memory");

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;

bool IsIntType(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kUint16:
    case GgufType::kInt16: case GgufType::kUint32: case GgufType::kInt32:
    case GgufType::kBool: case GgufType::kUint64: case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}
bool IsFloatType(GgufType t) {
  return t == GgufType::kFloat32 || t == GgufType::kFloat64;
}
// Bytes of one element of a fixed-size type (0 for string and array).
size_t ScalarSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool:
      return 1;
    case GgufType::kUint16: case GgufType::kInt16:
      return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}
absl::string_view TypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "u8";
    case GgufType::kInt8: return "i8";
    case GgufType::kUint16: return "u16";
    case GgufType::kInt16: return "i16";
    case GgufType::kUint32: return "u32";
    case GgufType::kInt32: return "i32";
    case GgufType::kFloat32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "str";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "u64";
    case GgufType::kInt64: return "i64";
    case GgufType::kFloat64: return "f64";
  }
  return "?";
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// ---------------------------------------------------------------------------
// Encoding.

void PutRaw(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}
template <typename T>
void Put(std::string* out, T v) {
  PutRaw(out, &v, sizeof(v));
}
void PutString(std::string* out, absl::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

void PutElement(std::string* out, const GgufValue& v, size_t i) {
  switch (v.elem) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool:
      Put<uint8_t>(out, static_cast<uint8_t>(v.ints[i]));
      break;
    case GgufType::kUint16: case GgufType::kInt16:
      Put<uint16_t>(out, static_cast<uint16_t>(v.ints[i]));
      break;
    case GgufType::kUint32: case GgufType::kInt32:
      Put<uint32_t>(out, static_cast<uint32_t>(v.ints[i]));
      break;
    case GgufType::kUint64: case GgufType::kInt64:
      Put<uint64_t>(out, static_cast<uint64_t>(v.ints[i]));
      break;
    case GgufType::kFloat32:
      Put<float>(out, static_cast<float>(v.floats[i]));
      break;
    case GgufType::kFloat64:
      Put<double>(out, v.floats[i]);
      break;
    case GgufType::kString:
      PutString(out, v.strings[i]);
      break;
    case GgufType::kArray:
      break;  // rejected by AddMetadata
  }
}

void PutValue(std::string* out, const GgufValue& v) {
  if (v.is_array) {
    Put<uint32_t>(out, static_cast<uint32_t>(GgufType::kArray));
    Put<uint32_t>(out, static_cast<uint32_t>(v.elem));
    Put<uint64_t>(out, v.size());
  } else {
    Put<uint32_t>(out, static_cast<uint32_t>(v.elem));
  }
  for (size_t i = 0; i < v.size(); ++i) PutElement(out, v, i);
}

// ---------------------------------------------------------------------------
// Decoding.

class Cursor {
 public:
  Cursor(absl::string_view bytes, const GgufReadLimits& limits)
      : bytes_(bytes), limits_(limits) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }

  absl::Status Raw(void* out, size_t n, absl::string_view what) {
    if (n > left()) return Truncated(what);
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Get(absl::string_view what) {
    T v{};
    RETURN_IF_ERROR(Raw(&v, sizeof(v), what));
    return v;
  }
  absl::StatusOr<std::string> String(absl::string_view what) {
    ASSIGN_OR_RETURN(uint64_t n, Get<uint64_t>(what));
    if (n > limits_.max_string_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": string of ", n, " bytes exceeds the limit of ",
          limits_.max_string_bytes, " (at byte ", pos_, ")"));
    }
    if (n > left()) return Truncated(what);
    std::string s(bytes_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  absl::Status Truncated(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": runs past the end of the file (at byte ", pos_,
                     " of ", bytes_.size(), "; truncated?)"));
  }

  absl::StatusOr<GgufType> Type(absl::string_view what) {
    ASSIGN_OR_RETURN(uint32_t t, Get<uint32_t>(what));
    if (t > static_cast<uint32_t>(GgufType::kFloat64)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown value type ", t));
    }
    return static_cast<GgufType>(t);
  }

  absl::Status Element(GgufType t, GgufValue* v, absl::string_view what) {
    int64_t i = 0;
    switch (t) {
      case GgufType::kUint8: { ASSIGN_OR_RETURN(uint8_t x, Get<uint8_t>(what)); i = x; break; }
      case GgufType::kInt8: { ASSIGN_OR_RETURN(int8_t x, Get<int8_t>(what)); i = x; break; }
      case GgufType::kBool: {
        ASSIGN_OR_RETURN(uint8_t x, Get<uint8_t>(what));
        if (x > 1) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": bool byte ", x, " is not 0 or 1"));
        }
        i = x;
        break;
      }
      case GgufType::kUint16: { ASSIGN_OR_RETURN(uint16_t x, Get<uint16_t>(what)); i = x; break; }
      case GgufType::kInt16: { ASSIGN_OR_RETURN(int16_t x, Get<int16_t>(what)); i = x; break; }
      case GgufType::kUint32: { ASSIGN_OR_RETURN(uint32_t x, Get<uint32_t>(what)); i = x; break; }
      case GgufType::kInt32: { ASSIGN_OR_RETURN(int32_t x, Get<int32_t>(what)); i = x; break; }
      case GgufType::kUint64: { ASSIGN_OR_RETURN(uint64_t x, Get<uint64_t>(what)); i = static_cast<int64_t>(x); break; }
      case GgufType::kInt64: { ASSIGN_OR_RETURN(int64_t x, Get<int64_t>(what)); i = x; break; }
      case GgufType::kFloat32: {
        ASSIGN_OR_RETURN(float x, Get<float>(what));
        v->floats.push_back(x);
        return absl::OkStatus();
      }
      case GgufType::kFloat64: {
        ASSIGN_OR_RETURN(double x, Get<double>(what));
        v->floats.push_back(x);
        return absl::OkStatus();
      }
      case GgufType::kString: {
        ASSIGN_OR_RETURN(std::string s, String(what));
        v->strings.push_back(std::move(s));
        return absl::OkStatus();
      }
      case GgufType::kArray:
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": arrays of arrays are not supported"));
    }
    v->ints.push_back(i);
    return absl::OkStatus();
  }

  absl::StatusOr<GgufValue> Value(absl::string_view what) {
    GgufValue v;
    ASSIGN_OR_RETURN(GgufType t, Type(what));
    if (t != GgufType::kArray) {
      v.elem = t;
      RETURN_IF_ERROR(Element(t, &v, what));
      return v;
    }
    v.is_array = true;
    ASSIGN_OR_RETURN(v.elem, Type(what));
    ASSIGN_OR_RETURN(uint64_t n, Get<uint64_t>(what));
    // Every element takes at least one byte (strings eight), so a count the
    // remaining input cannot hold is rejected before allocating.
    const uint64_t min_size = v.elem == GgufType::kString ? 8 : ScalarSize(v.elem);
    if (n > limits_.max_array_elements ||
        (min_size > 0 && n > left() / min_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": array of ", n, " ", TypeName(v.elem),
          " elements does not fit the file or exceeds the limit of ",
          limits_.max_array_elements));
    }
    for (uint64_t i = 0; i < n; ++i) RETURN_IF_ERROR(Element(v.elem, &v, what));
    return v;
  }

 private:
  absl::string_view bytes_;
  const GgufReadLimits& limits_;
  uint64_t pos_ = 0;
};

absl::Status ParseTensorInfo(Cursor& c, size_t index, GgufTensorInfo* t) {
  const std::string where = absl::StrCat("tensor #", index);
  ASSIGN_OR_RETURN(t->name, c.String(where + " name"));
  const std::string what = absl::StrCat("tensor '", t->name, "'");
  ASSIGN_OR_RETURN(uint32_t n_dims, c.Get<uint32_t>(what));
  if (n_dims < 1 || n_dims > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", n_dims, " dimensions (1 to 4 allowed)"));
  }
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    ASSIGN_OR_RETURN(uint64_t ne, c.Get<uint64_t>(what));
    if (ne == 0 || ne > (uint64_t{1} << 40) ||
        static_cast<uint64_t>(numel) > (uint64_t{1} << 50) / ne) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": dimension ", d, " = ", ne, " is 0 or too large"));
    }
    numel *= static_cast<int64_t>(ne);
    t->ne.push_back(static_cast<int64_t>(ne));
  }
  ASSIGN_OR_RETURN(uint32_t type, c.Get<uint32_t>(what));
  if (type != static_cast<uint32_t>(GgmlType::kF32) &&
      type != static_cast<uint32_t>(GgmlType::kF16) &&
      type != static_cast<uint32_t>(GgmlType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ggml type ", type, " is not read here (F32, F16, BF16 only)"));
  }
  t->type = static_cast<GgmlType>(type);
  ASSIGN_OR_RETURN(t->offset, c.Get<uint64_t>(what));
  return absl::OkStatus();
}

}  // namespace

size_t GgmlTypeSize(GgmlType t) { return t == GgmlType::kF32 ? 4 : 2; }

absl::string_view GgmlTypeName(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kBF16: return "BF16";
  }
  return "?";
}

GgufValue GgufValue::U32(uint32_t v) {
  return GgufValue{.elem = GgufType::kUint32, .ints = {v}};
}
GgufValue GgufValue::F32(float v) {
  return GgufValue{.elem = GgufType::kFloat32, .floats = {v}};
}
GgufValue GgufValue::Bool(bool v) {
  return GgufValue{.elem = GgufType::kBool, .ints = {v ? 1 : 0}};
}
GgufValue GgufValue::Str(std::string v) {
  return GgufValue{.elem = GgufType::kString, .strings = {std::move(v)}};
}
GgufValue GgufValue::I32Array(const std::vector<int32_t>& v) {
  return GgufValue{.is_array = true, .elem = GgufType::kInt32,
                   .ints = std::vector<int64_t>(v.begin(), v.end())};
}
GgufValue GgufValue::F32Array(const std::vector<float>& v) {
  std::vector<double> f;
  for (float x : v) f.push_back(static_cast<float>(x));
  return GgufValue{.is_array = true, .elem = GgufType::kFloat32,
                   .floats = std::move(f)};
}
GgufValue GgufValue::StrArray(std::vector<std::string> v) {
  return GgufValue{.is_array = true, .elem = GgufType::kString,
                   .strings = std::move(v)};
}

size_t GgufValue::size() const {
  if (IsIntType(elem)) return ints.size();
  if (IsFloatType(elem)) return floats.size();
  return strings.size();
}

std::string GgufValue::DebugString() const {
  std::vector<std::string> parts;
  const size_t n = std::min<size_t>(size(), 8);
  for (size_t i = 0; i < n; ++i) {
    if (IsIntType(elem)) {
      parts.push_back(absl::StrCat(ints[i]));
    } else if (IsFloatType(elem)) {
      parts.push_back(absl::StrCat(floats[i]));
    } else {
      parts.push_back(absl::StrCat("\"", strings[i].substr(0, 40), "\""));
    }
  }
  if (size() > n) parts.push_back("...");
  if (!is_array) return absl::StrCat(TypeName(elem), " ", absl::StrJoin(parts, ""));
  return absl::StrCat("[", TypeName(elem), " x ", size(), ": ",
                      absl::StrJoin(parts, ", "), "]");
}

absl::Status GgufWriter::AddMetadata(const std::string& key, GgufValue value) {
  if (key.empty()) return absl::InvalidArgumentError("empty metadata key");
  for (const auto& [k, v] : metadata_) {
    if (k == key) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata key '", key, "' added twice"));
    }
  }
  const bool ok =
      value.elem != GgufType::kArray &&
      (IsIntType(value.elem) ? value.floats.empty() && value.strings.empty()
       : IsFloatType(value.elem) ? value.ints.empty() && value.strings.empty()
                                 : value.ints.empty() && value.floats.empty()) &&
      (value.is_array || value.size() == 1);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata key '", key, "': value does not match its type"));
  }
  metadata_.emplace_back(key, std::move(value));
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(const std::string& name, GgmlType type,
                                   std::vector<int64_t> ne, FillFn fill) {
  if (name.empty() || tensor_index_.count(name) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': empty or duplicate name"));
  }
  if (ne.empty() || ne.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", ne.size(), " dimensions"));
  }
  uint64_t numel = 1;
  for (int64_t d : ne) {
    if (d <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': dimension ", d));
    }
    numel *= static_cast<uint64_t>(d);
  }
  tensor_index_[name] = tensors_.size();
  tensors_.push_back(Tensor{.name = name, .type = type, .ne = std::move(ne),
                            .fill = std::move(fill),
                            .bytes = numel * GgmlTypeSize(type)});
  return absl::OkStatus();
}

absl::Status GgufWriter::Write(const std::string& path) const {
  std::string head;
  head.append(kMagic, 4);
  Put<uint32_t>(&head, kVersion);
  Put<uint64_t>(&head, tensors_.size());
  Put<uint64_t>(&head, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    PutString(&head, key);
    PutValue(&head, value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&head, t.name);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) Put<uint64_t>(&head, static_cast<uint64_t>(d));
    Put<uint32_t>(&head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&head, offset);
    offset = AlignUp(offset + t.bytes, kDefaultAlignment);
  }
  head.resize(AlignUp(head.size(), kDefaultAlignment), '\0');

  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  std::vector<uint8_t> buf;
  for (const Tensor& t : tensors_) {
    buf.assign(AlignUp(t.bytes, kDefaultAlignment), 0);
    absl::Status s = t.fill(absl::MakeSpan(buf.data(), t.bytes));
    if (!s.ok()) {
      out.close();
      std::filesystem::remove(tmp);
      return absl::Status(s.code(),
                          absl::StrCat("tensor '", t.name, "': ", s.message()));
    }
    out.write(reinterpret_cast<const char*>(buf.data()),
              static_cast<std::streamsize>(buf.size()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("writing ", tmp, " failed"));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("rename ", tmp, " -> ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

const GgufValue* GgufContents::Find(absl::string_view key) const {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

const GgufTensorInfo* GgufContents::FindTensor(absl::string_view name) const {
  for (const GgufTensorInfo& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<GgufContents> ParseGguf(absl::string_view bytes,
                                       const GgufReadLimits& limits) {
  Cursor c(bytes, limits);
  char magic[4];
  RETURN_IF_ERROR(c.Raw(magic, 4, "magic"));
  if (std::memcmp(magic, kMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a GGUF file (magic is not 'GGUF')");
  }
  GgufContents out;
  ASSIGN_OR_RETURN(out.version, c.Get<uint32_t>("version"));
  if (out.version != 2 && out.version != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF version ", out.version, " (2 or 3 supported)"));
  }
  ASSIGN_OR_RETURN(uint64_t n_tensors, c.Get<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(uint64_t n_kv, c.Get<uint64_t>("metadata count"));
  if (n_tensors > limits.max_tensors || n_kv > limits.max_metadata) {
    return absl::InvalidArgumentError(absl::StrCat(
        n_tensors, " tensors / ", n_kv, " metadata entries exceed the limits (",
        limits.max_tensors, " / ", limits.max_metadata, ")"));
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    ASSIGN_OR_RETURN(std::string key,
                     c.String(absl::StrCat("metadata #", i, " key")));
    ASSIGN_OR_RETURN(GgufValue v, c.Value(absl::StrCat("metadata '", key, "'")));
    if (out.Find(key) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata key '", key, "' appears twice"));
    }
    out.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = out.Find("general.alignment")) {
    if (a->is_array || a->elem != GgufType::kUint32 || a->ints[0] <= 0 ||
        (a->ints[0] & (a->ints[0] - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "general.alignment: ", a->DebugString(), " is not a u32 power of two"));
    }
    out.alignment = static_cast<uint32_t>(a->ints[0]);
  }
  std::map<std::string, size_t> seen;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    RETURN_IF_ERROR(ParseTensorInfo(c, i, &t));
    if (!seen.emplace(t.name, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' appears twice"));
    }
    out.tensors.push_back(std::move(t));
  }
  const uint64_t data_start = AlignUp(c.pos(), out.alignment);
  if (data_start > bytes.size()) return c.Truncated("padding before the data");
  const uint64_t data_size = bytes.size() - data_start;
  for (GgufTensorInfo& t : out.tensors) {
    const uint64_t size = static_cast<uint64_t>(t.numel()) * GgmlTypeSize(t.type);
    if (t.offset % out.alignment != 0 || t.offset > data_size ||
        size > data_size - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': data at offset ", t.offset, " (", size,
          " bytes) is unaligned or runs past the data section (", data_size,
          " bytes)"));
    }
    t.data = bytes.substr(data_start + t.offset, size);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GgufFile>> ReadGgufFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  auto file = std::make_unique<GgufFile>();
  file->bytes.assign(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
  absl::StatusOr<GgufContents> c = ParseGguf(file->bytes);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat(path, ": ", c.status().message()));
  }
  file->contents = *std::move(c);
  return file;
}

}  // namespace swaserve::model
