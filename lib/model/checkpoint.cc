#include "lib/model/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"

namespace swaserve::model {

static_assert(
    std::endian::native == std::endian::little,
    "safetensors data is little-endian; big-endian hosts need byte swaps");

namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB
constexpr size_t kMaxReportedProblems = 10;

// Bits per element of every dtype the safetensors format defines; 0 for a
// name it does not define (accepted as kOther; its byte size is unchecked).
int DTypeBits(const std::string& name) {
  static const std::pair<const char*, int> kTable[] = {
      {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E4M3", 8}, {"F8_E5M2", 8},
      {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32}, {"F32", 32}, {"I64", 64},    {"U64", 64},
      {"F64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
  };
  for (const auto& [n, bits] : kTable) {
    if (name == n) return bits;
  }
  return 0;
}

TensorDType DTypeFromName(const std::string& name) {
  if (name == "F32") return TensorDType::kF32;
  if (name == "BF16") return TensorDType::kBF16;
  if (name == "F16") return TensorDType::kF16;
  if (name == "F8_E4M3") return TensorDType::kF8E4M3;
  return TensorDType::kOther;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Quoted(absl::string_view name) {
  std::string s = Json(std::string(name))
                      .dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 200) s = absl::StrCat(s.substr(0, 197), "...");
  return s;
}

absl::Status TensorError(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", Quoted(name), ": ", what));
}

// Reads a non-negative JSON integer that fits in int64.
bool NonNegativeInt(const Json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return *out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

absl::StatusOr<TensorInfo> ParseEntry(const std::string& name, const Json& e,
                                      uint64_t data_size) {
  if (!e.is_object()) {
    return TensorError(name,
                       absl::StrCat("expected an object, got ", e.type_name()));
  }
  TensorInfo t;
  t.name = name;
  auto dtype = e.find("dtype");
  if (dtype == e.end()) return TensorError(name, "missing \"dtype\"");
  if (!dtype->is_string())
    return TensorError(name, "\"dtype\" is not a string");
  t.dtype_name = dtype->get<std::string>();
  t.dtype = DTypeFromName(t.dtype_name);

  auto shape = e.find("shape");
  if (shape == e.end()) return TensorError(name, "missing \"shape\"");
  if (!shape->is_array()) return TensorError(name, "\"shape\" is not a list");
  if (shape->size() > 64) {
    return TensorError(name, absl::StrCat("\"shape\" has ", shape->size(),
                                          " dims (limit 64)"));
  }
  bool zero = false;
  for (const Json& d : *shape) {
    uint64_t v = 0;
    if (!NonNegativeInt(d, &v)) {
      return TensorError(name, absl::StrCat("\"shape\" entry ", d.dump(),
                                            " is not a non-negative integer"));
    }
    zero |= v == 0;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  uint64_t numel = 1;
  if (zero) {
    numel = 0;
  } else {
    for (int64_t d : t.shape) {
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return TensorError(name, absl::StrCat("shape ", ShapeString(t.shape),
                                              " has too many elements"));
      }
    }
  }

  auto offsets = e.find("data_offsets");
  if (offsets == e.end()) return TensorError(name, "missing \"data_offsets\"");
  if (!offsets->is_array() || offsets->size() != 2 ||
      !NonNegativeInt((*offsets)[0], &t.begin) ||
      !NonNegativeInt((*offsets)[1], &t.end)) {
    return TensorError(name,
                       absl::StrCat("\"data_offsets\" must be [begin, end] "
                                    "of non-negative integers, got ",
                                    offsets->dump()));
  }
  if (t.begin > t.end) {
    return TensorError(name, absl::StrCat("data_offsets [", t.begin, ", ",
                                          t.end, "]: begin > end"));
  }
  if (t.end > data_size) {
    return TensorError(
        name,
        absl::StrCat("data_offsets [", t.begin, ", ", t.end,
                     "] run past the end of the data (", data_size, " bytes)"));
  }
  const int bits = DTypeBits(t.dtype_name);
  if (bits > 0) {
    uint64_t total_bits = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(bits),
                               &total_bits)) {
      return TensorError(name, absl::StrCat("shape ", ShapeString(t.shape),
                                            " has too many elements"));
    }
    if (total_bits % 8 != 0) {
      return TensorError(
          name, absl::StrCat("shape ", ShapeString(t.shape), " of ",
                             t.dtype_name, " is not a whole number of bytes"));
    }
    if (total_bits / 8 != t.end - t.begin) {
      return TensorError(
          name,
          absl::StrCat("shape ", ShapeString(t.shape), " of ", t.dtype_name,
                       " is ", total_bits / 8, " bytes, but data_offsets [",
                       t.begin, ", ", t.end, "] span ", t.end - t.begin));
    }
  }
  return t;
}

uint32_t FloatBits(float x) { return std::bit_cast<uint32_t>(x); }
float BitsFloat(uint32_t u) { return std::bit_cast<float>(u); }

std::string JoinProblems(const std::vector<std::string>& problems) {
  std::string out = absl::StrJoin(
      problems.begin(),
      problems.begin() + std::min(problems.size(), kMaxReportedProblems), "; ");
  if (problems.size() > kMaxReportedProblems) {
    absl::StrAppend(&out, "; and ", problems.size() - kMaxReportedProblems,
                    " more");
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return buf.str();
}

}  // namespace

// ---------------------------------------------------------------------------
// Conversions.

uint16_t F32ToBf16(float x) {
  uint32_t u = FloatBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inf stays inf)
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToF32(uint16_t x) {
  return BitsFloat(static_cast<uint32_t>(x) << 16);
}

uint16_t F32ToF16(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x477ff000u) {  // >= 65520 (and inf) rounds to inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (a < 0x38800000u) {  // below 2^-14: a half subnormal (or zero)
    if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 .. 24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (a - 0x38000000u) >> 13;  // rebias 127 -> 15
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float F16ToF32(uint16_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x8000u) << 16;
  const uint32_t exp = (x >> 10) & 0x1fu;
  const uint32_t mant = x & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);  // exact
    return BitsFloat(FloatBits(v) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

size_t TensorDTypeSize(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kF32:
      return 4;
    case TensorDType::kBF16:
    case TensorDType::kF16:
      return 2;
    case TensorDType::kF8E4M3:
      return 1;
    case TensorDType::kOther:
      return 0;
  }
  return 0;
}

absl::string_view TensorDTypeName(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::kF32:
      return "F32";
    case TensorDType::kBF16:
      return "BF16";
    case TensorDType::kF16:
      return "F16";
    case TensorDType::kF8E4M3:
      return "F8_E4M3";
    case TensorDType::kOther:
      return "?";
  }
  return "?";
}

TensorDType ToTensorDType(kv::DType dtype) {
  switch (dtype) {
    case kv::DType::kF32:
      return TensorDType::kF32;
    case kv::DType::kBF16:
      return TensorDType::kBF16;
    case kv::DType::kF16:
      return TensorDType::kF16;
  }
  return TensorDType::kOther;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// Header parsing.

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
    absl::string_view header, uint64_t data_size) {
  // nlohmann reads a NUL byte as the end of the input, which would hide
  // whatever follows it; JSON text never contains one.
  if (const size_t nul = header.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header: NUL byte at offset ", nul, " (not valid JSON)"));
  }
  // nlohmann keeps the last of duplicate keys silently; a strict reader must
  // not (two entries for one tensor name is a corrupt file).
  std::string duplicate;
  std::set<std::string> top_keys, entry_keys;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start && depth == 1) {
      entry_keys.clear();
    } else if (event == Json::parse_event_t::key &&
               (depth == 1 || depth == 2) && duplicate.empty()) {
      std::set<std::string>& keys = depth == 1 ? top_keys : entry_keys;
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.insert(key).second) duplicate = key;
    }
    return true;
  };
  Json root = Json::parse(header.begin(), header.end(), callback,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    std::string why = "invalid JSON";
    try {
      Json unused = Json::parse(header.begin(), header.end());
      (void)unused;
    } catch (const Json::exception& e) {
      why = absl::StrCat("invalid JSON: ", e.what());
    }
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header: ", why));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header: expected a JSON object, got ", root.type_name()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header: duplicate key ", Quoted(duplicate)));
  }
  std::vector<TensorInfo> tensors;
  tensors.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) {
        return absl::InvalidArgumentError(
            "safetensors header: \"__metadata__\" must be an object of "
            "strings");
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("safetensors header: \"__metadata__\" value of ",
                           Quoted(m.key()), " is not a string"));
        }
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo t, ParseEntry(it.key(), *it, data_size));
    tensors.push_back(std::move(t));
  }
  // Overlaps: sort by [begin, end) and compare neighbours. Empty tensors
  // overlap nothing.
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) {
              return a->begin != b->begin ? a->begin < b->begin
                                          : a->end < b->end;
            });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    if (b.begin < a.end) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors header: tensors ", Quoted(a.name), " [",
                       a.begin, ", ", a.end, ") and ", Quoted(b.name), " [",
                       b.begin, ", ", b.end, ") overlap"));
    }
  }
  return tensors;
}

