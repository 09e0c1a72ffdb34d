// Weight-format benchmark: one pro-mini-sized model
// (BuiltinConfig "mimo-v2.5-pro-mini": 70 layers, hidden 256, 8 experts) in
// several checkpoint layouts with the same random seed: F32, BF16, FP8 E4M3
// with 128 x 128 block scales, and FP8 with a fused qkv_proj. For each, in
// the same run:
//   checkpoint bytes (model.safetensors), load time (Engine::Create),
//   resident memory added by the loaded engine (VmRSS after - before; the
//   checkpoint mapping is released after load) and at the peak of loading
//   (VmHWM - VmRSS before: mapping + packed weights), Engine::WeightBytes,
//   prefill tokens/s (one prompt) and decode tokens/s (batch 1 and 16).
//
//   layout_bench [--threads 2] [--vocab 16384] [--prompt 512] [--steps 32]
//                [--dir /tmp/layout-bench] [--layouts f32,bf16,fp8,fp8-fused]
// Memory figures are only meaningful for the first layout of a process
// (freed engines stay in malloc's arenas): run one layout per process.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/model/forward.h"

namespace swaserve::model {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A /proc/self/status field ("VmRSS", "VmHWM"), bytes.
size_t StatusBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      return std::strtoull(line.c_str() + key.size(), nullptr, 10) * 1024;
    }
  }
  return 0;
}
size_t RssBytes() { return StatusBytes("VmRSS"); }

ModelConfig LayoutConfig(const std::string& layout, int vocab) {
  ModelConfig c = *BuiltinConfig("mimo-v2.5-pro-mini", vocab);
  c.dtype = layout == "f32" ? kv::DType::kF32 : kv::DType::kBF16;
  if (layout == "fp8" || layout == "fp8-fused") {
    c.quant.fp8 = true;
    c.quant.block_out = c.quant.block_in = 128;
  }
  if (layout == "fp8-fused") c.qkv_layout = QkvLayout::kFused;
  return c;
}

struct Row {
  std::string layout;
  double file_mb = 0, load_s = 0, rss_mb = 0, peak_mb = 0, weight_mb = 0;
  double prefill_tps = 0, decode1_tps = 0, decode16_tps = 0;
};

// Decode tokens/s of `batch` sequences, each prefilled with 16 tokens, over
// `steps` steps.
double Decode(Engine& e, int batch, int steps) {
  kv::KvShape shape = e.config().KvShape(16);
  auto pools = *kv::KvPools::Create({shape, 64 * batch, 64 * batch, true});
  std::vector<std::unique_ptr<kv::Sequence>> seqs;
  std::vector<std::vector<uint32_t>> toks(batch);
  std::mt19937 rng(7);
  std::vector<ForwardItem> items;
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(std::make_unique<kv::Sequence>(kv::SequenceOptions{pools.get(), nullptr, 0, false}));
    toks[b].resize(16);
    for (uint32_t& t : toks[b]) t = rng() % e.config().vocab_size;
    (void)seqs[b]->Append(16);
    items.push_back({seqs[b].get(), toks[b], 0});
  }
  ForwardOutput out;
  (void)e.Forward(items, &out);
  std::vector<uint32_t> next(batch, 1);
  const double t0 = Now();
  for (int s = 0; s < steps; ++s) {
    items.clear();
    for (int b = 0; b < batch; ++b) {
      const int pos = static_cast<int>(seqs[b]->length());
      (void)seqs[b]->Append(1);
      items.push_back({seqs[b].get(), absl::MakeConstSpan(&next[b], 1), pos});
    }
    (void)e.Forward(items, &out);
  }
  return static_cast<double>(batch) * steps / (Now() - t0);
}

double Prefill(Engine& e, int n) {
  kv::KvShape shape = e.config().KvShape(16);
  auto pools = *kv::KvPools::Create({shape, n / 16 + 8, n / 16 + 8, true});
  kv::Sequence seq({pools.get(), nullptr, 0, false});
  std::vector<uint32_t> tokens(n);
  std::mt19937 rng(3);
  for (uint32_t& t : tokens) t = rng() % e.config().vocab_size;
  (void)seq.Append(n);
  ForwardItem item{&seq, tokens, 0};
  ForwardOutput out;
  const double t0 = Now();
  (void)e.Forward({&item, 1}, &out);
  return n / (Now() - t0);
}

int Main(int argc, char** argv) {
  int threads = 2, vocab = 16384, prompt = 512, steps = 32;
  std::string dir = "/tmp/layout-bench", layouts = "f32,bf16,fp8,fp8-fused";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") (void)absl::SimpleAtoi(v, &threads);
    if (k == "--vocab") (void)absl::SimpleAtoi(v, &vocab);
    if (k == "--prompt") (void)absl::SimpleAtoi(v, &prompt);
    if (k == "--steps") (void)absl::SimpleAtoi(v, &steps);
    if (k == "--dir") dir = v;
    if (k == "--layouts") layouts = v;
  }
  std::vector<Row> rows;
  for (absl::string_view name : absl::StrSplit(layouts, ',')) {
    Row r;
    r.layout = std::string(name);
    const std::string d = dir + "/" + r.layout;
    const ModelConfig c = LayoutConfig(r.layout, vocab);
    if (!std::filesystem::exists(d + "/model.safetensors")) {
      const absl::Status s = WriteRandomCheckpoint(c, 1, d);
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", r.layout.c_str(), std::string(s.message()).c_str());
        return 1;
      }
    }
    r.file_mb = std::filesystem::file_size(d + "/model.safetensors") / 1048576.0;
    const size_t rss0 = RssBytes();
    const double t0 = Now();
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create({d, threads});
    r.load_s = Now() - t0;
    if (!e.ok()) {
      std::fprintf(stderr, "%s: %s\n", r.layout.c_str(), std::string(e.status().message()).c_str());
      return 1;
    }
    r.rss_mb = (static_cast<double>(RssBytes()) - rss0) / 1048576.0;
    r.peak_mb = (static_cast<double>(StatusBytes("VmHWM")) - rss0) / 1048576.0;
    r.weight_mb = (*e)->WeightBytes() / 1048576.0;
    r.prefill_tps = Prefill(**e, prompt);
    r.decode1_tps = Decode(**e, 1, steps);
    r.decode16_tps = Decode(**e, 16, steps);
    rows.push_back(r);
    std::fprintf(stderr, "%s done\n", r.layout.c_str());
  }
  std::printf("| layout | checkpoint MiB | load s | RSS added MiB | peak RSS added MiB | "
              "WeightBytes MiB | prefill tok/s (%d) | decode tok/s b=1 | decode tok/s b=16 |\n"
              "|---|---|---|---|---|---|---|---|---|\n",
              prompt);
  for (const Row& r : rows) {
    std::printf("| %s | %.1f | %.2f | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f |\n",
                r.layout.c_str(), r.file_mb, r.load_s, r.rss_mb, r.peak_mb, r.weight_mb,
                r.prefill_tps, r.decode1_tps, r.decode16_tps);
  }
  return 0;
}

}  // namespace
}  // namespace swaserve::model

int main(int argc, char** argv) { return swaserve::model::Main(argc, argv); }
