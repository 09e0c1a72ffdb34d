// `swaserve export-gguf` (lib/model/gguf_export.h): the tiny model, the demo
// model and the mini released-layout checkpoints exported and read back with
// our own reader: llama.cpp's mimo2 metadata, the tensor names and shapes it
// expects, and the bytes (stored dtype: the checkpoint's own bytes; F32: the
// exact values, FP8 dequantised equal to its BF16 twin). What mimo2 cannot
// express is a named error.
#include "lib/model/gguf_export.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/model/checkpoint.h"
#include "lib/model/cpu_kernels.h"
#include "lib/model/gguf.h"
#include "lib/model/mini_checkpoints.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kSource = SWASERVE_SOURCE_DIR;
const std::string kDemo = kSource + "/models/demo";
const std::string kTokenizer = kDemo + "/tokenizer.json";

// Ids of models/demo/tokenizer.json (vocabulary and added tokens).
constexpr int kDemoVocab = 4352;

class GgufExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { root_ = new std::string(*base::MakeTempDir("gguf-export")); }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  // The tiny shape on the demo tokenizer's ids, in `dtype`.
  static std::string Tiny(kv::DType dtype) {
    const std::string dir = absl::StrCat(*root_, "/tiny-", static_cast<int>(dtype));
    if (!fs::exists(dir + "/config.json")) {
      ModelConfig c = *BuiltinConfig("tiny", kDemoVocab);
      c.dtype = dtype;
      EXPECT_TRUE(WriteRandomCheckpoint(c, 7, dir, kTokenizer).ok());
    }
    return dir;
  }
  // Mini layout `name` on the demo tokenizer.
  static std::string Mini(const std::string& name) {
    const std::string dir = *root_ + "/mini-" + name;
    if (!fs::exists(dir + "/config.json")) {
      MiniLayout l = *FindMiniLayout(name);
      l.config.vocab_size = kDemoVocab;
      l.options.tokenizer_json = kTokenizer;
      EXPECT_TRUE(WriteRandomCheckpoint(l.config, 25, dir, l.options).ok());
    }
    return dir;
  }
  static std::unique_ptr<GgufFile> Export(const std::string& dir, const std::string& dtype,
                                          const std::string& tag) {
    const std::string out = absl::StrCat(*root_, "/", tag, ".gguf");
    absl::StatusOr<GgufExportSummary> s = ExportGguf(dir, out, {.dtype = dtype});
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<GgufFile>> f = ReadGgufFile(out);
    EXPECT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->contents.tensors.size(), static_cast<size_t>(s->tensors));
    return f.ok() ? *std::move(f) : nullptr;
  }
  static std::string* root_;
};
std::string* GgufExportTest::root_ = nullptr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::string_view Bytes(const TensorInfo& t) {
  return absl::string_view(reinterpret_cast<const char*>(t.data), t.end - t.begin);
}

std::vector<float> Widened(const TensorInfo& t) {
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint16_t h;
    switch (t.dtype) {
      case TensorDType::kF32:
        std::memcpy(&out[i], t.data + 4 * i, 4);
        break;
      case TensorDType::kBF16:
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = Bf16ToF32(h);
        break;
      default:
        ADD_FAILURE() << t.name;
    }
  }
  return out;
}

std::vector<float> Floats(const GgufTensorInfo& t) {
  EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  std::vector<float> out(t.numel());
  std::memcpy(out.data(), t.data.data(), 4 * out.size());
  return out;
}

