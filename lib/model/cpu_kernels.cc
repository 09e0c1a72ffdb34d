#include "lib/model/cpu_kernels.h"

#include "lib/model/cpu_kernels_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <type_traits>

// GCC 12 reports the _mm512_undefined_* placeholders inside the widening
// intrinsics (vpmovzx, vpslld) as maybe-uninitialized once inlined: a known
// false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace swaserve::model {

// ---------------------------------------------------------------------------
// Threads.

struct KernelThreads::Impl {
  std::mutex call_mu;  // one ParallelFor at a time
  std::mutex mu;
  std::condition_variable cv;
  std::condition_variable done_cv;
  std::vector<std::thread> workers;
  const absl::FunctionRef<void(int64_t, int64_t)>* fn = nullptr;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  uint64_t generation = 0;
  int pending = 0;
  bool stop = false;
};

namespace {
std::atomic<int> g_requested_threads{0};
}  // namespace

KernelThreads::KernelThreads(int n) : impl_(std::make_unique<Impl>()) {
  n = std::max(1, n);
  for (int i = 1; i < n; ++i) {
    impl_->workers.emplace_back([this, i] {
      Impl& s = *impl_;
      uint64_t seen = 0;
      while (true) {
        std::pair<int64_t, int64_t> chunk;
        const absl::FunctionRef<void(int64_t, int64_t)>* fn;
        {
          std::unique_lock<std::mutex> lock(s.mu);
          s.cv.wait(lock, [&] { return s.stop || s.generation != seen; });
          if (s.stop) return;
          seen = s.generation;
          chunk = i < static_cast<int>(s.chunks.size()) ? s.chunks[i]
                                                         : std::make_pair(int64_t{0}, int64_t{0});
          fn = s.fn;
        }
        if (chunk.second > chunk.first) (*fn)(chunk.first, chunk.second);
        std::lock_guard<std::mutex> lock(s.mu);
        if (--s.pending == 0) s.done_cv.notify_one();
      }
    });
  }
}

KernelThreads::~KernelThreads() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (std::thread& t : impl_->workers) t.join();
}

KernelThreads& KernelThreads::Get() {
  static KernelThreads* pool = [] {
    int n = g_requested_threads.load();
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return new KernelThreads(n);
  }();
  return *pool;
}

void KernelThreads::SetThreads(int n) { g_requested_threads.store(n); }

int KernelThreads::threads() const {
  return static_cast<int>(impl_->workers.size()) + 1;
}

void KernelThreads::ParallelFor(int64_t n, int64_t grain,
                                absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int parts = static_cast<int>(std::min<int64_t>(threads(), units));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(impl_->call_mu);
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.chunks.clear();
    for (int p = 0; p < threads(); ++p) {
      const int64_t b = std::min(n, units * p / parts * grain);
      const int64_t e = p < parts ? std::min(n, units * (p + 1) / parts * grain) : b;
      s.chunks.emplace_back(p < parts ? b : 0, p < parts ? e : 0);
    }
    s.fn = &fn;
    s.pending = threads() - 1;
    ++s.generation;
  }
  s.cv.notify_all();
  fn(s.chunks[0].first, s.chunks[0].second);
  std::unique_lock<std::mutex> lock(s.mu);
  s.done_cv.wait(lock, [&] { return s.pending == 0; });
}

// ---------------------------------------------------------------------------
// Dot products and GEMM.

namespace {

bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have;
}

// Portable reference of the lane structure: lane k % 16 accumulates with
// fused multiply-add; lanes reduced as the AVX-512 reduce does (pairwise
// halves).
float ReduceLanes(const float* lanes) {
  float t8[8], t4[4], t2[2];
  for (int i = 0; i < 8; ++i) t8[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  for (int i = 0; i < 2; ++i) t2[i] = t4[i] + t4[i + 2];
  return t2[0] + t2[1];
}

float DotPortable(const float* a, const float* b, int64_t n) {
  float lanes[16] = {0};
  for (int64_t k = 0; k < n; ++k) lanes[k % 16] = std::fma(a[k], b[k], lanes[k % 16]);
  return ReduceLanes(lanes);
}

__attribute__((target("avx512f"))) inline __mmask16 TailMask(int64_t rem) {
  return rem >= 16 ? static_cast<__mmask16>(0xFFFF)
                   : static_cast<__mmask16>((1u << rem) - 1);
}

__attribute__((target("avx512f"))) float DotAvx512(const float* a,
                                                   const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc);
  }
  if (k < n) {
    const __mmask16 m = TailMask(n - k);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k),
                          _mm512_maskz_loadu_ps(m, b + k), acc);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  return ReduceLanes(lanes);
}

