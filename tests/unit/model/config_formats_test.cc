// The config.json formats beyond the plain hub fields (lib/model/config.h):
// transformers-native configs, fields rejected by name, FP8
// quantization_config, and the MTP layer count derived from tensor names.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/model/config.h"

namespace swaserve::model {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// A scaled-down MiMo-V2-Flash hub config (6 layers: full at 0 and 5).
Json Hub() {
  return Json::parse(R"({
    "architectures": ["MiMoV2FlashForCausalLM"],
    "model_type": "mimo_v2_flash",
    "vocab_size": 500, "hidden_size": 64, "num_hidden_layers": 6,
    "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0],
    "sliding_window": 16, "attention_chunk_size": 16,
    "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 24, "v_head_dim": 16,
    "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
    "swa_head_dim": 24, "swa_v_head_dim": 16,
    "rope_theta": 5000000, "swa_rope_theta": 10000,
    "partial_rotary_factor": 0.334,
    "add_swa_attention_sink_bias": true,
    "add_full_attention_sink_bias": false,
    "attention_value_scale": 0.707,
    "moe_layer_freq": [0, 1, 1, 1, 1, 1],
    "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "intermediate_size": 96,
    "n_shared_experts": null, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
    "norm_topk_prob": true, "routed_scaling_factor": null,
    "num_nextn_predict_layers": 2, "layernorm_epsilon": 1e-5,
    "torch_dtype": "bfloat16", "tie_word_embeddings": false,
    "attention_bias": false, "hidden_act": "silu",
    "max_position_embeddings": 4096, "eos_token_id": 499,
    "use_cache": true, "transformers_version": "4.57.0"
  })");
}

// What transformers' convert_mimo_v2_flash_weights_to_hf.py writes for
// Hub(): hub-only keys dropped, lists renamed, RoPE per layer type.
Json Native() {
  Json j = Hub();
  for (const char* k :
       {"attention_chunk_size", "n_shared_experts", "scoring_func",
        "topk_method", "swa_num_attention_heads", "swa_num_key_value_heads",
        "swa_head_dim", "swa_v_head_dim", "add_swa_attention_sink_bias",
        "add_full_attention_sink_bias", "hybrid_layer_pattern",
        "moe_layer_freq", "rope_theta", "swa_rope_theta",
        "partial_rotary_factor", "layernorm_epsilon"}) {
    j.erase(k);
  }
  j["rms_norm_eps"] = 1e-5;
  j["layer_types"] = {"full_attention",    "sliding_attention",
                      "sliding_attention", "sliding_attention",
                      "sliding_attention", "full_attention"};
  j["mlp_layer_types"] = {"dense",  "sparse", "sparse",
                          "sparse", "sparse", "sparse"};
  j["routed_scaling_factor"] = 1.0;
  j["rope_parameters"] = Json::parse(R"({
    "full_attention": {"rope_type": "default", "rope_theta": 5000000.0,
                       "partial_rotary_factor": 0.334},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                          "partial_rotary_factor": 0.334}})");
  j["dtype"] = j["torch_dtype"];
  j.erase("torch_dtype");
  return j;
}

absl::StatusOr<ModelConfig> Parse(const Json& j) {
  return ModelConfig::FromJson(j.dump(), "config.json");
}

void ExpectError(const Json& j, const std::string& field) {
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_FALSE(c.ok()) << "accepted; expected an error naming " << field;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("'" + field + "'"));
}

TEST(NativeConfig, ParsesToTheSameConfigAsTheHubFormat) {
  absl::StatusOr<ModelConfig> hub = Parse(Hub());
  absl::StatusOr<ModelConfig> native = Parse(Native());
  ASSERT_TRUE(hub.ok()) << hub.status();
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_EQ(native->swa.num_kv_heads, 2);  // 2 x num_key_value_heads
  EXPECT_TRUE(native->swa.sink);
  EXPECT_FALSE(native->full.sink);
  EXPECT_DOUBLE_EQ(native->full.rope_theta, 5e6);
  EXPECT_DOUBLE_EQ(native->swa.rope_theta, 1e4);
  EXPECT_EQ(native->full.rotary_dim, 8);
  EXPECT_TRUE(*hub == *native);
}

