// EncoderCore (lib/encoder/encoder_core.h): real PNG/JPEG/WAV bytes through
// lib/media and the model's towers; embeddings equal the towers' own output
// bit for bit whether batched across concurrent requests or not; the cache;
// bad input named per item.
#include "lib/encoder/encoder_core.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/media/image_preprocess.h"
#include "lib/media/mel.h"
#include "lib/media/video.h"
#include "lib/model/audio.h"
#include "lib/model/vision.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve::encoder {
namespace {

namespace fs = std::filesystem;

std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

class EncoderCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("encoder-core-test-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                        getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << "{}\n";
    ASSERT_TRUE(model::WriteRandomVisionTower(model::TinyVisionConfig(64), 3, dir_.string()).ok());
    ASSERT_TRUE(model::WriteRandomAudioTower(model::TinyAudioConfig(64), 3, dir_.string()).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<EncoderCore> Core(absl::Duration window = absl::Milliseconds(1),
                                    std::function<void(EncoderCoreOptions&)> tweak = nullptr) {
    EncoderCoreOptions o;
    o.model_dir = dir_.string();
    o.batcher.batch_window = window;
    o.image.max_pixels = 112 * 112;  // small images keep the test fast
    o.registry = &registry_;
    if (tweak) tweak(o);
    auto c = EncoderCore::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  // What the vision tower gives for `png` encoded alone.
  std::vector<float> Direct(const std::string& png) {
    auto tower = model::VisionTower::Load(dir_.string());
    auto img = media::DecodeImage(
        {reinterpret_cast<const uint8_t*>(png.data()), png.size()});
    media::ImagePreprocessOptions po;
    po.patch_size = 14;
    po.merge_size = 2;
    po.max_pixels = 112 * 112;
    auto p = media::PreprocessImage(*img, po);
    const model::VisionInput in{.patches = p->data, .grid_h = p->grid_height,
                                .grid_w = p->grid_width};
    return *(*tower)->Encode({&in, 1});
  }

  fs::path dir_;
  metrics::Registry registry_;
};

TEST_F(EncoderCoreTest, ImagesAndAudioBecomeTheTowersEmbeddingsAndAreCached) {
  auto core = Core();
  ASSERT_NE(core, nullptr);
  EXPECT_TRUE(core->has_vision() && core->has_audio());
  const std::string png = Str(media::testing::EncodePng(media::testing::MakePattern(100, 60, 1)));
  const std::string jpeg = Str(media::testing::EncodeJpeg(media::testing::MakePattern(40, 90, 2)));
  const std::string wav =
      Str(media::testing::WriteWav(media::testing::Sine(440, 1.5, 44100), 1, 44100, 16));
  std::vector<EncodeItem> items = {{Modality::kImage, png}, {Modality::kAudio, wav},
                                   {Modality::kImage, jpeg}};
  auto r = core->Encode(items);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  media::ImagePreprocessOptions po;
  po.patch_size = 14;
  po.merge_size = 2;
  po.max_pixels = 112 * 112;
  EXPECT_EQ((*r)[0].embedding->num_tokens, *media::ImagePlaceholderTokens(100, 60, po));
  EXPECT_EQ((*r)[2].embedding->num_tokens, *media::ImagePlaceholderTokens(40, 90, po));
  // 1.5 s at 44.1 kHz resampled to 16 kHz: 24,000 samples.
  EXPECT_EQ((*r)[1].embedding->num_tokens,
            media::AudioPlaceholderTokens(24000, {.conv_stride = 2, .merge_size = 2}));
  for (const EncodedItem& e : *r) {
    EXPECT_EQ(e.embedding->hidden, 64);
    EXPECT_FALSE(e.cache_hit);
    EXPECT_EQ(e.embedding->values.size(),
              static_cast<size_t>(e.embedding->num_tokens) * 64);
  }
  EXPECT_EQ((*r)[0].embedding->values, Direct(png));
  EXPECT_EQ((*r)[0].content_hash, core->ContentHash(items[0]));
  EXPECT_NE((*r)[0].content_hash, (*r)[2].content_hash);
  // Again: every item from the cache, the same values.
  auto again = core->Encode(items);
  ASSERT_TRUE(again.ok());
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE((*again)[i].cache_hit);
    EXPECT_EQ((*again)[i].embedding->values, (*r)[i].embedding->values);
  }
  EXPECT_EQ(core->cache_stats().hits, 3);
  EXPECT_EQ(core->cache_stats().misses, 3);
  EXPECT_NE(registry_.RenderText().find("swaserve_encoder_preprocess_seconds_count{modality=\"image\"} 2"),
            std::string::npos)
      << registry_.RenderText();
}

TEST_F(EncoderCoreTest, ConcurrentRequestsShareBatchesAndGetTheirOwnEmbeddings) {
  auto core = Core(absl::Milliseconds(200));
  ASSERT_NE(core, nullptr);
  constexpr int kRequests = 6;
  std::vector<std::string> pngs;
  for (int i = 0; i < kRequests; ++i) {
    pngs.push_back(Str(media::testing::EncodePng(media::testing::MakePattern(50 + 9 * i, 70, i))));
  }
  std::vector<std::vector<float>> got(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      const EncodeItem item{Modality::kImage, pngs[i]};
      auto r = core->Encode({&item, 1});
      ASSERT_TRUE(r.ok()) << r.status();
      got[i] = (*r)[0].embedding->values;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[i], Direct(pngs[i])) << "request " << i;
  // Fewer forwards than requests: items of different requests shared one.
  const std::string text = registry_.RenderText();
  const std::string key = "swaserve_encoder_batches_total{modality=\"image\",result=\"ok\"} ";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << text;
  const int batches = std::stoi(text.substr(at + key.size()));
  EXPECT_LT(batches, kRequests);
  std::printf("%d requests in %d batches\n", kRequests, batches);
}

TEST_F(EncoderCoreTest, AVideoIsItsSampledFramesThroughTheVisionTower) {
  auto core = Core();
  ASSERT_NE(core, nullptr);
  const std::string path = (dir_ / "clip.mkv").string();
  // 3 s at 10 fps, frames that encode their index; sampled at 2 fps: 6 frames.
  ASSERT_TRUE(media::testing::WriteTestVideo(path, {.width = 64, .height = 48, .fps = 10,
                                                    .num_frames = 30})
                  .ok());
  std::ifstream in(path, std::ios::binary);
  const std::string video((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const EncodeItem item{Modality::kVideo, video};
  auto r = core->Encode({&item, 1});
  ASSERT_TRUE(r.ok()) << r.status();
  media::ImagePreprocessOptions po;
  po.patch_size = 14;
  po.merge_size = 2;
  po.max_pixels = 112 * 112;
  const int64_t per_frame = *media::ImagePlaceholderTokens(64, 48, po);
  const auto& e = *(*r)[0].embedding;
  EXPECT_EQ(e.num_tokens, 6 * per_frame);
  // Frame k's embedding is the image encoding of that frame, decoded at the
  // model's input size (so the image path's resize is the identity).
  media::VideoDecodeOptions at_model_size;
  at_model_size.model_input = po;
  auto frames = media::DecodeVideoMemory(
      {reinterpret_cast<const uint8_t*>(video.data()), video.size()}, at_model_size);
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->frames.size(), 6u);
  const std::string png3 = Str(media::testing::EncodePng(*frames->frames[3]));
  const std::vector<float> frame3 = Direct(png3);
  ASSERT_EQ(frame3.size(), static_cast<size_t>(per_frame) * 64);
  EXPECT_TRUE(std::equal(frame3.begin(), frame3.end(),
                         e.values.begin() + static_cast<size_t>(3 * per_frame) * 64));
  // Cached like any item.
  auto again = core->Encode({&item, 1});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)[0].cache_hit);
  EXPECT_NE(registry_.RenderText().find("swaserve_encoder_items_total{modality=\"video\"} 6"),
            std::string::npos);
}

TEST_F(EncoderCoreTest, BadInputIsNamedPerItemAndNeverCached) {
  auto core = Core();
  ASSERT_NE(core, nullptr);
  const std::string png = Str(media::testing::EncodePng(media::testing::MakePattern(30, 30, 0)));
  auto expect_bad = [&](const std::vector<EncodeItem>& items, absl::string_view want) {
    auto r = core->Encode(items);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), want)) << r.status();
  };
  expect_bad({{Modality::kImage, png}, {Modality::kImage, png.substr(0, png.size() / 2)}},
             "item 1 (image)");
  expect_bad({{Modality::kImage, "GIF89a not supported"}}, "item 0 (image)");
  expect_bad({{Modality::kImage, ""}}, "no data");
  expect_bad({{Modality::kAudio, "RIFF....WAVEjunk"}}, "item 0 (audio)");
  expect_bad({{Modality::kVideo, "not a container"}}, "item 0 (video)");
  expect_bad({{Modality::kVideo, Str(media::testing::WriteWav(media::testing::Sine(200, 1, 16000),
                                                              1, 16000, 16))}},
             "item 0 (video)");
  // 31 s of audio: over the tiny tower's 1500 frames after conv2 (30 s).
  const std::string long_wav =
      Str(media::testing::WriteWav(media::testing::Sine(200, 31, 16000), 1, 16000, 16));
  expect_bad({{Modality::kAudio, long_wav}}, "too long");
  std::vector<uint8_t> bomb = media::testing::EncodePng(media::testing::MakePattern(8, 8, 0));
  media::testing::PatchPngDimensions(&bomb, 100000, 100000);
  expect_bad({{Modality::kImage, Str(bomb)}}, "item 0 (image)");
  // A request with a bad item fails before anything is encoded: nothing cached.
  EXPECT_EQ(core->cache_stats().entries, 0);
  // A model without towers.
  fs::remove(dir_ / "visual.safetensors");
  fs::remove(dir_ / "audio.safetensors");
  std::ofstream(dir_ / "config.json") << "{}\n";
  EncoderCoreOptions o;
  o.model_dir = dir_.string();
  auto none = EncoderCore::Create(o);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "neither")) << none.status();
}

