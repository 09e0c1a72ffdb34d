// Weights kept as stored (lib/model/weights.cc, packed_weight.cc): FP8
// block-scaled checkpoints load and compute exactly what their BF16 and F32
// twins holding the same weights compute; ignored_layers is honoured; memory
// follows the stored bytes; malformed quantization is a clear error.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/model/checkpoint.h"
#include "lib/model/forward.h"
#include "tests/unit/model/golden_util.h"

namespace swaserve::model {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

ModelConfig Tiny(kv::DType dtype, int block_out = 0, int block_in = 0,
                 std::vector<std::string> ignored = {}) {
  ModelConfig c = *BuiltinConfig("tiny", 256);
  c.dtype = dtype;
  if (block_out > 0) {
    c.quant.fp8 = true;
    c.quant.block_out = block_out;
    c.quant.block_in = block_in;
    c.quant.ignored_layers = std::move(ignored);
  }
  return c;
}

ModelConfig Fused(ModelConfig c) {
  c.qkv_layout = QkvLayout::kFused;
  return c;
}

std::string Write(const std::string& root, const std::string& name,
                  const ModelConfig& c, int grid_out, int grid_in,
                  bool fused_grid = false) {
  const std::string dir = root + "/" + name;
  RandomCheckpointOptions o;
  o.fp8_grid_block_out = grid_out;
  o.fp8_grid_block_in = grid_in;
  o.fused_qkv_grid = fused_grid;
  const absl::Status s = WriteRandomCheckpoint(c, 11, dir, o);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

using testing_util::ModelRun;

ModelRun RunModel(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create({dir, 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return ModelRun();
  std::mt19937 rng(3);
  std::vector<uint32_t> tokens(21);
  for (uint32_t& t : tokens) t = rng() % 256;
  return testing_util::RunPrompt(**engine, tokens, (*engine)->config().dtype, 6);
}

void ExpectSame(const ModelRun& a, const ModelRun& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4), 0) << what;
  ASSERT_EQ(a.mtp_logits.size(), b.mtp_logits.size()) << what;
  EXPECT_EQ(std::memcmp(a.mtp_logits.data(), b.mtp_logits.data(), a.mtp_logits.size() * 4), 0)
      << what;
  EXPECT_EQ(a.greedy, b.greedy) << what;
}

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = *base::MakeTempDir("weights-test"); }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(WeightsTest, Fp8ComputesExactlyWhatItsBf16AndF32TwinsCompute) {
  // 128 x 128 (one block per small matrix) and 24 x 40 (partial edge blocks
  // in both dimensions: 64 % 40, 96 % 24 ...).
  for (auto [bo, bi] : std::vector<std::pair<int, int>>{{128, 128}, {24, 40}}) {
    const std::string tag = absl::StrCat(bo, "x", bi);
    // The unquantized tensors (embeddings, norms, router) are in
    // torch_dtype: BF16 for one FP8 checkpoint, F32 for the other.
    const ModelRun fp8 = RunModel(Write(root_, "fp8-" + tag, Tiny(kv::DType::kBF16, bo, bi), 0, 0));
    const ModelRun fp8_f32 =
        RunModel(Write(root_, "fp8-f32-" + tag, Tiny(kv::DType::kF32, bo, bi), 0, 0));
    const ModelRun bf16 = RunModel(Write(root_, "bf16-" + tag, Tiny(kv::DType::kBF16), bo, bi));
    const ModelRun f32 = RunModel(Write(root_, "f32-" + tag, Tiny(kv::DType::kF32), bo, bi));
    ASSERT_FALSE(fp8.logits.empty());
    ExpectSame(fp8, bf16, "fp8 vs bf16 " + tag);
    ExpectSame(fp8_f32, f32, "fp8 (f32 rest) vs f32 " + tag);
    // The grid matters: the plain BF16 weights differ.
    const ModelRun plain = RunModel(Write(root_, "plain-" + tag, Tiny(kv::DType::kBF16), 0, 0));
    EXPECT_NE(std::memcmp(plain.logits.data(), fp8.logits.data(), fp8.logits.size() * 4), 0);
  }
}

TEST_F(WeightsTest, IgnoredLayersStayUnquantized) {
  const ModelConfig c = Tiny(kv::DType::kBF16, 32, 32,
                             {"model.layers.0.self_attn.q_proj", "model.mtp",
                              "model.layers.2.mlp.experts.1"});
  const std::string dir = Write(root_, "ignored", c, 32, 32);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->Find("model.layers.0.self_attn.q_proj.weight")->dtype, TensorDType::kBF16);
  EXPECT_EQ((*ck)->Find("model.layers.0.self_attn.q_proj.weight_scale_inv"), nullptr);
  EXPECT_EQ((*ck)->Find("model.layers.0.self_attn.k_proj.weight")->dtype, TensorDType::kF8E4M3);
  EXPECT_EQ((*ck)->Find("model.mtp.layers.0.eh_proj.weight")->dtype, TensorDType::kBF16);
  EXPECT_EQ((*ck)->Find("model.layers.2.mlp.experts.1.up_proj.weight")->dtype, TensorDType::kBF16);
  EXPECT_EQ((*ck)->Find("model.layers.2.mlp.experts.0.up_proj.weight")->dtype,
            TensorDType::kF8E4M3);
  EXPECT_EQ((*ck)->Find("model.layers.2.mlp.gate.weight")->dtype, TensorDType::kBF16);
  EXPECT_EQ((*ck)->Find("lm_head.weight")->dtype, TensorDType::kBF16);
  ExpectSame(RunModel(dir), RunModel(Write(root_, "twin", Tiny(kv::DType::kBF16), 32, 32)),
             "ignored layers vs bf16 twin");
}