// 16 E4M3 bytes -> f32 x 2^-8: the E4M3 bits moved into an f16 (sign to
// bit 15, exponent and mantissa shifted up 7: an f16 exponent bias of 15
// against E4M3's 7, so the value is off by exactly 2^8, subnormals
// included), then widened.
__attribute__((target("avx512f"))) inline __m512 Fp8x16(const uint8_t* p) {
  const __m512i v =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x7F)), 7);
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 8);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_or_si512(mag, sign)));
}

__attribute__((target("avx512f"))) inline __m512 Bf16x16(const uint16_t* p) {
  const __m512i v =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

__attribute__((target("avx512f"))) inline __m512 F16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Rows [0, MR) × columns [n, n + 32) of y = x · w with w packed K×ld:
// acc[i][v] lane j holds y[i][n + 16v + j], summed over k in order. Narrow
// formats are widened to f32 (FP8: times its block's column scale) right
// before the multiply-adds, so each weight element's f32 value, and each
// output's sequence of operations, is the same whatever the batch.
// The row loops are unrolled so that acc stays in registers (without the
// pragma GCC kept it on the stack: 2.5x slower at 4 rows). Covers k in
// [k0, k1); when k0 > 0 the accumulators continue from the
// partial sums stored in y, so the per-element order is still k = 0..K-1.
// Where a micro-kernel reads its weights: the packed weight itself, or (f32
// only) a converted K-block panel of 32 columns, whose element (k, n) is
// f32[(k - kbase) * ld + (n - nbase)].
struct WeightView {
  const PackedWeight* w = nullptr;
  const float* f32 = nullptr;
  int64_t ld = 0;
  int64_t kbase = 0;
  int64_t nbase = 0;
};

template <int MR, WeightFormat F>
__attribute__((target("avx512f"))) void MicroAvx512(const float* x, int64_t K,
                                                    const WeightView& view,
                                                    int64_t n, int64_t nn,
                                                    int64_t k0, int64_t k1,
                                                    float* y, int64_t ldy) {
  const PackedWeight& w = *view.w;
  const int64_t ld = w.ld;
  const __mmask16 m0 = TailMask(std::min<int64_t>(16, nn));
  const __mmask16 m1 = nn > 16 ? TailMask(nn - 16) : static_cast<__mmask16>(0);
  __m512 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (k0 == 0) {
      acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    } else {
      acc[i][0] = _mm512_maskz_loadu_ps(m0, y + i * ldy + n);
      acc[i][1] = _mm512_maskz_loadu_ps(m1, y + i * ldy + n + 16);
    }
  }
  // FP8: the scale row of the current K block, advanced at block edges.
  const int64_t bi = F == WeightFormat::kFp8E4M3 ? w.block_in : 1;
  int64_t next_block = (k0 / bi + 1) * bi;
  const float* cs = F == WeightFormat::kFp8E4M3
                        ? w.col_scale.data() + (k0 / bi) * ld + n
                        : nullptr;
  for (int64_t k = k0; k < k1; ++k) {
    __m512 w0, w1;
    if constexpr (F == WeightFormat::kF32) {
      const float* wp = view.f32 + (k - view.kbase) * view.ld + (n - view.nbase);
      w0 = _mm512_maskz_loadu_ps(m0, wp);
      w1 = _mm512_maskz_loadu_ps(m1, wp + 16);
    } else if constexpr (F == WeightFormat::kBF16) {
      const uint16_t* wp = w.data16.data() + k * ld + n;
      w0 = Bf16x16(wp);
      w1 = Bf16x16(wp + 16);
    } else if constexpr (F == WeightFormat::kF16) {
      const uint16_t* wp = w.data16.data() + k * ld + n;
      w0 = F16x16(wp);
      w1 = F16x16(wp + 16);
    } else {
      if (k == next_block) {
        next_block += bi;
        cs += ld;
      }
      const uint8_t* wp = w.data8.data() + k * ld + n;
      w0 = _mm512_mul_ps(Fp8x16(wp), _mm512_loadu_ps(cs));
      w1 = _mm512_mul_ps(Fp8x16(wp + 16), _mm512_loadu_ps(cs + 16));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * K + k]);
      acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy + n, m0, acc[i][0]);
    if (nn > 16) _mm512_mask_storeu_ps(y + i * ldy + n + 16, m1, acc[i][1]);
  }
}

