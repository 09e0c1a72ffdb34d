// The trained demo model (models/demo, tools/train/) served by lib/model.
//
// Fixtures (no Python at test time):
//   tests/fixtures/model/demo_golden.json   tools/train/make_demo_fixtures.py:
//       float64 reference logits (tools/reference/mimo_reference.py) of a
//       held-out sequence, main model and every MTP layer; a held-out slice
//       with the training script's loss on it; a greedy continuation.
//   tests/fixtures/model/demo_tokenizer_golden.json
//       tools/train/train_tokenizer.js: ids from Hugging Face tokenizers.
//
// Checks: the checkpoint is the one the fixture describes and has every
// feature of the served family; the C++ tokenizer gives the trainer's ids;
// the engine's logits are within 1e-4 (max |engine - golden| / max |golden|
// per row) of the reference, main and MTP, also under chunked prefill and
// decode steps; its mean next-token loss on the held-out slice equals the
// training script's within 1% (with f32 KV and with the served bf16 KV);
// greedy decoding over paged KV gives the reference's tokens.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/chat_template.h"
#include "lib/model/checkpoint.h"
#include "lib/model/config.h"
#include "lib/model/forward.h"
#include "tests/unit/model/golden_util.h"
#include "lib/model/sampling.h"
#include "lib/model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {
namespace {

using Json = nlohmann::json;

constexpr char kModelDir[] = SWASERVE_SOURCE_DIR "/models/demo";
constexpr char kGolden[] =
    SWASERVE_SOURCE_DIR "/tests/fixtures/model/demo_golden.json";
constexpr char kTokGolden[] =
    SWASERVE_SOURCE_DIR "/tests/fixtures/model/demo_tokenizer_golden.json";
constexpr double kTolerance = 1e-4;
constexpr double kLossTolerance = 0.01;  // relative
constexpr int kPage = 16;

using testing_util::Fnv1a64Hex;
using testing_util::ReadFile;

constexpr char kRegenerate[] =
    "models/demo and tests/fixtures/model/demo_golden.json must come from the "
    "same "
    "training run; regenerate the fixture (tools/train/README.md):\n"
    "  /usr/bin/python3 tools/train/make_demo_fixtures.py --model models/demo "
    "--corpus /tmp/demo-corpus --out tests/fixtures/model/demo_golden.json";

class DemoModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = new Json(
        Json::parse(ReadFile(kGolden), nullptr, /*allow_exceptions=*/false));
    auto engine = Engine::Create({kModelDir, 2});
    if (engine.ok())
      engine_ = engine->release();
    else
      load_error_ = new std::string(engine.status().ToString());
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
    delete golden_;
    golden_ = nullptr;
    delete load_error_;
    load_error_ = nullptr;
  }

  void SetUp() override {
    ASSERT_EQ(load_error_, nullptr) << *load_error_;
    ASSERT_FALSE(golden_->is_discarded()) << "cannot parse " << kGolden;
    ASSERT_NE(engine_, nullptr);
    // The served KV cache has the weights' dtype (bf16 here); comparisons
    // with the float64 reference at 1e-4 use f32 KV, so that they measure
    // the engine's arithmetic and not the storage format (bf16 KV alone
    // moves logits by ~1e-3 relative).
    kv::KvShape f32 = engine_->config().KvShape(kPage);
    f32.dtype = kv::DType::kF32;
    pools_ = *kv::KvPools::Create({f32, 512, 512, true});
    served_pools_ = *kv::KvPools::Create(
        {engine_->config().KvShape(kPage), 512, 512, true});
  }

  std::unique_ptr<kv::Sequence> NewSeq(bool served_kv = false) {
    return std::make_unique<kv::Sequence>(kv::SequenceOptions{
        served_kv ? served_pools_.get() : pools_.get(), nullptr, 0, false});
  }

  static bool FixtureMatches() {
    const Json& c = (*golden_)["checkpoint"];
    return Fnv1a64Hex(std::string(kModelDir) + "/model.safetensors") ==
               c["safetensors_fnv1a64"].get<std::string>() &&
           Fnv1a64Hex(std::string(kModelDir) + "/config.json") ==
               c["config_fnv1a64"].get<std::string>();
  }

  // Checks engine rows (row-major, vocab floats per position) against the
  // fixture's layer entry: the full rows at its positions and the top values
  // of every row. Returns the worst relative difference.
  static double CheckLayer(const std::vector<float>& rows, const Json& layer,
                           const std::string& what) {
    const int V = engine_->config().vocab_size;
    const auto max_abs = layer["max_abs"].get<std::vector<double>>();
    const size_t n = max_abs.size();
    EXPECT_EQ(rows.size(), n * V) << what;
    if (rows.size() != n * V) return 1e9;
    double worst = 0;
    const auto positions = layer["positions"].get<std::vector<size_t>>();
    const auto full = layer["rows"].get<std::vector<std::vector<double>>>();
    for (size_t i = 0; i < positions.size(); ++i) {
      const float* r = rows.data() + positions[i] * V;
      double diff = 0, scale = 1e-30;
      for (int v = 0; v < V; ++v) {
        scale = std::max(scale, std::fabs(full[i][v]));
        diff =
            std::max(diff, std::fabs(static_cast<double>(r[v]) - full[i][v]));
      }
      worst = std::max(worst, diff / scale);
      EXPECT_LT(diff / scale, kTolerance)
          << what << " position " << positions[i];
    }
    const auto ids = layer["top_ids"].get<std::vector<std::vector<int>>>();
    const auto vals =
        layer["top_values"].get<std::vector<std::vector<double>>>();
    for (size_t p = 0; p < n; ++p) {
      const float* r = rows.data() + p * V;
      for (size_t j = 0; j < ids[p].size(); ++j) {
        const double d = std::fabs(r[ids[p][j]] - vals[p][j]) / max_abs[p];
        worst = std::max(worst, d);
        EXPECT_LT(d, kTolerance) << what << " position " << p << " top-" << j;
      }
    }
    return worst;
  }

  static Json* golden_;
  static Engine* engine_;
  static std::string* load_error_;
  std::unique_ptr<kv::KvPools> pools_;         // f32 KV
  std::unique_ptr<kv::KvPools> served_pools_;  // the model's KV dtype (bf16)
};