TEST_F(WeightsTest, MemoryFollowsTheStoredBytes) {
  // Wider than tiny so that the 32-column padding of narrow formats is
  // small: every projection at least 128 wide.
  ModelConfig base = Tiny(kv::DType::kF32);
  base.hidden_size = 256;
  base.full.num_heads = base.swa.num_heads = 8;
  base.full.num_kv_heads = 4;
  base.swa.num_kv_heads = 8;
  base.full.head_dim = base.swa.head_dim = 32;
  base.full.v_head_dim = base.swa.v_head_dim = 32;
  base.full.rotary_dim = base.swa.rotary_dim = 16;
  base.intermediate_size = 256;
  base.moe_intermediate_size = 128;
  ASSERT_TRUE(base.Validate().ok()) << base.Validate();
  size_t bytes[3];
  double ratio[3];
  const kv::DType dtypes[3] = {kv::DType::kF32, kv::DType::kBF16, kv::DType::kBF16};
  for (int i = 0; i < 3; ++i) {
    ModelConfig c = base;
    c.dtype = dtypes[i];
    if (i == 2) {
      c.quant.fp8 = true;
      c.quant.block_out = c.quant.block_in = 128;
    }
    const std::string dir = Write(root_, absl::StrCat("mem", i), c, 0, 0);
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create({dir, 1});
    ASSERT_TRUE(e.ok()) << e.status();
    bytes[i] = (*e)->WeightBytes();
    ratio[i] = static_cast<double>(bytes[i]) / fs::file_size(dir + "/model.safetensors");
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(ratio[i], 0.97) << i;
    EXPECT_LT(ratio[i], 1.10) << i << ": " << bytes[i];
  }
  EXPECT_LT(bytes[1], bytes[0] * 0.55);
  EXPECT_LT(bytes[2], bytes[1] * 0.75);
}

// Rewrites checkpoint `from` into `to`, passing each tensor through `edit`
// (return false to drop it; it may change the dtype, shape and bytes), and
// config.json through `edit_config`.
using TensorEdit = std::function<bool(const std::string& name, TensorDType* dtype,
                                      std::vector<int64_t>* shape, std::string* data)>;