// Converts rows [k0, k1) x columns [n, n + 32) of a narrow weight to f32
// into panel[(k - k0) * 32 + j]: the very values the micro-kernel would
// widen in place (so a product's arithmetic is the same either way).
template <WeightFormat F>
__attribute__((target("avx512f"))) void ConvertPanel(const PackedWeight& w, int64_t n,
                                                     int64_t k0, int64_t k1, float* panel) {
  const int64_t ld = w.ld;
  for (int64_t k = k0; k < k1; ++k) {
    float* out = panel + (k - k0) * 32;
    if constexpr (F == WeightFormat::kBF16) {
      _mm512_storeu_ps(out, Bf16x16(w.data16.data() + k * ld + n));
      _mm512_storeu_ps(out + 16, Bf16x16(w.data16.data() + k * ld + n + 16));
    } else if constexpr (F == WeightFormat::kF16) {
      _mm512_storeu_ps(out, F16x16(w.data16.data() + k * ld + n));
      _mm512_storeu_ps(out + 16, F16x16(w.data16.data() + k * ld + n + 16));
    } else {
      const float* cs = w.col_scale.data() + (k / w.block_in) * ld + n;
      const uint8_t* wp = w.data8.data() + k * ld + n;
      _mm512_storeu_ps(out, _mm512_mul_ps(Fp8x16(wp), _mm512_loadu_ps(cs)));
      _mm512_storeu_ps(out + 16, _mm512_mul_ps(Fp8x16(wp + 16), _mm512_loadu_ps(cs + 16)));
    }
  }
}

// With at least kPanelRows rows, a narrow weight's K-block panel is
// converted once and shared by every row block (prefill); below, each
// micro-kernel widens its weights in place (decode: each weight is used by
// few rows, a conversion pass would cost more than it saves).
constexpr int64_t kPanelRows = 16;

template <WeightFormat F>
__attribute__((target("avx512f"))) void MatMulRangeAvx512(
    const float* x, int64_t M, const PackedWeight& w, int64_t n0, int64_t n1,
    float* y, int64_t ldy) {
  const int64_t K = w.K;
  // K blocks of 256 keep a 256×32 weight panel (32 KiB in f32) in L1 while
  // every row block passes over it.
  constexpr int64_t kKc = 256;
  const bool panel_mode = F != WeightFormat::kF32 && M >= kPanelRows;
  alignas(64) float panel[kKc * 32];
  for (int64_t n = n0; n < n1; n += 32) {
    const int64_t nn = std::min<int64_t>(32, n1 - n);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t k1 = std::min(K, k0 + kKc);
      WeightView v{.w = &w, .f32 = w.data.data(), .ld = w.ld, .kbase = 0, .nbase = 0};
      if (panel_mode) {
        if constexpr (F != WeightFormat::kF32) ConvertPanel<F>(w, n, k0, k1, panel);
        v = {.w = &w, .f32 = panel, .ld = 32, .kbase = k0, .nbase = n};
      }
      auto rows = [&](auto fmt) {
        int64_t m = 0;
        for (; m + 8 <= M; m += 8) MicroAvx512<8, decltype(fmt)::value>(x + m * K, K, v, n, nn, k0, k1, y + m * ldy, ldy);
        for (; m + 4 <= M; m += 4) MicroAvx512<4, decltype(fmt)::value>(x + m * K, K, v, n, nn, k0, k1, y + m * ldy, ldy);
        for (; m < M; ++m) MicroAvx512<1, decltype(fmt)::value>(x + m * K, K, v, n, nn, k0, k1, y + m * ldy, ldy);
      };
      if (panel_mode) {
        rows(std::integral_constant<WeightFormat, WeightFormat::kF32>());
      } else {
        rows(std::integral_constant<WeightFormat, F>());
      }
    }
  }
}

