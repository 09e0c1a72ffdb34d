#include "lib/model/config.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// A MiMo-V2-Flash style config.json (values scaled down, the real field
// names and the extra fields a hub config carries).
Json FlashLike() {
  return Json::parse(R"({
    "architectures": ["MiMoV2FlashForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_mimo_v2_flash.MiMoV2FlashConfig"},
    "model_type": "mimo_v2_flash",
    "vocab_size": 1000,
    "hidden_size": 128,
    "num_hidden_layers": 8,
    "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0, 1, 1],
    "sliding_window": 32,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 48,
    "v_head_dim": 32,
    "swa_num_attention_heads": 8,
    "swa_num_key_value_heads": 4,
    "swa_head_dim": 48,
    "swa_v_head_dim": 32,
    "rope_theta": 5000000,
    "swa_rope_theta": 10000,
    "partial_rotary_factor": 0.334,
    "add_swa_attention_sink_bias": true,
    "add_full_attention_sink_bias": false,
    "attention_value_scale": 0.707,
    "moe_layer_freq": [0, 1, 1, 1, 1, 1, 1, 1],
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "intermediate_size": 256,
    "n_shared_experts": null,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": true,
    "routed_scaling_factor": null,
    "num_nextn_predict_layers": 3,
    "layernorm_epsilon": 1e-5,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": false,
    "attention_bias": false,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "bos_token_id": null,
    "eos_token_id": 999,
    "use_cache": true,
    "rope_scaling": null,
    "transformers_version": "4.57.0"
  })");
}

absl::StatusOr<ModelConfig> Parse(const Json& j) {
  return ModelConfig::FromJson(j.dump(), "config.json");
}

TEST(RotaryDim, RoundsDownToEven) {
  EXPECT_EQ(RotaryDim(192, 0.334), 64);
  EXPECT_EQ(RotaryDim(16, 0.5), 8);
  EXPECT_EQ(RotaryDim(10, 0.5), 4);  // 5 -> 4
  EXPECT_EQ(RotaryDim(128, 1.0), 128);
  EXPECT_EQ(RotaryDim(48, 0.334), 16);  // 16.03
  EXPECT_EQ(RotaryDim(3, 0.5), 0);
}

TEST(ModelConfig, ParsesFlashLikeConfig) {
  absl::StatusOr<ModelConfig> c = Parse(FlashLike());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "mimo_v2_flash");
  EXPECT_EQ(c->vocab_size, 1000);
  EXPECT_EQ(c->hidden_size, 128);
  EXPECT_EQ(c->num_layers, 8);
  ASSERT_EQ(c->layer_types.size(), 8u);
  EXPECT_EQ(c->layer_types[0], AttentionType::kFull);
  EXPECT_EQ(c->layer_types[1], AttentionType::kSwa);
  EXPECT_EQ(c->layer_types[5], AttentionType::kFull);
  EXPECT_EQ(c->num_full_layers(), 2);
  EXPECT_EQ(c->num_swa_layers(), 6);
  EXPECT_EQ(c->sliding_window, 32);
  EXPECT_EQ(c->full.num_heads, 8);
  EXPECT_EQ(c->full.num_kv_heads, 2);
  EXPECT_EQ(c->full.head_dim, 48);
  EXPECT_EQ(c->full.v_head_dim, 32);
  EXPECT_DOUBLE_EQ(c->full.rope_theta, 5e6);
  EXPECT_FALSE(c->full.sink);
  EXPECT_EQ(c->full.rotary_dim, 16);
  EXPECT_EQ(c->swa.num_kv_heads, 4);
  EXPECT_DOUBLE_EQ(c->swa.rope_theta, 1e4);
  EXPECT_TRUE(c->swa.sink);
  EXPECT_EQ(c->swa.rotary_dim, 16);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.334);
  EXPECT_DOUBLE_EQ(c->attention_value_scale, 0.707);
  EXPECT_EQ(c->moe_layers, (std::vector<bool>{false, true, true, true, true,
                                              true, true, true}));
  EXPECT_EQ(c->n_routed_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 64);
  EXPECT_EQ(c->intermediate_size, 256);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 1.0);  // null -> default
  EXPECT_EQ(c->num_mtp_layers, 3);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->dtype, kv::DType::kBF16);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->max_position_embeddings, 262144);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{999});
  EXPECT_EQ(&c->attention(0), &c->full);
  EXPECT_EQ(&c->attention(1), &c->swa);
}