TEST(NativeConfig, HubFieldsGivenTooMustAgree) {
  Json j = Native();
  j["swa_num_key_value_heads"] = 2;
  j["add_swa_attention_sink_bias"] = true;
  j["rope_theta"] = 5e6;
  EXPECT_TRUE(Parse(j).ok());
  j["swa_num_key_value_heads"] = 1;
  ExpectError(j, "swa_num_key_value_heads");
  j = Native();
  j["rope_theta"] = 1e6;
  ExpectError(j, "rope_theta");
  j = Native();
  j["add_full_attention_sink_bias"] = true;
  ExpectError(j, "add_full_attention_sink_bias");
  j = Native();
  j["attention_chunk_size"] = 8;
  ExpectError(j, "attention_chunk_size");
}

TEST(NativeConfig, RejectsRopeParametersItDoesNotUnderstand) {
  Json j = Native();
  j["rope_parameters"]["full_attention"]["factor"] = 4.0;
  ExpectError(j, "rope_parameters.full_attention.factor");
  j = Native();
  j["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  ExpectError(j, "rope_parameters.full_attention.rope_type");
  j = Native();
  j["rope_parameters"]["chunked_attention"] = j["rope_parameters"]["full_attention"];
  ExpectError(j, "rope_parameters.chunked_attention");
  j = Native();
  j["rope_parameters"].erase("sliding_attention");
  ExpectError(j, "rope_parameters.sliding_attention");
  j = Native();
  j["rope_parameters"]["sliding_attention"].erase("rope_theta");
  ExpectError(j, "rope_parameters.sliding_attention.rope_theta");
  j = Native();
  j["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 0.5;
  ExpectError(j, "rope_parameters.sliding_attention.partial_rotary_factor");
  // MiMo without a factor: transformers would assume 0.334; we ask for it.
  j = Native();
  j["rope_parameters"]["full_attention"].erase("partial_rotary_factor");
  j["rope_parameters"]["sliding_attention"].erase("partial_rotary_factor");
  ExpectError(j, "rope_parameters.full_attention.partial_rotary_factor");
  j = Native();
  j["rope_parameters"] = "default";
  ExpectError(j, "rope_parameters");
}

TEST(NativeConfig, FlatRopeParametersForAnAllFullModel) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(R"({
      "model_type": "llama", "vocab_size": 100, "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})",
                                                        "llama.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->full.rope_theta, 5e5);
  EXPECT_EQ(c->full.rotary_dim, 16);
  EXPECT_FALSE(c->full.sink);
}

TEST(NativeConfig, SlidingLayersOfAnotherModelTypeAreRejected) {
  Json j = Native();
  j["model_type"] = "gemma3_text";
  ExpectError(j, "model_type");
}

TEST(HubConfig, MimoSwaGeometryIsNeverGuessed) {
  // transformers-style lists without rope_parameters and without the swa_*
  // fields: this parsed with full-attention KV heads, theta and no sinks.
  for (const char* field : {"swa_num_key_value_heads", "swa_rope_theta",
                            "add_swa_attention_sink_bias"}) {
    Json j = Hub();
    j.erase(field);
    ExpectError(j, field);
  }
}

TEST(HubConfig, UnknownFieldsAreRejectedByName) {
  Json j = Hub();
  j["qk_layernorm"] = true;
  ExpectError(j, "qk_layernorm");
  j = Hub();
  j["topk_method"] = "group_limited_greedy";
  ExpectError(j, "topk_method");
  // Known not to change the computation: accepted.
  j = Hub();
  j["auto_map"] = {{"AutoConfig", "x"}};
  j["moe_router_dtype"] = "bfloat16";
  j["initializer_range"] = 0.02;
  j["vision_config"] = {{"depth", 28}};
  j["hybrid_block_size"] = nullptr;  // null reads as absent, known or not
  EXPECT_TRUE(Parse(j).ok()) << Parse(j).status();
}

Json Fp8(Json j) {
  j["quantization_config"] = Json::parse(R"({
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
    "ignored_layers": ["lm_head", "model.layers.0.mlp.gate",
                       "model.mtp"]})");
  return j;
}

TEST(QuantizationConfig, Fp8BlockScales) {
  absl::StatusOr<ModelConfig> c = Parse(Fp8(Hub()));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quant.fp8);
  EXPECT_EQ(c->quant.block_out, 128);
  EXPECT_EQ(c->quant.block_in, 128);
  EXPECT_TRUE(c->quant.Quantized("model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(c->quant.Quantized("lm_head"));
  EXPECT_FALSE(c->quant.Quantized("model.layers.0.mlp.gate"));
  EXPECT_TRUE(c->quant.Quantized("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(c->quant.Quantized("model.mtp.layers.0.eh_proj"));
  EXPECT_FALSE(Parse(Hub())->quant.Quantized("model.layers.1.mlp.up_proj"));
  // Round trip.
  absl::StatusOr<ModelConfig> back =
      ModelConfig::FromJson(c->ToJson(), "roundtrip");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *c);
  // The transformers spelling of the ignore list.
  Json j = Fp8(Hub());
  j["quantization_config"]["modules_to_not_convert"] =
      j["quantization_config"]["ignored_layers"];
  j["quantization_config"].erase("ignored_layers");
  absl::StatusOr<ModelConfig> alias = Parse(j);
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_EQ(alias->quant, c->quant);
}

TEST(QuantizationConfig, MalformedIsAClearError) {
  Json j = Fp8(Hub());
  j["quantization_config"]["quant_method"] = "gptq";
  ExpectError(j, "quantization_config.quant_method");
  j = Fp8(Hub());
  j["quantization_config"]["fmt"] = "e5m2";
  ExpectError(j, "quantization_config.fmt");
  j = Fp8(Hub());
  j["quantization_config"]["activation_scheme"] = "static";
  ExpectError(j, "quantization_config.activation_scheme");
  j = Fp8(Hub());
  j["quantization_config"].erase("weight_block_size");
  ExpectError(j, "quantization_config.weight_block_size");
  j = Fp8(Hub());
  j["quantization_config"]["weight_block_size"] = {128};
  ExpectError(j, "quantization_config.weight_block_size");
  j = Fp8(Hub());
  j["quantization_config"]["weight_block_size"] = {0, 128};
  ExpectError(j, "quantization_config.weight_block_size");
  j = Fp8(Hub());
  j["quantization_config"]["bits"] = 8;
  ExpectError(j, "quantization_config.bits");
  j = Fp8(Hub());
  j["quantization_config"].erase("quant_method");
  ExpectError(j, "quantization_config.quant_method");
  j = Fp8(Hub());
  j["quantization_config"]["ignored_layers"] = {1};
  ExpectError(j, "quantization_config.ignored_layers");
}

TEST(QuantizationConfig, FieldsThatChangeNothingAreAccepted) {
  const absl::StatusOr<ModelConfig> plain = Parse(Fp8(Hub()));
  ASSERT_TRUE(plain.ok()) << plain.status();
  // What quantization tools commonly add: empty mappings and schemes, and
  // informational keys.
  Json j = Fp8(Hub());
  j["quantization_config"]["packed_modules_mapping"] = Json::object();
  j["quantization_config"]["kv_cache_scheme"] = nullptr;
  j["quantization_config"]["sparsity_config"] = Json::object();
  j["quantization_config"]["transform_config"] = Json::array();
  j["quantization_config"]["producer"] = {{"name", "modelopt"},
                                          {"version", "0.31"}};
  j["quantization_config"]["version"] = "0.10.2";
  j["quantization_config"]["global_compression_ratio"] = 1.87;
  const absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quant, plain->quant);
  EXPECT_TRUE(*c == *plain);
}

TEST(QuantizationConfig, FieldsThatWouldChangeTheMathAreNamed) {
  const std::pair<const char*, Json> cases[] = {
      {"packed_modules_mapping",
       {{"qkv_proj", {"q_proj", "k_proj", "v_proj"}}}},
      {"kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}}},
      {"sparsity_config", {{"format", "sparse-24"}}},
      {"transform_config", {{"config_groups", {{"R1", 1}}}}},
      {"weight_per_tensor", true},
  };
  for (const auto& [key, value] : cases) {
    Json j = Fp8(Hub());
    j["quantization_config"][key] = value;
    const absl::StatusOr<ModelConfig> c = Parse(j);
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()),
                testing::HasSubstr(absl::StrCat("quantization_config.", key)));
  }
  Json j = Fp8(Hub());
  j["quantization_config"]["packed_modules_mapping"] = {{"gate_up_proj", 1}};
  EXPECT_THAT(std::string(Parse(j).status().message()),
              testing::HasSubstr("would change the computation"));
}

TEST(AttentionProjectionLayout, SplitOrFused) {
  Json j = Hub();
  EXPECT_EQ(Parse(j)->qkv_layout, QkvLayout::kSplit);
  j["attention_projection_layout"] = "fused_qkv";
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->qkv_layout, QkvLayout::kFused);
  EXPECT_TRUE(*ModelConfig::FromJson(c->ToJson(), "rt") == *c);
  j["attention_projection_layout"] = "interleaved";
  ExpectError(j, "attention_projection_layout");
}

