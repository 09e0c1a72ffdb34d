#include "lib/media/video.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/time/clock.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/media/audio.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve::media {
namespace {

using ::testing::HasSubstr;
using testing::TempPath;
using testing::TestVideoOptions;
using testing::WriteTestVideo;

// 3 s at 10 fps, a keyframe every 5 frames.
std::string MakeVideo(const std::string& name,
                      const std::string& codec = "mpeg4") {
  const std::string path = TempPath(name);
  TestVideoOptions o;
  o.codec = codec;
  const absl::Status s = WriteTestVideo(path, o);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

void ExpectSame(const VideoFrames& a, const VideoFrames& b,
                const std::string& what) {
  ASSERT_EQ(a.frames.size(), b.frames.size()) << what;
  EXPECT_EQ(a.sample_times, b.sample_times) << what;
  EXPECT_EQ(a.frame_times, b.frame_times) << what;
  for (size_t i = 0; i < a.frames.size(); ++i) {
    EXPECT_EQ(a.frames[i]->pixels, b.frames[i]->pixels) << what << " frame " << i;
  }
}

TEST(VideoDecode, SamplesTheNearestFrameAtTheRequestedRate) {
  const std::string path = MakeVideo("sample.mkv");
  VideoDecodeOptions all;
  all.sample_fps = 10;
  absl::StatusOr<VideoFrames> full = DecodeVideoFile(path, all);
  ASSERT_TRUE(full.ok()) << full.status();
  // Matroska stores the last frame's time (2.9 s) or the end (3 s).
  EXPECT_GE(full->duration_seconds, 2.9 - 1e-6);
  EXPECT_LE(full->duration_seconds, 3.0 + 1e-6);
  const auto samples = [&](double fps) {
    return static_cast<size_t>(std::ceil(full->duration_seconds * fps - 1e-9));
  };
  ASSERT_EQ(full->frames.size(), samples(10));
  for (size_t i = 0; i < full->frames.size(); ++i) {
    EXPECT_NEAR(full->frame_times[i], static_cast<double>(i) / 10, 1e-6);
    EXPECT_EQ(full->frames[i]->width, 64);
    EXPECT_EQ(full->frames[i]->height, 48);
    // Lossy (mpeg4 + 4:2:0), but clearly the i-th pattern.
    EXPECT_LT(
        testing::MeanAbsDiff(*full->frames[i], testing::MakePattern(64, 48, i)),
        12)
        << i;
  }
  VideoDecodeOptions three;
  three.sample_fps = 3;
  absl::StatusOr<VideoFrames> sampled = DecodeVideoFile(path, three);
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  ASSERT_EQ(sampled->frames.size(), 9u);  // ceil(3 s * 3 fps)
  for (int k = 0; k < 9; ++k) {
    const double t = k / 3.0;
    const int nearest =
        static_cast<int>(std::lround(t * 10));  // no exact ties here
    EXPECT_DOUBLE_EQ(sampled->sample_times[k], t);
    EXPECT_NEAR(sampled->frame_times[k], nearest / 10.0, 1e-6) << k;
    EXPECT_EQ(sampled->frames[k]->pixels, full->frames[nearest]->pixels) << k;
  }
  // Faster than the video: repeated frames; samples past the end get the last.
  VideoDecodeOptions fast;
  fast.sample_fps = 25;
  absl::StatusOr<VideoFrames> dense = DecodeVideoFile(path, fast);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->frames.size(), samples(25));
  for (size_t k = 0; k < dense->frames.size(); ++k) {
    const double nearest =
        std::min(2.9, std::round(dense->sample_times[k] * 10) / 10);
    EXPECT_NEAR(dense->frame_times[k], nearest, 1e-6) << k;
  }
}

TEST(VideoDecode, SizesThatAreNotMultiplesOf16ConvertRowByRow) {
  // libswscale's SIMD converters write whole vectors past a row's end;
  // the decoder converts into padded rows (the fuzzer found the overrun).
  const std::string path = TempPath("odd.mkv");
  TestVideoOptions o;
  o.width = 66;
  o.height = 50;
  o.num_frames = 4;
  ASSERT_TRUE(WriteTestVideo(path, o).ok());
  VideoDecodeOptions all;
  all.sample_fps = 10;
  absl::StatusOr<VideoFrames> v = DecodeVideoFile(path, all);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_FALSE(v->frames.empty());
  for (size_t i = 0; i < v->frames.size(); ++i) {
    ASSERT_EQ(v->frames[i]->width, 66);
    ASSERT_EQ(v->frames[i]->pixels.size(), 66u * 50 * 3);
    EXPECT_LT(
        testing::MeanAbsDiff(*v->frames[i],
                             testing::MakePattern(66, 50, static_cast<int>(i))),
        12)
        << i;
  }
}

TEST(VideoDecode, ChunkedParallelDecodeEqualsOnePass) {
  for (const std::string codec : {"mpeg4", "ffv1"}) {
    const std::string path = MakeVideo("chunks_" + codec + ".mkv", codec);
    absl::StatusOr<std::vector<uint8_t>> bytes = testing::ReadFileBytes(path);
    ASSERT_TRUE(bytes.ok());
    for (double fps : {2.0, 7.0}) {
      VideoDecodeOptions one;
      one.sample_fps = fps;
      absl::StatusOr<VideoFrames> single = DecodeVideoFile(path, one);
      ASSERT_TRUE(single.ok()) << single.status();
      absl::StatusOr<VideoFrames> memory = DecodeVideoMemory(*bytes, one);
      ASSERT_TRUE(memory.ok()) << memory.status();
      ExpectSame(*single, *memory, codec + " memory");
      for (int chunks : {2, 3, 5, 50}) {
        VideoDecodeOptions par = one;
        par.num_chunks = chunks;
        par.num_threads = 2;
        absl::StatusOr<VideoFrames> split = DecodeVideoMemory(*bytes, par);
        ASSERT_TRUE(split.ok()) << split.status();
        ExpectSame(*single, *split,
                   absl::StrCat(codec, " fps ", fps, " chunks ", chunks));
      }
    }
  }
}

TEST(VideoDecode, BadInputsAreInvalidArgumentNamingTheProblem) {
  auto error = [](const absl::StatusOr<VideoFrames>& r) {
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    return std::string(r.status().message());
  };
  // A container with only audio.
  const std::vector<uint8_t> wav =
      testing::WriteWav(testing::Sine(440, 0.5, 16000), 1, 16000, 16);
  VideoDecodeOptions with_wav;
  with_wav.allowed_formats = "wav";
  EXPECT_THAT(error(DecodeVideoMemory(wav, with_wav)),
              HasSubstr("no video stream"));
  // wav is not an allowed video container by default.
  EXPECT_THAT(error(DecodeVideoMemory(wav)),
              HasSubstr("cannot open the container"));
  const std::vector<uint8_t> junk(1000, 0x42);
  EXPECT_THAT(error(DecodeVideoMemory(junk)),
              HasSubstr("cannot open the container"));
  EXPECT_THAT(error(DecodeVideoMemory({})), HasSubstr("empty"));
  EXPECT_THAT(error(DecodeVideoFile(TempPath("missing.mkv"))),
              HasSubstr("cannot read"));

  const std::string path = MakeVideo("limits.mkv");
  VideoDecodeOptions o;
  o.max_duration_seconds = 1;
  EXPECT_THAT(error(DecodeVideoFile(path, o)), HasSubstr("video too long"));
  o = {};
  o.max_frames = 5;  // 3 s at 2 fps = 6
  EXPECT_THAT(error(DecodeVideoFile(path, o)), HasSubstr("too many frames"));
  o = {};
  o.frame_limits.max_width = 32;
  EXPECT_THAT(error(DecodeVideoFile(path, o)), HasSubstr("exceeds the limit"));
  o = {};
  o.max_bytes = 100;
  EXPECT_THAT(error(DecodeVideoFile(path, o)),
              HasSubstr("bytes exceeds the limit"));
  o = {};
  o.sample_fps = 0;
  EXPECT_THAT(error(DecodeVideoFile(path, o)), HasSubstr("bad options"));

  // Truncated or damaged files: a result or InvalidArgument, never a crash.
  absl::StatusOr<std::vector<uint8_t>> bytes = testing::ReadFileBytes(path);
  ASSERT_TRUE(bytes.ok());
  for (size_t keep : {size_t{16}, bytes->size() / 3, bytes->size() - 7}) {
    const std::vector<uint8_t> cut(bytes->begin(), bytes->begin() + keep);
    absl::StatusOr<VideoFrames> r = DecodeVideoMemory(cut);
    EXPECT_TRUE(r.ok() || absl::IsInvalidArgument(r.status()))
        << keep << " " << r.status();
  }
  std::vector<uint8_t> damaged = *bytes;
  for (size_t i = damaged.size() / 2; i < damaged.size() / 2 + 64; ++i)
    damaged[i] ^= 0xA5;
  absl::StatusOr<VideoFrames> r = DecodeVideoMemory(damaged);
  EXPECT_TRUE(r.ok() || absl::IsInvalidArgument(r.status())) << r.status();
}

// A Matroska file of unknown duration whose frame timestamps jump far ahead
// (found by video_fuzzer in CI: it emitted ~1.8M samples, 1.4 GB, before the
// frame count was checked). With the fuzzer's limits it is refused as too
// many frames, promptly.
TEST(VideoDecode, AnUnboundedRunStopsAtMaxFramesWhenTimestampsJump) {
  absl::StatusOr<std::vector<uint8_t>> bytes = testing::ReadFileBytes(
      std::string(SWASERVE_SOURCE_DIR) + "/tests/fuzz/corpus/video/regression-timestamp-jump.mkv");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  VideoDecodeOptions o;
  o.sample_fps = 4;
  o.max_bytes = 1 << 20;
  o.max_duration_seconds = 30;
  o.max_frames = 16;
  o.max_decoded_frames = 64;
  o.num_chunks = 2;
  absl::StatusOr<VideoFrames> r = DecodeVideoMemory(*bytes, o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("too many frames"));
}

}  // namespace
}  // namespace swaserve::media

