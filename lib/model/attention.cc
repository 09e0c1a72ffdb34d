#include "lib/model/attention.h"

#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics (max, roundscale, scalef) pass
// _mm512_undefined_ps() as the unused merge source, which its own
// -Wuninitialized flags at -O2; the values are never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Every function passing __m512 here is target("avx512f") and internal to
// this file, so the vector ABI is the same on both sides of each call
// (unoptimized builds do not inline them).
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <vector>

#include "lib/model/cpu_kernels.h"
#include "lib/model/cpu_kernels_avx2.h"
#include "lib/model/kv_io.h"

namespace swaserve::model {

namespace {

constexpr int kLanes = 16;
constexpr int kBk = kAttentionKeyBlock;
// Most vectors of 16 lanes one AVX-512 task computes together (Avx512Tile).
constexpr int kMaxVectors = 3;
// Windows shorter than this take one vector per task (VectorsFor).
constexpr int kShortWindow = 1024;
// Tasks reading at least this many keys prefetch the next block's rows.
constexpr int kPrefetchMinKeys = 4096;

int WindowStart(const AttentionParams& p, const AttentionSpan& sp, int pos) {
  return std::max(sp.first_key, p.window > 0 ? std::max(0, pos - p.window + 1) : 0);
}

// Per-thread scratch; vectors only grow, so steady state does not allocate.
struct Scratch {
  std::vector<float> qt;      // [head_dim][lanes]: the task's queries, transposed
  std::vector<float> o;       // [v_head_dim][lanes]: output accumulators
  std::vector<float> s;       // [kBk][lanes]: a block's scores, then weights
  std::vector<float> kconv;   // [kBk][head_dim]: keys widened from bf16/f16
  std::vector<float> vconv;   // [kBk][v_head_dim]
  std::vector<uint16_t> valid;  // [kBk][vectors]: lane masks per key
  std::vector<float> scores;  // portable kernel: one query's scores
  void Reserve(const AttentionParams& p, size_t keys) {
    auto grow = [](auto& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(qt, static_cast<size_t>(p.head_dim) * kLanes * kMaxVectors);
    grow(o, static_cast<size_t>(p.v_head_dim) * kLanes * kMaxVectors);
    grow(s, static_cast<size_t>(kBk) * kLanes * kMaxVectors);
    grow(kconv, static_cast<size_t>(kBk) * p.head_dim);
    grow(vconv, static_cast<size_t>(kBk) * p.v_head_dim);
    grow(valid, static_cast<size_t>(kBk) * kMaxVectors);
    if (scores.size() < keys) {
      // Sized for 64K keys on first use, doubled beyond: decode steps never
      // allocate while the context grows.
      scores.resize(std::max<size_t>({keys, size_t{1} << 16, 2 * scores.size()}));
    }
  }
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// ---------------------------------------------------------------------------
// Portable kernel: one (query, head) at a time, keys in position order.

void PortableQueryHead(const AttentionParams& p, const AttentionSpan& sp,
                       int qi, int h, const float* q, float* out,
                       Scratch& sc) {
  const int nh = p.num_heads, hd = p.head_dim, vd = p.v_head_dim;
  const int kvh = h / (nh / p.num_kv_heads);
  const kv::LayerView& view = sp.view;
  const kv::DType dt = view.pool->geometry().dtype;
  const size_t es = kv::DTypeSize(dt);
  const int pos = sp.pos0 + qi;
  const int lo = WindowStart(p, sp, pos);
  const int n = pos - lo + 1;
  sc.Reserve(p, n);
  float* kbuf = sc.kconv.data();
  float* vbuf = sc.vconv.data();
  const int row = sp.row0 + qi;
  const float* qh = q + (static_cast<size_t>(row) * nh + h) * hd;
  float m = -INFINITY;
  float* scores = sc.scores.data();
  for (int j = 0; j < n; ++j) {
    LoadKv(dt, view.K(lo + j) + static_cast<size_t>(kvh) * hd * es, kbuf, hd);
    scores[j] = Dot(qh, kbuf, hd) * p.scale;
    m = std::max(m, scores[j]);
  }
  const float sink = p.sinks != nullptr ? p.sinks[h] : -INFINITY;
  m = std::max(m, sink);
  float denom = 0;
  for (int j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - m);
    denom += scores[j];
  }
  if (p.sinks != nullptr) denom += std::exp(sink - m);
  const float inv = 1.0f / denom;
  float* o = out + (static_cast<size_t>(row) * nh + h) * vd;
  std::fill(o, o + vd, 0.0f);
  for (int j = 0; j < n; ++j) {
    LoadKv(dt, view.V(lo + j) + static_cast<size_t>(kvh) * vd * es, vbuf, vd);
    Axpy(scores[j] * inv, vbuf, o, vd);
  }
}

// A tile's lanes [lane0, lane0 + nlanes) of W: the (query, head) pairs of
// KV head kvh, numbered query-major (lane = query · group + g). Fills each
// lane's key range [lo, pos] (empty for lanes past nlanes), its queries
// transposed into qt[hd][W], the softmax state (m, l: the sink's, if any),
// and the union of the lanes' key ranges [*kmin, *kmax].
void SetUpLanes(const AttentionParams& p, const AttentionSpan& sp, int kvh, int lane0,
                int nlanes, int W, const float* q, float* qt, int32_t* lo_a, int32_t* pos_a,
                float* m_a, float* l_a, int* kmin, int* kmax) {
  const int nh = p.num_heads, hd = p.head_dim, group = nh / p.num_kv_heads;
  for (int lane = 0; lane < W; ++lane) {
    if (lane >= nlanes) {
      lo_a[lane] = INT_MAX;  // never valid
      pos_a[lane] = -1;
      m_a[lane] = -INFINITY;
      l_a[lane] = 0;
      for (int i = 0; i < hd; ++i) qt[i * W + lane] = 0;
      continue;
    }
    const int idx = lane0 + lane;
    const int qi = idx / group, h = kvh * group + idx % group;
    const int pos = sp.pos0 + qi;
    lo_a[lane] = WindowStart(p, sp, pos);
    pos_a[lane] = pos;
    *kmin = std::min(*kmin, lo_a[lane]);
    *kmax = std::max(*kmax, pos);
    const float* qrow = q + (static_cast<size_t>(sp.row0 + qi) * nh + h) * hd;
    for (int i = 0; i < hd; ++i) qt[i * W + lane] = qrow[i];
    m_a[lane] = p.sinks != nullptr ? p.sinks[h] : -INFINITY;
    l_a[lane] = p.sinks != nullptr ? 1.0f : 0.0f;
  }
}

// Key and value rows [a, a + nk) of KV head kvh: f32 pointers into the
// pages, or copies widened by `load` into the scratch.
void BlockRows(const AttentionParams& p, const kv::LayerView& view, int kvh, int a, int nk,
               void (*load)(kv::DType, const uint8_t*, float*, int), Scratch& sc,
               const float** krow, const float** vrow) {
  const int hd = p.head_dim, vd = p.v_head_dim;
  const kv::DType dt = view.pool->geometry().dtype;
  const size_t es = kv::DTypeSize(dt);
  for (int j = 0; j < nk; ++j) {
    const uint8_t* kp = view.K(a + j) + static_cast<size_t>(kvh) * hd * es;
    const uint8_t* vp = view.V(a + j) + static_cast<size_t>(kvh) * vd * es;
    if (dt == kv::DType::kF32) {
      krow[j] = reinterpret_cast<const float*>(kp);
      vrow[j] = reinterpret_cast<const float*>(vp);
    } else {
      load(dt, kp, sc.kconv.data() + static_cast<size_t>(j) * hd, hd);
      load(dt, vp, sc.vconv.data() + static_cast<size_t>(j) * vd, vd);
      krow[j] = sc.kconv.data() + static_cast<size_t>(j) * hd;
      vrow[j] = sc.vconv.data() + static_cast<size_t>(j) * vd;
    }
  }
}

// Prefetches the key and value rows of KV head kvh in key block kb (up to
// kmax) into L1, for a tile over a long key range (its rows are not in
// cache) to read them from memory while the block before computes.
void PrefetchBlock(const AttentionParams& p, const kv::LayerView& view, int kvh, int kb,
                   int kmax) {
  const int hd = p.head_dim, vd = p.v_head_dim;
  const size_t es = kv::DTypeSize(view.pool->geometry().dtype);
  for (int t = kb * kBk, nb = std::min(kb * kBk + kBk - 1, kmax); t <= nb; ++t) {
    const uint8_t* kp = view.K(t) + static_cast<size_t>(kvh) * hd * es;
    const uint8_t* vp = view.V(t) + static_cast<size_t>(kvh) * vd * es;
    _mm_prefetch(reinterpret_cast<const char*>(kp), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(kp + hd * es - 1), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(vp), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(vp + vd * es - 1), _MM_HINT_T0);
  }
}

// out = o / l for each of the tile's lanes (o: [vd][W]).
void WriteLanes(const AttentionParams& p, const AttentionSpan& sp, int kvh, int lane0,
                int nlanes, int W, const float* o, const float* l_a, float* out) {
  const int nh = p.num_heads, vd = p.v_head_dim, group = nh / p.num_kv_heads;
  for (int lane = 0; lane < nlanes; ++lane) {
    const int idx = lane0 + lane;
    const int qi = idx / group, h = kvh * group + idx % group;
    float* dst = out + (static_cast<size_t>(sp.row0 + qi) * nh + h) * vd;
    const float inv = 1.0f / l_a[lane];
    for (int c = 0; c < vd; ++c) dst[c] = o[c * W + lane] * inv;
  }
}

// ---------------------------------------------------------------------------
// AVX-512 kernel: a tile of up to 16 (query, head) lanes sharing a KV head.

__attribute__((target("avx512f"))) inline __m512 Exp512(__m512 x) {
  // exp(x) = 2^n · e^r, n = round(x·log2 e), |r| ≤ ln2/2, e^r by its degree-7
  // Taylor polynomial (relative error < 1e-8 before rounding). Inputs below
  // −87.3 (exp underflows to denormals) are clamped there; callers mask the
  // lanes that must be exactly 0.
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.0f / 5040);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 720));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// Scales a lane's score, masks lanes for which key t is outside [lo, pos]
// (→ −inf), stores it and its lane mask, and folds it into the block max.
__attribute__((target("avx512f"))) inline void FinishScore(
    __m512 acc, int t, __m512i lo_v, __m512i pos_v, __m512 scale, float* s_out,
    uint16_t* valid_out, __m512* m_blk) {
  const __m512i tv = _mm512_set1_epi32(t);
  const __mmask16 ok = _mm512_cmp_epi32_mask(lo_v, tv, _MM_CMPINT_LE) &
                       _mm512_cmp_epi32_mask(tv, pos_v, _MM_CMPINT_LE);
  const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, _mm512_mul_ps(acc, scale));
  _mm512_storeu_ps(s_out, s);
  *valid_out = ok;
  *m_blk = _mm512_max_ps(*m_blk, s);
}