void Rewrite(const std::string& from, const std::string& to, const TensorEdit& edit,
             const std::function<void(nlohmann::json&)>& edit_config = nullptr) {
  fs::create_directories(to);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(from + "/config.json"));
  if (edit_config) edit_config(config);
  std::ofstream(to + "/config.json") << config.dump();
  auto file = *SafetensorsFile::Open(from + "/model.safetensors");
  SafetensorsWriter w;
  for (const TensorInfo& t : file->tensors()) {
    TensorDType dtype = t.dtype;
    std::vector<int64_t> shape = t.shape;
    std::string data(reinterpret_cast<const char*>(t.data), t.end - t.begin);
    if (!edit(t.name, &dtype, &shape, &data)) continue;
    ASSERT_TRUE(w.Add(t.name, dtype, shape, data).ok()) << t.name;
  }
  ASSERT_TRUE(w.Write(to + "/model.safetensors").ok());
}

std::string OpenError(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck = Checkpoint::Open(dir);
  EXPECT_FALSE(ck.ok()) << dir << " opened";
  return ck.ok() ? "" : std::string(ck.status().message());
}

TEST_F(WeightsTest, MalformedQuantizationIsAClearError) {
  const std::string good = Write(root_, "good", Tiny(kv::DType::kBF16, 32, 32), 0, 0);
  ASSERT_TRUE(Checkpoint::Open(good).ok());
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  const std::string qs = q + "_scale_inv";
  // Missing scales.
  Rewrite(good, root_ + "/no-scale", [&](const std::string& n, auto*, auto*, auto*) {
    return n != qs;
  });
  EXPECT_THAT(OpenError(root_ + "/no-scale"), HasSubstr("missing tensor \"" + qs + "\" [2, 2]"));
  // Wrong scale shape.
  Rewrite(good, root_ + "/bad-scale", [&](const std::string& n, auto*, auto* shape, auto* data) {
    if (n == qs) {
      *shape = {2, 1};
      data->resize(8);
    }
    return true;
  });
  EXPECT_THAT(OpenError(root_ + "/bad-scale"),
              HasSubstr("\"" + qs + "\" in " + root_ + "/bad-scale/model.safetensors has shape "
                        "[2, 1], expected [2, 2]"));
  // Scales not F32.
  Rewrite(good, root_ + "/bf16-scale", [&](const std::string& n, auto* dtype, auto*, auto* data) {
    if (n == qs) {
      *dtype = TensorDType::kBF16;
      data->resize(data->size() / 2);
    }
    return true;
  });
  EXPECT_THAT(OpenError(root_ + "/bf16-scale"), HasSubstr("FP8 block scales must be F32"));
  // A quantized projection stored BF16 (and its scale dropped).
  Rewrite(good, root_ + "/bf16-proj", [&](const std::string& n, auto* dtype, auto*, auto* data) {
    if (n == qs) return false;
    if (n == q) {
      *dtype = TensorDType::kBF16;
      data->resize(data->size() * 2);
    }
    return true;
  });
  EXPECT_THAT(OpenError(root_ + "/bf16-proj"),
              HasSubstr("is BF16, but quantization_config makes it F8_E4M3"));
  // FP8 tensors without a quantization_config.
  Rewrite(good, root_ + "/no-config", [](auto&, auto*, auto*, auto*) { return true; },
          [](nlohmann::json& j) { j.erase("quantization_config"); });
  EXPECT_THAT(OpenError(root_ + "/no-config"), HasSubstr("has no FP8 quantization_config"));
  // An FP8 tensor in a module ignored_layers lists.
  Rewrite(good, root_ + "/ignored-fp8", [](auto&, auto*, auto*, auto*) { return true; },
          [&](nlohmann::json& j) {
            j["quantization_config"]["ignored_layers"] = {"model.layers.1.self_attn.q_proj"};
          });
  EXPECT_THAT(OpenError(root_ + "/ignored-fp8"), HasSubstr("ignored_layers lists its module"));
  // Unknown quant_method.
  Rewrite(good, root_ + "/awq", [](auto&, auto*, auto*, auto*) { return true; },
          [&](nlohmann::json& j) { j["quantization_config"]["quant_method"] = "awq"; });
  EXPECT_THAT(OpenError(root_ + "/awq"), HasSubstr("'quantization_config.quant_method'"));
  // A NaN weight.
  Rewrite(good, root_ + "/nan", [&](const std::string& n, auto*, auto*, auto* data) {
    if (n == q) (*data)[3] = 0x7F;
    return true;
  });
  ASSERT_TRUE(Checkpoint::Open(root_ + "/nan").ok());
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create({root_ + "/nan", 1});
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(std::string(e.status().message()), HasSubstr(q));
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("NaN"));
}

