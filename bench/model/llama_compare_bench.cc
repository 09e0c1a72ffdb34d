// This engine's side of the llama.cpp speed comparison (bench/llama_compare.sh
// runs it and tools/llama_oracle/speed.mjs on the same checkpoint, threads
// and prompts): prefill tokens/s of one prompt per length, evaluated in
// chunks of --chunk tokens (llama.cpp's batch), and decode tokens/s of
// greedy steps after the first prompt at batch 1 and with B parallel
// sequences (each at that prompt's context), then the process's peak RSS.
//
//   llama_compare_bench --checkpoint DIR [--threads 2] [--prompts 512,4096]
//                       [--decode 64] [--batches 1,8,16] [--chunk 512]
// Prints one JSON object per measurement (the shape speed.mjs prints).
// Token ids: the fixed pseudo-random ids below 4093 speed.mjs uses. KV in
// the checkpoint's dtype (bf16 for the demo model).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/forward.h"

namespace swaserve::model {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<int> List(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int v;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

std::vector<uint32_t> Tokens(int n, uint64_t seed) {
  std::vector<uint32_t> t;
  uint64_t x = seed;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(static_cast<uint32_t>((x >> 33) % 4093));
  }
  return t;
}

double PeakRssMib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

uint32_t Argmax(const float* row, int V) {
  return static_cast<uint32_t>(std::max_element(row, row + V) - row);
}

int Run(const std::string& dir, int threads, const std::vector<int>& prompts, int decode,
        const std::vector<int>& batches, int chunk) {
  KernelThreads::SetThreads(threads);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create({dir, threads});
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  Engine& e = **engine;
  const int V = e.config().vocab_size;
  int max_batch = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);
  int max_len = 0;
  for (int n : prompts) max_len = std::max(max_len, n);
  const int64_t pages = static_cast<int64_t>(max_batch) * ((max_len + decode) / 16 + 4) + 64;
  auto pools = *kv::KvPools::Create({e.KvShapeFor(16), pages, pages, true});
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int n = prompts[i];
    const std::vector<uint32_t> tokens = Tokens(n, i + 1);
    // The timed prefill (one sequence).
    uint32_t next = 0;
    {
      kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false});
      const double t0 = Now();
      ForwardOutput out;
      for (int pos = 0; pos < n; pos += chunk) {
        const int len = std::min(chunk, n - pos);
        if (!seq.Append(len).ok()) return 1;
        ForwardItem item{.seq = &seq, .tokens = absl::MakeConstSpan(tokens).subspan(pos, len),
                         .start = pos};
        if (!e.Forward({&item, 1}, &out).ok()) return 1;
      }
      const double dt = Now() - t0;
      next = Argmax(out.logits.data() + out.logits.size() - V, V);
      std::printf("{\"what\": \"prefill\", \"tokens\": %d, \"seconds\": %.4f, \"tokens_per_s\": %.1f}\n",
                  n, dt, n / dt);
      std::fflush(stdout);
    }
    if (i != 0 || decode <= 0) continue;
    for (int b : batches) {
      // b sequences, each its own copy of the prompt's state: decode steps from position n.
      std::vector<std::unique_ptr<kv::Sequence>> d;
      std::vector<uint32_t> tok(b);
      for (int q = 0; q < b; ++q) {
        d.push_back(std::make_unique<kv::Sequence>(kv::SequenceOptions{pools.get(), nullptr, 0, false}));
        ForwardOutput out;
        for (int pos = 0; pos < n; pos += chunk) {
          const int len = std::min(chunk, n - pos);
          if (!d.back()->Append(len).ok()) return 1;
          ForwardItem item{.seq = d.back().get(),
                           .tokens = absl::MakeConstSpan(tokens).subspan(pos, len),
                           .start = pos};
          if (!e.Forward({&item, 1}, &out).ok()) return 1;
        }
        tok[q] = next;
      }
      const double t0 = Now();
      for (int step = 0; step < decode; ++step) {
        std::vector<ForwardItem> items;
        for (int q = 0; q < b; ++q) {
          if (!d[q]->Append(1).ok()) return 1;
          items.push_back(ForwardItem{.seq = d[q].get(), .tokens = absl::MakeConstSpan(&tok[q], 1),
                                      .start = n + step});
        }
        ForwardOutput out;
        if (!e.Forward(items, &out).ok()) return 1;
        for (int q = 0; q < b; ++q) tok[q] = Argmax(out.logits.data() + q * V, V);
      }
      const double dt = Now() - t0;
      std::printf("{\"what\": \"decode\", \"context\": %d, \"batch\": %d, \"steps\": %d, "
                  "\"seconds\": %.4f, \"tokens_per_s\": %.1f}\n",
                  n, b, decode, dt, b * decode / dt);
      std::fflush(stdout);
    }
  }
  std::printf("{\"what\": \"peak_rss_mib\", \"value\": %.1f}\n", PeakRssMib());
  return 0;
}

}  // namespace
}  // namespace swaserve::model

int main(int argc, char** argv) {
  std::string dir;
  int threads = 2, decode = 64, chunk = 512;
  std::vector<int> prompts = {512, 4096}, batches = {1, 8, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--checkpoint") dir = next();
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--prompts") prompts = swaserve::model::List(next());
    else if (a == "--decode") decode = std::stoi(next());
    else if (a == "--batches") batches = swaserve::model::List(next());
    else if (a == "--chunk") chunk = std::stoi(next());
    else {
      dir.clear();
      break;
    }
  }
  if (dir.empty() || prompts.empty() || chunk <= 0) {
    std::fprintf(stderr, "usage: llama_compare_bench --checkpoint DIR [--threads N] "
                         "[--prompts L,..] [--decode N] [--batches B,..] [--chunk N]\n");
    return 2;
  }
  return swaserve::model::Run(dir, threads, prompts, decode, batches, chunk);
}