// Lanes [lane0, lane0 + nlanes) of the span's (query, head-in-group) pairs,
// numbered query-major (lane index = query · group + g), for KV head kvh.
// LoadKv with bf16 widened 16 at a time (bit for bit the scalar widening:
// the bf16 bits become the f32's high half).
__attribute__((target("avx512f"))) void LoadKvAvx512(kv::DType dt, const uint8_t* src,
                                                     float* dst, int n) {
  if (dt != kv::DType::kBF16) return LoadKv(dt, src, dst, n);
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) dst[i] = BF16ToF32(s[i]);
}

// V vectors of 16 lanes (V · 16 (query, head) pairs) of one span and KV head
// at once: every key row read and widened once serves V · 16 lanes, and each
// broadcast key element feeds V FMAs. Each lane's arithmetic is the V = 1
// kernel's, bit for bit: the same FMA chains in the same order, over key
// blocks aligned to absolute positions (a block outside a lane's range
// leaves it unchanged), so V is a speed choice only.
template <int V>
__attribute__((target("avx512f"))) void Avx512Tile(
    const AttentionParams& p, const AttentionSpan& sp, int kvh, int lane0,
    int nlanes, const float* q, float* out, Scratch& sc) {
  constexpr int W = V * kLanes;  // lanes of the task
  const int hd = p.head_dim, vd = p.v_head_dim;
  const kv::LayerView& view = sp.view;
  sc.Reserve(p, 0);
  float* qt = sc.qt.data();     // [hd][W]
  float* o = sc.o.data();       // [vd][W]
  float* sbuf = sc.s.data();    // [kBk][W]
  uint16_t* valid = sc.valid.data();  // [kBk][V]

  alignas(64) int32_t lo_a[W], pos_a[W];
  alignas(64) float m_a[W], l_a[W];
  int kmin = INT_MAX, kmax = -1;
  SetUpLanes(p, sp, kvh, lane0, nlanes, W, q, qt, lo_a, pos_a, m_a, l_a, &kmin, &kmax);
  __m512i lo_v[V], pos_v[V];
  __m512 m[V], l[V];
  for (int v = 0; v < V; ++v) {
    lo_v[v] = _mm512_loadu_si512(lo_a + v * kLanes);
    pos_v[v] = _mm512_loadu_si512(pos_a + v * kLanes);
    m[v] = _mm512_loadu_ps(m_a + v * kLanes);
    l[v] = _mm512_loadu_ps(l_a + v * kLanes);
  }
  for (int c = 0; c < vd * W; c += kLanes) _mm512_storeu_ps(o + c, _mm512_setzero_ps());
  const __m512 scale = _mm512_set1_ps(p.scale);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);

  const bool prefetch = kmax - kmin >= kPrefetchMinKeys;
  for (int kb = kmin / kBk; kb <= kmax / kBk; ++kb) {
    const int a = std::max(kb * kBk, kmin);
    const int b = std::min(kb * kBk + kBk - 1, kmax);
    const int nk = b - a + 1;
    // Key and value rows of the block (f32 pointers into the pages, or
    // widened copies).
    const float* krow[kBk];
    const float* vrow[kBk];
    // Over a long key range (rows not in cache) the next block's rows are
    // read from memory while this one computes; a short one (a window, a
    // short context) is cached already and the prefetches would only cost.
    if (prefetch && kb < kmax / kBk) PrefetchBlock(p, view, kvh, kb + 1, kmax);
    BlockRows(p, view, kvh, a, nk, &LoadKvAvx512, sc, krow, vrow);
    // Scores: lane's q · k as one FMA chain over the head dim; four keys at
    // a time for independent chains.
    __m512 m_blk[V];
    for (int v = 0; v < V; ++v) m_blk[v] = neg_inf;
    int j = 0;
    for (; j + 4 <= nk; j += 4) {
      __m512 acc[4][V];
      for (int k = 0; k < 4; ++k) {
        for (int v = 0; v < V; ++v) acc[k][v] = _mm512_setzero_ps();
      }
      const float *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
      for (int i = 0; i < hd; ++i) {
        const __m512 b0 = _mm512_set1_ps(k0[i]), b1 = _mm512_set1_ps(k1[i]);
        const __m512 b2 = _mm512_set1_ps(k2[i]), b3 = _mm512_set1_ps(k3[i]);
        for (int v = 0; v < V; ++v) {
          const __m512 qv = _mm512_loadu_ps(qt + i * W + v * kLanes);
          acc[0][v] = _mm512_fmadd_ps(qv, b0, acc[0][v]);
          acc[1][v] = _mm512_fmadd_ps(qv, b1, acc[1][v]);
          acc[2][v] = _mm512_fmadd_ps(qv, b2, acc[2][v]);
          acc[3][v] = _mm512_fmadd_ps(qv, b3, acc[3][v]);
        }
      }
      for (int k = 0; k < 4; ++k) {
        for (int v = 0; v < V; ++v) {
          FinishScore(acc[k][v], a + j + k, lo_v[v], pos_v[v], scale,
                      sbuf + (j + k) * W + v * kLanes, valid + (j + k) * V + v, &m_blk[v]);
        }
      }
    }
    for (; j < nk; ++j) {
      const float* k0 = krow[j];
      for (int v = 0; v < V; ++v) {
        __m512 a0 = _mm512_setzero_ps();
        for (int i = 0; i < hd; ++i) {
          a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + i * W + v * kLanes), _mm512_set1_ps(k0[i]),
                               a0);
        }
        FinishScore(a0, a + j, lo_v[v], pos_v[v], scale, sbuf + j * W + v * kLanes,
                    valid + j * V + v, &m_blk[v]);
      }
    }
    // Online softmax: lanes without a key here keep m, get corr = exp(0) = 1
    // and add nothing, so they are unchanged bit for bit.
    __m512 corr[V];
    for (int v = 0; v < V; ++v) {
      const __m512 m_new = _mm512_max_ps(m[v], m_blk[v]);
      const __mmask16 had = _mm512_cmp_ps_mask(m[v], neg_inf, _CMP_NEQ_OQ);
      corr[v] = _mm512_maskz_mov_ps(had, Exp512(_mm512_sub_ps(m[v], m_new)));
      l[v] = _mm512_mul_ps(l[v], corr[v]);
      for (int jj = 0; jj < nk; ++jj) {
        float* sj = sbuf + jj * W + v * kLanes;
        const __m512 w =
            _mm512_maskz_mov_ps(valid[jj * V + v], Exp512(_mm512_sub_ps(_mm512_loadu_ps(sj), m_new)));
        l[v] = _mm512_add_ps(l[v], w);
        _mm512_storeu_ps(sj, w);
      }
      m[v] = m_new;
    }
    // o = o · corr + Σ_j w_j · v_j, each output dim a chain over keys in
    // order; four dims at a time.
    int c = 0;
    for (; c + 4 <= vd; c += 4) {
      __m512 acc[4][V];
      for (int d = 0; d < 4; ++d) {
        for (int v = 0; v < V; ++v) {
          acc[d][v] = _mm512_mul_ps(_mm512_loadu_ps(o + (c + d) * W + v * kLanes), corr[v]);
        }
      }
      for (int jj = 0; jj < nk; ++jj) {
        const float* vr = vrow[jj] + c;
        const __m512 b0 = _mm512_set1_ps(vr[0]), b1 = _mm512_set1_ps(vr[1]);
        const __m512 b2 = _mm512_set1_ps(vr[2]), b3 = _mm512_set1_ps(vr[3]);
        for (int v = 0; v < V; ++v) {
          const __m512 w = _mm512_loadu_ps(sbuf + jj * W + v * kLanes);
          const __mmask16 ok = valid[jj * V + v];
          acc[0][v] = _mm512_mask3_fmadd_ps(w, b0, acc[0][v], ok);
          acc[1][v] = _mm512_mask3_fmadd_ps(w, b1, acc[1][v], ok);
          acc[2][v] = _mm512_mask3_fmadd_ps(w, b2, acc[2][v], ok);
          acc[3][v] = _mm512_mask3_fmadd_ps(w, b3, acc[3][v], ok);
        }
      }
      for (int d = 0; d < 4; ++d) {
        for (int v = 0; v < V; ++v) _mm512_storeu_ps(o + (c + d) * W + v * kLanes, acc[d][v]);
      }
    }
    for (; c < vd; ++c) {
      for (int v = 0; v < V; ++v) {
        __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(o + c * W + v * kLanes), corr[v]);
        for (int jj = 0; jj < nk; ++jj) {
          o0 = _mm512_mask3_fmadd_ps(_mm512_loadu_ps(sbuf + jj * W + v * kLanes),
                                     _mm512_set1_ps(vrow[jj][c]), o0, valid[jj * V + v]);
        }
        _mm512_storeu_ps(o + c * W + v * kLanes, o0);
      }
    }
  }
  // out = o / l per lane.
  for (int v = 0; v < V; ++v) _mm512_storeu_ps(l_a + v * kLanes, l[v]);
  WriteLanes(p, sp, kvh, lane0, nlanes, W, o, l_a, out);
}