// ---------------------------------------------------------------------------
// SafetensorsFile.

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg)
                         : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated: ", size,
        " bytes, but a safetensors file starts with an 8-byte header length"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": mmap failed: ", std::strerror(map_err)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile);
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = size;
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t n = 0;
  std::memcpy(&n, bytes, 8);  // little-endian host (static_assert above)
  if (n > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length ", n, " runs past the end of the file (", size,
        " bytes; truncated?)"));
  }
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", n,
                                                   " exceeds the limit of ",
                                                   kMaxHeaderBytes, " bytes"));
  }
  absl::string_view header(reinterpret_cast<const char*>(bytes + 8), n);
  const uint64_t data_size = size - 8 - n;
  absl::StatusOr<std::vector<TensorInfo>> tensors =
      ParseSafetensorsHeader(header, data_size);
  if (!tensors.ok()) return base::Annotate(tensors.status(), path);
  file->tensors_ = *std::move(tensors);
  const uint8_t* data = bytes + 8 + n;
  for (size_t i = 0; i < file->tensors_.size(); ++i) {
    TensorInfo& t = file->tensors_[i];
    t.data = data + t.begin;
    file->index_.emplace(t.name, i);
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------
// Expected tensors.

std::map<std::string, std::vector<int64_t>> ExpectedTensors(
    const ModelConfig& config) {
  std::map<std::string, std::vector<int64_t>> out;
  const int64_t h = config.hidden_size;
  const int64_t v = config.vocab_size;
  auto attention = [&](const std::string& p, const AttentionConfig& a) {
    const int64_t heads = a.num_heads, kv = a.num_kv_heads;
    if (config.qkv_layout == QkvLayout::kFused) {
      out[p + "self_attn.qkv_proj.weight"] = {
          heads * a.head_dim + kv * (a.head_dim + a.v_head_dim), h};
    } else {
      out[p + "self_attn.q_proj.weight"] = {heads * a.head_dim, h};
      out[p + "self_attn.k_proj.weight"] = {kv * a.head_dim, h};
      out[p + "self_attn.v_proj.weight"] = {kv * a.v_head_dim, h};
    }
    out[p + "self_attn.o_proj.weight"] = {h, heads * a.v_head_dim};
    if (a.sink) out[p + "self_attn.attention_sink_bias"] = {heads};
  };
  auto dense_mlp = [&](const std::string& p) {
    const int64_t i = config.intermediate_size;
    out[p + "mlp.gate_proj.weight"] = {i, h};
    out[p + "mlp.up_proj.weight"] = {i, h};
    out[p + "mlp.down_proj.weight"] = {h, i};
  };
  out["model.embed_tokens.weight"] = {v, h};
  out["model.norm.weight"] = {h};
  if (!config.tie_word_embeddings) out["lm_head.weight"] = {v, h};
  for (int l = 0; l < config.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    out[p + "input_layernorm.weight"] = {h};
    out[p + "post_attention_layernorm.weight"] = {h};
    attention(p, config.attention(l));
    if (config.moe_layers[l]) {
      const int64_t e = config.n_routed_experts;
      const int64_t mi = config.moe_intermediate_size;
      out[p + "mlp.gate.weight"] = {e, h};
      out[p + "mlp.gate.e_score_correction_bias"] = {e};
      for (int64_t x = 0; x < e; ++x) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", x, ".");
        out[ep + "gate_proj.weight"] = {mi, h};
        out[ep + "up_proj.weight"] = {mi, h};
        out[ep + "down_proj.weight"] = {h, mi};
      }
    } else {
      dense_mlp(p);
    }
  }
  for (int k = 0; k < config.num_mtp_layers; ++k) {
    const std::string p = absl::StrCat("model.mtp.layers.", k, ".");
    out[p + "enorm.weight"] = {h};
    out[p + "hnorm.weight"] = {h};
    out[p + "eh_proj.weight"] = {h, 2 * h};
    out[p + "final_layernorm.weight"] = {h};
    out[p + "input_layernorm.weight"] = {h};
    out[p + "post_attention_layernorm.weight"] = {h};
    attention(p, config.swa);
    dense_mlp(p);
  }
  AddScaleTensors(config, &out);
  return out;
}

