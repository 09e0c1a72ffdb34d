// Capacity of the dual full/SWA pool for one request of the MiMo-V2.5-Pro
// shape (70 layers = 10 full + 60 SWA, W = 128, 8 KV heads, K 192 / V 128,
// bf16, page 16), at 4K, 32K, 128K and 1M tokens.
//
// Everything is measured, not computed: a real Sequence (metadata-only pools,
// allocate_memory = false) runs a chunked prefill of N tokens, then
// TrimWindow() (what the engine calls after the last chunk's forward pass;
// the next Append or Finish does it too), and the bytes it holds are the
// pools' in-use page counts x page bytes. It is compared against
//   minimum      full: N tokens x 10 layers; SWA: min(N, W) tokens x 60 layers
//   single pool  the same classes with a window >= N, i.e. a pool that keeps
//                all 70 layers for every token (measured the same way; also
//                checked against N x 70 layers x token bytes)
// Also shown: what the sequence holds right after the last chunk's Append
// (before TrimWindow: the chunk's forward pass writes and reads the SWA KV of
// all its tokens), the peak during prefill, and the most SWA pages held
// during --decode further decode steps (stays O(W)).
//
// Usage: kv_capacity_bench [--json FILE] [--chunk TOKENS] [--decode STEPS]
//                          [--slack TOKENS]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "nlohmann/json.hpp"