Json* DemoModelTest::golden_ = nullptr;
Engine* DemoModelTest::engine_ = nullptr;
std::string* DemoModelTest::load_error_ = nullptr;

TEST_F(DemoModelTest, CheckpointHasEveryFeatureOfTheFamily) {
  EXPECT_TRUE(FixtureMatches()) << kRegenerate;
  const ModelConfig& c = engine_->config();
  EXPECT_GE(c.num_layers, 8);
  EXPECT_LE(c.num_layers, 12);
  EXPECT_EQ(c.num_swa_layers(), 5 * c.num_full_layers());
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_TRUE(c.swa.sink);
  EXPECT_FALSE(c.full.sink);
  EXPECT_NE(c.full.rope_theta, c.swa.rope_theta);
  EXPECT_LT(c.full.rotary_dim, c.full.head_dim);  // partial RoPE
  EXPECT_EQ(c.full.num_kv_heads, 4);
  EXPECT_EQ(c.swa.num_kv_heads, 8);
  EXPECT_NE(c.full.head_dim, c.full.v_head_dim);
  EXPECT_FALSE(c.moe_layers[0]);
  for (int l = 1; l < c.num_layers; ++l) EXPECT_TRUE(c.moe_layers[l]) << l;
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.num_mtp_layers, 3);
  EXPECT_EQ(c.dtype, kv::DType::kBF16);
  EXPECT_LE(
      std::filesystem::file_size(std::string(kModelDir) + "/model.safetensors"),
      30u * 1000 * 1000);
  // The router e_score_correction_bias was trained (aux-free balance
  // updates), so it is not all zero.
  auto ckpt = Checkpoint::Open(kModelDir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto bias =
      (*ckpt)->ReadF32("model.layers.1.mlp.gate.e_score_correction_bias");
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_TRUE(
      std::any_of(bias->begin(), bias->end(), [](float b) { return b != 0; }));
}

