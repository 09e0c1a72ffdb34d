// AVX2 + FMA (+ F16C) kernels for machines without AVX-512 (cpu_kernels.cc
// dispatches to them; the portable loops are the fallback below these).
// Each computes exactly what the AVX-512 kernel and the portable loop
// compute: Dot keeps the 16 lanes (k % 16) and their pairwise reduction, the
// GEMM each output element's fused multiply-adds in k order (k-blocked, the
// partial sums continued through y), Axpy one fused multiply-add per
// element. So results are bit-identical across the three paths, and batch-
// and chunk-invariant like them.
//
// Without these, a machine with AVX2 but no AVX-512 (AMD EPYC before Zen 4)
// ran the portable loops, whose std::fma is a libm call in a baseline x86-64
// build: the MiMo-V2.5-Pro-pattern window-restore test took over 15 minutes.
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "lib/model/cpu_kernels_avx2.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace swaserve::model::avx2 {

#define SWASERVE_AVX2 __attribute__((target("avx2,fma,f16c")))

bool Have() {
  // F16C is CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no
  // "f16c").
  static const bool have = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return have;
}

namespace {

// Lane mask for the first `rem` (< 8) of 8 floats.
SWASERVE_AVX2 inline __m256i TailMask(int64_t rem) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rem)), idx);
}

SWASERVE_AVX2 inline __m256 Bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

SWASERVE_AVX2 inline __m256 F16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8 E4M3 bytes -> f32 x 2^-8 (the bit trick of cpu_kernels.cc's Fp8x16,
// in 16-bit lanes).
SWASERVE_AVX2 inline __m256 Fp8x8(const uint8_t* p) {
  const __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i mag = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7F)), 7);
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8);
  return _mm256_cvtph_ps(_mm_or_si128(mag, sign));
}

// 8 weights of row k, columns [n, n + 8), widened to f32 (FP8 times its
// block's column scales cs[0..8)).
template <WeightFormat F>
SWASERVE_AVX2 inline __m256 Load8(const PackedWeight& w, int64_t k, int64_t n, const float* cs) {
  const int64_t i = k * w.ld + n;
  if constexpr (F == WeightFormat::kBF16) {
    return Bf16x8(w.data16.data() + i);
  } else if constexpr (F == WeightFormat::kF16) {
    return F16x8(w.data16.data() + i);
  } else {
    return _mm256_mul_ps(Fp8x8(w.data8.data() + i), _mm256_loadu_ps(cs));
  }
}

// Rows [0, MR) x columns [n, n + nn) (nn <= 16) of y = x · w over k in
// [k0, k1), continuing from y when k0 > 0. f32 weights are read from
// `f32` (row stride ld, element (k, n) at (k - kbase) * ld + n - nbase):
// the packed weight or a converted panel; narrow ones are widened in place.
template <int MR, WeightFormat F>
SWASERVE_AVX2 void Micro(const float* x, int64_t K, const PackedWeight& w, const float* f32,
                         int64_t ld, int64_t kbase, int64_t nbase, int64_t n, int64_t nn,
                         int64_t k0, int64_t k1, float* y, int64_t ldy) {
  const __m256i m0 = nn >= 8 ? _mm256_set1_epi32(-1) : TailMask(nn);
  const __m256i m1 = nn >= 16 ? _mm256_set1_epi32(-1) : TailMask(std::max<int64_t>(0, nn - 8));
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (k0 == 0) {
      acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    } else {
      acc[i][0] = _mm256_maskload_ps(y + i * ldy + n, m0);
      acc[i][1] = _mm256_maskload_ps(y + i * ldy + n + 8, m1);
    }
  }
  const int64_t bi = F == WeightFormat::kFp8E4M3 ? w.block_in : 1;
  int64_t next_block = (k0 / bi + 1) * bi;
  const float* cs =
      F == WeightFormat::kFp8E4M3 ? w.col_scale.data() + (k0 / bi) * w.ld + n : nullptr;
  for (int64_t k = k0; k < k1; ++k) {
    __m256 w0, w1;
    if constexpr (F == WeightFormat::kF32) {
      const float* wp = f32 + (k - kbase) * ld + (n - nbase);
      w0 = _mm256_maskload_ps(wp, m0);
      w1 = _mm256_maskload_ps(wp + 8, m1);
    } else {
      if (F == WeightFormat::kFp8E4M3 && k == next_block) {
        next_block += bi;
        cs += w.ld;
      }
      // Narrow rows are padded to ld (a multiple of 32): whole vectors.
      w0 = Load8<F>(w, k, n, cs);
      w1 = Load8<F>(w, k, n + 8, cs == nullptr ? nullptr : cs + 8);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_set1_ps(x[i * K + k]);
      acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm256_maskstore_ps(y + i * ldy + n, m0, acc[i][0]);
    if (nn > 8) _mm256_maskstore_ps(y + i * ldy + n + 8, m1, acc[i][1]);
  }
}

