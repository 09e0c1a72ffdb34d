// attention_bench: PagedAttention for one prefill chunk at long context
// (Google Benchmark), the kernel that dominates a long prompt's prefill: the
// demo model's full-attention layer (8 heads, 4 KV heads, head dims 36 / 24,
// bf16 KV) and its SWA layer (W = 128), a 512-query chunk after C cached
// tokens (and one query: a decode step). Counters: GFLOP/s (2 · (hd + vd) FLOPs per (query, head, key)) and,
// for the physical limit in the same run, the peak of a register-only FMA
// loop on the same threads, at the widest vectors the kernels use here
// (BM_FmaPeak: AVX-512, else AVX2 + FMA; its label says which).
//
//   build/bench/model/attention_bench --benchmark_min_time=2
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/attention.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/cpu_kernels_avx2.h"
#include "lib/model/kv_io.h"

namespace swaserve::model {
namespace {

constexpr int kHeads = 8, kKvHeads = 4, kHd = 36, kVd = 24, kChunk = 512;

// A sequence of `context + kChunk` tokens with random bf16 K/V in its
// full layer 0 and SWA layer 0, and a chunk's queries.
struct Setup {
  std::unique_ptr<kv::KvPools> pools;
  std::unique_ptr<kv::Sequence> seq;
  std::vector<float> q, out;
  std::vector<float> sinks;

  explicit Setup(int context) {
    kv::KvShape shape;
    shape.full_layers = shape.swa_layers = 1;
    shape.full_kv_heads = shape.swa_kv_heads = kKvHeads;
    shape.full_k_head_dim = shape.swa_k_head_dim = kHd;
    shape.full_v_head_dim = shape.swa_v_head_dim = kVd;
    shape.sliding_window = 128;
    shape.page_size = 16;
    shape.dtype = kv::DType::kBF16;
    const int tokens = context + kChunk;
    const int64_t pages = tokens / shape.page_size + 2;
    pools = std::move(*kv::KvPools::Create({.shape = shape, .full_pages = pages,
                                            .swa_pages = pages}));
    seq = std::make_unique<kv::Sequence>(
        kv::SequenceOptions{pools.get(), nullptr, 1 << 30, false});
    if (!seq->Append(tokens).ok()) std::abort();
    // Uniform values in [-1.7, 1.7) from a cheap generator (setup time).
    uint64_t x = 7;
    auto nd = [&x] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<int32_t>(x >> 32)) * (1.7f / 2147483648.0f);
    };
    std::vector<float> row(kKvHeads * kHd);
    for (kv::LayerView view : {seq->FullLayer(0), seq->SwaLayer(0)}) {
      for (int t = 0; t < tokens; ++t) {
        for (float& v : row) v = nd();
        StoreKv(shape.dtype, view.K(t), row.data(), kKvHeads * kHd);
        StoreKv(shape.dtype, view.V(t), row.data(), kKvHeads * kVd);
      }
    }
    q.resize(static_cast<size_t>(kChunk) * kHeads * kHd);
    for (float& v : q) v = nd();
    out.resize(static_cast<size_t>(kChunk) * kHeads * kVd);
    sinks.assign(kHeads, 0.5f);
  }
};

void BM_ChunkAttention(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  const int window = static_cast<int>(state.range(1));
  const int queries = static_cast<int>(state.range(2));  // kChunk, or 1 (a decode step)
  static std::unique_ptr<Setup> setup;
  static int setup_context = -1;
  if (setup_context != context) {
    setup.reset();
    setup = std::make_unique<Setup>(context);
    setup_context = context;
  }
  AttentionParams p;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHd;
  p.v_head_dim = kVd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHd));
  p.window = window;
  p.sinks = window > 0 ? setup->sinks.data() : nullptr;
  const kv::LayerView view = window > 0 ? setup->seq->SwaLayer(0) : setup->seq->FullLayer(0);
  const AttentionSpan span{.view = view, .row0 = 0, .pos0 = context, .n = queries};
  double keys = 0;  // (query, key) pairs of the chunk
  for (int i = 0; i < queries; ++i) {
    keys += window > 0 ? std::min(window, context + i + 1) : context + i + 1;
  }
  for (auto _ : state) {
    PagedAttention(p, {&span, 1}, setup->q.data(), setup->out.data());
    benchmark::DoNotOptimize(setup->out.data());
  }
  const double flops = 2.0 * (kHd + kVd) * kHeads * keys;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ChunkAttention)
    ->ArgNames({"context", "window", "queries"})
    ->Args({8192, 0, kChunk})
    ->Args({65536, 0, kChunk})
    ->Args({262144, 0, kChunk})
    ->Args({65536, 128, kChunk})
    ->Args({65536, 0, 1})
    ->Args({65536, 128, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The machine's FMA peak on the kernel threads: independent chains of FMAs
// per thread, no memory traffic. 8 chains of 16 lanes (AVX-512) cover 2
// ports at latency 4; 12 chains of 8 lanes (AVX2) cover 2 ports at latency 5
// or 6 (AMD Zen).
__attribute__((target("avx512f"))) double FmaLoop512(int64_t iters) {
  __m512 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 8; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}
constexpr double kFlopsPerIter512 = 2.0 * 16 * 8;

__attribute__((target("avx2,fma"))) double FmaLoop256(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  double sum = 0;
  for (float f : lanes) sum += f;
  return sum;
}
constexpr double kFlopsPerIter256 = 2.0 * 8 * 12;

void BM_FmaPeak(benchmark::State& state) {
  const bool wide = UsingAvx512();
  if (!wide && !avx2::Have()) {
    state.SkipWithError("neither AVX-512 nor AVX2 + FMA: the kernels run portable loops");
    return;
  }
  state.SetLabel(wide ? "AVX-512" : "AVX2+FMA");
  KernelThreads& threads = KernelThreads::Get();
  constexpr int64_t kIters = 1 << 22;
  std::vector<double> sink(threads.threads());
  for (auto _ : state) {
    threads.ParallelFor(threads.threads(), 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) sink[t] = wide ? FmaLoop512(kIters) : FmaLoop256(kIters);
    });
    benchmark::DoNotOptimize(sink.data());
  }
  const double flops = (wide ? kFlopsPerIter512 : kFlopsPerIter256) * kIters * threads.threads();
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace swaserve::model

BENCHMARK_MAIN();
