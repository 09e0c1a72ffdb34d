#include "lib/media/mel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace swaserve::media {
namespace {

// librosa's Slaney mel scale (htk=False).
constexpr double kFSp = 200.0 / 3.0;
constexpr double kMinLogHz = 1000.0;
constexpr double kMinLogMel = kMinLogHz / kFSp;  // 15

double LogStep() { return std::log(6.4) / 27.0; }

double HzToMel(double hz) {
  if (hz >= kMinLogHz) return kMinLogMel + std::log(hz / kMinLogHz) / LogStep();
  return hz / kFSp;
}

double MelToHz(double mel) {
  if (mel >= kMinLogMel)
    return kMinLogHz * std::exp(LogStep() * (mel - kMinLogMel));
  return kFSp * mel;
}

// librosa.filters.mel(sr, n_fft, n_mels), norm="slaney", as [n_mels][bins].
std::vector<float> SlaneyMelFilters(int sample_rate, int n_fft, int n_mels) {
  const int bins = n_fft / 2 + 1;
  std::vector<double> fft_freqs(bins);
  for (int k = 0; k < bins; ++k) {
    fft_freqs[k] = (sample_rate / 2.0) * k / (bins - 1);  // linspace(0, sr/2)
  }
  const double mel_min = HzToMel(0.0);
  const double mel_max = HzToMel(sample_rate / 2.0);
  std::vector<double> mel_f(n_mels + 2);
  for (int i = 0; i < n_mels + 2; ++i) {
    mel_f[i] = MelToHz(mel_min + (mel_max - mel_min) * i / (n_mels + 1));
  }
  std::vector<float> filters(static_cast<size_t>(n_mels) * bins);
  for (int m = 0; m < n_mels; ++m) {
    const double fdiff0 = mel_f[m + 1] - mel_f[m];
    const double fdiff1 = mel_f[m + 2] - mel_f[m + 1];
    const double enorm = 2.0 / (mel_f[m + 2] - mel_f[m]);
    for (int k = 0; k < bins; ++k) {
      const double lower = -(mel_f[m] - fft_freqs[k]) / fdiff0;
      const double upper = (mel_f[m + 2] - fft_freqs[k]) / fdiff1;
      filters[static_cast<size_t>(m) * bins + k] =
          static_cast<float>(std::max(0.0, std::min(lower, upper)) * enorm);
    }
  }
  return filters;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MelFilterbank>> MelFilterbank::Create(
    const MelOptions& options) {
  if (options.sample_rate <= 0 || options.n_fft < 2 ||
      options.hop_length <= 0 || options.n_mels <= 0 ||
      options.n_mels > options.n_fft / 2 + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mel: bad options sample_rate=", options.sample_rate,
        " n_fft=", options.n_fft, " hop_length=", options.hop_length,
        " n_mels=", options.n_mels));
  }
  std::unique_ptr<MelFilterbank> mel(new MelFilterbank(options));
  const int n = options.n_fft;
  const int bins = n / 2 + 1;
  mel->bins_ = bins;
  mel->window_.resize(n);
  for (int i = 0; i < n; ++i) {
    mel->window_[i] =
        static_cast<float>(0.5 - 0.5 * std::cos(2 * std::numbers::pi * i / n));
  }
  mel->fft_ = std::make_unique<Fft>(n);
  mel->filters_ = SlaneyMelFilters(options.sample_rate, n, options.n_mels);
  // Each filter's non-zero bins (a triangle): [first_bin_, end_bin_).
  mel->first_bin_.assign(options.n_mels, 0);
  mel->end_bin_.assign(options.n_mels, 0);
  for (int m = 0; m < options.n_mels; ++m) {
    const float* f = &mel->filters_[static_cast<size_t>(m) * bins];
    int first = 0, end = bins;
    while (first < bins && f[first] == 0.0f) ++first;
    while (end > first && f[end - 1] == 0.0f) --end;
    mel->first_bin_[m] = first;
    mel->end_bin_[m] = end;
  }
  return mel;
}

absl::StatusOr<MelSpectrogram> MelFilterbank::Compute(
    absl::Span<const float> samples) const {
  const int n = options_.n_fft;
  const int half = n / 2;
  const int64_t len = static_cast<int64_t>(samples.size());
  if (len <= half) {
    return absl::InvalidArgumentError(absl::StrCat("mel: audio too short (",
                                                   len, " samples; more than ",
                                                   half, " needed)"));
  }
  if (len > options_.max_samples) {
    return absl::InvalidArgumentError(absl::StrCat("mel: audio too long (", len,
                                                   " samples; limit ",
                                                   options_.max_samples, ")"));
  }
  const int64_t frames = len / options_.hop_length;
  const int bins = bins_;
  const int n_mels = options_.n_mels;
  MelSpectrogram out{.frames = static_cast<int>(frames), .n_mels = n_mels};
  out.data.resize(static_cast<size_t>(frames) * n_mels);
  std::vector<Complex> x(n), spectrum(n);
  std::vector<float> power(bins);
  float max_log = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < frames; ++t) {
    // Reflect padding: padded index j maps to sample |j - half| mirrored at
    // both ends (numpy/torch "reflect": no edge repeat).
    for (int i = 0; i < n; ++i) {
      int64_t j = t * options_.hop_length + i - half;
      if (j < 0) j = -j;
      if (j >= len) j = 2 * (len - 1) - j;
      x[i] = {samples[j] * window_[i], 0.0f};
    }
    fft_->Forward(x.data(), spectrum.data());
    for (int k = 0; k < bins; ++k) {
      power[k] =
          spectrum[k].re * spectrum[k].re + spectrum[k].im * spectrum[k].im;
    }
    float* row = &out.data[static_cast<size_t>(t) * n_mels];
    for (int m = 0; m < n_mels; ++m) {
      const float* f = &filters_[static_cast<size_t>(m) * bins];
      float sum = 0;
      for (int k = first_bin_[m]; k < end_bin_[m]; ++k) sum += f[k] * power[k];
      row[m] = std::log10(std::max(sum, 1e-10f));
      max_log = std::max(max_log, row[m]);
    }
  }
  const float floor = max_log - 8.0f;
  for (float& v : out.data) v = (std::max(v, floor) + 4.0f) / 4.0f;
  return out;
}

int64_t AudioPlaceholderTokens(int64_t num_samples,
                               const AudioTokenOptions& options) {
  if (num_samples <= 0 || options.hop_length <= 0 || options.conv_stride <= 0 ||
      options.merge_size <= 0) {
    return 0;
  }
  const int64_t frames = num_samples / options.hop_length;
  const int64_t conv = (frames + options.conv_stride - 1) / options.conv_stride;
  return (conv + options.merge_size - 1) / options.merge_size;
}

}  // namespace swaserve::media
