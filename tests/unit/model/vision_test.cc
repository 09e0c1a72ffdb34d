// The vision tower (lib/model/vision.h) against the PyTorch reference's golden
// embeddings (tools/reference/vision_reference.py), batched vs unbatched bit
// for bit, and its config and input errors.
#include "lib/model/vision.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;

// One directory per test and process (parallel ctest runs).
class VisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("vision-test-", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                        "-", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << "{\"model_type\": \"test\"}\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

uint64_t Fnv1a64(const std::string& data) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : data) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// The fixture's input formula (vision_reference.py).
std::vector<float> Patches(int image, int n, int dim) {
  std::vector<float> x(static_cast<size_t>(n) * dim);
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < dim; ++c) {
      x[static_cast<size_t>(r) * dim + c] = static_cast<float>(
          std::sin(0.37 * r + 0.11 * c + 0.05 * image) * (1 + 0.5 * std::cos(0.013 * c * (image + 1))));
    }
  }
  return x;
}

TEST_F(VisionTest, EmbeddingsMatchThePyTorchReference) {
  const std::string text = ReadFile(fs::path(SWASERVE_SOURCE_DIR) /
                                    "tests/fixtures/model/vision_tiny_golden.json");
  ASSERT_FALSE(text.empty());
  const nlohmann::json golden = nlohmann::json::parse(text);
  const VisionConfig config = TinyVisionConfig(64);
  ASSERT_TRUE(WriteRandomVisionTower(config, golden["seed"].get<uint64_t>(), dir_.string()).ok());
  // The same weights as the reference saw (else the generator changed:
  // regenerate the fixture, tools/reference/vision_reference.py).
  EXPECT_EQ(absl::StrFormat("%016x", Fnv1a64(ReadFile(dir_ / "visual.safetensors"))),
            golden["visual_fnv1a64"].get<std::string>());
  absl::StatusOr<std::unique_ptr<VisionTower>> tower = VisionTower::Load(dir_.string());
  ASSERT_TRUE(tower.ok()) << tower.status();
  EXPECT_EQ((*tower)->config(), config);
  const int dim = 3 * config.patch_size * config.patch_size;
  double worst = 0;
  int image = 0;
  for (const auto& im : golden["images"]) {
    const int gh = im["grid_h"].get<int>(), gw = im["grid_w"].get<int>();
    const std::vector<float> x = Patches(image, gh * gw, dim);
    const VisionInput in{.patches = x, .grid_h = gh, .grid_w = gw};
    absl::StatusOr<std::vector<float>> got = (*tower)->Encode({&in, 1});
    ASSERT_TRUE(got.ok()) << got.status();
    const auto& want = im["embeddings"];
    ASSERT_EQ(static_cast<int64_t>(want.size()), (*tower)->Tokens(gh, gw));
    ASSERT_EQ(got->size(), want.size() * config.out_hidden_size);
    for (size_t t = 0; t < want.size(); ++t) {
      for (int j = 0; j < config.out_hidden_size; ++j) {
        const double diff =
            std::abs((*got)[t * config.out_hidden_size + j] - want[t][j].get<double>());
        worst = std::max(worst, diff);
        ASSERT_LE(diff, 1e-4) << "image " << image << " token " << t << " dim " << j;
      }
    }
    ++image;
  }
  EXPECT_EQ(image, 3);
  std::printf("vision tower vs PyTorch (float64): max |diff| %.3g\n", worst);
}