// The GGUF name of every HF tensor of the tiny model (written independently
// of the exporter's table), and how the bytes relate.
TEST_F(GgufExportTest, TinyModelRoundTripsNamesShapesMetadataAndBytes) {
  const std::string dir = Tiny(kv::DType::kBF16);
  std::unique_ptr<GgufFile> f = Export(dir, "stored", "tiny-stored");
  ASSERT_NE(f, nullptr);
  const GgufContents& g = f->contents;
  std::unique_ptr<Checkpoint> ck = *Checkpoint::Open(dir);
  const ModelConfig& c = ck->config();
  ASSERT_EQ(c.num_layers, 6);
  ASSERT_EQ(c.num_mtp_layers, 2);

  EXPECT_EQ(*g.Find("general.architecture"), GgufValue::Str("mimo2"));
  EXPECT_EQ(*g.Find("general.file_type"), GgufValue::U32(32));  // MOSTLY_BF16
  EXPECT_EQ(*g.Find("mimo2.block_count"), GgufValue::U32(8));
  EXPECT_EQ(*g.Find("mimo2.nextn_predict_layers"), GgufValue::U32(2));
  EXPECT_EQ(*g.Find("mimo2.context_length"), GgufValue::U32(65536));
  EXPECT_EQ(*g.Find("mimo2.embedding_length"), GgufValue::U32(64));
  EXPECT_EQ(*g.Find("mimo2.feed_forward_length"), GgufValue::U32(96));
  EXPECT_EQ(*g.Find("mimo2.expert_feed_forward_length"), GgufValue::U32(32));
  EXPECT_EQ(*g.Find("mimo2.expert_count"), GgufValue::U32(4));
  EXPECT_EQ(*g.Find("mimo2.expert_used_count"), GgufValue::U32(2));
  EXPECT_EQ(*g.Find("mimo2.attention.head_count"), GgufValue::U32(4));
  // Pattern 0 1 1 0 1 1, MTP blocks SWA; KV heads 2 (full) / 4 (SWA).
  EXPECT_EQ(*g.Find("mimo2.attention.sliding_window_pattern"),
            GgufValue::I32Array({0, 1, 1, 0, 1, 1, 1, 1}));
  EXPECT_EQ(*g.Find("mimo2.attention.head_count_kv"),
            GgufValue::I32Array({2, 4, 4, 2, 4, 4, 4, 4}));
  EXPECT_EQ(*g.Find("mimo2.attention.sliding_window"), GgufValue::U32(16));
  EXPECT_EQ(*g.Find("mimo2.attention.key_length"), GgufValue::U32(16));
  EXPECT_EQ(*g.Find("mimo2.attention.value_length"), GgufValue::U32(8));
  EXPECT_EQ(*g.Find("mimo2.attention.value_scale"), GgufValue::F32(0.707f));
  EXPECT_EQ(*g.Find("mimo2.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-6f));
  EXPECT_EQ(*g.Find("mimo2.rope.dimension_count"), GgufValue::U32(8));  // 16 x 0.5
  EXPECT_EQ(*g.Find("mimo2.rope.freq_base"), GgufValue::F32(100000.0f));
  EXPECT_EQ(*g.Find("mimo2.rope.freq_base_swa"), GgufValue::F32(10000.0f));

  // Every HF tensor lands somewhere; the GGUF file holds nothing else.
  std::set<std::string> expected;
  auto same_bytes = [&](const std::string& gguf, const std::vector<std::string>& hf) {
    expected.insert(gguf);
    const GgufTensorInfo* t = g.FindTensor(gguf);
    ASSERT_NE(t, nullptr) << gguf;
    EXPECT_EQ(t->type, GgmlType::kBF16) << gguf;
    std::string want;
    for (const std::string& n : hf) want += std::string(Bytes(*ck->Find(n)));
    EXPECT_TRUE(t->data == want) << gguf;
  };
  auto widened = [&](const std::string& gguf, const std::string& hf) {
    expected.insert(gguf);
    const GgufTensorInfo* t = g.FindTensor(gguf);
    ASSERT_NE(t, nullptr) << gguf;
    EXPECT_EQ(Floats(*t), Widened(*ck->Find(hf))) << gguf;
  };
  same_bytes("token_embd.weight", {"model.embed_tokens.weight"});
  EXPECT_EQ(g.FindTensor("token_embd.weight")->ne, (std::vector<int64_t>{64, kDemoVocab}));
  same_bytes("output.weight", {"lm_head.weight"});
  widened("output_norm.weight", "model.norm.weight");
  for (int b = 0; b < 8; ++b) {
    const bool mtp = b >= 6;
    const std::string blk = absl::StrCat("blk.", b, ".");
    const std::string p = mtp ? absl::StrCat("model.mtp.layers.", b - 6, ".")
                              : absl::StrCat("model.layers.", b, ".");
    widened(blk + "attn_norm.weight", p + "input_layernorm.weight");
    widened(blk + "ffn_norm.weight", p + "post_attention_layernorm.weight");
    if (mtp) {
      same_bytes(blk + "attn_qkv.weight", {p + "self_attn.q_proj.weight",
                                           p + "self_attn.k_proj.weight",
                                           p + "self_attn.v_proj.weight"});
      EXPECT_EQ(g.FindTensor(blk + "attn_qkv.weight")->ne,
                (std::vector<int64_t>{64, 4 * 16 + 4 * 16 + 4 * 8}));
      same_bytes(blk + "nextn.eh_proj.weight", {p + "eh_proj.weight"});
      EXPECT_EQ(g.FindTensor(blk + "nextn.eh_proj.weight")->ne,
                (std::vector<int64_t>{128, 64}));
      widened(blk + "nextn.enorm.weight", p + "enorm.weight");
      widened(blk + "nextn.hnorm.weight", p + "hnorm.weight");
      widened(blk + "layer_output_norm.weight", p + "final_layernorm.weight");
    } else {
      for (const char* x : {"q", "k", "v"}) {
        same_bytes(absl::StrCat(blk, "attn_", x, ".weight"),
                   {absl::StrCat(p, "self_attn.", x, "_proj.weight")});
      }
    }
    same_bytes(blk + "attn_output.weight", {p + "self_attn.o_proj.weight"});
    const bool swa = mtp || c.layer_types[b] == AttentionType::kSwa;
    if (swa) widened(blk + "attn_sinks.weight", p + "self_attn.attention_sink_bias");
    if (!mtp && c.moe_layers[b]) {
      widened(blk + "ffn_gate_inp.weight", p + "mlp.gate.weight");
      widened(blk + "exp_probs_b.bias", p + "mlp.gate.e_score_correction_bias");
      for (const char* x : {"gate", "up", "down"}) {
        std::vector<std::string> experts;
        for (int e = 0; e < 4; ++e) {
          experts.push_back(absl::StrCat(p, "mlp.experts.", e, ".", x, "_proj.weight"));
        }
        same_bytes(absl::StrCat(blk, "ffn_", x, "_exps.weight"), experts);
      }
      EXPECT_EQ(g.FindTensor(blk + "ffn_down_exps.weight")->ne,
                (std::vector<int64_t>{32, 64, 4}));
    } else {
      for (const char* x : {"gate", "up", "down"}) {
        same_bytes(absl::StrCat(blk, "ffn_", x, ".weight"),
                   {absl::StrCat(p, "mlp.", x, "_proj.weight")});
      }
    }
  }
  std::set<std::string> got;
  for (const GgufTensorInfo& t : g.tensors) got.insert(t.name);
  EXPECT_EQ(got, expected);
}

TEST_F(GgufExportTest, DemoModelCarriesItsTokenizer) {
  std::unique_ptr<GgufFile> f = Export(kDemo, "stored", "demo-stored");
  ASSERT_NE(f, nullptr);
  const GgufContents& g = f->contents;
  EXPECT_EQ(*g.Find("tokenizer.ggml.model"), GgufValue::Str("gpt2"));
  EXPECT_EQ(*g.Find("tokenizer.ggml.pre"), GgufValue::Str("qwen2"));
  const GgufValue& tokens = *g.Find("tokenizer.ggml.tokens");
  // 4,343 BPE ids, the three special tokens, then the six added non-special
  // tool and reasoning tags (models/demo/tokenizer.json).
  ASSERT_EQ(tokens.size(), 4352u);
  EXPECT_EQ(tokens.strings[4343], "<|endoftext|>");
  EXPECT_EQ(tokens.strings[4345], "<|im_end|>");
  EXPECT_EQ(tokens.strings[4348], "<tool_call>");
  const GgufValue& types = *g.Find("tokenizer.ggml.token_type");
  EXPECT_EQ(types.ints[4343], 3);  // control
  EXPECT_EQ(types.ints[0], 1);     // normal
  EXPECT_EQ(g.Find("tokenizer.ggml.merges")->size(), 4087u);
  EXPECT_EQ(*g.Find("tokenizer.ggml.eos_token_id"), GgufValue::U32(4345));
  EXPECT_EQ(*g.Find("mimo2.block_count"), GgufValue::U32(15));  // 12 + 3 MTP
  // Sinks on SWA layers only; full layer 5 has none.
  EXPECT_NE(g.FindTensor("blk.0.attn_sinks.weight"), nullptr);
  EXPECT_EQ(g.FindTensor("blk.5.attn_sinks.weight"), nullptr);
  std::unique_ptr<Checkpoint> ck = *Checkpoint::Open(kDemo);
  EXPECT_TRUE(g.FindTensor("blk.3.attn_q.weight")->data ==
              Bytes(*ck->Find("model.layers.3.self_attn.q_proj.weight")));
}

TEST_F(GgufExportTest, Fp8ExportsExactlyAsItsBf16Twin) {
  // flash-bf16 holds flash-fp8's weights rounded to the same FP8 grid, so
  // the dequantised F32 export equals the BF16 one's, byte for byte.
  std::unique_ptr<GgufFile> fp8 = Export(Mini("flash-fp8"), "f32", "flash-fp8-f32");
  std::unique_ptr<GgufFile> bf16 = Export(Mini("flash-bf16"), "f32", "flash-bf16-f32");
  ASSERT_NE(fp8, nullptr);
  ASSERT_NE(bf16, nullptr);
  ASSERT_EQ(fp8->contents.tensors.size(), bf16->contents.tensors.size());
  for (const GgufTensorInfo& t : bf16->contents.tensors) {
    const GgufTensorInfo* u = fp8->contents.FindTensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->ne, t.ne) << t.name;
    EXPECT_EQ(u->type, GgmlType::kF32) << t.name;
    EXPECT_TRUE(u->data == t.data) << t.name;
  }
  // The native-config layout of the same weights exports the same file.
  std::unique_ptr<GgufFile> native = Export(Mini("flash-native"), "f32", "flash-native-f32");
  ASSERT_NE(native, nullptr);
  for (const GgufTensorInfo& t : bf16->contents.tensors) {
    EXPECT_TRUE(native->contents.FindTensor(t.name)->data == t.data) << t.name;
  }
  for (const char* key : {"mimo2.attention.head_count_kv", "mimo2.rope.freq_base_swa",
                          "mimo2.attention.sliding_window_pattern"}) {
    EXPECT_EQ(*native->contents.Find(key), *bf16->contents.Find(key)) << key;
  }
  // As stored, FP8 has no GGUF type: a clear error.
  absl::StatusOr<GgufExportSummary> s =
      ExportGguf(Mini("flash-fp8"), *root_ + "/x.gguf", {.dtype = "stored"});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("FP8"));
}