TEST_F(WeightsTest, FusedQkvComputesWhatTheSplitLayoutComputes) {
  // BF16: the fused tensor holds the split tensors' rows group by group.
  ExpectSame(RunModel(Write(root_, "fused", Fused(Tiny(kv::DType::kBF16)), 0, 0)),
             RunModel(Write(root_, "split", Tiny(kv::DType::kBF16), 0, 0)), "fused vs split");
  // FP8: scale blocks per group (the published layout); the split twin holds
  // the same dequantized weights. 24 x 40 blocks: groups of 32 + 16 + 8 = 56
  // (full) and 32 + 32 + 16 = 80 rows (SWA) are not whole blocks, so parts
  // start inside blocks and groups are padded.
  for (auto [bo, bi] : std::vector<std::pair<int, int>>{{128, 128}, {24, 40}}) {
    const std::string tag = absl::StrCat(bo, "x", bi);
    const std::string fp8 =
        Write(root_, "fused-fp8-" + tag, Fused(Tiny(kv::DType::kBF16, bo, bi)), 0, 0);
    absl::StatusOr<std::unique_ptr<Checkpoint>> ck = Checkpoint::Open(fp8);
    ASSERT_TRUE(ck.ok()) << ck.status();
    const TensorInfo* s = (*ck)->Find("model.layers.0.self_attn.qkv_proj.weight_scale_inv");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->shape[0], 2 * ((56 + bo - 1) / bo)) << tag;  // 2 groups, padded each
    ExpectSame(RunModel(fp8),
               RunModel(Write(root_, "split-twin-" + tag, Tiny(kv::DType::kBF16), bo, bi, true)),
               "fused fp8 vs split twin " + tag);
  }
}

TEST_F(WeightsTest, FusedQkvLayoutMismatchesAreErrors) {
  const std::string good = Write(root_, "good", Fused(Tiny(kv::DType::kBF16, 24, 40)), 0, 0);
  const std::string qkv = "model.layers.0.self_attn.qkv_proj.weight";
  // The scales of one unpadded grid (ceil(112 / 24) = 5 rows, not 2 x 3).
  Rewrite(good, root_ + "/flat-scale", [&](const std::string& n, auto*, auto* shape, auto* data) {
    if (n == qkv + "_scale_inv") {
      (*shape)[0] = 5;
      data->resize(5 * (*shape)[1] * 4);
    }
    return true;
  });
  EXPECT_THAT(OpenError(root_ + "/flat-scale"), HasSubstr("has shape [5, 2], expected [6, 2]"));
  // A split tensor in a fused checkpoint is unexpected (named); encoder
  // tensors are skipped.
  Rewrite(good, root_ + "/stray2", [&](const std::string& n, auto*, auto*, auto*) { return true; });
  auto file = *SafetensorsFile::Open(root_ + "/stray2/model.safetensors");
  SafetensorsWriter w;
  for (const TensorInfo& t : file->tensors()) {
    ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape,
                      std::string(reinterpret_cast<const char*>(t.data), t.end - t.begin))
                    .ok());
  }
  ASSERT_TRUE(w.Add("model.layers.0.self_attn.q_proj.weight", TensorDType::kF32, {1},
                    std::string(4, '\0'))
                  .ok());
  ASSERT_TRUE(w.Add("visual.blocks.0.attn.qkv.weight", TensorDType::kF32, {2},
                    std::string(8, '\0'))
                  .ok());
  ASSERT_TRUE(w.Add("model.audio_encoder.layers.0.fc1.weight", TensorDType::kF32, {2},
                    std::string(8, '\0'))
                  .ok());
  file.reset();
  ASSERT_TRUE(w.Write(root_ + "/stray2/model.safetensors").ok());
  const std::string err = OpenError(root_ + "/stray2");
  EXPECT_THAT(err, HasSubstr("unexpected tensor \"model.layers.0.self_attn.q_proj.weight\""));
  EXPECT_THAT(err, Not(HasSubstr("visual.")));
  EXPECT_THAT(err, Not(HasSubstr("audio_encoder")));
}

