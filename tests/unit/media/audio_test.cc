#include "lib/media/audio.h"

#include <cmath>
#include <numbers>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve::media {
namespace {

using ::testing::HasSubstr;
using testing::Sine;
using testing::WriteWav;

std::string ErrorOf(const std::vector<uint8_t>& wav,
                    const WavDecodeOptions& options = {}) {
  absl::StatusOr<AudioMono> out = DecodeWav(wav, options);
  if (out.ok()) return "OK";
  EXPECT_TRUE(absl::IsInvalidArgument(out.status())) << out.status();
  return std::string(out.status().message());
}

TEST(WavDecode, EverySampleFormatDecodesToTheSameSignal) {
  const std::vector<float> sine = Sine(440, 0.05, 16000);
  struct Case {
    int bits, format;
    bool extensible;
    float tolerance;
  };
  for (const Case& c :
       {Case{8, 1, false, 1.0f / 100}, Case{16, 1, false, 1e-4f},
        Case{24, 1, false, 1e-6f}, Case{32, 1, true, 1e-6f},
        Case{32, 3, false, 0.0f}, Case{32, 3, true, 0.0f}}) {
    absl::StatusOr<AudioMono> out =
        DecodeWav(WriteWav(sine, 1, 16000, c.bits, c.format, c.extensible));
    ASSERT_TRUE(out.ok()) << out.status() << " bits " << c.bits;
    EXPECT_EQ(out->sample_rate, 16000);
    ASSERT_EQ(out->samples.size(), sine.size());
    for (size_t i = 0; i < sine.size(); ++i) {
      ASSERT_NEAR(out->samples[i], sine[i], c.tolerance) << c.bits << " " << i;
    }
  }
}

TEST(WavDecode, ChannelsAreAveragedToMono) {
  const std::vector<float> sine = Sine(300, 0.02, 8000);
  std::vector<float> same, opposite, three;
  for (float v : sine) {
    same.insert(same.end(), {v, v});
    opposite.insert(opposite.end(), {v, -v});
    three.insert(three.end(), {v, v, v});
  }
  WavDecodeOptions keep;
  keep.target_sample_rate = 0;
  absl::StatusOr<AudioMono> a = DecodeWav(WriteWav(same, 2, 8000, 16), keep);
  absl::StatusOr<AudioMono> b =
      DecodeWav(WriteWav(opposite, 2, 8000, 32, 3), keep);
  absl::StatusOr<AudioMono> c = DecodeWav(WriteWav(three, 3, 8000, 24), keep);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->sample_rate, 8000);
  ASSERT_EQ(a->samples.size(), sine.size());
  for (size_t i = 0; i < sine.size(); ++i) {
    EXPECT_NEAR(a->samples[i], sine[i], 1e-4);
    EXPECT_NEAR(b->samples[i], 0.0f, 1e-7);
    EXPECT_NEAR(c->samples[i], sine[i], 1e-6);
  }
}

TEST(WavDecode, ResamplesToTheTargetRateKeepingThePitch) {
  for (int rate : {8000, 22050, 44100, 48000}) {
    const std::vector<float> sine = Sine(440, 0.5, rate);
    absl::StatusOr<AudioMono> out = DecodeWav(WriteWav(sine, 1, rate, 16));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->sample_rate, 16000);
    EXPECT_EQ(out->samples.size(),
              static_cast<size_t>(std::lround(sine.size() * 16000.0 / rate)));
    const std::vector<float> ideal = Sine(440, 0.5, 16000);
    // Away from the edges (filter start-up), within the filter's ripple.
    float max_err = 0;
    for (size_t i = 200; i + 200 < ideal.size(); ++i) {
      max_err = std::max(max_err, std::abs(out->samples[i] - ideal[i]));
    }
    EXPECT_LT(max_err, 0.01) << rate;
  }
  absl::StatusOr<std::vector<float>> same =
      ResampleMono(std::vector<float>{1, 2}, 5, 5);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, (std::vector<float>{1, 2}));
  EXPECT_FALSE(ResampleMono(std::vector<float>{1}, 0, 5).ok());
}

TEST(WavDecode, BadInputsAreInvalidArgumentNamingTheProblem) {
  const std::vector<uint8_t> good =
      WriteWav(Sine(440, 0.1, 16000), 1, 16000, 16);
  EXPECT_THAT(ErrorOf({}), HasSubstr("empty"));
  EXPECT_THAT(ErrorOf({'R', 'I', 'F', 'F', 0, 0, 0, 0, 'A', 'V', 'I', ' '}),
              HasSubstr("not a RIFF/WAVE"));
  // Truncated anywhere: in the header, in fmt, in the data.
  for (size_t keep : {size_t{5}, size_t{20}, size_t{50}, good.size() - 1}) {
    EXPECT_NE(ErrorOf(std::vector<uint8_t>(good.begin(), good.begin() + keep)),
              "OK")
        << keep;
  }
  EXPECT_THAT(ErrorOf(std::vector<uint8_t>(good.begin(), good.end() - 10)),
              HasSubstr("truncated 'data'"));
  EXPECT_THAT(ErrorOf(WriteWav({0.1f}, 1, 16000, 16, /*format=*/2)),
              HasSubstr("unsupported format tag 2"));
  EXPECT_THAT(ErrorOf(WriteWav({0.1f}, 1, 16000, 64, 1)),
              HasSubstr("unsupported 64-bit PCM"));
  EXPECT_THAT(ErrorOf(WriteWav({}, 1, 16000, 16)), HasSubstr("no samples"));
  // One sample at 48 kHz is round(1/3) = 0 samples at 16 kHz.
  EXPECT_THAT(ErrorOf(WriteWav({0.1f}, 1, 48000, 16)),
              HasSubstr("audio too short"));
  EXPECT_THAT(ErrorOf(WriteWav({0.1f}, 1, 100, 16)),
              HasSubstr("sample rate 100 Hz"));
  WavDecodeOptions short_limit;
  short_limit.max_duration_seconds = 0.05;
  EXPECT_THAT(ErrorOf(good, short_limit), HasSubstr("audio too long"));
  std::vector<uint8_t> no_channels = good;
  no_channels[22] = 0;  // fmt channels
  EXPECT_THAT(ErrorOf(no_channels), HasSubstr("0 channels"));
  std::vector<uint8_t> bad_align = good;
  bad_align[32] = 3;  // fmt block align
  EXPECT_THAT(ErrorOf(bad_align), HasSubstr("block align"));
  std::vector<uint8_t> no_fmt = good;
  no_fmt[12] = 'x';  // "fmt " -> "xmt ": skipped as unknown
  EXPECT_THAT(ErrorOf(no_fmt), HasSubstr("no fmt chunk"));
}

}  // namespace
}  // namespace swaserve::media