TEST_F(DemoModelTest, TokenizerMatchesTrainer) {
  auto tok = Tokenizer::Load(std::string(kModelDir) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), engine_->config().vocab_size);
  const Json g = Json::parse(ReadFile(kTokGolden));
  size_t n = 0;
  for (const Json& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<uint32_t>>();
    auto ids = (*tok)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, want) << "case " << n << ": " << text.substr(0, 80);
    EXPECT_EQ((*tok)->Decode(*ids), text) << "case " << n;
    ++n;
  }
  EXPECT_GE(n, 8u);
  // The chat template's control tokens and the model's stop ids exist.
  ASSERT_TRUE((*tok)->im_start_id().has_value());
  ASSERT_TRUE((*tok)->im_end_id().has_value());
  const auto& eos = engine_->config().eos_token_ids;
  EXPECT_NE(
      std::find(eos.begin(), eos.end(), static_cast<int>(*(*tok)->im_end_id())),
      eos.end());
  auto chat = EncodeChat(**tok, {{"user", "And God said"}}, {});
  ASSERT_TRUE(chat.ok()) << chat.status();
}

// Whole-sequence prefill, then every MTP layer chained on the hidden states.
TEST_F(DemoModelTest, LogitsMatchReference) {
  ASSERT_TRUE(FixtureMatches()) << kRegenerate;
  const ModelConfig& c = engine_->config();
  const auto tokens = (*golden_)["tokens"].get<std::vector<uint32_t>>();
  const Json& layers = (*golden_)["logits"];
  ASSERT_EQ(layers.size(), static_cast<size_t>(1 + c.num_mtp_layers));
  const int T = static_cast<int>(tokens.size());
  ASSERT_GT(T, 2 * c.sliding_window);
  auto seq = NewSeq();
  ASSERT_TRUE(seq->Append(T).ok());
  ForwardItem item{seq.get(), tokens, 0, true};
  ForwardOutput out;
  ASSERT_TRUE(
      engine_->Forward({&item, 1}, &out, /*keep_all_hidden=*/true).ok());
  const double main = CheckLayer(out.logits, layers[0], "main");
  std::vector<float> hidden = out.all_hidden;
  double worst_mtp = 0;
  for (int k = 0; k < c.num_mtp_layers; ++k) {
    const int n = T - 1 - k;
    ForwardItem mi{seq.get(), absl::MakeConstSpan(tokens).subspan(1 + k, n), 0,
                   true};
    std::vector<float> h(
        hidden.begin(),
        hidden.begin() + static_cast<size_t>(n) * c.hidden_size);
    ForwardOutput mo;
    ASSERT_TRUE(engine_->ForwardMtp(k, {&mi, 1}, h, &mo).ok());
    worst_mtp = std::max(worst_mtp, CheckLayer(mo.logits, layers[1 + k],
                                               absl::StrCat("MTP ", k)));
    hidden = mo.all_hidden;
  }
  std::printf(
      "demo model vs reference: worst relative difference main %.3g, MTP "
      "%.3g\n",
      main, worst_mtp);
}

// Chunked prefill (chunks crossing pages and windows) and then one-token
// decode steps give the same main logits.
TEST_F(DemoModelTest, ChunkedPrefillAndDecodeMatchReference) {
  ASSERT_TRUE(FixtureMatches()) << kRegenerate;
  const auto tokens = (*golden_)["tokens"].get<std::vector<uint32_t>>();
  const int T = static_cast<int>(tokens.size());
  const std::vector<int> chunks = {37, 100, 1, 64};
  auto seq = NewSeq();
  std::vector<float> rows;
  int pos = 0;
  for (size_t ci = 0; pos < T - 20; ++ci) {
    const int n = std::min(chunks[ci % chunks.size()], T - 20 - pos);
    ASSERT_TRUE(seq->Append(n).ok());
    ForwardItem item{seq.get(), absl::MakeConstSpan(tokens).subspan(pos, n),
                     pos, true};
    ForwardOutput out;
    ASSERT_TRUE(engine_->Forward({&item, 1}, &out).ok());
    rows.insert(rows.end(), out.logits.begin(), out.logits.end());
    pos += n;
  }
  for (; pos < T; ++pos) {  // decode steps
    ASSERT_TRUE(seq->Append(1).ok());
    ForwardItem item{seq.get(), absl::MakeConstSpan(tokens).subspan(pos, 1),
                     pos, false};
    ForwardOutput out;
    ASSERT_TRUE(engine_->Forward({&item, 1}, &out).ok());
    rows.insert(rows.end(), out.logits.begin(), out.logits.end());
  }
  CheckLayer(rows, (*golden_)["logits"][0], "chunked + decode");
}