// ---------------------------------------------------------------------------
// AVX2 kernel (CPUs without AVX-512: cpu_kernels_avx2.h): Avx512Tile's
// algorithm on 8-lane vectors — the same per-lane FMA chains over the head
// dim and over keys in order, key blocks aligned to absolute positions, the
// same exp polynomial and online softmax — with lane masks as compare
// results and blends instead of mask registers. Up to 2 vectors per task
// (16 ymm registers).

constexpr int kLanes8 = 8;

#define SWASERVE_AVX2 __attribute__((target("avx2,fma,f16c")))

// Exp512's polynomial; 2^n built in the exponent field (callers' inputs are
// <= 0 and clamped at -87.3, so n is in [-126, 0] and 2^n is normal).
SWASERVE_AVX2 inline __m256 Exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.0f / 5040);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 720));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 120));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 24));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 6));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Lanes whose range [lo, pos] holds key t (all-ones floats).
SWASERVE_AVX2 inline __m256 KeyValid(int t, __m256i lo_v, __m256i pos_v) {
  const __m256i tv = _mm256_set1_epi32(t);
  const __m256i below = _mm256_cmpgt_epi32(lo_v, tv);   // lo > t
  const __m256i above = _mm256_cmpgt_epi32(tv, pos_v);  // t > pos
  return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_or_si256(below, above), _mm256_set1_epi32(-1)));
}