ParamCounts CountParams(const ModelConfig& config) {
  ParamCounts c;
  int64_t experts = 0;
  for (const auto& [name, shape] : ExpectedTensors(config)) {
    if (IsScaleTensor(name)) continue;  // FP8 block scales: not parameters
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    c.total += n;
    if (name.rfind("model.mtp.", 0) == 0) {
      c.mtp += n;
    } else if (name.find(".mlp.experts.") != std::string::npos) {
      experts += n;
    } else {
      c.active += n;
    }
  }
  if (config.n_routed_experts > 0) {
    c.active += experts / config.n_routed_experts * config.num_experts_per_tok;
  }
  return c;
}

// ---------------------------------------------------------------------------
// Checkpoint.

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& dir) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint);
  ck->dir_ = dir;
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": not a checkpoint directory"));
  }
  ASSIGN_OR_RETURN(ck->config_,
                   ModelConfig::Load((root / "config.json").string()));

  // Which file holds each tensor.
  std::map<std::string, std::string, std::less<>> file_of;
  const fs::path single = root / "model.safetensors";
  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single.string()));
    ck->files_.push_back(std::move(file));
  } else if (fs::exists(index_path, ec)) {
    const std::string ipath = index_path.string();
    ASSIGN_OR_RETURN(std::string text, ReadFile(ipath));
    Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ipath, ": not a JSON object"));
    }
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ipath, ": missing \"weight_map\" object"));
    }
    std::map<std::string, std::vector<std::string>> by_file;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(ipath, ": weight_map entry for tensor ",
                         Quoted(it.key()), " is not a file name"));
      }
      const std::string f = it->get<std::string>();
      const fs::path fp(f);
      bool bad = f.empty() || fp.is_absolute();
      for (const auto& part : fp) bad |= part == "..";
      if (bad) {
        return absl::InvalidArgumentError(absl::StrCat(
            ipath, ": tensor ", Quoted(it.key()), " maps to file ", Quoted(f),
            ", which is not a plain file name inside the checkpoint"));
      }
      by_file[f].push_back(it.key());
    }
    if (by_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ipath, ": empty weight_map"));
    }
    for (const auto& [f, names] : by_file) {
      const std::string fpath = (root / f).string();
      if (!fs::exists(fpath, ec)) {
        return absl::NotFoundError(absl::StrCat(
            ipath, ": file ", Quoted(f), " (holding tensor ", Quoted(names[0]),
            ", and ", names.size() - 1, " more) does not exist"));
      }
      ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(fpath));
      for (const std::string& n : names) {
        if (file->Find(n) == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(ipath, ": tensor ", Quoted(n), " maps to ",
                           Quoted(f), ", which does not hold it"));
        }
      }
      ck->files_.push_back(std::move(file));
    }
    // Every tensor of a shard must be where the index says, and nowhere else.
    for (const auto& file : ck->files_) {
      const std::string f =
          fs::path(file->path()).lexically_relative(root).string();
      for (const TensorInfo& t : file->tensors()) {
        auto it = wm->find(t.name);
        if (it == wm->end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(file->path(), ": tensor ", Quoted(t.name),
                           " is not listed in ", ipath));
        }
        const std::string mapped = it->get<std::string>();
        if (fs::path(mapped).lexically_normal() !=
            fs::path(f).lexically_normal()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor ", Quoted(t.name), " is in two files: ", Quoted(mapped),
              " and ", Quoted(f), " (", ipath, ")"));
        }
      }
    }
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no model.safetensors or model.safetensors.index.json"));
  }

  for (const auto& file : ck->files_) {
    for (const TensorInfo& t : file->tensors()) {
      // MiMo checkpoints name the MTP block's second norm
      // "pre_mlp_layernorm"; it is the post-attention norm of a decoder
      // layer (SGLang renames it the same way). A checkpoint holding both
      // names is reported below as having an unexpected tensor.
      std::string name = t.name;
      if (IsSkippedTensor(name)) {
        ck->skipped_.push_back(name);
        continue;
      }
      // transformers' name for the sink logits (conversion_mapping.py renames
      // attention_sink_bias to sinks); both names in one checkpoint are
      // reported below as an unexpected tensor.
      constexpr absl::string_view kSinks = ".self_attn.sinks";
      if (absl::EndsWith(name, kSinks) &&
          !file->Find(absl::StrCat(name.substr(0, name.size() - 6), ".attention_sink_bias"))) {
        name = absl::StrCat(name.substr(0, name.size() - 6), ".attention_sink_bias");
      }
      constexpr absl::string_view kMtpAlias = ".pre_mlp_layernorm.weight";
      if (absl::StartsWith(name, "model.mtp.layers.") && absl::EndsWith(name, kMtpAlias) &&
          !file->Find(absl::StrCat(name.substr(0, name.size() - kMtpAlias.size()),
                                   ".post_attention_layernorm.weight"))) {
        name = absl::StrCat(name.substr(0, name.size() - kMtpAlias.size()),
                            ".post_attention_layernorm.weight");
      }
      ck->index_.emplace(name, &t);
      file_of.emplace(name, file->path());
    }
  }

  // Validate against the config.
  const std::map<std::string, std::vector<int64_t>> expected =
      ExpectedTensors(ck->config_);
  std::vector<std::string> problems;
  for (const auto& [name, info] : ck->index_) {
    const std::string& f = file_of.find(name)->second;
    auto e = expected.find(name);
    if (e == expected.end()) {
      problems.push_back(absl::StrCat("unexpected tensor ", Quoted(name), " ",
                                      ShapeString(info->shape), " in ", f));
      continue;
    }
    if (std::string p = DTypeProblem(ck->config_, name, *info); !p.empty()) {
      problems.push_back(absl::StrCat("tensor ", Quoted(name), " in ", f, " ", p));
    }
    if (info->shape != e->second) {
      problems.push_back(absl::StrCat("tensor ", Quoted(name), " in ", f,
                                      " has shape ", ShapeString(info->shape),
                                      ", expected ", ShapeString(e->second)));
    }
  }
  for (const auto& [name, shape] : expected) {
    if (ck->index_.find(name) == ck->index_.end()) {
      problems.push_back(absl::StrCat("missing tensor ", Quoted(name), " ",
                                      ShapeString(shape)));
    }
  }
  if (!ck->skipped_.empty()) {
    SWA_LOG(info, "{}: skipped {} tensors of the vision/audio encoders (e.g. {}): only the "
            "text model is served", dir, ck->skipped_.size(), ck->skipped_[0]);
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": checkpoint does not match config.json (", problems.size(),
        problems.size() == 1 ? " problem): " : " problems): ",
        JoinProblems(problems)));
  }
  return ck;
}

