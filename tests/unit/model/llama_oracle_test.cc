// llama.cpp as an independent oracle of the engine: the tiny model (f32
// weights) exported with `swaserve export-gguf --dtype=f32`, run by
// llama.cpp's prebuilt CPU library through node-llama-cpp
// (tools/llama_oracle/oracle.mjs) and by this engine, both with f32 KV, on
// the same token prompts: short, across the sliding window, across prefill
// chunk boundaries (64-token chunks on both sides) and 8K tokens; and the
// FP8 and fused-QKV mini released layouts (1K tokens for the long prompt).
//
// Bound: both engines compute in f32 from the same f32 weights; they differ
// only in summation order and in their exp / sigmoid / SiLU routines. Each
// f32 operation is exact to 2^-24 relative, a dot product of K terms to
// about K x 2^-24 of the sum of |terms| in the worst case; over 6 layers of
// K <= 4096 that is well under 1e-4 of a row's logit scale, so the largest
// logit difference allowed is 1e-4 x max |logit| of the row (about 800
// units in the last place of the largest logit). Greedy outputs must agree
// for 128 tokens, or the first divergence must be a near-tie: the two
// leading logits closer than twice that bound.
//
// $SWASERVE_ORACLE_MODEL=DIR runs the same comparison on another checkpoint
// (e.g. models/demo). Skipped (with the reason) when node or node-llama-cpp
// is not installed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/model/forward.h"
#include "lib/model/gguf_export.h"
#include "lib/model/mini_checkpoints.h"
#include "lib/model/tokenizer.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kSource = SWASERVE_SOURCE_DIR;
constexpr int kGenerate = 128;
constexpr double kRelBound = 1e-4;
constexpr int kPage = 16;

struct Prompt {
  std::string name;
  std::vector<uint32_t> tokens;
  std::vector<int> positions;  // whose next-token logits are compared
  int chunk = 0;               // prefill chunk (both engines)
};

struct EngineRun {
  std::vector<std::vector<float>> logits;  // per position
  std::vector<uint32_t> greedy;
  std::vector<std::pair<float, float>> top2;  // per greedy step
};

std::vector<uint32_t> Tokens(int n, uint64_t seed) {
  std::vector<uint32_t> t;
  uint64_t x = seed;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(static_cast<uint32_t>((x >> 33) % 4093));  // no special tokens
  }
  return t;
}

std::pair<float, float> Top2(const float* row, int V) {
  const int best = static_cast<int>(std::max_element(row, row + V) - row);
  float second = -INFINITY;
  for (int i = 0; i < V; ++i) {
    if (i != best) second = std::max(second, row[i]);
  }
  return {row[best], second};
}

EngineRun RunOurs(Engine& e, const Prompt& p) {
  EngineRun r;
  const int V = e.config().vocab_size;
  const int64_t total = static_cast<int64_t>(p.tokens.size()) + kGenerate;
  kv::KvShape shape = e.config().KvShape(kPage);
  shape.dtype = kv::DType::kF32;
  const int64_t pages = total / kPage + 16;
  auto pools = *kv::KvPools::Create({shape, pages, pages, true});
  kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false}, kv::CacheHit());
  r.logits.resize(p.positions.size());
  std::vector<float> last;
  for (size_t start = 0; start < p.tokens.size(); start += p.chunk) {
    const size_t n = std::min<size_t>(p.chunk, p.tokens.size() - start);
    EXPECT_TRUE(seq.Append(n).ok());
    ForwardItem item{.seq = &seq,
                     .tokens = absl::MakeConstSpan(p.tokens).subspan(start, n),
                     .start = static_cast<int>(start),
                     .all_logits = true};
    ForwardOutput out;
    const absl::Status s = e.Forward({&item, 1}, &out);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return r;
    for (size_t k = 0; k < p.positions.size(); ++k) {
      const int pos = p.positions[k];
      if (pos >= static_cast<int>(start) && pos < static_cast<int>(start + n)) {
        const float* row = out.logits.data() + (pos - start) * V;
        r.logits[k].assign(row, row + V);
      }
    }
    last.assign(out.logits.end() - V, out.logits.end());
  }
  for (int step = 0; step < kGenerate; ++step) {
    r.top2.push_back(Top2(last.data(), V));
    r.greedy.push_back(static_cast<uint32_t>(std::max_element(last.begin(), last.end()) -
                                             last.begin()));
    if (step + 1 == kGenerate) break;
    const int pos = static_cast<int>(seq.length());
    EXPECT_TRUE(seq.Append(1).ok());
    ForwardItem d{.seq = &seq, .tokens = absl::MakeConstSpan(&r.greedy.back(), 1), .start = pos};
    ForwardOutput o;
    EXPECT_TRUE(e.Forward({&d, 1}, &o).ok());
    last = o.logits;
  }
  return r;
}

