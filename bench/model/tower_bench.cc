// Encoder towers: items/s of the vision and audio towers when B
// items go through one Encode (the encoder service's cross-request batch)
// against one at a time, with the GEMM work per second achieved. Medium
// towers with random weights (the shapes are printed); numbers in
// bench/RESULTS.md "Encoder towers".
//   tower_bench [--reps N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "lib/base/subprocess.h"
#include "lib/model/audio.h"
#include "lib/model/vision.h"

namespace swaserve::model {
namespace {

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename Encode>
double MedianSeconds(int reps, Encode&& encode) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    encode();
    t.push_back(Seconds(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Main(int argc, char** argv) {
  int reps = 5;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: tower_bench [--reps N] [--json FILE]\n");
      return 2;
    }
  }
  auto dir = base::MakeTempDir("tower-bench");
  if (!dir.ok()) return 1;
  std::ofstream(*dir + "/config.json") << "{}\n";
  const VisionConfig vc{.patch_size = 14, .merge_size = 2, .hidden_size = 256, .depth = 8,
                        .num_heads = 8, .intermediate_size = 1024, .out_hidden_size = 1024,
                        .window_size = 112, .fullatt_block_indexes = {3, 7}};
  const AudioConfig ac{.num_mel_bins = 80, .d_model = 256, .encoder_layers = 8,
                       .encoder_attention_heads = 8, .encoder_ffn_dim = 1024,
                       .out_hidden_size = 1024, .merge_size = 2};
  if (!WriteRandomVisionTower(vc, 1, *dir).ok() || !WriteRandomAudioTower(ac, 1, *dir).ok()) {
    return 1;
  }
  auto vision = VisionTower::Load(*dir);
  auto audio = AudioTower::Load(*dir);
  if (!vision.ok() || !audio.ok()) return 1;
  nlohmann::json out = nlohmann::json::array();
  // Linear-layer FLOPs per item (2 per multiply-add): vision per patch, audio
  // per frame after conv2 (+ conv1 per input frame).
  const double D = vc.hidden_size, I = vc.intermediate_size, P = 3.0 * 14 * 14;
  const int grid = 16;  // a 224 x 224 image: 256 patches, 64 tokens
  const double v_flops = 2 * grid * grid * (P * D + vc.depth * (4 * D * D + 3 * D * I)) +
                         2 * (grid * grid / 4.0) * (16 * D * D + 4 * D * 1024);
  const int frames = 500;  // 5 s of audio: 250 frames after conv2, 125 tokens
  const double A = ac.d_model, F = ac.encoder_ffn_dim;
  const double a_flops = 2 * frames * (80 * 3 * A) + 2 * 250 * (3 * A * A) +
                         2 * 250 * ac.encoder_layers * (4 * A * A + 2 * A * F) +
                         2 * 125 * A * 1024;
  std::vector<float> patches(static_cast<size_t>(grid) * grid * P);
  for (size_t i = 0; i < patches.size(); ++i) patches[i] = static_cast<float>((i * 7919) % 1000) / 1000;
  std::vector<float> mel(static_cast<size_t>(frames) * 80);
  for (size_t i = 0; i < mel.size(); ++i) mel[i] = static_cast<float>((i * 104729) % 997) / 997;
  std::printf("vision tower: hidden %d, %d blocks (%d full), MLP %d; 224x224 images (256 patches, "
              "64 tokens)\naudio tower: d_model %d, %d layers, FFN %d; 5 s clips (500 frames, 125 "
              "tokens)\n\n%-7s %5s %12s %12s %10s\n",
              vc.hidden_size, vc.depth, static_cast<int>(vc.fullatt_block_indexes.size()),
              vc.intermediate_size, ac.d_model, ac.encoder_layers, ac.encoder_ffn_dim, "tower",
              "batch", "items/s", "vs batch 1", "GFLOP/s");
  for (const char* kind : {"vision", "audio"}) {
    double base = 0;
    for (int b : {1, 2, 4, 8, 16}) {
      double s = 0;
      if (std::string(kind) == "vision") {
        std::vector<VisionInput> in(b, VisionInput{.patches = patches, .grid_h = grid, .grid_w = grid});
        s = MedianSeconds(reps, [&] { (void)(*vision)->Encode(in); });
      } else {
        std::vector<AudioInput> in(b, AudioInput{.mel = mel, .frames = frames});
        s = MedianSeconds(reps, [&] { (void)(*audio)->Encode(in); });
      }
      const double ips = b / s;
      if (b == 1) base = ips;
      const double gflops = ips * (std::string(kind) == "vision" ? v_flops : a_flops) / 1e9;
      std::printf("%-7s %5d %12.1f %11.2fx %10.1f\n", kind, b, ips, ips / base, gflops);
      out.push_back({{"tower", kind}, {"batch", b}, {"items_per_s", ips},
                     {"speedup", ips / base}, {"gflops", gflops}});
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace swaserve::model

int main(int argc, char** argv) { return swaserve::model::Main(argc, argv); }