SWASERVE_AVX2 void LoadKvAvx2(kv::DType dt, const uint8_t* src, float* dst, int n) {
  if (dt == kv::DType::kF32) return LoadKv(dt, src, dst, n);
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(dst + i, dt == kv::DType::kBF16
                                  ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                                  : _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = dt == kv::DType::kBF16 ? BF16ToF32(s[i]) : F16ToF32(s[i]);
}

// Key block [a, b] holds only keys every real lane of the tile sees
// (lanes past nlanes are never written out): its scores, weights and output
// updates need no lane masks. The masked path computes the same values for
// valid lanes (a blend picks the unmasked result), so a lane's bits do not
// depend on which path its blocks took.
struct TileRange {
  int lo_max = INT_MIN;   // every real lane sees keys >= lo_max ...
  int pos_min = INT_MAX;  // ... up to pos_min
  bool Full(int a, int b) const { return a >= lo_max && b <= pos_min; }
};

// Scores of keys [j, j + K) of a block for V vectors of 8 lanes whose
// transposed queries start at qt (rows W floats apart): one FMA chain over
// the head dim per lane and key.
template <int V, int K, int W>
SWASERVE_AVX2 inline void Avx2Scores(const float* const* krow, int j, int hd, const float* qt,
                                     __m256 (&acc)[K][V]) {
  for (int k = 0; k < K; ++k) {
    for (int v = 0; v < V; ++v) acc[k][v] = _mm256_setzero_ps();
  }
  for (int i = 0; i < hd; ++i) {
    __m256 qv[V];
    for (int v = 0; v < V; ++v) qv[v] = _mm256_loadu_ps(qt + i * W + v * kLanes8);
    for (int k = 0; k < K; ++k) {
      const __m256 bk = _mm256_set1_ps(krow[j + k][i]);
      for (int v = 0; v < V; ++v) acc[k][v] = _mm256_fmadd_ps(qv[v], bk, acc[k][v]);
    }
  }
}

// Output dims [c, c + D) of V vectors of the tile (sbuf and o offset to the
// first; rows W floats apart): o = o · corr + Σ_j w_j · v_j, each a chain
// over the block's keys in order; masked: keys outside a lane's range leave
// it unchanged.
template <int V, int D, bool kMasked, int W>
SWASERVE_AVX2 inline void Avx2Output(const float* const* vrow, int a, int nk, int c,
                                     const float* sbuf, const __m256* corr, const __m256i* lo_v,
                                     const __m256i* pos_v, float* o) {
  __m256 acc[D][V];
  for (int d = 0; d < D; ++d) {
    for (int v = 0; v < V; ++v) {
      acc[d][v] = _mm256_mul_ps(_mm256_loadu_ps(o + (c + d) * W + v * kLanes8), corr[v]);
    }
  }
  for (int jj = 0; jj < nk; ++jj) {
    const float* vr = vrow[jj] + c;
    __m256 w[V], ok[V];
    for (int v = 0; v < V; ++v) {
      w[v] = _mm256_loadu_ps(sbuf + jj * W + v * kLanes8);
      if constexpr (kMasked) ok[v] = KeyValid(a + jj, lo_v[v], pos_v[v]);
    }
    for (int d = 0; d < D; ++d) {
      const __m256 bd = _mm256_set1_ps(vr[d]);
      for (int v = 0; v < V; ++v) {
        const __m256 f = _mm256_fmadd_ps(w[v], bd, acc[d][v]);
        if constexpr (kMasked) {
          acc[d][v] = _mm256_blendv_ps(acc[d][v], f, ok[v]);
        } else {
          acc[d][v] = f;
        }
      }
    }
  }
  for (int d = 0; d < D; ++d) {
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(o + (c + d) * W + v * kLanes8, acc[d][v]);
  }
}

template <int V, bool kMasked, int W>
SWASERVE_AVX2 void Avx2OutputDims(const float* const* vrow, int a, int nk, int vd,
                                  const float* sbuf, const __m256* corr, const __m256i* lo_v,
                                  const __m256i* pos_v, float* o) {
  int c = 0;
  for (; c + 4 <= vd; c += 4) {
    Avx2Output<V, 4, kMasked, W>(vrow, a, nk, c, sbuf, corr, lo_v, pos_v, o);
  }
  for (; c < vd; ++c) Avx2Output<V, 1, kMasked, W>(vrow, a, nk, c, sbuf, corr, lo_v, pos_v, o);
}

// Vectors [g, g + G) of the tile: scores of the block's keys (four at a
// time for independent chains, then one at a time) into sbuf, and the
// block's max per lane into m_blk.
template <int G, int W>
SWASERVE_AVX2 inline void Avx2BlockScores(const float* const* krow, int a, int nk, int hd,
                                          int g, bool full, const float* qt, __m256 scale,
                                          const __m256i* lo_v, const __m256i* pos_v,
                                          float* sbuf, __m256* m_blk) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  auto finish = [&](__m256 acc, int jk, int v) SWASERVE_AVX2 {
    __m256 sv = _mm256_mul_ps(acc, scale);
    if (!full) sv = _mm256_blendv_ps(neg_inf, sv, KeyValid(a + jk, lo_v[g + v], pos_v[g + v]));
    _mm256_storeu_ps(sbuf + jk * W + (g + v) * kLanes8, sv);
    m_blk[g + v] = _mm256_max_ps(m_blk[g + v], sv);
  };
  int j = 0;
  for (; j + 4 <= nk; j += 4) {
    __m256 acc[4][G];
    Avx2Scores<G, 4, W>(krow, j, hd, qt + g * kLanes8, acc);
    for (int k = 0; k < 4; ++k) {
      for (int v = 0; v < G; ++v) finish(acc[k][v], j + k, v);
    }
  }
  for (; j < nk; ++j) {
    __m256 acc[1][G];
    Avx2Scores<G, 1, W>(krow, j, hd, qt + g * kLanes8, acc);
    for (int v = 0; v < G; ++v) finish(acc[0][v], j, v);
  }
}