TEST_F(VisionTest, BatchedEqualsUnbatchedBitForBit) {
  const VisionConfig config = TinyVisionConfig(64);
  ASSERT_TRUE(WriteRandomVisionTower(config, 11, dir_.string()).ok());
  auto tower = VisionTower::Load(dir_.string());
  ASSERT_TRUE(tower.ok()) << tower.status();
  const int dim = 3 * config.patch_size * config.patch_size;
  const std::vector<std::pair<int, int>> grids = {{4, 6}, {10, 8}, {2, 2}, {12, 12}};
  std::vector<std::vector<float>> xs;
  std::vector<VisionInput> ins;
  for (size_t i = 0; i < grids.size(); ++i) {
    xs.push_back(Patches(static_cast<int>(i) + 5, grids[i].first * grids[i].second, dim));
  }
  for (size_t i = 0; i < grids.size(); ++i) {
    ins.push_back({.patches = xs[i], .grid_h = grids[i].first, .grid_w = grids[i].second});
  }
  absl::StatusOr<std::vector<float>> batched = (*tower)->Encode(ins);
  ASSERT_TRUE(batched.ok()) << batched.status();
  std::vector<float> alone;
  for (const VisionInput& in : ins) {
    absl::StatusOr<std::vector<float>> one = (*tower)->Encode({&in, 1});
    ASSERT_TRUE(one.ok());
    alone.insert(alone.end(), one->begin(), one->end());
  }
  ASSERT_EQ(batched->size(), alone.size());
  EXPECT_EQ(0, std::memcmp(batched->data(), alone.data(), alone.size() * sizeof(float)));
  // Windowed layers see only their window: a patch outside every window of
  // token 0's patches changes token 0 only through full layers, so turning
  // every layer windowed makes token 0 of a 12x12 image independent of the
  // far corner.
  VisionConfig windowed = config;
  windowed.fullatt_block_indexes.clear();
  fs::path d2 = dir_ / "windowed";
  fs::create_directories(d2);
  std::ofstream(d2 / "config.json") << "{}\n";
  ASSERT_TRUE(WriteRandomVisionTower(windowed, 11, d2.string()).ok());
  auto wt = VisionTower::Load(d2.string());
  ASSERT_TRUE(wt.ok()) << wt.status();
  std::vector<float> x = Patches(1, 144, dim);
  const VisionInput a{.patches = x, .grid_h = 12, .grid_w = 12};
  auto ya = (*wt)->Encode({&a, 1});
  std::vector<float> x2 = x;
  for (int c = 0; c < dim; ++c) x2[static_cast<size_t>(143) * dim + c] += 1.0f;
  const VisionInput b{.patches = x2, .grid_h = 12, .grid_w = 12};
  auto yb = (*wt)->Encode({&b, 1});
  ASSERT_TRUE(ya.ok() && yb.ok());
  const int o = config.out_hidden_size;
  EXPECT_EQ(0, std::memcmp(ya->data(), yb->data(), o * sizeof(float)));  // token 0
  EXPECT_NE(0, std::memcmp(ya->data() + ya->size() - o, yb->data() + yb->size() - o,
                           o * sizeof(float)));  // the last token sees the change
  // With the full layers back, token 0 sees it too.
  auto fa = (*tower)->Encode({&a, 1});
  auto fb = (*tower)->Encode({&b, 1});
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_NE(0, std::memcmp(fa->data(), fb->data(), o * sizeof(float)));
}

TEST_F(VisionTest, BadConfigsAndInputsAreNamed) {
  EXPECT_EQ(VisionConfig::FromConfigJson("{}", "c").status().code(), absl::StatusCode::kNotFound);
  auto bad = [](const std::string& vc) {
    return std::string(
        VisionConfig::FromConfigJson(absl::StrCat("{\"vision_config\": ", vc, "}"), "c.json")
            .status()
            .message());
  };
  const std::string ok =
      R"("patch_size": 14, "hidden_size": 64, "depth": 2, "num_heads": 4, )"
      R"("intermediate_size": 8, "out_hidden_size": 16)";
  EXPECT_TRUE(VisionConfig::FromConfigJson(absl::StrCat("{\"vision_config\": {", ok, "}}"), "c")
                  .ok());
  EXPECT_NE(bad(R"({"patch_size": 14})").find("hidden_size is missing"), std::string::npos);
  EXPECT_NE(bad(absl::StrCat("{", ok, R"(, "window_size": 100})")).find("window_size"),
            std::string::npos);
  EXPECT_NE(bad(absl::StrCat("{", ok, R"(, "fullatt_block_indexes": [2]})")).find("not a block"),
            std::string::npos);
  EXPECT_NE(bad(absl::StrCat("{", ok, R"(, "num_heads": 3})")).find("num_heads"),
            std::string::npos);
  EXPECT_NE(bad(R"("x")").find("must be an object"), std::string::npos);
  // A missing tensor is named.
  fs::remove(dir_ / "visual.safetensors");
  ASSERT_TRUE(WriteRandomVisionTower(TinyVisionConfig(64), 3, dir_.string()).ok());
  {
    std::vector<std::pair<std::string, std::vector<float>>> none;
    auto t = VisionTower::FromTensors(TinyVisionConfig(64), none);
    EXPECT_TRUE(absl::StrContains(t.status().message(), "tensor visual.") &&
                absl::StrContains(t.status().message(), " is missing"))
        << t.status();
  }
  auto tower = VisionTower::Load(dir_.string());
  ASSERT_TRUE(tower.ok());
  const std::vector<float> x(588 * 6);
  const VisionInput odd{.patches = x, .grid_h = 3, .grid_w = 2};
  EXPECT_EQ((*tower)->Encode({&odd, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  const VisionInput mismatch{.patches = x, .grid_h = 2, .grid_w = 2};
  EXPECT_EQ((*tower)->Encode({&mismatch, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  const VisionInput empty{.patches = {}, .grid_h = 0, .grid_w = 2};
  EXPECT_EQ((*tower)->Encode({&empty, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::model