// A small file whose header declares ~8000 samples of 4096x4096 (400 GB as
// full-size RGB): refused from its header before any frame is decoded.
TEST_F(EncoderCoreTest, AVideoBombIsRefusedBeforeDecoding) {
  auto core = Core();
  ASSERT_NE(core, nullptr);
  const std::string path = (dir_ / "bomb.mkv").string();
  ASSERT_TRUE(media::testing::WriteTestVideo(path, {.width = 4096, .height = 4096, .fps = 1,
                                                    .num_frames = 2, .frame_step = 3999,
                                                    .codec = "mjpeg"})
                  .ok());
  const EncodeItem item{Modality::kVideo, Str(*media::testing::ReadFileBytes(path))};
  const absl::Time start = absl::Now();
  auto r = core->Encode({&item, 1});
  const absl::Duration took = absl::Now() - start;
  std::printf("bomb (%zu bytes) refused in %.1f ms: %s\n", item.data.size(),
              absl::ToDoubleMilliseconds(took), std::string(r.status().message()).c_str());
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "item 0 (video)")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "decoded-bytes budget")) << r.status();
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(core->decoded_bytes_in_flight(), 0);
}

TEST_F(EncoderCoreTest, ARequestOverItsDecodedBytesBudgetIsRefusedBeforeDecoding) {
  const std::string png = Str(media::testing::EncodePng(media::testing::MakePattern(200, 150, 1)));
  const std::string png2 = Str(media::testing::EncodePng(media::testing::MakePattern(200, 150, 2)));
  auto probe = Core();
  ASSERT_NE(probe, nullptr);
  const int64_t one = *probe->DecodedBytes({Modality::kImage, png});
  EXPECT_GE(one, 200 * 150 * 3);
  const std::string wav =
      Str(media::testing::WriteWav(media::testing::Sine(200, 2, 16000), 1, 16000, 16));
  EXPECT_GE(*probe->DecodedBytes({Modality::kAudio, wav}), 2 * 16000 * 4);
  auto core = Core(absl::Milliseconds(1), [&](EncoderCoreOptions& o) {
    o.max_request_decoded_bytes = one + one / 2;
  });
  ASSERT_NE(core, nullptr);
  const std::vector<EncodeItem> two = {{Modality::kImage, png}, {Modality::kImage, png2}};
  auto r = core->Encode(two);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "per-request decoded-bytes budget"))
      << r.status();
  EXPECT_EQ(core->cache_stats().entries, 0);  // nothing was decoded or encoded
  // Each alone fits; once cached, both together cost nothing to decode.
  ASSERT_TRUE(core->Encode({&two[0], 1}).ok());
  ASSERT_TRUE(core->Encode({&two[1], 1}).ok());
  EXPECT_TRUE(core->Encode(two).ok());
  // The per-request budget may not exceed the encoder's.
  EncoderCoreOptions bad;
  bad.model_dir = dir_.string();
  bad.max_request_decoded_bytes = bad.max_decoded_bytes_in_flight + 1;
  EXPECT_FALSE(EncoderCore::Create(bad).ok());
}

}  // namespace
}  // namespace swaserve::encoder
