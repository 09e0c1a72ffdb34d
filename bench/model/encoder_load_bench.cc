// The encoder service's cross-request batching under load (encoder
// throughput batched vs unbatched at equal p99 latency): EncoderCore (what
// swaserve-encoder serves, without gRPC) with the medium vision tower of
// tower_bench, C closed-loop client threads each encoding one 224 × 224 PNG
// per call (its own PNG decode and preprocessing on the client thread, as the
// service does per call), the embedding cache off so every item is encoded.
// Two modes: unbatched (--batch.max_items 1) and batched (max 16, window
// 5 ms). Prints items/s and per-call latency p50/p99 per concurrency, then
// the best throughput of each mode whose p99 stays under each bound.
//   encoder_load_bench [--seconds S] [--concurrency 1,2,4,8,16]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/base/subprocess.h"
#include "lib/encoder/encoder_core.h"
#include "lib/model/vision.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve::encoder {
namespace {

struct Point {
  int concurrency = 0;
  double items_per_s = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

Point Run(EncoderCore& core, const std::string& png, int concurrency, double seconds) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> lat(concurrency);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      const EncodeItem item{.modality = Modality::kImage, .data = png};
      while (!stop.load()) {
        const auto s = std::chrono::steady_clock::now();
        auto r = core.Encode({&item, 1});
        if (!r.ok()) {
          std::fprintf(stderr, "encode failed: %s\n", r.status().ToString().c_str());
          std::exit(1);
        }
        lat[c].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all;
  for (const auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  Point p;
  p.concurrency = concurrency;
  p.items_per_s = static_cast<double>(all.size()) / wall;
  p.p50_ms = all[all.size() / 2];
  p.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return p;
}

int Main(int argc, char** argv) {
  double seconds = 6;
  std::vector<int> concurrency = {1, 2, 4, 8, 16};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) {
      seconds = std::atof(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--concurrency") == 0) {
      concurrency.clear();
      for (absl::string_view v : absl::StrSplit(argv[i + 1], ',')) {
        int c = 0;
        if (!absl::SimpleAtoi(v, &c) || c < 1) return 2;
        concurrency.push_back(c);
      }
    } else {
      std::fprintf(stderr, "usage: encoder_load_bench [--seconds S] [--concurrency 1,2,4]\n");
      return 2;
    }
  }
  auto dir = base::MakeTempDir("encoder-load-bench");
  if (!dir.ok()) return 1;
  std::ofstream(*dir + "/config.json") << "{}\n";
  const model::VisionConfig vc{.patch_size = 14, .merge_size = 2, .hidden_size = 256,
                               .depth = 8, .num_heads = 8, .intermediate_size = 1024,
                               .out_hidden_size = 1024, .window_size = 112,
                               .fullatt_block_indexes = {3, 7}};
  if (!model::WriteRandomVisionTower(vc, 1, *dir).ok()) return 1;
  const std::vector<uint8_t> bytes =
      media::testing::EncodePng(media::testing::MakePattern(224, 224, 1));
  const std::string png(bytes.begin(), bytes.end());
  std::printf("vision tower hidden %d, depth %d; 224x224 PNG (64 tokens); %.0f s per point\n",
              vc.hidden_size, vc.depth, seconds);
  std::printf("%-10s %6s %10s %9s %9s\n", "mode", "conc", "items/s", "p50 ms", "p99 ms");
  std::vector<Point> modes[2];
  for (int mode = 0; mode < 2; ++mode) {
    EncoderCoreOptions o;
    o.model_dir = *dir;
    o.cache.max_bytes = 0;  // every item encoded
    o.batcher.max_batch_items = mode == 0 ? 1 : 16;
    o.batcher.batch_window = mode == 0 ? absl::ZeroDuration() : absl::Milliseconds(5);
    auto core = EncoderCore::Create(o);
    if (!core.ok()) {
      std::fprintf(stderr, "%s\n", core.status().ToString().c_str());
      return 1;
    }
    for (int c : concurrency) {
      const Point p = Run(**core, png, c, seconds);
      modes[mode].push_back(p);
      std::printf("%-10s %6d %10.1f %9.1f %9.1f\n", mode == 0 ? "unbatched" : "batched", c,
                  p.items_per_s, p.p50_ms, p.p99_ms);
      std::fflush(stdout);
    }
  }
  // The best throughput whose p99 is under each bound, per mode.
  std::printf("\n%-12s %16s %16s %8s\n", "p99 bound", "unbatched it/s", "batched it/s", "ratio");
  for (double bound : {100.0, 200.0, 400.0, 800.0, 1600.0}) {
    double best[2] = {0, 0};
    for (int m = 0; m < 2; ++m) {
      for (const Point& p : modes[m]) {
        if (p.p99_ms <= bound) best[m] = std::max(best[m], p.items_per_s);
      }
    }
    std::printf("<= %6.0f ms %16.1f %16.1f %7.2fx\n", bound, best[0], best[1],
                best[0] > 0 ? best[1] / best[0] : 0.0);
  }
  return 0;
}

}  // namespace
}  // namespace swaserve::encoder

int main(int argc, char** argv) { return swaserve::encoder::Main(argc, argv); }