const TensorInfo* Checkpoint::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<std::vector<float>> Checkpoint::ReadF32(
    absl::string_view name, absl::Span<const int64_t> shape) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": no tensor ", Quoted(name)));
  }
  if (!shape.empty() && !std::equal(shape.begin(), shape.end(),
                                    t->shape.begin(), t->shape.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir_, ": tensor ", Quoted(name), " has shape ",
                     ShapeString(t->shape), ", expected ", ShapeString(shape)));
  }
  const int64_t n = t->numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (t->dtype) {
    case TensorDType::kF32:
      if (n > 0) std::memcpy(out.data(), t->data, static_cast<size_t>(n) * 4);
      break;
    case TensorDType::kBF16:
    case TensorDType::kF16: {
      const bool bf16 = t->dtype == TensorDType::kBF16;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t x;
        std::memcpy(&x, t->data + 2 * i, 2);
        out[i] = bf16 ? Bf16ToF32(x) : F16ToF32(x);
      }
      break;
    }
    case TensorDType::kF8E4M3:
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": tensor ", Quoted(name),
                       " is FP8 with block scales; read it with Weight()"));
    case TensorDType::kOther:
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": tensor ", Quoted(name),
                       " has unsupported dtype ", Quoted(t->dtype_name)));
  }
  return out;
}