template <int V>
SWASERVE_AVX2 void Avx2Tile(const AttentionParams& p, const AttentionSpan& sp, int kvh,
                            int lane0, int nlanes, const float* q, float* out, Scratch& sc) {
  constexpr int W = V * kLanes8;
  const int hd = p.head_dim, vd = p.v_head_dim;
  const kv::LayerView& view = sp.view;
  sc.Reserve(p, 0);
  float* qt = sc.qt.data();   // [hd][W]
  float* o = sc.o.data();     // [vd][W]
  float* sbuf = sc.s.data();  // [kBk][W]
  alignas(32) int32_t lo_a[W], pos_a[W];
  alignas(32) float m_a[W], l_a[W];
  int kmin = INT_MAX, kmax = -1;
  SetUpLanes(p, sp, kvh, lane0, nlanes, W, q, qt, lo_a, pos_a, m_a, l_a, &kmin, &kmax);
  TileRange range;
  for (int lane = 0; lane < nlanes; ++lane) {
    range.lo_max = std::max(range.lo_max, lo_a[lane]);
    range.pos_min = std::min(range.pos_min, pos_a[lane]);
  }
  __m256i lo_v[V], pos_v[V];
  __m256 m[V], l[V];
  for (int v = 0; v < V; ++v) {
    lo_v[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_a + v * kLanes8));
    pos_v[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pos_a + v * kLanes8));
    m[v] = _mm256_load_ps(m_a + v * kLanes8);
    l[v] = _mm256_load_ps(l_a + v * kLanes8);
  }
  for (int c = 0; c < vd * W; c += kLanes8) _mm256_storeu_ps(o + c, _mm256_setzero_ps());
  const __m256 scale = _mm256_set1_ps(p.scale);
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  const bool prefetch = kmax - kmin >= kPrefetchMinKeys;
  for (int kb = kmin / kBk; kb <= kmax / kBk; ++kb) {
    const int a = std::max(kb * kBk, kmin);
    const int b = std::min(kb * kBk + kBk - 1, kmax);
    const int nk = b - a + 1;
    const bool full = range.Full(a, b);
    const float* krow[kBk];
    const float* vrow[kBk];
    // As in Avx512Tile: over a long key range the next block's rows are
    // fetched from memory while this one computes.
    if (prefetch && kb < kmax / kBk) PrefetchBlock(p, view, kvh, kb + 1, kmax);
    BlockRows(p, view, kvh, a, nk, &LoadKvAvx2, sc, krow, vrow);
    // Scores, two vectors at a time (the registers hold 4 keys × 2 vectors
    // of chains): the block's rows, widened once, stay in L1 for all of
    // them.
    __m256 m_blk[V];
    for (int v = 0; v < V; ++v) m_blk[v] = neg_inf;
    for (int g = 0; g + 2 <= V; g += 2) {
      Avx2BlockScores<2, W>(krow, a, nk, hd, g, full, qt, scale, lo_v, pos_v, sbuf, m_blk);
    }
    if (V % 2 != 0) {
      Avx2BlockScores<1, W>(krow, a, nk, hd, V - 1, full, qt, scale, lo_v, pos_v, sbuf, m_blk);
    }
    // Online softmax (lanes without a key here are unchanged, as there).
    __m256 corr[V];
    for (int v = 0; v < V; ++v) {
      const __m256 m_new = _mm256_max_ps(m[v], m_blk[v]);
      const __m256 had = _mm256_cmp_ps(m[v], neg_inf, _CMP_NEQ_OQ);
      corr[v] = _mm256_and_ps(had, Exp256(_mm256_sub_ps(m[v], m_new)));
      l[v] = _mm256_mul_ps(l[v], corr[v]);
      for (int jj = 0; jj < nk; ++jj) {
        float* sj = sbuf + jj * W + v * kLanes8;
        __m256 w = Exp256(_mm256_sub_ps(_mm256_loadu_ps(sj), m_new));
        if (!full) w = _mm256_and_ps(KeyValid(a + jj, lo_v[v], pos_v[v]), w);
        l[v] = _mm256_add_ps(l[v], w);
        _mm256_storeu_ps(sj, w);
      }
      m[v] = m_new;
    }
    for (int g = 0; g < V; g += 2) {
      const float* sb = sbuf + g * kLanes8;
      float* og = o + g * kLanes8;
      if (g + 2 <= V) {
        if (full) {
          Avx2OutputDims<2, false, W>(vrow, a, nk, vd, sb, corr + g, lo_v + g, pos_v + g, og);
        } else {
          Avx2OutputDims<2, true, W>(vrow, a, nk, vd, sb, corr + g, lo_v + g, pos_v + g, og);
        }
      } else if (full) {
        Avx2OutputDims<1, false, W>(vrow, a, nk, vd, sb, corr + g, lo_v + g, pos_v + g, og);
      } else {
        Avx2OutputDims<1, true, W>(vrow, a, nk, vd, sb, corr + g, lo_v + g, pos_v + g, og);
      }
    }
  }
  for (int v = 0; v < V; ++v) _mm256_store_ps(l_a + v * kLanes8, l[v]);
  WriteLanes(p, sp, kvh, lane0, nlanes, W, o, l_a, out);
}

