#include "lib/model/tower_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"

namespace swaserve::model {

namespace fs = std::filesystem;
using Json = nlohmann::json;

absl::StatusOr<std::string> ReadConfigJsonText(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::vector<std::pair<std::string, std::vector<float>>>> LoadTensorsF32(
    const std::string& dir, const std::string& prefix) {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(f.string()));
    for (const TensorInfo& t : file->tensors()) {
      if (!absl::StartsWith(t.name, prefix)) continue;
      std::vector<float> v(static_cast<size_t>(t.numel()));
      const size_t size = TensorDTypeSize(t.dtype);
      if (t.dtype != TensorDType::kF32 && t.dtype != TensorDType::kBF16 &&
          t.dtype != TensorDType::kF16) {
        return absl::InvalidArgumentError(absl::StrCat(f.string(), ": tensor ", t.name,
                                                       " has dtype ", t.dtype_name,
                                                       " (f32, bf16 or f16 expected)"));
      }
      for (int64_t i = 0; i < t.numel(); ++i) {
        const uint8_t* p = t.data + i * size;
        if (t.dtype == TensorDType::kF32) {
          std::memcpy(&v[i], p, 4);
        } else {
          uint16_t x;
          std::memcpy(&x, p, 2);
          v[i] = t.dtype == TensorDType::kBF16 ? Bf16ToF32(x) : F16ToF32(x);
        }
      }
      tensors.emplace_back(t.name, std::move(v));
    }
  }
  return tensors;
}

absl::Status WriteRandomTower(
    const std::string& dir, const std::string& file,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes, uint64_t seed,
    const std::string& config_key, const std::string& config_object_json) {
  const fs::path config_path = fs::path(dir) / "config.json";
  ASSIGN_OR_RETURN(const std::string text, ReadConfigJsonText(dir));
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": not a JSON object"));
  }
  SafetensorsWriter writer;
  for (const auto& [name, shape] : shapes) {
    int64_t numel = 1, fan_in = 1;
    for (int64_t d : shape) numel *= d;
    for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
    // SplitMix64 stream seeded by the seed and the name (FNV-1a).
    uint64_t state = seed ^ 0x9E3779B97F4A7C15ull;
    for (unsigned char ch : name) state = (state ^ ch) * 0x100000001B3ull;
    auto next = [&] {
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    auto uniform = [&] { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; };
    auto normal = [&] {
      return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
    };
    const bool bias = absl::EndsWith(name, ".bias");
    const bool norm = shape.size() == 1 && !bias;
    const double sd = shape.size() >= 2 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.02;
    std::string bytes(static_cast<size_t>(numel) * 4, '\0');
    for (int64_t i = 0; i < numel; ++i) {
      const float v = static_cast<float>(norm ? 1.0 + 0.1 * normal() : sd * normal());
      std::memcpy(&bytes[static_cast<size_t>(i) * 4], &v, 4);
    }
    RETURN_IF_ERROR(writer.Add(name, TensorDType::kF32, shape, std::move(bytes)));
  }
  RETURN_IF_ERROR(writer.Write((fs::path(dir) / file).string()));
  root[config_key] = Json::parse(config_object_json);
  const fs::path tmp = config_path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << root.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, config_path, ec);
  if (ec) return absl::InternalError(absl::StrCat("rename ", tmp.string(), ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<TowerTensors> TowerTensors::Create(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
    const std::vector<std::pair<std::string, std::vector<float>>>& tensors,
    const std::string& what) {
  TowerTensors t;
  std::map<std::string, const std::vector<float>*> by_name;
  for (const auto& [name, values] : tensors) by_name[name] = &values;
  for (const auto& [name, shape] : shapes) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor ", name, " is missing"));
    }
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (static_cast<int64_t>(it->second->size()) != numel) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor ", name, " has ",
                                                     it->second->size(), " values, expected ",
                                                     numel));
    }
    t.values_[name] = it->second;
    t.shapes_[name] = shape;
  }
  return t;
}

std::vector<float> TowerTensors::Vec(const std::string& name) const { return *values_.at(name); }

PackedWeight TowerTensors::Packed(const std::string& name) const {
  const std::vector<int64_t>& s = shapes_.at(name);
  int64_t in = 1;
  for (size_t i = 1; i < s.size(); ++i) in *= s[i];
  return PackedWeight::FromOutIn(values_.at(name)->data(), s[0], in);
}

float GeluErf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

void AddBias(float* y, int64_t rows, const std::vector<float>& b) {
  const int64_t n = static_cast<int64_t>(b.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += b[j];
  }
}

void AttendRows(const float* qkv, int64_t D, int heads, int hd, int64_t q_row,
                absl::Span<const int64_t> key_rows, float* out, std::vector<float>* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int h = 0; h < heads; ++h) {
    const float* q = qkv + q_row * 3 * D + int64_t{h} * hd;
    scores->clear();
    float mx = -INFINITY;
    for (int64_t kr : key_rows) {
      const float s = Dot(q, qkv + kr * 3 * D + D + int64_t{h} * hd, hd) * scale;
      scores->push_back(s);
      mx = std::max(mx, s);
    }
    float sum = 0;
    for (float& s : *scores) {
      s = std::exp(s - mx);
      sum += s;
    }
    float* o = out + int64_t{h} * hd;
    std::fill(o, o + hd, 0.0f);
    for (size_t k = 0; k < key_rows.size(); ++k) {
      Axpy((*scores)[k] / sum, qkv + key_rows[k] * 3 * D + 2 * D + int64_t{h} * hd, o, hd);
    }
  }
}

}  // namespace swaserve::model
