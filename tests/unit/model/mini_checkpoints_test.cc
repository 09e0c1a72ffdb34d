// The mini released-layout checkpoints (lib/model/mini_checkpoints.h): each
// loads; its logits (main model and MTP) match the PyTorch reference's
// golden logits (tests/fixtures/model/mini_<layout>_golden.json, written by
// tools/reference/make_layout_golden.py) within 1e-4 of the row's scale;
// layouts of the same weights give identical logits and greedy output;
// memory follows the stored bytes.
#include "lib/model/mini_checkpoints.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/model/forward.h"
#include "tests/unit/model/golden_util.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kSeed = 25;
constexpr double kTolerance = 1e-4;

using testing_util::Fnv1a64Hex;
using testing_util::ReadFile;
using testing_util::RowRelDiff;
using testing_util::RunPrompt;
using Outputs = testing_util::ModelRun;

// KV in f32 for the golden comparison: the pools would otherwise follow
// torch_dtype (BF16), whose rounding of K and V (~1e-3) the float64
// reference does not model; what is compared here is the weights' path.
Outputs RunEngine(Engine& e, const std::vector<uint32_t>& tokens) {
  return RunPrompt(e, tokens, kv::DType::kF32, 8);
}

class MiniCheckpointsTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { root_ = new std::string(*base::MakeTempDir("mini-ckpt")); }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  // Writes (once) and returns the directory of `layout`.
  static std::string Dir(const std::string& layout) {
    const std::string dir = *root_ + "/" + layout;
    if (!fs::exists(dir + "/model.safetensors")) {
      const absl::Status s = WriteMiniCheckpoint(layout, kSeed, dir);
      EXPECT_TRUE(s.ok()) << s;
    }
    return dir;
  }
  static std::string* root_;
};
std::string* MiniCheckpointsTest::root_ = nullptr;

TEST_P(MiniCheckpointsTest, MatchesThePyTorchReference) {
  const std::string layout = GetParam();
  const std::string fixture =
      absl::StrCat(SWASERVE_SOURCE_DIR, "/tests/fixtures/model/mini_", layout, "_golden.json");
  const Json j = Json::parse(ReadFile(fixture), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << "cannot read " << fixture;
  const std::string dir = Dir(layout);
  const Json& c = j["checkpoint"];
  ASSERT_EQ(c["seed"].get<uint64_t>(), kSeed);
  ASSERT_TRUE(Fnv1a64Hex(dir + "/config.json") == c["config_fnv1a64"].get<std::string>() &&
              Fnv1a64Hex(dir + "/model.safetensors") == c["safetensors_fnv1a64"].get<std::string>())
      << "the mini checkpoint generator changed; if intended, regenerate the fixtures:\n"
         "  ninja -C build make_mini_checkpoints\n"
         "  build/tools/mini_checkpoints/make_mini_checkpoints /tmp/mini 25\n"
         "  /usr/bin/python3 tools/reference/make_layout_golden.py --mini-dir /tmp/mini "
         "--seed 25 --out-dir tests/fixtures/model";
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create({dir, 2});
  ASSERT_TRUE(e.ok()) << e.status();
  const int V = (*e)->config().vocab_size;
  int rows = 0;
  for (const Json& s : j["sequences"]) {
    const auto tokens = s["tokens"].get<std::vector<uint32_t>>();
    const auto logits = s["logits"].get<std::vector<std::vector<double>>>();
    const auto mtp = s["mtp"].get<std::vector<std::vector<double>>>();
    const Outputs out = RunEngine(**e, tokens);
    ASSERT_EQ(out.logits.size(), logits.size() * V);
    ASSERT_EQ(out.mtp_logits.size(), mtp.size() * V);
    for (size_t p = 0; p < logits.size(); ++p, ++rows) {
      EXPECT_LT(RowRelDiff(out.logits.data() + p * V, logits[p]), kTolerance)
          << layout << " position " << p;
    }
    for (size_t p = 0; p < mtp.size(); ++p, ++rows) {
      EXPECT_LT(RowRelDiff(out.mtp_logits.data() + p * V, mtp[p]), kTolerance)
          << layout << " MTP position " << p;
    }
  }
  EXPECT_GT(rows, 50);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MiniCheckpointsTest,
                         ::testing::Values("flash-bf16", "flash-fp8", "flash-native",
                                           "v2.5-fused-fp8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace_if(n.begin(), n.end(),
                                           [](char ch) { return !std::isalnum(ch); }, '_');
                           return n;
                         });

