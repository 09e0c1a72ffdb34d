// The audio tower (lib/model/audio.h) against the PyTorch reference's golden
// embeddings (tools/reference/audio_reference.py), batched vs unbatched bit
// for bit, the placeholder count of lib/media, and its errors.
#include "lib/model/audio.h"

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
#include "lib/media/mel.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;

class AudioTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("audio-test-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                        getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << "{\"model_type\": \"test\"}\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string ReadFile(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // The fixture's input formula (audio_reference.py).
  static std::vector<float> Mel(int clip, int frames, int bins) {
    std::vector<float> x(static_cast<size_t>(frames) * bins);
    for (int t = 0; t < frames; ++t) {
      for (int c = 0; c < bins; ++c) {
        x[static_cast<size_t>(t) * bins + c] = static_cast<float>(
            std::sin(0.21 * t + 0.07 * c + 0.3 * clip) * 0.8 + 0.1 * std::cos(0.05 * c * t));
      }
    }
    return x;
  }
  fs::path dir_;
};

TEST_F(AudioTest, EmbeddingsMatchThePyTorchReference) {
  const nlohmann::json golden = nlohmann::json::parse(
      ReadFile(fs::path(SWASERVE_SOURCE_DIR) / "tests/fixtures/model/audio_tiny_golden.json"));
  const AudioConfig config = TinyAudioConfig(64);
  ASSERT_TRUE(WriteRandomAudioTower(config, golden["seed"].get<uint64_t>(), dir_.string()).ok());
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : ReadFile(dir_ / "audio.safetensors")) h = (h ^ c) * 0x100000001B3ull;
  EXPECT_EQ(absl::StrFormat("%016x", h), golden["audio_fnv1a64"].get<std::string>());
  auto tower = AudioTower::Load(dir_.string());
  ASSERT_TRUE(tower.ok()) << tower.status();
  EXPECT_EQ((*tower)->config(), config);
  double worst = 0;
  int clip = 0;
  for (const auto& c : golden["clips"]) {
    const int frames = c["frames"].get<int>();
    const std::vector<float> x = Mel(clip, frames, config.num_mel_bins);
    const AudioInput in{.mel = x, .frames = frames};
    auto got = (*tower)->Encode({&in, 1});
    ASSERT_TRUE(got.ok()) << got.status();
    const auto& want = c["embeddings"];
    ASSERT_EQ(static_cast<int64_t>(want.size()), (*tower)->Tokens(frames));
    // The placeholder count lib/media gives a clip of frames · hop samples.
    EXPECT_EQ((*tower)->Tokens(frames),
              media::AudioPlaceholderTokens(int64_t{frames} * 160,
                                            {.hop_length = 160, .conv_stride = 2,
                                             .merge_size = config.merge_size}));
    ASSERT_EQ(got->size(), want.size() * config.out_hidden_size);
    for (size_t t = 0; t < want.size(); ++t) {
      for (int j = 0; j < config.out_hidden_size; ++j) {
        const double d = std::abs((*got)[t * config.out_hidden_size + j] - want[t][j].get<double>());
        worst = std::max(worst, d);
        ASSERT_LE(d, 1e-4) << "clip " << clip << " token " << t << " dim " << j;
      }
    }
    ++clip;
  }
  EXPECT_EQ(clip, 4);
  std::printf("audio tower vs PyTorch (float64): max |diff| %.3g\n", worst);
}

TEST_F(AudioTest, BatchedEqualsUnbatchedBitForBit) {
  const AudioConfig config = TinyAudioConfig(64);
  ASSERT_TRUE(WriteRandomAudioTower(config, 5, dir_.string()).ok());
  auto tower = AudioTower::Load(dir_.string());
  ASSERT_TRUE(tower.ok()) << tower.status();
  std::vector<std::vector<float>> xs;
  const std::vector<int> frames = {50, 3, 17, 1};
  for (size_t i = 0; i < frames.size(); ++i) xs.push_back(Mel(9 + i, frames[i], 80));
  std::vector<AudioInput> ins;
  for (size_t i = 0; i < frames.size(); ++i) ins.push_back({.mel = xs[i], .frames = frames[i]});
  auto batched = (*tower)->Encode(ins);
  ASSERT_TRUE(batched.ok()) << batched.status();
  std::vector<float> alone;
  for (const AudioInput& in : ins) {
    auto one = (*tower)->Encode({&in, 1});
    ASSERT_TRUE(one.ok());
    alone.insert(alone.end(), one->begin(), one->end());
  }
  ASSERT_EQ(batched->size(), alone.size());
  EXPECT_EQ(0, std::memcmp(batched->data(), alone.data(), alone.size() * sizeof(float)));
}

TEST_F(AudioTest, BadConfigsAndInputsAreNamed) {
  EXPECT_EQ(AudioConfig::FromConfigJson("{}", "c").status().code(), absl::StatusCode::kNotFound);
  auto msg = [](const std::string& ac) {
    return std::string(
        AudioConfig::FromConfigJson(absl::StrCat("{\"audio_config\": ", ac, "}"), "c.json")
            .status()
            .message());
  };
  EXPECT_TRUE(absl::StrContains(msg(R"({"d_model": 64})"), "encoder_layers is missing"));
  EXPECT_TRUE(absl::StrContains(
      msg(R"({"d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 5, )"
          R"("encoder_ffn_dim": 8, "out_hidden_size": 8})"),
      "encoder_attention_heads"));
  AudioConfig small = TinyAudioConfig(64);
  small.max_source_positions = 10;
  ASSERT_TRUE(WriteRandomAudioTower(small, 1, dir_.string()).ok());
  auto tower = AudioTower::Load(dir_.string());
  ASSERT_TRUE(tower.ok()) << tower.status();
  const std::vector<float> x = Mel(0, 21, 80);
  const AudioInput too_long{.mel = x, .frames = 21};  // 11 frames after conv2
  auto r = (*tower)->Encode({&too_long, 1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "too long")) << r.status();
  const AudioInput fits{.mel = absl::MakeConstSpan(x).subspan(0, 20 * 80), .frames = 20};
  EXPECT_TRUE((*tower)->Encode({&fits, 1}).ok());
  const AudioInput mismatch{.mel = x, .frames = 20};
  EXPECT_EQ((*tower)->Encode({&mismatch, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  const AudioInput empty{.mel = {}, .frames = 0};
  EXPECT_EQ((*tower)->Encode({&empty, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::model