#undef SWASERVE_AVX2

// Work items: (span, KV head, tile of 16 lanes) for AVX-512, (span, query,
// head) for the portable kernel.
struct Task {
  int span;
  int kvh;
  int lane0;
  int vectors;  // AVX-512: 16-lane vectors of the task (1, 2 or 4)
};

// Vectors per AVX-512 task for a span of `lanes` (query, head) pairs per KV
// head: as many as the span fills, up to 3 (4 spills the score and output
// accumulators to the stack; attention_bench). A decode step's 1-8 queries
// take one, and so does a sliding-window layer with a short window: a task
// reads the union of its queries' windows, W + its queries - 1 keys, and
// more queries per task would add more masked keys than they save.
int VectorsFor(const AttentionParams& p, int lanes) {
  if (p.window > 0 && p.window < kShortWindow) return 1;
  if (lanes >= 3 * kLanes) return 3;
  return lanes > kLanes ? 2 : 1;
}

// Vectors of 8 lanes per AVX2 task: as many lanes per task as an AVX-512
// task has (VectorsFor): up to 48, and 16 for a short window (its keys are
// W + queries - 1 per task, so wider tasks add masked keys). A task computes
// two vectors at a time, but the key rows it widens once serve all of them,
// so a long context is read from memory a sixth as often as with 8 lanes.
int Avx2VectorsFor(const AttentionParams& p, int lanes) {
  if (lanes <= kLanes8) return 1;
  if (p.window > 0 && p.window < kShortWindow) return 2;
  if (lanes <= 2 * kLanes8) return 2;
  return lanes <= 4 * kLanes8 ? 4 : 6;
}

}  // namespace