// Rows [k0, k1) x columns [n, n + 32) of a narrow weight as f32 into
// panel[(k - k0) * 32 + j]: the values Micro would widen in place.
template <WeightFormat F>
SWASERVE_AVX2 void ConvertPanel(const PackedWeight& w, int64_t n, int64_t k0, int64_t k1,
                                float* panel) {
  for (int64_t k = k0; k < k1; ++k) {
    const float* cs = F == WeightFormat::kFp8E4M3
                          ? w.col_scale.data() + (k / w.block_in) * w.ld + n
                          : nullptr;
    for (int j = 0; j < 32; j += 8) {
      _mm256_storeu_ps(panel + (k - k0) * 32 + j, Load8<F>(w, k, n + j, cs == nullptr ? nullptr : cs + j));
    }
  }
}

constexpr int64_t kPanelRows = 16;  // as cpu_kernels.cc

template <WeightFormat F>
SWASERVE_AVX2 void MatMulRangeT(const float* x, int64_t M, const PackedWeight& w, int64_t n0,
                                int64_t n1, float* y, int64_t ldy) {
  const int64_t K = w.K;
  constexpr int64_t kKc = 256;
  const bool panel_mode = F != WeightFormat::kF32 && M >= kPanelRows;
  alignas(32) float panel[kKc * 32];
  for (int64_t n = n0; n < n1; n += 32) {
    const int64_t nn = std::min<int64_t>(32, n1 - n);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t k1 = std::min(K, k0 + kKc);
      const float* f32 = w.data.data();
      int64_t ld = w.ld, kbase = 0, nbase = 0;
      if (panel_mode) {
        if constexpr (F != WeightFormat::kF32) ConvertPanel<F>(w, n, k0, k1, panel);
        f32 = panel;
        ld = 32;
        kbase = k0;
        nbase = n;
      }
      // Two 16-column halves of the 32-column block.
      for (int64_t h = 0; h < nn; h += 16) {
        const int64_t hn = std::min<int64_t>(16, nn - h);
        auto rows = [&](auto fmt) {
          constexpr WeightFormat G = decltype(fmt)::value;
          int64_t m = 0;
          for (; m + 4 <= M; m += 4) {
            Micro<4, G>(x + m * K, K, w, f32, ld, kbase, nbase, n + h, hn, k0, k1, y + m * ldy, ldy);
          }
          for (; m < M; ++m) {
            Micro<1, G>(x + m * K, K, w, f32, ld, kbase, nbase, n + h, hn, k0, k1, y + m * ldy, ldy);
          }
        };
        if (panel_mode) {
          rows(std::integral_constant<WeightFormat, WeightFormat::kF32>());
        } else {
          rows(std::integral_constant<WeightFormat, F>());
        }
      }
    }
  }
}

}  // namespace

SWASERVE_AVX2 float Dot(const float* a, const float* b, int64_t n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), hi);
  }
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (; k < n; ++k) lanes[k % 16] = std::fma(a[k], b[k], lanes[k % 16]);
  // cpu_kernels.cc's ReduceLanes: pairwise halves.
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

SWASERVE_AVX2 void Axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

void MatMulRange(const float* x, int64_t M, const PackedWeight& w, int64_t n0, int64_t n1,
                 float* y, int64_t ldy) {
  switch (w.format) {
    case WeightFormat::kF32:
      return MatMulRangeT<WeightFormat::kF32>(x, M, w, n0, n1, y, ldy);
    case WeightFormat::kBF16:
      return MatMulRangeT<WeightFormat::kBF16>(x, M, w, n0, n1, y, ldy);
    case WeightFormat::kF16:
      return MatMulRangeT<WeightFormat::kF16>(x, M, w, n0, n1, y, ldy);
    case WeightFormat::kFp8E4M3:
      return MatMulRangeT<WeightFormat::kFp8E4M3>(x, M, w, n0, n1, y, ldy);
  }
}

#undef SWASERVE_AVX2

}  // namespace swaserve::model::avx2
