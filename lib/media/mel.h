// Whisper-style log-mel spectrogram for the audio encoder, and the
// audio placeholder-token count. Formulas (reproduced in PyTorch by
// tools/media_reference/check_preprocess.py: within 6e-6 of torch.stft and
// librosa's Slaney filters):
//
//   window   w[n] = 0.5 - 0.5 cos(2 pi n / n_fft)        (periodic Hann,
//            torch.hann_window(n_fft))
//   STFT     centre padding: the signal is reflect-padded by n_fft / 2 on
//            both sides; frame t covers padded samples [t*hop, t*hop + n_fft);
//            power P[t][k] = |sum_n x[n] w[n] e^{-2 pi i k n / n_fft}|^2,
//            k = 0 .. n_fft/2; the last frame is dropped, as Whisper does
//            (stft[..., :-1]), leaving frames = num_samples / hop (floor).
//   mel      M = filters @ P, filters = librosa.filters.mel(sr, n_fft, n_mels)
//            (Slaney mel scale, Slaney area normalisation, fmin 0,
//            fmax sr / 2), computed in double, stored as float.
//   log      L = log10(max(M, 1e-10)); L = max(L, max(L) - 8); L = (L + 4) / 4
//            (max over the whole clip).
//   output   [frames, n_mels] row-major (Whisper's [n_mels, frames]
//            transposed).
//
// The DFT is a single-precision mixed-radix FFT (fft.h; fixed evaluation
// order), and each filter sums only its non-zero bins, so results are
// deterministic.
//
// Thread-safety: a MelFilterbank is immutable after Create; Compute may be
// called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/media/fft.h"

namespace swaserve::media {

struct MelOptions {
  int sample_rate = 16000;
  int n_fft = 400;
  int hop_length = 160;
  int n_mels = 80;
  // Most samples accepted (Compute also needs more than n_fft / 2, what
  // reflect padding needs).
  int64_t max_samples = 16000LL * 600;
};

// [frames, n_mels] row-major.
struct MelSpectrogram {
  int frames = 0;
  int n_mels = 0;
  std::vector<float> data;
};

class MelFilterbank {
 public:
  // InvalidArgument for non-positive sizes, n_fft < 2, or more mel bands
  // than frequency bins.
  static absl::StatusOr<std::unique_ptr<MelFilterbank>> Create(
      const MelOptions& options);

  // Log-mel of mono samples at options.sample_rate. InvalidArgument when
  // there are n_fft / 2 samples or fewer, or more than max_samples.
  absl::StatusOr<MelSpectrogram> Compute(absl::Span<const float> samples) const;

  // [n_mels, n_fft / 2 + 1] row-major: the mel filters (for checks).
  const std::vector<float>& filters() const { return filters_; }
  const MelOptions& options() const { return options_; }

 private:
  explicit MelFilterbank(const MelOptions& options) : options_(options) {}

  MelOptions options_;
  int bins_ = 0;
  std::vector<float> window_;   // [n_fft]
  std::unique_ptr<Fft> fft_;    // length n_fft
  std::vector<float> filters_;  // [n_mels][bins]
  std::vector<int> first_bin_;  // [n_mels]: each filter's non-zero bins
  std::vector<int> end_bin_;    // [n_mels]
};

// Audio placeholder tokens (Whisper-style encoder: two convolutions, the
// second with stride conv_stride, kernel 3 and padding 1, then merge_size
// frames pooled per token):
//   frames = num_samples / hop_length (floor; the mel frame count above)
//   tokens = ceil(ceil(frames / conv_stride) / merge_size)
struct AudioTokenOptions {
  int hop_length = 160;
  int conv_stride = 2;
  int merge_size = 1;
};
int64_t AudioPlaceholderTokens(int64_t num_samples,
                               const AudioTokenOptions& options = {});

}  // namespace swaserve::media