// A safetensors file holding only a header with `names` (zero-size F32
// tensors): enough for the tensor-name scan.
void WriteHeaderOnly(const std::filesystem::path& path,
                     const std::vector<std::string>& names) {
  Json h = Json::object();
  for (const std::string& n : names) {
    h[n] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  }
  const std::string text = h.dump();
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << text;
}

class MtpCountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test and process: ctest runs this suite's tests as
    // parallel processes, which must not remove each other's files.
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("mtp_count_test_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                        getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    Json j = Hub();
    j.erase("num_nextn_predict_layers");
    std::ofstream(dir_ / "config.json") << j.dump();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(MtpCountTest, FromJsonAloneLeavesZeroAndMarksDerived) {
  Json j = Hub();
  j.erase("num_nextn_predict_layers");
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_mtp_layers, 0);
  EXPECT_TRUE(c->mtp_layers_derived);
  EXPECT_FALSE(Parse(Hub())->mtp_layers_derived);
}

TEST_F(MtpCountTest, CountedFromTheSafetensorsHeaders) {
  WriteHeaderOnly(dir_ / "model.safetensors",
                  {"model.embed_tokens.weight",
                   "model.mtp.layers.0.eh_proj.weight",
                   "model.mtp.layers.1.eh_proj.weight",
                   "model.mtp.layers.2.enorm.weight"});
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_mtp_layers, 3);
  EXPECT_TRUE(c->mtp_layers_derived);
  EXPECT_EQ(c->KvShape().swa_layers, 4 + 3);
}