// Why the oracle cannot run here, or "" when it can.
std::string OracleUnavailable() {
  if (!fs::exists(kSource + "/tools/llama_oracle/node_modules/node-llama-cpp/package.json")) {
    return "node-llama-cpp is not installed (scripts/install-deps.sh installs it in "
           "tools/llama_oracle)";
  }
  std::string out;
  absl::StatusOr<int> rc = base::RunCommand({"node", "--version"}, &out, absl::Seconds(20));
  if (!rc.ok() || *rc != 0) return "node is not installed";
  return "";
}

// Exports `model_dir` as f32 into `dir`, runs the four prompts (the long one
// `long_len` tokens) and the tokenizer texts on both engines and checks the
// bounds above.
void CompareWithLlamaCpp(const std::string& model_dir, const std::string& dir, int long_len) {
  const ModelConfig c = *ModelConfig::Load(model_dir);
  const std::string gguf = dir + "/model-f32.gguf";
  absl::StatusOr<GgufExportSummary> ex = ExportGguf(model_dir, gguf, {.dtype = "f32"});
  ASSERT_TRUE(ex.ok()) << ex.status();
  const int W = c.sliding_window;
  const std::vector<Prompt> prompts = {
      {.name = "short", .tokens = Tokens(8, 1), .positions = {0, 3, 7}, .chunk = 8},
      {.name = "across_window", .tokens = Tokens(3 * W, 2),
       .positions = {W - 2, W - 1, W, W + 1, 2 * W - 1, 2 * W, 3 * W - 1}, .chunk = 3 * W},
      {.name = "across_chunks", .tokens = Tokens(200, 3),
       .positions = {63, 64, 127, 128, 199}, .chunk = 64},
      {.name = absl::StrCat("long_", long_len), .tokens = Tokens(long_len, 4),
       .positions = {1000, long_len / 2 - 1, long_len / 2, long_len - 1}, .chunk = 512},
  };
  // One llama.cpp thread: its threads spin at barriers, which on a busy
  // machine costs more than the second core brings (the logits do not depend
  // on the thread count).
  Json req = {{"model", gguf}, {"threads", 1}, {"context", long_len + kGenerate + 64},
              {"vocab", c.vocab_size}, {"kv_type", "F32"}, {"prompts", Json::array()}};
  // The exported vocabulary: llama.cpp's tokenizer against ours.
  const std::vector<std::string> texts = {
      "In the beginning God created the heaven and the earth.",
      "  And the earth was without form,\n\nand void; 1234 567890 verses 3:16-17.",
      "Unicode: caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!",
      "<|im_start|>user\nWho begat Enos?<|im_end|>\n<|im_start|>assistant\n",
      "tabs\tand   spaces   \r\n end",
  };
  req["texts"] = texts;
  for (const Prompt& p : prompts) {
    req["prompts"].push_back({{"name", p.name}, {"tokens", p.tokens},
                              {"positions", p.positions}, {"generate", kGenerate},
                              {"batch", p.chunk}});
  }
  std::ofstream(dir + "/request.json") << req.dump();
  std::string log;
  const absl::Time node_start = absl::Now();
  absl::StatusOr<int> rc = base::RunCommand(
      {"node", kSource + "/tools/llama_oracle/oracle.mjs", dir + "/request.json",
       dir + "/result.json"},
      &log, absl::Seconds(600));
  ASSERT_TRUE(rc.ok()) << rc.status();
  if (*rc == 3) GTEST_SKIP() << log;
  ASSERT_EQ(*rc, 0) << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
  std::ifstream in(dir + "/result.json");
  const Json res = Json::parse(in);
  std::printf("llama.cpp %s (node-llama-cpp %s): %.1f s for every prompt\n",
              res["llama_cpp"]["release"].get<std::string>().c_str(),
              res["llama_cpp"]["package"].get<std::string>().c_str(),
              absl::ToDoubleSeconds(absl::Now() - node_start));

  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(model_dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_EQ(res["tokenized"].size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(res["tokenized"][i].get<std::vector<uint32_t>>(), *(*tok)->Encode(texts[i], true))
        << "text " << i << ": " << texts[i];
  }
  std::printf("tokenizer: %zu texts tokenized identically\n", texts.size());

  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create({model_dir, 2});
  ASSERT_TRUE(e.ok()) << e.status();
  const int V = c.vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Prompt& p = prompts[i];
    const Json& theirs = res["prompts"][i];
    ASSERT_EQ(theirs["name"], p.name);
    const absl::Time ours_start = absl::Now();
    const EngineRun ours = RunOurs(**e, p);
    const double ours_s = absl::ToDoubleSeconds(absl::Now() - ours_start);
    ASSERT_EQ(ours.logits.size(), p.positions.size()) << p.name;
    for (const std::vector<float>& row : ours.logits) ASSERT_EQ(row.size(), static_cast<size_t>(V));
    double worst = 0, worst_abs = 0;
    for (size_t k = 0; k < p.positions.size(); ++k) {
      const Json& row = theirs["logits"][k];
      ASSERT_EQ(row.size(), static_cast<size_t>(V));
      double scale = 1e-30, diff = 0;
      for (int v = 0; v < V; ++v) {
        const double t = row[v].get<double>();
        scale = std::max(scale, std::fabs(t));
        diff = std::max(diff, std::fabs(t - ours.logits[k][v]));
      }
      worst = std::max(worst, diff / scale);
      worst_abs = std::max(worst_abs, diff);
      EXPECT_LE(diff, kRelBound * scale)
          << p.name << " position " << p.positions[k] << ": max |logit diff| " << diff
          << " over a row scale of " << scale;
    }
    std::vector<uint32_t> their_greedy = theirs["greedy"].get<std::vector<uint32_t>>();
    ASSERT_EQ(their_greedy.size(), static_cast<size_t>(kGenerate));
    int diverge = -1;
    for (int s = 0; s < kGenerate; ++s) {
      if (ours.greedy[s] != their_greedy[s]) {
        diverge = s;
        break;
      }
    }
    std::printf("%-14s %5zu tokens (ours %.1f s): max |logit diff| %.3g (%.3g of the row "
                "scale); greedy %s\n",
                p.name.c_str(), p.tokens.size(), ours_s, worst_abs, worst,
                diverge < 0 ? absl::StrCat("identical for ", kGenerate, " tokens").c_str()
                            : absl::StrCat("diverges at step ", diverge).c_str());
    if (diverge >= 0) {
      const auto [a, b] = ours.top2[diverge];
      const double gap = a - b;
      const double their_gap = theirs["greedy_top2"][diverge][0].get<double>() -
                               theirs["greedy_top2"][diverge][1].get<double>();
      std::printf("  first divergence at step %d: top-2 gap %.3g (ours), %.3g (llama.cpp)\n",
                  diverge, gap, their_gap);
      EXPECT_LE(std::min(gap, their_gap), 2 * kRelBound * std::fabs(a))
          << p.name << ": greedy outputs diverge at step " << diverge
          << " where the leading logits are not a near-tie";
    }
  }
}