// The served model is the trained one: the engine's mean next-token loss on
// the held-out slice equals the training script's within 1%.
TEST_F(DemoModelTest, HeldOutLossMatchesTrainingScript) {
  ASSERT_TRUE(FixtureMatches()) << kRegenerate;
  const Json& s = (*golden_)["valid_slice"];
  const int chunk = s["chunk_tokens"].get<int>();
  const auto tokens = s["tokens"].get<std::vector<uint32_t>>();
  const double want = s["train_script_loss"].get<double>();
  const int V = engine_->config().vocab_size;
  for (bool served_kv : {false, true}) {
    double total = 0;
    int64_t count = 0;
    for (size_t off = 0; off + chunk <= tokens.size(); off += chunk) {
      auto seq = NewSeq(served_kv);
      ASSERT_TRUE(seq->Append(chunk).ok());
      ForwardItem item{
          seq.get(), absl::MakeConstSpan(tokens).subspan(off, chunk), 0, true};
      ForwardOutput out;
      ASSERT_TRUE(engine_->Forward({&item, 1}, &out).ok());
      for (int p = 0; p + 1 < chunk; ++p) {
        const float* r = out.logits.data() + static_cast<size_t>(p) * V;
        const double m = *std::max_element(r, r + V);
        double z = 0;
        for (int v = 0; v < V; ++v)
          z += std::exp(static_cast<double>(r[v]) - m);
        total += m + std::log(z) - r[tokens[off + p + 1]];
        ++count;
      }
    }
    ASSERT_GT(count, 0);
    const double loss = total / count;
    std::printf(
        "held-out loss over %lld tokens (%s KV): engine %.6f, training script "
        "%.6f "
        "(whole split %.4f)\n",
        static_cast<long long>(count), served_kv ? "served bf16" : "f32", loss,
        want, s["whole_valid_loss"].get<double>());
    EXPECT_NEAR(loss, want, kLossTolerance * want)
        << (served_kv ? "served KV" : "f32 KV");
  }
}

// Greedy decoding over paged KV (prefill, then one token per step) gives the
// reference's continuation of a held-out prompt.
TEST_F(DemoModelTest, GreedyContinuationMatchesReference) {
  ASSERT_TRUE(FixtureMatches()) << kRegenerate;
  const auto prompt =
      (*golden_)["greedy"]["prompt"].get<std::vector<uint32_t>>();
  const auto want =
      (*golden_)["greedy"]["generated"].get<std::vector<uint32_t>>();
  auto seq = NewSeq();
  ASSERT_TRUE(seq->Append(static_cast<int>(prompt.size())).ok());
  ForwardItem item{seq.get(), prompt, 0, false};
  ForwardOutput out;
  ASSERT_TRUE(engine_->Forward({&item, 1}, &out).ok());
  std::vector<uint32_t> gen{Argmax(out.logits)};
  while (gen.size() < want.size()) {
    ASSERT_TRUE(seq->Append(1).ok());
    ForwardItem step{seq.get(), absl::MakeConstSpan(&gen.back(), 1),
                     seq->length() - 1, false};
    ASSERT_TRUE(engine_->Forward({&step, 1}, &out).ok());
    gen.push_back(Argmax(out.logits));
  }
  EXPECT_EQ(gen, want);
  auto tok = Tokenizer::Load(std::string(kModelDir) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  std::printf("prompt: %s\ngreedy: %s\n", (*tok)->Decode(prompt).c_str(),
              (*tok)->Decode(gen).c_str());
}

}  // namespace
}  // namespace swaserve::model