TEST_F(GgufExportTest, FusedQkvIsRegroupedToQThenKThenV) {
  std::unique_ptr<GgufFile> f = Export(Mini("v2.5-fused-fp8"), "f32", "fused-f32");
  ASSERT_NE(f, nullptr);
  std::unique_ptr<Checkpoint> ck = *Checkpoint::Open(Mini("v2.5-fused-fp8"));
  const ModelConfig& c = ck->config();
  const AttentionConfig& a = c.attention(0);
  const GgufTensorInfo* t = f->contents.FindTensor("blk.0.attn_qkv.weight");
  ASSERT_NE(t, nullptr);
  const int64_t q = a.num_heads * a.head_dim, k = a.num_kv_heads * a.head_dim;
  ASSERT_EQ(t->ne, (std::vector<int64_t>{c.hidden_size, q + k + a.num_kv_heads * a.v_head_dim}));
  // Row r of group g's K block must be row (g * k/G + r) of the K rows.
  const int G = c.qkv_groups();
  ASSERT_GT(G, 1);
  const WeightPart fused = *ck->Weight("model.layers.0.self_attn.qkv_proj.weight");
  const FusedQkvParts parts = *SplitFusedQkv(c, a, fused);
  ASSERT_EQ(static_cast<int>(parts.k.size()), G);
  const std::vector<float> all = Floats(*t);
  const int64_t H = c.hidden_size;
  // The exporter's values for group 1's first K row.
  const WeightPart& k1 = parts.k[1];
  const int64_t row = q + k / G;  // K row k/G lives in group 1
  // Dequantise that row independently.
  for (int64_t col = 0; col < H; ++col) {
    const uint8_t byte = static_cast<const uint8_t*>(k1.data)[col];
    float s;
    std::memcpy(&s, k1.scale + (k1.row0 / k1.block_out) * k1.scale_cols + col / k1.block_in, 4);
    ASSERT_EQ(all[row * H + col], Fp8E4M3ToF32(byte) * s) << col;
  }
}