void MatMulRangeDispatch(const float* x, int64_t M, const PackedWeight& w,
                         int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (w.format) {
    case WeightFormat::kF32:
      return MatMulRangeAvx512<WeightFormat::kF32>(x, M, w, n0, n1, y, ldy);
    case WeightFormat::kBF16:
      return MatMulRangeAvx512<WeightFormat::kBF16>(x, M, w, n0, n1, y, ldy);
    case WeightFormat::kF16:
      return MatMulRangeAvx512<WeightFormat::kF16>(x, M, w, n0, n1, y, ldy);
    case WeightFormat::kFp8E4M3:
      return MatMulRangeAvx512<WeightFormat::kFp8E4M3>(x, M, w, n0, n1, y, ldy);
  }
}

void MatMulRangePortable(const float* x, int64_t M, const PackedWeight& w,
                         int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t K = w.K;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(x[m * K + k], w.At(k, n), acc);
      y[m * ldy + n] = acc;
    }
  }
}

}  // namespace

bool UsingAvx512() { return HaveAvx512(); }

float Dot(const float* a, const float* b, int64_t n) {
  if (HaveAvx512()) return DotAvx512(a, b, n);
  return avx2::Have() ? avx2::Dot(a, b, n) : DotPortable(a, b, n);
}

void MatMul(const float* x, int64_t M, const PackedWeight& w, float* y,
            int64_t ldy) {
  if (M <= 0 || w.N <= 0) return;
  const bool avx = HaveAvx512();
  const bool use_avx2 = avx2::Have();
  auto run = [&](int64_t n0, int64_t n1) {
    if (avx) {
      MatMulRangeDispatch(x, M, w, n0, n1, y, ldy);
    } else if (use_avx2) {
      avx2::MatMulRange(x, M, w, n0, n1, y, ldy);
    } else {
      MatMulRangePortable(x, M, w, n0, n1, y, ldy);
    }
  };
  // Split columns across threads (in multiples of the 32-column block) when
  // there is enough work; the split never changes an element's arithmetic.
  if (M * w.N * w.K < (1 << 20)) {
    run(0, w.N);
  } else {
    KernelThreads::Get().ParallelFor(w.N, 32, run);
  }
}

void MatMulNT(const float* x, int64_t M, int64_t K, const float* w, int64_t N,
              float* y) {
  MatMul(x, M, PackedWeight::FromOutIn(w, N, K), y, N);
}

void RmsNorm(const float* x, const float* weight, float* y, int64_t rows,
             int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float ss = Dot(xr, xr, dim);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void ApplyRope(float* vec, int heads, int head_dim, int rot_dim, int64_t pos,
               double theta) {
  const int half = rot_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = 1.0 / std::pow(theta, (2.0 * i) / rot_dim);
    const double angle = static_cast<double>(pos) * inv_freq;
    const float c = static_cast<float>(std::cos(angle));
    const float s = static_cast<float>(std::sin(angle));
    for (int h = 0; h < heads; ++h) {
      float* v = vec + static_cast<int64_t>(h) * head_dim;
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

namespace {
__attribute__((target("avx512f"))) void AxpyAvx512(float a, const float* x,
                                                   float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i),
                                                    _mm512_maskz_loadu_ps(m, y + i)));
  }
}
}  // namespace

void Axpy(float a, const float* x, float* y, int64_t n) {
  if (HaveAvx512()) {
    AxpyAvx512(a, x, y, n);
    return;
  }
  if (avx2::Have()) {
    avx2::Axpy(a, x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace swaserve::model
