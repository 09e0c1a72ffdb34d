#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/model/checkpoint.h"
#include "lib/model/config.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class RandomCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::path(::testing::TempDir()) /
        absl::StrCat("random_checkpoint_test_", info->name(), "_", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(BuiltinConfig, Tiny) {
  absl::StatusOr<ModelConfig> c = BuiltinConfig("tiny", 512);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_layers, 6);
  EXPECT_EQ(c->num_full_layers(), 2);
  EXPECT_EQ(c->num_swa_layers(), 4);
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(c->full.num_heads, 4);
  EXPECT_EQ(c->full.num_kv_heads, 2);
  EXPECT_EQ(c->full.head_dim, 16);
  EXPECT_EQ(c->full.v_head_dim, 8);
  EXPECT_FALSE(c->full.sink);
  EXPECT_EQ(c->swa.num_heads, 4);
  EXPECT_EQ(c->swa.num_kv_heads, 4);  // differs from full on purpose
  EXPECT_TRUE(c->swa.sink);
  EXPECT_EQ(c->full.rotary_dim, 8);
  EXPECT_EQ(c->swa.rotary_dim, 8);
  EXPECT_NE(c->full.rope_theta, c->swa.rope_theta);
  EXPECT_DOUBLE_EQ(c->attention_value_scale, 0.707);
  EXPECT_EQ(c->moe_layers,
            (std::vector<bool>{false, true, true, true, true, true}));
  EXPECT_EQ(c->n_routed_experts, 4);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 32);
  EXPECT_EQ(c->intermediate_size, 96);
  EXPECT_EQ(c->num_mtp_layers, 2);
  EXPECT_EQ(c->dtype, kv::DType::kF32);
  EXPECT_TRUE(c->eos_token_ids.empty());
  kv::KvShape s = c->KvShape();
  EXPECT_EQ(s.full_layers, 2);
  EXPECT_EQ(s.swa_layers, 4 + 2);
  EXPECT_EQ(s.full_kv_heads, 2);
  EXPECT_EQ(s.swa_kv_heads, 4);
  EXPECT_TRUE(s.Validate().ok());
  // It round-trips through config.json.
  absl::StatusOr<ModelConfig> back = ModelConfig::FromJson(c->ToJson(), "tiny");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *c);
}

TEST(BuiltinConfig, MiMoProMini) {
  absl::StatusOr<ModelConfig> c = BuiltinConfig("mimo-v2.5-pro-mini", 151669);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers, 70);
  EXPECT_EQ(c->num_full_layers(), 10);
  EXPECT_EQ(c->num_swa_layers(), 60);
  for (int l = 0; l < 70; ++l) {
    EXPECT_EQ(c->layer_types[l] == AttentionType::kFull, l % 7 == 0) << l;
  }
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_EQ(c->full.num_kv_heads, 8);
  EXPECT_EQ(c->swa.num_kv_heads, 8);
  EXPECT_EQ(c->full.head_dim, 192);
  EXPECT_EQ(c->full.v_head_dim, 128);
  EXPECT_EQ(c->full.rotary_dim, 64);
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->full.num_heads, 16);
  EXPECT_EQ(c->n_routed_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->num_mtp_layers, 1);
  EXPECT_EQ(c->dtype, kv::DType::kBF16);
  EXPECT_EQ(c->vocab_size, 151669);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{151645, 151643}));
  // Same KV geometry as the real MiMo-V2.5-Pro, plus its MTP layer.
  kv::KvShape want = kv::KvShape::MiMoV25Pro();
  kv::KvShape got = c->KvShape();
  EXPECT_EQ(got.full_layers, want.full_layers);
  EXPECT_EQ(got.swa_layers, want.swa_layers + 1);
  EXPECT_EQ(got.Full().TokenLayerBytes(), want.Full().TokenLayerBytes());
  EXPECT_EQ(got.Swa().TokenLayerBytes(), want.Swa().TokenLayerBytes());
  EXPECT_EQ(got.sliding_window, want.sliding_window);
  EXPECT_EQ(got.dtype, want.dtype);
}

TEST(BuiltinConfig, Errors) {
  absl::StatusOr<ModelConfig> unknown = BuiltinConfig("huge", 512);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("tiny"));
  absl::StatusOr<ModelConfig> no_vocab = BuiltinConfig("tiny", 0);
  ASSERT_FALSE(no_vocab.ok());
  EXPECT_THAT(std::string(no_vocab.status().message()),
              HasSubstr("vocab_size"));
}