TEST(ModelConfig, PoolLayers) {
  absl::StatusOr<ModelConfig> c = Parse(FlashLike());
  ASSERT_TRUE(c.ok()) << c.status();
  // pattern [0, 1, 1, 1, 1, 0, 1, 1]
  const int want[] = {0, 0, 1, 2, 3, 1, 4, 5};
  for (int l = 0; l < 8; ++l) EXPECT_EQ(c->pool_layer(l), want[l]) << l;
  EXPECT_EQ(c->mtp_pool_layer(0), 6);
  EXPECT_EQ(c->mtp_pool_layer(2), 8);
}

TEST(ModelConfig, KvShape) {
  absl::StatusOr<ModelConfig> c = Parse(FlashLike());
  ASSERT_TRUE(c.ok()) << c.status();
  kv::KvShape s = c->KvShape(32);
  EXPECT_EQ(s.full_layers, 2);
  EXPECT_EQ(s.full_kv_heads, 2);
  EXPECT_EQ(s.full_k_head_dim, 48);
  EXPECT_EQ(s.full_v_head_dim, 32);
  EXPECT_EQ(s.swa_layers, 6 + 3);  // SWA layers + MTP layers
  EXPECT_EQ(s.swa_kv_heads, 4);
  EXPECT_EQ(s.swa_k_head_dim, 48);
  EXPECT_EQ(s.swa_v_head_dim, 32);
  EXPECT_EQ(s.sliding_window, 32);
  EXPECT_EQ(s.page_size, 32);
  EXPECT_EQ(s.dtype, kv::DType::kBF16);
  EXPECT_TRUE(s.Validate().ok());
  EXPECT_EQ(c->KvShape().page_size, 16);
  EXPECT_EQ(s.Full().TokenBytes(), 2u * 2 * (48 + 32) * 2);
  EXPECT_EQ(s.Swa().TokenBytes(), 9u * 4 * (48 + 32) * 2);
}

TEST(ModelConfig, KvShapeDTypeFollowsConfig) {
  for (const auto& [name, dtype] :
       std::vector<std::pair<std::string, kv::DType>>{
           {"float32", kv::DType::kF32},
           {"bfloat16", kv::DType::kBF16},
           {"float16", kv::DType::kF16},
           {"bf16", kv::DType::kBF16}}) {
    Json j = FlashLike();
    j["torch_dtype"] = name;
    absl::StatusOr<ModelConfig> c = Parse(j);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->dtype, dtype) << name;
    EXPECT_EQ(c->KvShape().dtype, dtype) << name;
  }
}

TEST(ModelConfig, MiMoProShapeMatchesKvReference) {
  Json j = FlashLike();
  j["num_hidden_layers"] = 70;
  std::vector<int> pattern;
  std::vector<int> moe;
  for (int l = 0; l < 70; ++l) {
    pattern.push_back(l % 7 == 0 ? 0 : 1);
    moe.push_back(l == 0 ? 0 : 1);
  }
  j["hybrid_layer_pattern"] = pattern;
  j["moe_layer_freq"] = moe;
  j["sliding_window"] = 128;
  j["num_attention_heads"] = 16;
  j["num_key_value_heads"] = 8;
  j["swa_num_attention_heads"] = 16;
  j["swa_num_key_value_heads"] = 8;
  j["head_dim"] = 192;
  j["swa_head_dim"] = 192;
  j["v_head_dim"] = 128;
  j["swa_v_head_dim"] = 128;
  j["num_nextn_predict_layers"] = 0;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->full.rotary_dim, 64);
  kv::KvShape want = kv::KvShape::MiMoV25Pro();
  kv::KvShape got = c->KvShape(16);
  EXPECT_EQ(got.full_layers, want.full_layers);
  EXPECT_EQ(got.swa_layers, want.swa_layers);
  EXPECT_EQ(got.Full().PageBytes(), want.Full().PageBytes());
  EXPECT_EQ(got.Swa().PageBytes(), want.Swa().PageBytes());
}

