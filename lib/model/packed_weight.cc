// PackedWeight (cpu_kernels.h): weights packed for the GEMM in their stored
// format, and the element conversions the kernels use.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"

namespace swaserve::model {
namespace {

// The f16 bits whose value is the E4M3 value times 2^-8 (see Fp8x16).
uint16_t Fp8ToF16Bits(uint8_t x) {
  return static_cast<uint16_t>(((x & 0x7F) << 7) | ((x & 0x80) << 8));
}

bool IsFp8Nan(uint8_t x) { return (x & 0x7F) == 0x7F; }

size_t ElementSize(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return 4;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      return 2;
    case WeightFormat::kFp8E4M3:
      return 1;
  }
  return 4;
}

absl::Status CheckParts(absl::Span<const WeightPart> parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no weight parts");
  const WeightPart& first = parts[0];
  for (size_t i = 0; i < parts.size(); ++i) {
    const WeightPart& p = parts[i];
    if (p.format != first.format || p.K != first.K) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight part ", i, " differs from part 0 in format or in_features (",
          p.K, " vs ", first.K, ")"));
    }
    if (p.rows < 0 || p.K <= 0 || (p.rows > 0 && p.data == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight part ", i, ": bad shape [", p.rows, ", ", p.K,
                       "]"));
    }
    if (p.format != WeightFormat::kFp8E4M3) continue;
    if (p.block_out <= 0 || p.block_in <= 0 || p.scale == nullptr ||
        p.block_in != first.block_in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 weight part ", i, ": needs block scales with one block_in (",
          p.block_in, " vs ", first.block_in, ")"));
    }
    if (p.scale_cols != (p.K + p.block_in - 1) / p.block_in) {
      return absl::InvalidArgumentError(
          absl::StrCat("FP8 weight part ", i, ": ", p.scale_cols,
                       " scale columns for in_features ", p.K, " in blocks of ",
                       p.block_in));
    }
  }
  return absl::OkStatus();
}

}  // namespace

float Fp8E4M3ToF32(uint8_t x) {
  if (IsFp8Nan(x)) return std::nanf("");
  return F16ToF32(Fp8ToF16Bits(x)) * 256.0f;
}

uint8_t F32ToFp8E4M3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;  // saturate at the largest finite
  // Positive codes 0x00..0x7E increase with their value: binary search the
  // largest code <= a, then round to nearest, ties to the even code.
  int lo = 0, hi = 0x7E;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (Fp8E4M3ToF32(static_cast<uint8_t>(mid)) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int code = lo;
  if (code < 0x7E) {
    const float below = Fp8E4M3ToF32(static_cast<uint8_t>(code));
    const float above = Fp8E4M3ToF32(static_cast<uint8_t>(code + 1));
    const float d_below = a - below, d_above = above - a;
    if (d_above < d_below || (d_above == d_below && (code & 1) != 0)) ++code;
  }
  return static_cast<uint8_t>(sign | code);
}

PackedWeight PackedWeight::FromOutIn(const float* w, int64_t N, int64_t K) {
  PackedWeight p;
  p.K = K;
  p.N = N;
  p.ld = N;
  p.data.resize(static_cast<size_t>(K) * N);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) p.data[k * N + n] = w[n * K + k];
  }
  return p;
}

