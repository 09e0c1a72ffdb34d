// KV element conversion between f32 (what the kernels compute in) and a KV
// pool's dtype (f32, bf16, f16). bf16 rounds to nearest even; NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "lib/kv/kv_shape.h"
#include "lib/model/checkpoint.h"

namespace swaserve::model {

inline float BF16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// n elements of src (f32) stored into dst in `dtype`.
inline void StoreKv(kv::DType dtype, uint8_t* dst, const float* src, int n) {
  switch (dtype) {
    case kv::DType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case kv::DType::kBF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = F32ToBF16(src[i]);
      return;
    }
    case kv::DType::kF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
  }
}

// n elements of src (in `dtype`) widened into dst (f32).
inline void LoadKv(kv::DType dtype, const uint8_t* src, float* dst, int n) {
  switch (dtype) {
    case kv::DType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case kv::DType::kBF16: {
      auto* s = reinterpret_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case kv::DType::kF16: {
      auto* s = reinterpret_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
  }
}

}  // namespace swaserve::model