TEST(ModelConfig, LayerTypesAlias) {
  Json a = FlashLike();
  Json b = FlashLike();
  b.erase("hybrid_layer_pattern");
  b["layer_types"] = {"full_attention",    "sliding_attention",
                      "sliding_attention", "sliding_attention",
                      "sliding_attention", "full_attention",
                      "sliding_attention", "sliding_attention"};
  absl::StatusOr<ModelConfig> ca = Parse(a);
  absl::StatusOr<ModelConfig> cb = Parse(b);
  ASSERT_TRUE(ca.ok()) << ca.status();
  ASSERT_TRUE(cb.ok()) << cb.status();
  EXPECT_EQ(ca->layer_types, cb->layer_types);
  // Both spellings, agreeing: fine.
  Json both = b;
  both["hybrid_layer_pattern"] = a["hybrid_layer_pattern"];
  EXPECT_TRUE(Parse(both).ok());
  // Disagreeing: an error naming the field.
  both["layer_types"][0] = "sliding_attention";
  absl::StatusOr<ModelConfig> bad = Parse(both);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("layer_types"));
}

TEST(ModelConfig, MlpLayerTypesAlias) {
  Json j = FlashLike();
  j.erase("moe_layer_freq");
  j["mlp_layer_types"] = {"dense",  "sparse", "sparse", "sparse",
                          "sparse", "sparse", "sparse", "sparse"};
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe_layers, Parse(FlashLike())->moe_layers);
}

TEST(ModelConfig, OtherAliases) {
  Json j = FlashLike();
  j.erase("sliding_window");
  j["sliding_window_size"] = 64;
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  j.erase("layernorm_epsilon");
  j["rms_norm_eps"] = 1e-6;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 64);
  EXPECT_EQ(c->dtype, kv::DType::kF16);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
}

TEST(ModelConfig, Defaults) {
  // A Llama-style config: no SWA fields, no MoE, no pattern.
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(R"({
      "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128,
      "eos_token_id": [1, 2], "sliding_window": null})",
                                                        "llama.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->full.num_kv_heads, 4);
  EXPECT_EQ(c->full.head_dim, 16);
  EXPECT_EQ(c->full.v_head_dim, 16);
  EXPECT_EQ(c->full.rotary_dim, 16);
  EXPECT_EQ(c->swa.num_heads, 4);
  EXPECT_EQ(c->swa.num_kv_heads, 4);
  EXPECT_EQ(c->swa.head_dim, 16);
  EXPECT_FALSE(c->swa.sink);
  EXPECT_EQ(c->num_swa_layers(), 0);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->moe_layers, (std::vector<bool>{false, false}));
  EXPECT_EQ(c->dtype, kv::DType::kF32);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->attention_value_scale, 1.0);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(c->num_mtp_layers, 0);
  // The SWA theta defaults to the full one.
  absl::StatusOr<ModelConfig> d = ModelConfig::FromJson(R"({
      "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 4, "intermediate_size": 128, "rope_theta": 1e6})",
                                                        "x");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ(d->swa.rope_theta, 1e6);
}

struct ErrorCase {
  std::string name;
  std::function<void(Json&)> mutate;
  std::string field;  // must appear in the message
};