// Ids of models/demo/tokenizer.json (vocabulary and added tokens), whose
// tokenizer the test checkpoints use.
constexpr int kDemoVocab = 4352;

TEST(LlamaOracle, TinyModelLogitsAndGreedyOutputsAgreeWithLlamaCpp) {
  if (const std::string why = OracleUnavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = *base::MakeTempDir("llama-oracle");
  // $SWASERVE_ORACLE_MODEL: another checkpoint directory to compare on (its
  // matrices exported as f32: exact for every stored format).
  const char* other = std::getenv("SWASERVE_ORACLE_MODEL");
  std::string model_dir = dir + "/tiny";
  if (other != nullptr && *other != '\0') {
    model_dir = other;
  } else {
    ModelConfig tiny = *BuiltinConfig("tiny", kDemoVocab);
    tiny.dtype = kv::DType::kF32;
    ASSERT_TRUE(WriteRandomCheckpoint(tiny, 60, model_dir,
                                      kSource + "/models/demo/tokenizer.json").ok());
  }
  CompareWithLlamaCpp(model_dir, dir, 8192);
  fs::remove_all(dir);
}

// The released layouts' mini checkpoints on the demo tokenizer's ids: FP8
// block scales (dequantised exactly by the export) and the fused qkv_proj
// regrouped from its tensor-parallel groups, against llama.cpp.
TEST(LlamaOracle, MiniReleasedLayoutsAgreeWithLlamaCpp) {
  if (const std::string why = OracleUnavailable(); !why.empty()) GTEST_SKIP() << why;
  for (const char* layout : {"flash-fp8", "v2.5-fused-fp8"}) {
    SCOPED_TRACE(layout);
    const std::string dir = *base::MakeTempDir("llama-oracle-mini");
    MiniLayout l = *FindMiniLayout(layout);
    l.config.vocab_size = kDemoVocab;
    l.options.tokenizer_json = kSource + "/models/demo/tokenizer.json";
    ASSERT_TRUE(WriteRandomCheckpoint(l.config, 25, dir + "/mini", l.options).ok());
    std::printf("== %s\n", layout);
    CompareWithLlamaCpp(dir + "/mini", dir, 1024);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace swaserve::model