TEST_F(GgufExportTest, WhatMimo2CannotExpressIsNamed) {
  const std::string base = Tiny(kv::DType::kF32);
  auto with = [&](const std::string& tag, auto edit) {
    ModelConfig c = *BuiltinConfig("tiny", kDemoVocab);
    edit(c);
    const std::string dir = *root_ + "/bad-" + tag;
    EXPECT_TRUE(WriteRandomCheckpoint(c, 7, dir, kTokenizer).ok());
    return ExportGguf(dir, dir + ".gguf", {}).status();
  };
  EXPECT_THAT(std::string(with("scale", [](ModelConfig& c) {
                            c.routed_scaling_factor = 2.5;
                          }).message()),
              HasSubstr("routed_scaling_factor"));
  EXPECT_THAT(std::string(with("norm", [](ModelConfig& c) {
                            c.norm_topk_prob = false;
                          }).message()),
              HasSubstr("norm_topk_prob"));
  EXPECT_THAT(std::string(with("heads", [](ModelConfig& c) {
                            c.swa.v_head_dim = 16;
                          }).message()),
              HasSubstr("v_head_dim"));
  // No tokenizer.json.
  const std::string bare = *root_ + "/bare";
  ASSERT_TRUE(WriteRandomCheckpoint(*BuiltinConfig("tiny", kDemoVocab), 7, bare).ok());
  EXPECT_THAT(std::string(ExportGguf(bare, bare + ".gguf", {}).status().message()),
              HasSubstr("tokenizer.json"));
  EXPECT_THAT(std::string(ExportGguf(base, base + ".gguf", {.dtype = "q4"}).status().message()),
              HasSubstr("q4"));
  // Normalizers: NFC is accepted (llama.cpp does not normalize; a warning
  // says so), any other is refused by name.
  const std::string json = ReadAll(base + "/tokenizer.json");
  for (const char* normalizer : {"{\"type\": \"NFC\"}", "{\"type\": \"Lowercase\"}"}) {
    std::string edited = json;
    const size_t at = edited.find("\"normalizer\": null");
    ASSERT_NE(at, std::string::npos);
    edited.replace(at, std::strlen("\"normalizer\": null"),
                   absl::StrCat("\"normalizer\": ", normalizer));
    std::ofstream(base + "/tokenizer.json", std::ios::trunc) << edited;
    const absl::Status s = ExportGguf(base, base + ".gguf", {}).status();
    if (absl::StrContains(normalizer, "NFC")) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_THAT(std::string(s.message()), HasSubstr("Lowercase"));
    }
  }
  std::ofstream(base + "/tokenizer.json", std::ios::trunc) << json;
}

}  // namespace
}  // namespace swaserve::model