TEST(ModelConfig, ErrorsNameTheField) {
  const std::vector<ErrorCase> cases = {
      {"missing vocab", [](Json& j) { j.erase("vocab_size"); }, "vocab_size"},
      {"missing hidden", [](Json& j) { j.erase("hidden_size"); },
       "hidden_size"},
      {"missing layers", [](Json& j) { j.erase("num_hidden_layers"); },
       "num_hidden_layers"},
      {"missing heads", [](Json& j) { j.erase("num_attention_heads"); },
       "num_attention_heads"},
      {"null required", [](Json& j) { j["vocab_size"] = nullptr; },
       "vocab_size"},
      {"string int", [](Json& j) { j["hidden_size"] = "128"; }, "hidden_size"},
      {"float int", [](Json& j) { j["head_dim"] = 48.5; }, "head_dim"},
      {"int out of range", [](Json& j) { j["head_dim"] = 1ll << 40; },
       "head_dim"},
      {"bool type", [](Json& j) { j["add_swa_attention_sink_bias"] = "yes"; },
       "add_swa_attention_sink_bias"},
      {"number type", [](Json& j) { j["rope_theta"] = "big"; }, "rope_theta"},
      {"head_dim zero", [](Json& j) { j["head_dim"] = 0; }, "head_dim"},
      {"head_dim negative", [](Json& j) { j["swa_head_dim"] = -4; },
       "swa_head_dim"},
      {"v_head_dim zero", [](Json& j) { j["v_head_dim"] = 0; }, "v_head_dim"},
      {"kv heads zero", [](Json& j) { j["num_key_value_heads"] = 0; },
       "num_key_value_heads"},
      {"heads not multiple", [](Json& j) { j["num_key_value_heads"] = 3; },
       "num_attention_heads"},
      {"swa heads not multiple",
       [](Json& j) { j["swa_num_key_value_heads"] = 3; },
       "swa_num_attention_heads"},
      {"no head_dim, indivisible",
       [](Json& j) {
         j.erase("head_dim");
         j["hidden_size"] = 100;
         j["num_attention_heads"] = 8;
       },
       "head_dim"},
      {"window zero", [](Json& j) { j["sliding_window"] = 0; },
       "sliding_window"},
      {"window negative", [](Json& j) { j["sliding_window"] = -1; },
       "sliding_window"},
      {"window missing", [](Json& j) { j.erase("sliding_window"); },
       "sliding_window"},
      {"unknown dtype", [](Json& j) { j["torch_dtype"] = "int8"; },
       "torch_dtype"},
      {"dtype not string", [](Json& j) { j["torch_dtype"] = 16; },
       "torch_dtype"},
      {"pattern too short",
       [](Json& j) {
         j["hybrid_layer_pattern"] = {0, 1, 1};
       },
       "hybrid_layer_pattern"},
      {"pattern entry", [](Json& j) { j["hybrid_layer_pattern"][2] = 2; },
       "hybrid_layer_pattern"},
      {"pattern type", [](Json& j) { j["hybrid_layer_pattern"] = "0,1"; },
       "hybrid_layer_pattern"},
      {"layer_types length",
       [](Json& j) {
         j.erase("hybrid_layer_pattern");
         j["layer_types"] = {"full_attention"};
       },
       "layer_types"},
      {"layer_types entry",
       [](Json& j) {
         j.erase("hybrid_layer_pattern");
         j["layer_types"] = Json::array();
         for (int i = 0; i < 8; ++i)
           j["layer_types"].push_back("chunked_attention");
       },
       "layer_types"},
      {"moe length",
       [](Json& j) {
         j["moe_layer_freq"] = {0, 1};
       },
       "moe_layer_freq"},
      {"moe as int", [](Json& j) { j["moe_layer_freq"] = 1; },
       "moe_layer_freq"},
      {"mlp_layer_types entry",
       [](Json& j) {
         j.erase("moe_layer_freq");
         j["mlp_layer_types"] = Json::array();
         for (int i = 0; i < 8; ++i) j["mlp_layer_types"].push_back("moe");
       },
       "mlp_layer_types"},
      {"moe without experts", [](Json& j) { j["n_routed_experts"] = 0; },
       "n_routed_experts"},
      {"moe experts missing", [](Json& j) { j.erase("n_routed_experts"); },
       "n_routed_experts"},
      {"topk > experts", [](Json& j) { j["num_experts_per_tok"] = 9; },
       "num_experts_per_tok"},
      {"topk zero", [](Json& j) { j["num_experts_per_tok"] = 0; },
       "num_experts_per_tok"},
      {"moe intermediate zero", [](Json& j) { j["moe_intermediate_size"] = 0; },
       "moe_intermediate_size"},
      {"dense intermediate missing",
       [](Json& j) { j.erase("intermediate_size"); }, "intermediate_size"},
      {"quantization",
       [](Json& j) {
         j["quantization_config"] = {{"quant_method", "awq"}};
       },
       "quantization_config.quant_method"},
      {"attention bias", [](Json& j) { j["attention_bias"] = true; },
       "attention_bias"},
      {"activation", [](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
      {"shared experts", [](Json& j) { j["n_shared_experts"] = 1; },
       "n_shared_experts"},
      {"softmax router", [](Json& j) { j["scoring_func"] = "softmax"; },
       "scoring_func"},
      {"grouped routing", [](Json& j) { j["n_group"] = 8; }, "n_group"},
      {"yarn",
       [](Json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       "rope_scaling"},
      {"rotary factor zero", [](Json& j) { j["partial_rotary_factor"] = 0; },
       "partial_rotary_factor"},
      {"rotary factor > 1", [](Json& j) { j["partial_rotary_factor"] = 1.5; },
       "partial_rotary_factor"},
      {"rotary dim zero", [](Json& j) { j["partial_rotary_factor"] = 0.01; },
       "partial_rotary_factor"},
      {"value scale", [](Json& j) { j["attention_value_scale"] = 0; },
       "attention_value_scale"},
      {"eps", [](Json& j) { j["layernorm_epsilon"] = -1; }, "rms_norm_eps"},
      {"eos out of vocab", [](Json& j) { j["eos_token_id"] = 1000; },
       "eos_token_id"},
      {"eos list entry",
       [](Json& j) {
         j["eos_token_id"] = {1, "x"};
       },
       "eos_token_id[1]"},
      {"bos", [](Json& j) { j["bos_token_id"] = -5; }, "bos_token_id"},
      {"mtp negative", [](Json& j) { j["num_nextn_predict_layers"] = -1; },
       "num_nextn_predict_layers"},
      {"huge layer count",
       [](Json& j) {
         j.erase("hybrid_layer_pattern");
         j.erase("moe_layer_freq");
         j["num_hidden_layers"] = 1000000000;
       },
       "num_hidden_layers"},
      {"vocab zero", [](Json& j) { j["vocab_size"] = 0; }, "vocab_size"},
      {"model_type type", [](Json& j) { j["model_type"] = 3; }, "model_type"},
  };
  for (const ErrorCase& c : cases) {
    Json j = FlashLike();
    c.mutate(j);
    absl::StatusOr<ModelConfig> r = Parse(j);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("'" + c.field + "'"))
        << c.name;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("config.json"))
        << c.name;
  }
}

TEST(ModelConfig, RejectsBadJson) {
  for (const std::string& text :
       {std::string(""), std::string("{"), std::string("[1, 2]"),
        std::string("\"x\""), std::string("{\"vocab_size\": 1,}"),
        std::string("null"), std::string("{}\0{\"x\": 1}", 11)}) {
    absl::StatusOr<ModelConfig> r = ModelConfig::FromJson(text, "bad.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("bad.json"))
        << text;
  }
}

TEST(ModelConfig, ValidateNamesRotaryDimMismatch) {
  absl::StatusOr<ModelConfig> c = Parse(FlashLike());
  ASSERT_TRUE(c.ok()) << c.status();
  ModelConfig bad = *c;
  bad.swa.rotary_dim = 48;
  absl::Status s = bad.Validate();
  EXPECT_THAT(std::string(s.message()), HasSubstr("swa.rotary_dim"));
  bad = *c;
  bad.layer_types.pop_back();
  EXPECT_THAT(std::string(bad.Validate().message()),
              HasSubstr("hybrid_layer_pattern"));
  bad = *c;
  bad.moe_layers.push_back(true);
  EXPECT_THAT(std::string(bad.Validate().message()),
              HasSubstr("moe_layer_freq"));
}

TEST(ModelConfig, ToJsonRoundTrips) {
  std::vector<Json> inputs = {FlashLike()};
  Json tied = FlashLike();
  tied["tie_word_embeddings"] = true;
  tied["eos_token_id"] = {3, 4, 5};
  tied["bos_token_id"] = 1;
  tied["routed_scaling_factor"] = 2.5;
  tied["norm_topk_prob"] = false;
  tied["add_full_attention_sink_bias"] = true;
  tied["torch_dtype"] = "float16";
  inputs.push_back(tied);
  Json no_eos = FlashLike();
  no_eos.erase("eos_token_id");
  inputs.push_back(no_eos);
  for (const Json& in : inputs) {
    absl::StatusOr<ModelConfig> a = Parse(in);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string text = a->ToJson();
    absl::StatusOr<ModelConfig> b = ModelConfig::FromJson(text, "roundtrip");
    ASSERT_TRUE(b.ok()) << b.status() << "\n" << text;
    EXPECT_TRUE(*a == *b) << text;
    EXPECT_EQ(b->ToJson(), text);
  }
}

TEST(ModelConfig, LoadFromDirectoryAndFile) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "config_test_load";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "config.json");
    out << FlashLike().dump(2);
  }
  absl::StatusOr<ModelConfig> a = ModelConfig::Load(dir.string());
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<ModelConfig> b =
      ModelConfig::Load((dir / "config.json").string());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(*a == *b);
  absl::StatusOr<ModelConfig> missing =
      ModelConfig::Load((dir / "nope" / "config.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  {
    std::ofstream out(dir / "config.json");
    out << "{\"vocab_size\": 10}";
  }
  absl::StatusOr<ModelConfig> bad = ModelConfig::Load(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("config.json"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("hidden_size"));
  std::filesystem::remove_all(dir);
}

// Work per key of context over work per token, counted by hand for a
// two-layer model (full dense layer, SWA MoE layer).
TEST(ContextCostPerToken, CountsFullAttentionKeysOverTokenWork) {
  ModelConfig c;
  c.hidden_size = 4;
  c.num_layers = 2;
  c.layer_types = {AttentionType::kFull, AttentionType::kSwa};
  c.moe_layers = {false, true};
  c.full = {.num_heads = 2, .num_kv_heads = 1, .head_dim = 3, .v_head_dim = 2};
  c.swa = {.num_heads = 1, .num_kv_heads = 1, .head_dim = 2, .v_head_dim = 2};
  c.intermediate_size = 5;
  c.moe_intermediate_size = 3;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  // Layer 0: q/k/v 4*(2*3 + 1*(3+2)) = 44, o 2*2*4 = 16, MLP 3*4*5 = 60.
  // Layer 1: q/k/v 4*(1*2 + 1*(2+2)) = 24, o 1*2*4 = 8, experts 3*4*3*2 = 72,
  // router 4*4 = 16. Per key: layer 0 only, 2*(3+2) = 10.
  EXPECT_DOUBLE_EQ(ContextCostPerToken(c), 10.0 / 240.0);
  // No full-attention layer: context costs nothing extra.
  c.layer_types = {AttentionType::kSwa, AttentionType::kSwa};
  EXPECT_DOUBLE_EQ(ContextCostPerToken(c), 0.0);
  EXPECT_DOUBLE_EQ(ContextCostPerToken(ModelConfig{}), 0.0);
}

}  // namespace
}  // namespace swaserve::model
