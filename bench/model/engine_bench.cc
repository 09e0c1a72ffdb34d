// Model engine benchmark:
//  1. GEMM: lib/model's batch-invariant MatMulNT vs OpenBLAS cblas_sgemm on the
//     same shapes, same thread count, same run; OpenBLAS's best is the peak.
//  2. Prefill tokens/s and decode step time vs context for a hybrid model
//     (2 full + 12 SWA layers, W = 128) and the same model with every layer
//     full. Decode steps at long contexts read KV that is filled with random
//     values directly (no 64K prefill needed); attention bytes read per step
//     are counted from the geometry.
//
//   engine_bench [--threads N] [--prefill 1024,2048,4096,8192]
//                [--decode 1024,4096,16384,65536] [--json FILE]
#include <cblas.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/base/subprocess.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/cpu_kernels_avx2.h"
#include "lib/model/forward.h"
#include "nlohmann/json.hpp"
#include "bench/common/bench_model.h"

namespace swaserve::model {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int v;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

struct GemmRow {
  int M, K, N;
  double ours_gflops, blas_gflops;
};

GemmRow BenchGemm(int M, int K, int N) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  std::vector<float> x(static_cast<size_t>(M) * K), w(static_cast<size_t>(N) * K),
      y(static_cast<size_t>(M) * N);
  for (auto& v : x) v = d(rng);
  for (auto& v : w) v = d(rng);
  const double flops = 2.0 * M * K * N;
  auto time = [&](auto fn) {
    fn();  // warm up
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = Now();
      int iters = 0;
      do {
        fn();
        ++iters;
      } while (Now() - t0 < 0.2);
      best = std::min(best, (Now() - t0) / iters);
    }
    return flops / best / 1e9;
  };
  const PackedWeight packed = PackedWeight::FromOutIn(w.data(), N, K);  // done once, at load
  const double ours = time([&] { MatMul(x.data(), M, packed, y.data()); });
  const double blas = time([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, w.data(), K,
                0.0f, y.data(), N);
  });
  return {M, K, N, ours, blas};
}

ModelConfig BenchConfig(bool all_full) { return bench::BenchModelConfig(all_full); }

struct ModelRun {
  std::string name;
  std::vector<std::pair<int, double>> prefill_tps;     // context -> tokens/s
  std::vector<std::pair<int, double>> decode_ms;       // context -> ms/step
  std::vector<std::pair<int, double>> decode_attn_mb;  // context -> MB read
};