void PagedAttention(const AttentionParams& p,
                    absl::Span<const AttentionSpan> spans, const float* q,
                    float* out) {
  const bool avx = UsingAvx512();
  const bool use_avx2 = !avx && avx2::Have();
  const int group = p.num_heads / p.num_kv_heads;
  thread_local std::vector<Task> task_storage;
  std::vector<Task>& tasks = task_storage;  // the caller's, seen by all threads
  tasks.clear();
  for (int s = 0; s < static_cast<int>(spans.size()); ++s) {
    if (avx || use_avx2) {
      const int lanes = spans[s].n * group;
      const int width = avx ? kLanes : kLanes8;
      const int vectors = avx ? VectorsFor(p, lanes) : Avx2VectorsFor(p, lanes);
      for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) {
        for (int l0 = 0; l0 < lanes; l0 += vectors * width) {
          tasks.push_back({s, kvh, l0, vectors});
        }
      }
    } else {
      for (int qi = 0; qi < spans[s].n; ++qi) {
        for (int h = 0; h < p.num_heads; ++h) tasks.push_back({s, h, qi, 1});
      }
    }
  }
  // Later tiles of a causal span have more keys: hand them out first, one
  // at a time (dynamic balance between threads).
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(tasks.size());
  if (n == 0) return;
  KernelThreads& threads = KernelThreads::Get();
  // Small calls (a decode step's few queries) run on this thread: waking
  // the pool costs more than the work. Each tile's arithmetic is the same
  // either way.
  int64_t work = 0;
  for (const AttentionSpan& sp : spans) {
    const int64_t keys = p.window > 0 ? std::min<int64_t>(p.window, sp.pos0 + sp.n)
                                      : sp.pos0 + sp.n;
    work += static_cast<int64_t>(sp.n) * p.num_heads * keys * (p.head_dim + p.v_head_dim);
  }
  const int64_t parts = work < (int64_t{1} << 19) ? 1 : std::min<int64_t>(threads.threads(), n);
  threads.ParallelFor(parts, 1, [&](int64_t, int64_t) {
    Scratch& sc = ThreadScratch();
    // Size this thread's scratch even if it gets no task this time, so a
    // steady decode loop never allocates when the dynamic split changes.
    sc.Reserve(p, 0);
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      const Task& task = tasks[n - 1 - t];
      const AttentionSpan& sp = spans[task.span];
      if (avx) {
        const int left = sp.n * group - task.lane0;
        switch (task.vectors) {
          case 3:
            Avx512Tile<3>(p, sp, task.kvh, task.lane0, std::min(3 * kLanes, left), q, out, sc);
            break;
          case 2:
            Avx512Tile<2>(p, sp, task.kvh, task.lane0, std::min(2 * kLanes, left), q, out, sc);
            break;
          default:
            Avx512Tile<1>(p, sp, task.kvh, task.lane0, std::min(kLanes, left), q, out, sc);
        }
      } else if (use_avx2) {
        const int left = sp.n * group - task.lane0;
        const int lanes = std::min(task.vectors * kLanes8, left);
        switch (task.vectors) {
          case 6:
            Avx2Tile<6>(p, sp, task.kvh, task.lane0, lanes, q, out, sc);
            break;
          case 4:
            Avx2Tile<4>(p, sp, task.kvh, task.lane0, lanes, q, out, sc);
            break;
          case 2:
            Avx2Tile<2>(p, sp, task.kvh, task.lane0, lanes, q, out, sc);
            break;
          default:
            Avx2Tile<1>(p, sp, task.kvh, task.lane0, lanes, q, out, sc);
        }
      } else {
        PortableQueryHead(p, sp, task.lane0, task.kvh, q, out, sc);
      }
    }
  });
}

}  // namespace swaserve::model