absl::StatusOr<PackedWeight> PackedWeight::Pack(
    absl::Span<const WeightPart> parts) {
  RETURN_IF_ERROR(CheckParts(parts));
  PackedWeight p;
  p.format = parts[0].format;
  p.K = parts[0].K;
  for (const WeightPart& part : parts) p.N += part.rows;
  const int64_t K = p.K;
  p.ld = p.format == WeightFormat::kF32 ? p.N : (p.N + 31) / 32 * 32;
  const size_t cells = static_cast<size_t>(K) * p.ld;
  switch (p.format) {
    case WeightFormat::kF32:
      p.data.assign(cells, 0.0f);
      break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      p.data16.assign(cells, 0);
      break;
    case WeightFormat::kFp8E4M3:
      p.data8.assign(cells, 0);
      p.block_in = parts[0].block_in;
      p.col_scale.assign(
          static_cast<size_t>((K + p.block_in - 1) / p.block_in) * p.ld, 0.0f);
      break;
  }
  const size_t esize = ElementSize(p.format);
  int64_t n0 = 0;
  for (const WeightPart& part : parts) {
    const auto* src = static_cast<const uint8_t*>(part.data);
    for (int64_t r = 0; r < part.rows; ++r) {
      const int64_t n = n0 + r;
      const uint8_t* row = src + static_cast<size_t>(r) * K * esize;
      switch (p.format) {
        case WeightFormat::kF32:
          for (int64_t k = 0; k < K; ++k) {
            std::memcpy(&p.data[k * p.ld + n], row + 4 * k, 4);
          }
          break;
        case WeightFormat::kBF16:
        case WeightFormat::kF16:
          for (int64_t k = 0; k < K; ++k) {
            std::memcpy(&p.data16[k * p.ld + n], row + 2 * k, 2);
          }
          break;
        case WeightFormat::kFp8E4M3: {
          for (int64_t k = 0; k < K; ++k) {
            if (IsFp8Nan(row[k])) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "FP8 weight holds a NaN at [", part.row0 + r, ", ", k, "]"));
            }
            p.data8[k * p.ld + n] = row[k];
          }
          const int64_t srow = (part.row0 + r) / part.block_out;
          for (int64_t kb = 0; kb < part.scale_cols; ++kb) {
            float s;  // the mapping need not align f32 data: copy it
            std::memcpy(&s, part.scale + srow * part.scale_cols + kb, 4);
            if (!std::isfinite(s)) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "FP8 block scale [", srow, ", ", kb, "] is not finite"));
            }
            p.col_scale[kb * p.ld + n] = s * 256.0f;
          }
          break;
        }
      }
    }
    n0 += part.rows;
  }
  return p;
}

PackedWeight PackedWeight::Columns(absl::Span<const int32_t> cols) const {
  PackedWeight p;
  ColumnsInto(cols, &p);
  return p;
}

void PackedWeight::ColumnsInto(absl::Span<const int32_t> cols, PackedWeight* out) const {
  PackedWeight& p = *out;
  p.format = format;
  p.K = K;
  p.N = static_cast<int64_t>(cols.size());
  p.block_in = block_in;
  // The same padding rule as Pack: F32 unpadded, the narrow formats to 32.
  p.ld = format == WeightFormat::kF32 ? p.N : (p.N + 31) / 32 * 32;
  auto gather = [&](const auto& src, auto& dst, int64_t rows) {
    dst.assign(static_cast<size_t>(rows) * p.ld, {});
    for (int64_t k = 0; k < rows; ++k) {
      for (size_t j = 0; j < cols.size(); ++j) {
        dst[static_cast<size_t>(k) * p.ld + j] = src[static_cast<size_t>(k) * ld + cols[j]];
      }
    }
  };
  switch (format) {
    case WeightFormat::kF32:
      gather(data, p.data, K);
      break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      gather(data16, p.data16, K);
      break;
    case WeightFormat::kFp8E4M3:
      gather(data8, p.data8, K);
      gather(col_scale, p.col_scale, (K + block_in - 1) / block_in);
      break;
  }
}

size_t PackedWeight::bytes() const {
  return data.size() * sizeof(float) + data16.size() * sizeof(uint16_t) +
         data8.size() + col_scale.size() * sizeof(float);
}

float PackedWeight::At(int64_t k, int64_t n) const {
  const size_t i = static_cast<size_t>(k) * ld + n;
  switch (format) {
    case WeightFormat::kF32:
      return data[i];
    case WeightFormat::kBF16:
      return Bf16ToF32(data16[i]);
    case WeightFormat::kF16:
      return F16ToF32(data16[i]);
    case WeightFormat::kFp8E4M3:
      return F16ToF32(Fp8ToF16Bits(data8[i])) *
             col_scale[static_cast<size_t>(k / block_in) * ld + n];
  }
  return 0;
}

}  // namespace swaserve::model