ModelRun BenchModel(const std::string& name, const ModelConfig& c, const std::vector<int>& prefill,
                    const std::vector<int>& decode) {
  ModelRun run{name, {}, {}, {}};
  const std::string dir = *base::MakeTempDir("engine-bench");
  if (absl::Status s = WriteRandomCheckpoint(c, 11, dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  auto engine = *Engine::Create({dir, 0});
  const int page = 16;
  int max_ctx = 0;
  for (int n : prefill) max_ctx = std::max(max_ctx, n);
  for (int n : decode) max_ctx = std::max(max_ctx, n + 8);
  const kv::KvShape shape = c.KvShape(page);
  const int64_t pages = max_ctx / page + 64;
  auto pools = *kv::KvPools::Create({shape, pages, pages, true});
  std::mt19937 rng(2);
  for (int n : prefill) {
    std::vector<uint32_t> tokens(n);
    for (auto& t : tokens) t = rng() % c.vocab_size;
    kv::Sequence seq({pools.get(), nullptr, 0, false});
    const double t0 = Now();
    for (int pos = 0; pos < n; pos += 512) {
      const int len = std::min(512, n - pos);
      (void)seq.Append(len);
      ForwardItem item{&seq, absl::MakeConstSpan(tokens).subspan(pos, len), pos, false};
      ForwardOutput out;
      if (!engine->Forward({&item, 1}, &out).ok()) std::exit(1);
    }
    const double dt = Now() - t0;
    run.prefill_tps.push_back({n, n / dt});
    std::fprintf(stderr, "  %s prefill %6d tokens: %.1f s, %.0f tokens/s\n", name.c_str(), n, dt, n / dt);
  }
  for (int n : decode) {
    kv::Sequence seq({pools.get(), nullptr, 0, false});
    (void)seq.Append(n);
    // Random KV for the context (only the pages a step may read exist).
    for (kv::PagePool* pool : {&pools->full(), &pools->swa()}) {
      for (kv::PageId p = 0; p < pool->num_pages(); ++p) {
        if (pool->state(p) != kv::PageState::kInUse) continue;
        float* f = reinterpret_cast<float*>(pool->PageData(p));
        for (size_t i = 0; i < pool->page_bytes() / 4; ++i) f[i] = (rng() % 2001 - 1000) * 1e-3f;
      }
    }
    std::vector<uint32_t> tok = {1};
    const int steps = 8;
    double best = 1e9;
    for (int s = 0; s < steps; ++s) {
      (void)seq.Append(1);
      ForwardItem item{&seq, tok, n + s, false};
      ForwardOutput out;
      const double t0 = Now();
      if (!engine->Forward({&item, 1}, &out).ok()) std::exit(1);
      best = std::min(best, Now() - t0);
    }
    // Attention KV bytes read by one step at context n.
    double bytes = 0;
    for (int l = 0; l < c.num_layers; ++l) {
      const AttentionConfig& a = c.attention(l);
      const int keys = c.layer_types[l] == AttentionType::kFull ? n + 1 : std::min(n + 1, c.sliding_window);
      bytes += static_cast<double>(keys) * a.num_kv_heads * (a.head_dim + a.v_head_dim) * 4;
    }
    run.decode_ms.push_back({n, best * 1e3});
    run.decode_attn_mb.push_back({n, bytes / 1e6});
    std::fprintf(stderr, "  %s decode at %6d: %.2f ms/step, attention reads %.1f MB\n", name.c_str(), n,
                 best * 1e3, bytes / 1e6);
  }
  return run;
}

}  // namespace
}  // namespace swaserve::model

