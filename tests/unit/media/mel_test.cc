#include "lib/media/mel.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "gtest/gtest.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve::media {
namespace {

// Direct double-precision evaluation of the header's formulas.
std::vector<double> ReferenceLogMelPower(const std::vector<float>& x,
                                         const MelFilterbank& mel, int frame) {
  const MelOptions& o = mel.options();
  const int n = o.n_fft, bins = n / 2 + 1, len = static_cast<int>(x.size());
  std::vector<double> power(bins);
  for (int k = 0; k < bins; ++k) {
    double re = 0, im = 0;
    for (int i = 0; i < n; ++i) {
      int j = frame * o.hop_length + i - n / 2;
      if (j < 0) j = -j;
      if (j >= len) j = 2 * (len - 1) - j;
      const double v =
          x[j] * (0.5 - 0.5 * std::cos(2 * std::numbers::pi * i / n));
      re += v * std::cos(2 * std::numbers::pi * k * i / n);
      im -= v * std::sin(2 * std::numbers::pi * k * i / n);
    }
    power[k] = re * re + im * im;
  }
  std::vector<double> out(o.n_mels);
  for (int m = 0; m < o.n_mels; ++m) {
    double sum = 0;
    for (int k = 0; k < bins; ++k)
      sum += mel.filters()[m * bins + k] * power[k];
    out[m] = std::log10(std::max(sum, 1e-10));
  }
  return out;
}

TEST(LogMel, MatchesTheFormulaAndFindsTheTone) {
  MelOptions o;
  o.n_mels = 80;
  auto mel = MelFilterbank::Create(o);
  ASSERT_TRUE(mel.ok()) << mel.status();
  const std::vector<float> tone =
      testing::Sine(1000, 0.25, 16000, 0.5);  // 4000 samples
  absl::StatusOr<MelSpectrogram> spec = (*mel)->Compute(tone);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->frames, 4000 / 160);
  EXPECT_EQ(spec->n_mels, 80);
  // The loudest band in a middle frame is the one whose filter peaks at 1 kHz.
  const int mid = spec->frames / 2;
  const float* row = &spec->data[mid * 80];
  const int loudest = static_cast<int>(std::max_element(row, row + 80) - row);
  const int bins = 201;
  const int bin_1k = 1000 * 400 / 16000;  // 25
  int best_band = 0;
  for (int m = 0; m < 80; ++m) {
    if ((*mel)->filters()[m * bins + bin_1k] >
        (*mel)->filters()[best_band * bins + bin_1k])
      best_band = m;
  }
  EXPECT_NEAR(loudest, best_band, 1);
  // Against the double-precision formula (before the clip-wide floor, which
  // does not bind in a middle frame of the tone's loudest bands).
  float max_log = -1e9;
  std::vector<std::vector<double>> ref;
  for (int t : {0, mid, spec->frames - 1})
    ref.push_back(ReferenceLogMelPower(tone, **mel, t));
  for (float v : spec->data) max_log = std::max(max_log, v * 4 - 4);
  int i = 0;
  for (int t : {0, mid, spec->frames - 1}) {
    for (int m = 0; m < 80; ++m) {
      const double want =
          (std::max(ref[i][m], static_cast<double>(max_log) - 8) + 4) / 4;
      EXPECT_NEAR(spec->data[t * 80 + m], want, 2e-4) << t << " " << m;
    }
    ++i;
  }
  // Filters: Slaney-normalised triangles, each non-empty.
  for (int m = 0; m < 80; ++m) {
    float sum = 0;
    for (int k = 0; k < bins; ++k) sum += (*mel)->filters()[m * bins + k];
    EXPECT_GT(sum, 0) << m;
  }
}

TEST(LogMel, LimitsAndTokenCounts) {
  auto mel = MelFilterbank::Create({});
  ASSERT_TRUE(mel.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      (*mel)->Compute(std::vector<float>(200)).status()));
  EXPECT_TRUE((*mel)->Compute(std::vector<float>(201)).ok());
  MelOptions bad;
  bad.n_mels = 500;
  EXPECT_FALSE(MelFilterbank::Create(bad).ok());
  // 30 s at 16 kHz: 3000 frames, 1500 after the stride-2 conv (Whisper).
  EXPECT_EQ(AudioPlaceholderTokens(480000), 1500);
  EXPECT_EQ(AudioPlaceholderTokens(480000, {.merge_size = 4}), 375);
  EXPECT_EQ(AudioPlaceholderTokens(16000 + 160), 51);  // 101 frames -> 51
  EXPECT_EQ(AudioPlaceholderTokens(159), 0);
}

}  // namespace
}  // namespace swaserve::media