TEST_F(MiniCheckpointsTest, LayoutsOfTheSameWeightsAgreeBitForBit) {
  const std::vector<uint32_t> tokens = {3, 141, 59, 26, 5, 35, 89, 79, 32, 38, 46, 26, 43, 38};
  std::map<std::string, Outputs> out;
  std::map<std::string, size_t> bytes;
  for (const char* layout : {"flash-bf16", "flash-fp8", "flash-native"}) {
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create({Dir(layout), 1});
    ASSERT_TRUE(e.ok()) << e.status();
    out[layout] = RunEngine(**e, tokens);
    bytes[layout] = (*e)->WeightBytes();
  }
  for (const char* layout : {"flash-fp8", "flash-native"}) {
    EXPECT_EQ(std::memcmp(out[layout].logits.data(), out["flash-bf16"].logits.data(),
                          out[layout].logits.size() * 4),
              0)
        << layout;
    EXPECT_EQ(std::memcmp(out[layout].mtp_logits.data(), out["flash-bf16"].mtp_logits.data(),
                          out[layout].mtp_logits.size() * 4),
              0)
        << layout;
    EXPECT_EQ(out[layout].greedy, out["flash-bf16"].greedy) << layout;
  }
  // Stored as loaded: FP8 about half of BF16 (embeddings, lm_head, norms
  // and the ignored layer 0 MLP stay BF16).
  EXPECT_EQ(bytes["flash-native"], bytes["flash-bf16"]);
  EXPECT_LT(bytes["flash-fp8"], bytes["flash-bf16"] * 0.75);
}

// The flash-fp8 checkpoint as quantization tools write it (an empty
// packed_modules_mapping in quantization_config) loads and computes what the
// plain one does; a mapping with content is refused by name.
TEST_F(MiniCheckpointsTest, EmptyPackedModulesMappingChangesNothing) {
  const std::string plain = Dir("flash-fp8");
  const std::string tooled = *root_ + "/flash-fp8-tooled";
  fs::create_directories(tooled);
  for (const char* f : {"model.safetensors", "tokenizer.json"}) {
    if (fs::exists(plain + "/" + f)) fs::copy_file(plain + "/" + f, tooled + "/" + f);
  }
  Json config = Json::parse(ReadFile(plain + "/config.json"));
  config["quantization_config"]["packed_modules_mapping"] = Json::object();
  std::ofstream(tooled + "/config.json") << config.dump(2);
  const std::vector<uint32_t> tokens = {3, 141, 59, 26, 5, 35, 89, 79};
  absl::StatusOr<std::unique_ptr<Engine>> a = Engine::Create({plain, 1});
  absl::StatusOr<std::unique_ptr<Engine>> b = Engine::Create({tooled, 1});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const Outputs oa = RunEngine(**a, tokens);
  const Outputs ob = RunEngine(**b, tokens);
  ASSERT_EQ(oa.logits.size(), ob.logits.size());
  EXPECT_EQ(std::memcmp(oa.logits.data(), ob.logits.data(), oa.logits.size() * 4), 0);
  EXPECT_EQ(oa.greedy, ob.greedy);

  config["quantization_config"]["packed_modules_mapping"] = {
      {"qkv_proj", {"q_proj", "k_proj", "v_proj"}}};
  std::ofstream(tooled + "/config.json") << config.dump(2);
  absl::StatusOr<std::unique_ptr<Engine>> c = Engine::Create({tooled, 1});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              ::testing::HasSubstr("quantization_config.packed_modules_mapping"));
}

TEST_F(MiniCheckpointsTest, UnknownLayoutIsNamed) {
  absl::StatusOr<MiniLayout> l = FindMiniLayout("flash-int4");
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(std::string(l.status().message()), ::testing::HasSubstr("flash-fp8"));
}

}  // namespace
}  // namespace swaserve::model