TEST_F(RandomCheckpointTest, DeterministicAndSeedDependent) {
  absl::StatusOr<ModelConfig> c = BuiltinConfig("tiny", 512);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(WriteRandomCheckpoint(*c, 1, (dir_ / "a").string()).ok());
  ASSERT_TRUE(WriteRandomCheckpoint(*c, 1, (dir_ / "b").string()).ok());
  ASSERT_TRUE(WriteRandomCheckpoint(*c, 2, (dir_ / "c").string()).ok());
  const std::string a = ReadAll(dir_ / "a" / "model.safetensors");
  const std::string b = ReadAll(dir_ / "b" / "model.safetensors");
  const std::string other = ReadAll(dir_ / "c" / "model.safetensors");
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b);
  EXPECT_EQ(a.size(), other.size());
  EXPECT_FALSE(a == other);
  EXPECT_EQ(ReadAll(dir_ / "a" / "config.json"),
            ReadAll(dir_ / "c" / "config.json"));
  EXPECT_FALSE(fs::exists(dir_ / "a" / "tokenizer.json"));
}

TEST_F(RandomCheckpointTest, PinnedValues) {
  // The PyTorch golden logits of tools/reference/ are made from these bytes:
  // a change of the generator must be deliberate.
  absl::StatusOr<ModelConfig> c = BuiltinConfig("tiny", 512);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(WriteRandomCheckpoint(*c, 1, dir_.string()).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  absl::StatusOr<std::vector<float>> norm = (*ck)->ReadF32("model.norm.weight");
  absl::StatusOr<std::vector<float>> q =
      (*ck)->ReadF32("model.layers.0.self_attn.q_proj.weight");
  ASSERT_TRUE(norm.ok() && q.ok());
  // Checked against an independent Python implementation of the generator
  // (mt19937_64 + SplitMix64 + FNV-1a + Box-Muller).
  const float want_norm[] = {0.98706549f, 0.98477745f, 1.02953994f,
                             1.07455027f};
  const float want_q[] = {-0.12714034f, 0.02712998f, 0.09778742f, -0.05035237f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR((*norm)[i], want_norm[i], 1e-6) << i;
    EXPECT_NEAR((*q)[i], want_q[i], 1e-6) << i;
  }
}

// Mean and standard deviation of a tensor.
std::pair<double, double> Moments(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += static_cast<double>(x) * x;
  }
  const double mean = s / v.size();
  return {mean, std::sqrt(s2 / v.size() - mean * mean)};
}

TEST_F(RandomCheckpointTest, TinyOpensWithSensibleScales) {
  absl::StatusOr<ModelConfig> c = BuiltinConfig("tiny", 512);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<uint64_t> progress;
  ASSERT_TRUE(WriteRandomCheckpoint(*c, 7, dir_.string(), "",
                                    [&](uint64_t done, uint64_t total) {
                                      progress.push_back(done);
                                      EXPECT_LE(done, total);
                                    })
                  .ok());
  ASSERT_FALSE(progress.empty());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_TRUE((*ck)->config() == *c);
  const ParamCounts params = CountParams(*c);
  EXPECT_EQ(fs::file_size(dir_ / "model.safetensors") % 8, 0u);
  EXPECT_GE(fs::file_size(dir_ / "model.safetensors"),
            static_cast<uintmax_t>(params.total) * 4);
  EXPECT_EQ(progress.back(), static_cast<uint64_t>(params.total) * 4);

  struct Want {
    std::string name;
    double mean, std, tol;
  };
  const std::vector<Want> wants = {
      {"model.embed_tokens.weight", 0, 1, 0.03},
      {"lm_head.weight", 0, 1 / 8.0, 0.01},  // fan_in 64
      {"model.layers.0.mlp.down_proj.weight", 0, 1 / std::sqrt(96.0), 0.01},
      {"model.layers.1.mlp.experts.3.down_proj.weight", 0, 1 / std::sqrt(32.0),
       0.02},
      {"model.mtp.layers.1.eh_proj.weight", 0, 1 / std::sqrt(128.0), 0.01},
      {"model.layers.2.input_layernorm.weight", 1, 0.05, 0.03},
  };
  for (const Want& w : wants) {
    absl::StatusOr<std::vector<float>> v = (*ck)->ReadF32(w.name);
    ASSERT_TRUE(v.ok()) << v.status();
    auto [mean, std] = Moments(*v);
    EXPECT_NEAR(mean, w.mean, w.tol) << w.name;
    EXPECT_NEAR(std, w.std, w.tol) << w.name;
  }
  absl::StatusOr<std::vector<float>> sink =
      (*ck)->ReadF32("model.layers.1.self_attn.attention_sink_bias", {4});
  ASSERT_TRUE(sink.ok()) << sink.status();
  for (float x : *sink) EXPECT_LT(std::fabs(x), 3.0f);
  absl::StatusOr<std::vector<float>> bias =
      (*ck)->ReadF32("model.layers.1.mlp.gate.e_score_correction_bias", {4});
  ASSERT_TRUE(bias.ok()) << bias.status();
  for (float x : *bias) EXPECT_LT(std::fabs(x), 0.3f);
  // Different tensors get different streams.
  absl::StatusOr<std::vector<float>> up =
      (*ck)->ReadF32("model.layers.0.mlp.up_proj.weight");
  absl::StatusOr<std::vector<float>> gate =
      (*ck)->ReadF32("model.layers.0.mlp.gate_proj.weight");
  ASSERT_TRUE(up.ok() && gate.ok());
  EXPECT_NE(*up, *gate);
}