namespace swaserve::media {
namespace {

TEST(VideoDecode, RepeatedFramesAreSharedNotCopied) {
  const std::string path = MakeVideo("shared.mkv");
  VideoDecodeOptions fast;
  fast.sample_fps = 25;  // 2.5 samples per decoded frame
  absl::StatusOr<VideoFrames> v = DecodeVideoFile(path, fast);
  ASSERT_TRUE(v.ok()) << v.status();
  int shared = 0;
  for (size_t k = 1; k < v->frames.size(); ++k) {
    if (v->frame_times[k] == v->frame_times[k - 1]) {
      EXPECT_EQ(v->frames[k].get(), v->frames[k - 1].get()) << k;
      ++shared;
    } else {
      EXPECT_NE(v->frames[k].get(), v->frames[k - 1].get()) << k;
    }
  }
  EXPECT_GT(shared, 30);
}

TEST(VideoDecode, FramesComeAtTheModelSizeWhenAsked) {
  const std::string path = TempPath("model_size.mkv");
  TestVideoOptions o;
  o.width = 320;
  o.height = 240;
  o.num_frames = 10;
  ASSERT_TRUE(WriteTestVideo(path, o).ok());
  VideoDecodeOptions d;
  d.model_input = ImagePreprocessOptions{};
  d.model_input->max_pixels = 112 * 112;
  absl::StatusOr<VideoFrames> v = DecodeVideoFile(path, d);
  ASSERT_TRUE(v.ok()) << v.status();
  const ImageSize target = *TargetImageSize(320, 240, *d.model_input);
  EXPECT_LT(target.width, 320);
  ASSERT_FALSE(v->frames.empty());
  for (size_t k = 0; k < v->frames.size(); ++k) {
    const ImageRgb8& f = *v->frames[k];
    ASSERT_EQ(f.width, target.width);
    ASSERT_EQ(f.height, target.height);
    ASSERT_EQ(f.pixels.size(), static_cast<size_t>(target.width) * target.height * 3);
    // The pattern of the frame chosen, resized; libswscale's filter, not the
    // preprocessing's, so close rather than equal.
    const int index = static_cast<int>(std::lround(v->frame_times[k] * 10));
    const ImageF32 want = ResizeBilinear(testing::MakePattern(320, 240, index), target.width,
                                         target.height);
    double diff = 0;
    for (size_t i = 0; i < f.pixels.size(); ++i) diff += std::abs(f.pixels[i] - want.data[i]);
    EXPECT_LT(diff / f.pixels.size(), 20) << k;
  }
  absl::StatusOr<VideoInfo> info = ProbeVideoMemory(*testing::ReadFileBytes(path), d);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->frame_width, target.width);
  EXPECT_EQ(info->samples, static_cast<int64_t>(v->frames.size()));
}

// The peak resident set growth of `f` (VmHWM, reset before), in bytes.
template <typename F>
int64_t PeakRssGrowth(F f) {
  auto read = [](const char* key) -> int64_t {
    FILE* in = std::fopen("/proc/self/status", "r");
    char line[256];
    int64_t kb = -1;
    while (in != nullptr && std::fgets(line, sizeof(line), in) != nullptr) {
      if (std::strncmp(line, key, std::strlen(key)) == 0) kb = std::atoll(line + std::strlen(key));
    }
    if (in != nullptr) std::fclose(in);
    return kb * 1024;
  };
  if (FILE* reset = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", reset);  // resets VmHWM to the current RSS
    std::fclose(reset);
  }
  const int64_t before = read("VmRSS:");
  f();
  return read("VmHWM:") - before;
}

// A small file whose header declares two 4096x4096 frames 3999 s apart:
// ~8000 samples at 2 fps, 400 GB of RGB if every sample were decoded at full
// size. Refused from the header before anything is decoded, quickly and
// without memory growth.
TEST(VideoDecode, AVideoBombIsRefusedFromItsHeader) {
  const std::string path = TempPath("bomb.mkv");
  TestVideoOptions o;
  o.width = 4096;
  o.height = 4096;
  o.fps = 1;
  o.num_frames = 2;
  o.frame_step = 3999;
  o.codec = "mjpeg";  // no limit on the time between frames
  ASSERT_TRUE(WriteTestVideo(path, o).ok());
  const std::vector<uint8_t> bomb = *testing::ReadFileBytes(path);
  std::printf("bomb: %zu bytes\n", bomb.size());
  absl::StatusOr<VideoInfo> info = ProbeVideoMemory(bomb, {.max_decoded_bytes = int64_t{1} << 50});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->decoded_bytes, int64_t{300} << 30);
  for (const bool model_size : {false, true}) {
    VideoDecodeOptions d;
    if (model_size) d.model_input = ImagePreprocessOptions{};
    absl::StatusOr<VideoFrames> v;
    const absl::Time start = absl::Now();
    const int64_t growth = PeakRssGrowth([&] { v = DecodeVideoMemory(bomb, d); });
    const absl::Duration took = absl::Now() - start;
    std::printf("bomb refused in %.1f ms, peak RSS growth %.1f MiB (model size %d): %s\n",
                absl::ToDoubleMilliseconds(took), growth / 1048576.0, model_size,
                std::string(v.status().message()).c_str());
    ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("decoded-bytes budget"));
    EXPECT_LT(took, absl::Seconds(2));
    EXPECT_LT(growth, int64_t{200} << 20);
  }
  // Within a budget that admits it, the samples share the two decoded frames.
  VideoDecodeOptions small;
  small.model_input = ImagePreprocessOptions{};
  small.model_input->max_pixels = 56 * 56;
  small.max_decoded_bytes = int64_t{1} << 30;
  absl::StatusOr<VideoFrames> v;
  const int64_t growth = PeakRssGrowth([&] { v = DecodeVideoMemory(bomb, small); });
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_GT(v->frames.size(), 7900u);
  EXPECT_EQ(v->frames.front().get(), v->frames[3000].get());
  EXPECT_LT(growth, int64_t{400} << 20);
  std::printf("admitted at 56x56: %zu samples, peak RSS growth %.1f MiB\n", v->frames.size(),
              growth / 1048576.0);
}

}  // namespace
}  // namespace swaserve::media