namespace swaserve::kv {
namespace {

struct Flags {
  std::string json;
  int chunk = 4096;   // prefill chunk (tokens)
  int decode = 1024;  // extra decode steps after reaching N tokens
  int slack = 0;      // Sequence swa_slack (speculative tokens)
};

struct Held {
  int64_t full_pages = 0;
  int64_t swa_pages = 0;
  double bytes = 0;
};

Held InUse(const KvPools& pools) {
  Held h;
  h.full_pages = pools.full().num_in_use();
  h.swa_pages = pools.swa().num_in_use();
  h.bytes = static_cast<double>(h.full_pages) * pools.full().page_bytes() +
            static_cast<double>(h.swa_pages) * pools.swa().page_bytes();
  return h;
}

struct Run {
  Held after_prefill;   // right after the last prefill chunk's Append
  Held peak_prefill;    // most bytes held during the prefill
  Held steady;          // N tokens after TrimWindow(): what it holds decoding
  int64_t max_swa_pages_decoding = 0;  // over --decode more steps
};

void Die(const std::string& what) {
  std::fprintf(stderr, "kv_capacity_bench: %s\n", what.c_str());
  std::exit(1);
}

// Runs one request of n tokens through a Sequence on fresh metadata-only
// pools of `shape`.
Run Measure(const KvShape& shape, int64_t n, const Flags& flags) {
  const int64_t ps = shape.page_size;
  // Generous pools: the figures are in-use counts, not pool sizes.
  const int64_t pages = (n + flags.decode + flags.chunk + ps - 1) / ps + 4;
  KvPoolsOptions opts;
  opts.shape = shape;
  opts.full_pages = pages;
  opts.swa_pages = pages;
  opts.allocate_memory = false;
  auto pools_or = KvPools::Create(opts);
  if (!pools_or.ok()) Die(std::string(pools_or.status().message()));
  KvPools& pools = **pools_or;
  SequenceOptions so;
  so.pools = &pools;
  so.cache = nullptr;
  so.swa_slack = flags.slack;
  so.evict_on_demand = false;

  Run run;
  {
    Sequence seq(so);
    while (seq.length() < n) {
      const int c = static_cast<int>(std::min<int64_t>(flags.chunk, n - seq.length()));
      if (absl::Status s = seq.Append(c); !s.ok()) Die(std::string(s.message()));
      const Held h = InUse(pools);
      if (h.bytes > run.peak_prefill.bytes) run.peak_prefill = h;
    }
    run.after_prefill = InUse(pools);
    // After the last chunk's forward pass: release the SWA pages that left
    // the window (Append and Finish do this too).
    seq.TrimWindow();
    run.steady = InUse(pools);
    for (int i = 0; i < flags.decode; ++i) {
      if (absl::Status s = seq.Append(1); !s.ok()) Die(std::string(s.message()));
      run.max_swa_pages_decoding =
          std::max(run.max_swa_pages_decoding, pools.swa().num_in_use());
    }
    seq.Abort();
  }
  if (pools.full().num_in_use() != 0 || pools.swa().num_in_use() != 0) {
    Die("pages still in use after Abort");
  }
  return run;
}

double MiB(double bytes) { return bytes / (1024.0 * 1024.0); }

int Main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> std::string {
      const std::string prefix = std::string(name) + "=";
      if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
      if (i + 1 >= argc) Die(std::string(name) + " needs a value");
      return argv[++i];
    };
    if (a == "--json" || a.rfind("--json=", 0) == 0) {
      flags.json = value("--json");
    } else if (a == "--chunk" || a.rfind("--chunk=", 0) == 0) {
      flags.chunk = std::atoi(value("--chunk").c_str());
    } else if (a == "--decode" || a.rfind("--decode=", 0) == 0) {
      flags.decode = std::atoi(value("--decode").c_str());
    } else if (a == "--slack" || a.rfind("--slack=", 0) == 0) {
      flags.slack = std::atoi(value("--slack").c_str());
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: kv_capacity_bench [--json FILE] [--chunk TOKENS] "
                  "[--decode STEPS] [--slack TOKENS]\n");
      return 0;
    } else {
      Die("unknown flag " + a);
    }
  }
  if (flags.chunk <= 0 || flags.decode < 0 || flags.slack < 0) Die("bad flag value");

  const KvShape shape = KvShape::MiMoV25Pro();
  const PoolGeometry full = shape.Full();
  const PoolGeometry swa = shape.Swa();
  const int w = shape.sliding_window;
  std::printf(
      "MiMo-V2.5-Pro KV shape: %d full + %d SWA layers, W = %d, %d KV heads, "
      "K %d / V %d, %s, page %d tokens\n"
      "token bytes: full %zu (%d layers), SWA %zu (%d layers); page bytes: "
      "full %zu, SWA %zu\n"
      "prefill chunk %d tokens, swa_slack %d, allocate_memory=false\n\n",
      shape.full_layers, shape.swa_layers, w, shape.full_kv_heads,
      shape.full_k_head_dim, shape.full_v_head_dim,
      std::string(DTypeName(shape.dtype)).c_str(), shape.page_size,
      full.TokenBytes(), full.num_layers, swa.TokenBytes(), swa.num_layers,
      full.PageBytes(), swa.PageBytes(), flags.chunk, flags.slack);

  const std::vector<int64_t> sizes = {4096, 32768, 131072, 1048576};
  nlohmann::json rows = nlohmann::json::array();
  bool min_met = true;
  double single_ratio_128k = 0;

  std::printf(
      "%9s %9s %5s %11s %11s %9s %12s %12s %8s | %12s %11s %9s\n", "tokens",
      "full pg", "swa pg", "held MiB", "min MiB", "held/min", "single MiB",
      "single(calc)", "single/x", "after-pf MiB", "peak-pf MiB",
      "decode swa");
  for (int64_t n : sizes) {
    const Run dual = Measure(shape, n, flags);
    KvShape single_shape = shape;
    // A window longer than the request: every SWA layer keeps every token,
    // so the two pools together keep all 70 layers for every token.
    single_shape.sliding_window = static_cast<int>(n + flags.decode + 2 * shape.page_size);
    const Run single = Measure(single_shape, n, flags);

    const double minimum = static_cast<double>(n) * full.TokenBytes() +
                           static_cast<double>(std::min<int64_t>(n, w)) * swa.TokenBytes();
    const double single_calc =
        static_cast<double>(n) * (full.TokenBytes() + swa.TokenBytes());
    const double held = dual.steady.bytes;
    const double held_over_min = held / minimum;
    const double single_over_held = single.steady.bytes / held;
    if (n >= 32768 && held_over_min > 1.05) min_met = false;
    if (n == 131072) single_ratio_128k = single_over_held;

    std::printf(
        "%9lld %9lld %6lld %11.1f %11.1f %8.4fx %12.1f %12.1f %7.2fx | %12.1f "
        "%11.1f %9lld\n",
        static_cast<long long>(n), static_cast<long long>(dual.steady.full_pages),
        static_cast<long long>(dual.steady.swa_pages), MiB(held), MiB(minimum),
        held_over_min, MiB(single.steady.bytes), MiB(single_calc), single_over_held,
        MiB(dual.after_prefill.bytes), MiB(dual.peak_prefill.bytes),
        static_cast<long long>(dual.max_swa_pages_decoding));

    auto held_json = [](const Held& h) {
      return nlohmann::json{{"full_pages", h.full_pages},
                            {"swa_pages", h.swa_pages},
                            {"bytes", h.bytes}};
    };
    rows.push_back({
        {"tokens", n},
        {"dual_steady", held_json(dual.steady)},
        {"dual_after_prefill", held_json(dual.after_prefill)},
        {"dual_peak_prefill", held_json(dual.peak_prefill)},
        {"dual_max_swa_pages_decoding", dual.max_swa_pages_decoding},
        {"single_pool_steady", held_json(single.steady)},
        {"single_pool_calculated_bytes", single_calc},
        {"minimum_bytes", minimum},
        {"held_over_minimum", held_over_min},
        {"single_pool_over_held", single_over_held},
    });
  }
  std::printf(
      "\ncolumns: held = bytes the request holds at N tokens (chunked prefill of N "
      "tokens, then TrimWindow());\n"
      "  min = N x 10 full layers + min(N, W) x 60 SWA layers; single = the "
      "same Sequence with W >= N (all 70 layers kept),\n"
      "  measured, and single(calc) = N x 70 layers; single/x = single / held;"
      " after-pf = held right after the last chunk's Append,\n"
      "  before TrimWindow (the chunk's SWA KV is needed by its forward pass); peak-pf = "
      "most held during that prefill; decode swa = most\n"
      "  SWA pages held during %d more decode steps.\n\n",
      flags.decode);

  const bool single_met = single_ratio_128k >= 6.5;
  std::printf("target: within 5%% of the minimum from 32K tokens up: %s\n",
              min_met ? "MET" : "NOT MET");
  std::printf("target: >= 6.5x less than a single pool at 128K: %.2fx -> %s\n",
              single_ratio_128k, single_met ? "MET" : "NOT MET");

  if (!flags.json.empty()) {
    nlohmann::json out = {
        {"benchmark", "kv_capacity_bench"},
        {"shape",
         {{"full_layers", shape.full_layers},
          {"swa_layers", shape.swa_layers},
          {"sliding_window", w},
          {"kv_heads", shape.full_kv_heads},
          {"k_head_dim", shape.full_k_head_dim},
          {"v_head_dim", shape.full_v_head_dim},
          {"dtype", std::string(DTypeName(shape.dtype))},
          {"page_size", shape.page_size},
          {"full_token_bytes", full.TokenBytes()},
          {"swa_token_bytes", swa.TokenBytes()}}},
        {"chunk", flags.chunk},
        {"decode_steps", flags.decode},
        {"swa_slack", flags.slack},
        {"rows", rows},
        {"targets",
         {{"within_5pct_of_minimum_from_32k", min_met},
          {"single_pool_over_held_at_128k", single_ratio_128k},
          {"at_least_6_5x_less_than_single_pool_at_128k", single_met}}},
    };
    std::ofstream f(flags.json);
    f << out.dump(2) << "\n";
    if (!f) Die("cannot write " + flags.json);
  }
  return 0;
}

}  // namespace
}  // namespace swaserve::kv

int main(int argc, char** argv) { return swaserve::kv::Main(argc, argv); }