TEST_F(RandomCheckpointTest, OtherDTypes) {
  for (kv::DType d : {kv::DType::kBF16, kv::DType::kF16}) {
    absl::StatusOr<ModelConfig> c = BuiltinConfig("tiny", 256);
    ASSERT_TRUE(c.ok()) << c.status();
    c->dtype = d;
    const fs::path dir = dir_ / std::string(kv::DTypeName(d));
    ASSERT_TRUE(WriteRandomCheckpoint(*c, 3, dir.string()).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
        Checkpoint::Open(dir.string());
    ASSERT_TRUE(ck.ok()) << ck.status();
    EXPECT_EQ((*ck)->config().dtype, d);
    const TensorInfo* t = (*ck)->Find("lm_head.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, ToTensorDType(d));
    absl::StatusOr<std::vector<float>> v = (*ck)->ReadF32("lm_head.weight");
    ASSERT_TRUE(v.ok());
    auto [mean, std] = Moments(*v);
    EXPECT_NEAR(std, 1 / 8.0, 0.01);
  }
}

TEST_F(RandomCheckpointTest, MiMoProMiniOpens) {
  absl::StatusOr<ModelConfig> c = BuiltinConfig("mimo-v2.5-pro-mini", 512);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(WriteRandomCheckpoint(*c, 1, dir_.string()).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ((*ck)->config().num_layers, 70);
  const TensorInfo* t = (*ck)->Find("model.layers.69.self_attn.q_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, TensorDType::kBF16);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{16 * 192, 256}));
  EXPECT_NE((*ck)->Find("model.layers.7.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ((*ck)->Find("model.layers.7.self_attn.attention_sink_bias"),
            nullptr);
  EXPECT_NE((*ck)->Find("model.layers.8.self_attn.attention_sink_bias"),
            nullptr);
  EXPECT_NE((*ck)->Find("model.mtp.layers.0.self_attn.attention_sink_bias"),
            nullptr);
  EXPECT_GE(fs::file_size(dir_ / "model.safetensors"),
            static_cast<uintmax_t>(CountParams(*c).total) * 2);
}

TEST_F(RandomCheckpointTest, CopiesTokenizer) {
  const fs::path tok_dir = dir_ / "tok";
  fs::create_directories(tok_dir);
  std::ofstream(tok_dir / "tokenizer.json") << R"({"model": {"type": "BPE"}})";
  std::ofstream(tok_dir / "tokenizer_config.json")
      << R"({"chat_template": "x"})";
  absl::StatusOr<ModelConfig> c = BuiltinConfig("tiny", 64);
  ASSERT_TRUE(c.ok()) << c.status();
  const fs::path out = dir_ / "out";
  ASSERT_TRUE(WriteRandomCheckpoint(*c, 1, out.string(),
                                    (tok_dir / "tokenizer.json").string())
                  .ok());
  EXPECT_EQ(ReadAll(out / "tokenizer.json"), R"({"model": {"type": "BPE"}})");
  EXPECT_EQ(ReadAll(out / "tokenizer_config.json"),
            R"({"chat_template": "x"})");
  EXPECT_TRUE(Checkpoint::Open(out.string()).ok());

  absl::Status missing = WriteRandomCheckpoint(*c, 1, (dir_ / "out2").string(),
                                               (dir_ / "nope.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("nope.json"));
  EXPECT_FALSE(fs::exists(dir_ / "out2"));
}

TEST_F(RandomCheckpointTest, RejectsInvalidConfig) {
  absl::StatusOr<ModelConfig> c = BuiltinConfig("tiny", 64);
  ASSERT_TRUE(c.ok()) << c.status();
  c->sliding_window = 0;
  absl::Status s = WriteRandomCheckpoint(*c, 1, dir_.string());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("sliding_window"));
}

}  // namespace
}  // namespace swaserve::model