TEST_F(WeightsTest, MtpLayerCountComesFromTheTensorsWhenTheConfigOmitsIt) {
  const std::string good = Write(root_, "with-count", Tiny(kv::DType::kBF16), 0, 0);
  Rewrite(good, root_ + "/no-count", [](auto&, auto*, auto*, auto*) { return true; },
          [](nlohmann::json& j) { j.erase("num_nextn_predict_layers"); });
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create({root_ + "/no-count", 1});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->config().num_mtp_layers, 2);
  EXPECT_TRUE((*e)->config().mtp_layers_derived);
  ExpectSame(RunModel(root_ + "/no-count"), RunModel(good), "derived MTP count");
}

TEST_F(WeightsTest, EncoderTensorsAreSkippedByRule) {
  EXPECT_TRUE(IsSkippedTensor("visual.blocks.0.attn.qkv.weight"));
  EXPECT_TRUE(IsSkippedTensor("model.visual.patch_embed.proj.weight"));
  EXPECT_TRUE(IsSkippedTensor("audio_tower.layers.1.fc2.weight"));
  EXPECT_FALSE(IsSkippedTensor("model.layers.0.visual.weight"));
  EXPECT_FALSE(IsSkippedTensor("visualizer.weight"));
  const std::string good = Write(root_, "text", Tiny(kv::DType::kBF16), 0, 0);
  Rewrite(good, root_ + "/with-vision", [](auto&, auto*, auto*, auto*) { return true; });
  auto file = *SafetensorsFile::Open(root_ + "/with-vision/model.safetensors");
  SafetensorsWriter w;
  for (const TensorInfo& t : file->tensors()) {
    // transformers' name for the sinks, too.
    std::string name = t.name;
    const std::string sink = ".self_attn.attention_sink_bias";
    if (name.size() > sink.size() && name.compare(name.size() - sink.size(), sink.size(), sink) == 0) {
      name = name.substr(0, name.size() - sink.size()) + ".self_attn.sinks";
    }
    ASSERT_TRUE(w.Add(name, t.dtype, t.shape,
                      std::string(reinterpret_cast<const char*>(t.data), t.end - t.begin))
                    .ok());
  }
  ASSERT_TRUE(w.Add("visual.blocks.0.attn.qkv.weight", TensorDType::kF32, {2},
                    std::string(8, '\0'))
                  .ok());
  file.reset();
  ASSERT_TRUE(w.Write(root_ + "/with-vision/model.safetensors").ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck = Checkpoint::Open(root_ + "/with-vision");
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->skipped_tensors(), std::vector<std::string>{"visual.blocks.0.attn.qkv.weight"});
  ExpectSame(RunModel(root_ + "/with-vision"), RunModel(good), "sinks alias + skipped encoder");
}

}  // namespace
}  // namespace swaserve::model