TEST_F(MtpCountTest, CountedFromTheShardIndex) {
  Json index = {{"metadata", {{"total_size", 0}}},
                {"weight_map",
                 {{"model.mtp.layers.0.hnorm.weight", "a.safetensors"},
                  {"lm_head.weight", "b.safetensors"}}}};
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump();
  absl::StatusOr<ModelConfig> c =
      ModelConfig::Load((dir_ / "config.json").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_mtp_layers, 1);
}

TEST_F(MtpCountTest, NoMtpTensorsMeansNone) {
  WriteHeaderOnly(dir_ / "model.safetensors", {"lm_head.weight"});
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_mtp_layers, 0);
}

TEST_F(MtpCountTest, AGapIsAnError) {
  WriteHeaderOnly(dir_ / "model.safetensors",
                  {"model.mtp.layers.0.eh_proj.weight",
                   "model.mtp.layers.2.eh_proj.weight"});
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir_.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("no model.mtp.layers.1"));
  WriteHeaderOnly(dir_ / "model.safetensors", {"model.mtp.layers.x.w"});
  EXPECT_FALSE(ModelConfig::Load(dir_.string()).ok());
}

// The fuzzer's seeds for the new formats parse and round-trip (the fuzzer
// itself needs clang; this keeps the seeds honest in every build).
TEST(FuzzSeeds, NewFormatsParseAndRoundTrip) {
  for (const char* name : {"fp8-block", "fused-qkv", "transformers-native"}) {
    const std::filesystem::path path = std::filesystem::path(SWASERVE_SOURCE_DIR) /
                                       "tests/fuzz/corpus/model_config" / name;
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(text, name);
    ASSERT_TRUE(c.ok()) << c.status();
    absl::StatusOr<ModelConfig> back = ModelConfig::FromJson(c->ToJson(), name);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == *c) << name;
  }
}

}  // namespace
}  // namespace swaserve::model