// ---------------------------------------------------------------------------
// SafetensorsWriter.

namespace {

absl::StatusOr<uint64_t> TensorBytes(const std::string& name, TensorDType dtype,
                                     const std::vector<int64_t>& shape) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid tensor name ", Quoted(name)));
  }
  const size_t size = TensorDTypeSize(dtype);
  if (size == 0) {
    return TensorError(name, "SafetensorsWriter writes only F32, BF16 and F16");
  }
  uint64_t bytes = size;
  for (int64_t d : shape) {
    if (d < 0) return TensorError(name, absl::StrCat("negative dim ", d));
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return TensorError(name, "too large");
    }
  }
  return bytes;
}

}  // namespace

absl::Status SafetensorsWriter::Add(const std::string& name, TensorDType dtype,
                                    std::vector<int64_t> shape,
                                    std::string data) {
  ASSIGN_OR_RETURN(uint64_t bytes, TensorBytes(name, dtype, shape));
  if (data.size() != bytes) {
    return TensorError(name, absl::StrCat("shape ", ShapeString(shape), " of ",
                                          TensorDTypeName(dtype), " needs ",
                                          bytes, " bytes, got ", data.size()));
  }
  if (entries_.count(name) > 0) return TensorError(name, "added twice");
  entries_.emplace(name,
                   Entry{dtype, std::move(shape), std::move(data), nullptr});
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddLazy(const std::string& name,
                                        TensorDType dtype,
                                        std::vector<int64_t> shape,
                                        FillFn fill) {
  RETURN_IF_ERROR(TensorBytes(name, dtype, shape).status());
  if (!fill) return TensorError(name, "no fill function");
  if (entries_.count(name) > 0) return TensorError(name, "added twice");
  entries_.emplace(name, Entry{dtype, std::move(shape), "", std::move(fill)});
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Write(const std::string& path,
                                      const ProgressFn& progress) const {
  // File order: element size descending, then name (the reference writer's
  // order), so each tensor is aligned to its element size.
  std::vector<std::pair<const std::string*, const Entry*>> order;
  for (const auto& [name, entry] : entries_) order.emplace_back(&name, &entry);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) {
                     return TensorDTypeSize(a.second->dtype) >
                            TensorDTypeSize(b.second->dtype);
                   });
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& [name, entry] : order) {
    const uint64_t bytes = *TensorBytes(*name, entry->dtype, entry->shape);
    nlohmann::ordered_json e;
    e["dtype"] = std::string(TensorDTypeName(entry->dtype));
    e["shape"] = entry->shape;
    e["data_offsets"] = {offset, offset + bytes};
    header[*name] = std::move(e);
    sizes.push_back(bytes);
    offset += bytes;
  }
  const uint64_t total = offset;
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  bool ok = true;
  auto put = [&](const void* p, size_t n) {
    if (ok && n > 0 && std::fwrite(p, 1, n, f) != n) ok = false;
  };
  const uint64_t n = text.size();
  put(&n, 8);
  put(text.data(), text.size());
  uint64_t done = 0;
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < order.size() && ok; ++i) {
    const Entry& e = *order[i].second;
    if (e.fill) {
      buffer.assign(sizes[i], 0);
      e.fill(absl::MakeSpan(buffer));
      put(buffer.data(), buffer.size());
    } else {
      put(e.data.data(), e.data.size());
    }
    done += sizes[i];
    if (progress) progress(done, total);
  }
  const int write_errno = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    return absl::DataLossError(
        absl::StrCat(tmp, ": write failed: ", std::strerror(write_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat(
        path, ": cannot rename from ", tmp, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace swaserve::model