int main(int argc, char** argv) {
  using namespace swaserve::model;
  std::string json_path, checkpoint;
  int threads = 2;
  std::vector<int> prefill = {1024, 2048, 4096, 8192};
  std::vector<int> decode = {1024, 4096, 16384, 65536};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--json") json_path = next();
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--prefill") prefill = ParseList(next());
    else if (a == "--decode") decode = ParseList(next());
    else if (a == "--checkpoint") checkpoint = next();
    else {
      std::fprintf(stderr, "usage: engine_bench [--threads N] [--prefill L] [--decode L] [--json FILE]\n");
      return 2;
    }
  }
  KernelThreads::SetThreads(threads);
  openblas_set_num_threads(threads);
  nlohmann::json j;
  if (!checkpoint.empty()) {
    // Prefill tokens/s of an existing checkpoint (e.g. the one
    // tools/reference/bench_torch_prefill.py measures), one 2048-token chunk
    // at a time, best of 3.
    auto engine = Engine::Create({checkpoint, threads});
    if (!engine.ok()) {
      std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
      return 1;
    }
    const ModelConfig& c = (*engine)->config();
    std::printf("== Prefill of %s, %d threads\n%8s %10s %12s\n", checkpoint.c_str(), threads, "tokens", "seconds", "tokens/s");
    for (int n : prefill) {
      std::mt19937 rng(n);
      std::vector<uint32_t> tokens(n);
      for (auto& t : tokens) t = rng() % c.vocab_size;
      const swaserve::kv::KvShape shape = c.KvShape(16);
      auto pools = *swaserve::kv::KvPools::Create({shape, n / 16 + 8, n / 16 + 8, true});
      double best = 1e9;
      for (int rep = 0; rep < 3; ++rep) {
        swaserve::kv::Sequence seq({pools.get(), nullptr, 0, false});
        const double t0 = Now();
        for (int pos = 0; pos < n; pos += 2048) {
          const int len = std::min(2048, n - pos);
          (void)seq.Append(len);
          ForwardItem item{&seq, absl::MakeConstSpan(tokens).subspan(pos, len), pos, false};
          ForwardOutput out;
          if (!(*engine)->Forward({&item, 1}, &out).ok()) return 1;
        }
        best = std::min(best, Now() - t0);
      }
      std::printf("%8d %10.3f %12.0f\n", n, best, n / best);
      j["checkpoint_prefill"].push_back({{"tokens", n}, {"seconds", best}, {"tokens_per_s", n / best}});
    }
    if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
    return 0;
  }
  std::printf("== GEMM (y = x·wᵀ), %d threads, kernel path: %s\n", threads,
              UsingAvx512() ? "AVX-512" : avx2::Have() ? "AVX2+FMA" : "portable");
  std::printf("%6s %6s %6s %12s %12s %8s\n", "M", "K", "N", "ours GF/s", "OpenBLAS", "ratio");
  const std::vector<std::array<int, 3>> shapes = {
      {512, 256, 1024}, {512, 256, 4096}, {2048, 256, 1024}, {512, 1024, 1024}, {1024, 1024, 1024}, {1, 256, 1024}};
  double blas_peak = 0, ours_best_prefill = 0;
  for (auto [M, K, N] : shapes) {
    GemmRow r = BenchGemm(M, K, N);
    blas_peak = std::max(blas_peak, r.blas_gflops);
    if (M >= 512) ours_best_prefill = std::max(ours_best_prefill, r.ours_gflops);
    std::printf("%6d %6d %6d %12.1f %12.1f %7.2fx\n", M, K, N, r.ours_gflops, r.blas_gflops,
                r.ours_gflops / r.blas_gflops);
    j["gemm"].push_back({{"M", M}, {"K", K}, {"N", N}, {"ours_gflops", r.ours_gflops}, {"openblas_gflops", r.blas_gflops}});
  }
  // Prefill-shaped efficiency: the median of ours over M >= 512 shapes vs the
  // OpenBLAS peak of the run.
  std::printf("OpenBLAS peak in this run: %.1f GF/s; our best prefill-shaped GEMM: %.1f GF/s = %.0f%% (target >= 50%%)\n",
              blas_peak, ours_best_prefill, 100 * ours_best_prefill / blas_peak);
  j["gemm_peak_openblas"] = blas_peak;
  j["gemm_best_ours"] = ours_best_prefill;

  ModelRun hybrid = BenchModel("hybrid", BenchConfig(false), prefill, decode);
  ModelRun full = BenchModel("all-full", BenchConfig(true), prefill, decode);
  std::printf("\n== Prefill tokens/s (512-token chunks)\n%8s %12s %12s %8s\n", "context", "hybrid", "all-full", "speedup");
  for (size_t i = 0; i < hybrid.prefill_tps.size(); ++i) {
    std::printf("%8d %12.0f %12.0f %7.2fx\n", hybrid.prefill_tps[i].first, hybrid.prefill_tps[i].second,
                full.prefill_tps[i].second, hybrid.prefill_tps[i].second / full.prefill_tps[i].second);
  }
  std::printf("\n== Decode step (one token)\n%8s %11s %11s %9s %13s %13s %9s\n", "context", "hybrid ms", "full ms",
              "time x", "hybrid attnMB", "full attnMB", "bytes x");
  for (size_t i = 0; i < hybrid.decode_ms.size(); ++i) {
    std::printf("%8d %11.2f %11.2f %8.3fx %13.1f %13.1f %8.3fx\n", hybrid.decode_ms[i].first,
                hybrid.decode_ms[i].second, full.decode_ms[i].second,
                hybrid.decode_ms[i].second / full.decode_ms[i].second, hybrid.decode_attn_mb[i].second,
                full.decode_attn_mb[i].second, hybrid.decode_attn_mb[i].second / full.decode_attn_mb[i].second);
  }
  for (const ModelRun* r : {&hybrid, &full}) {
    j[r->name]["prefill_tokens_per_s"] = r->prefill_tps;
    j[r->name]["decode_ms"] = r->decode_ms;
    j[r->name]["decode_attention_mb"] = r->decode_attn_mb;
  }
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  return 0;
}
