// Audio input for the multimodal encoder: RIFF/WAVE decoding to
// mono float at the model's sample rate.
//
// Accepted: PCM integer 8 (unsigned), 16, 24 and 32 bits, IEEE float 32 and
// 64 bits, plain or WAVE_FORMAT_EXTENSIBLE, any channel count up to the limit
// and any sample rate. Channels are averaged to mono (integer samples scaled
// by 1 / 2^(bits-1), 8-bit centred on 128), then resampled with FFmpeg's
// libswresample (its default windowed-sinc filter; output length
// round(n * to / from)). Unknown chunks are skipped; a data chunk that runs
// past the end of the input is truncation. Every bad input returns
// InvalidArgument naming the problem (also audio so short that it resamples
// to no sample); the duration limit is checked from the header before any
// sample is converted.
//
// Pure and thread-safe. Deterministic on a given machine (libswresample picks
// SIMD code by CPU, so the last bits may differ across CPU models).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace swaserve::media {

// Mono samples in [-1, 1] (resampling may overshoot slightly).
struct AudioMono {
  int sample_rate = 0;
  std::vector<float> samples;

  double duration_seconds() const {
    return sample_rate > 0 ? static_cast<double>(samples.size()) / sample_rate
                           : 0.0;
  }
};

struct WavDecodeOptions {
  // Output sample rate; 0 keeps the file's rate.
  int target_sample_rate = 16000;
  // Largest input accepted, in bytes.
  int64_t max_bytes = 128 << 20;
  // Longest audio accepted (checked from the header), in seconds.
  double max_duration_seconds = 600;
  // Most channels accepted.
  int max_channels = 32;
  // Highest and lowest source sample rates accepted, in Hz.
  int max_sample_rate = 384000;
  int min_sample_rate = 1000;
};

// What a WAV header declares (the limits above checked); nothing decoded.
struct WavInfo {
  int sample_rate = 0;
  int channels = 0;
  int64_t frames = 0;  // sample frames in the data chunk
};
absl::StatusOr<WavInfo> ProbeWav(absl::Span<const uint8_t> bytes,
                                 const WavDecodeOptions& options = {});

absl::StatusOr<AudioMono> DecodeWav(absl::Span<const uint8_t> bytes,
                                    const WavDecodeOptions& options = {});

// Resamples mono float samples from `from_rate` to `to_rate` Hz with
// libswresample (identity when equal). Output length
// round(samples.size() * to_rate / from_rate). InvalidArgument for rates <= 0.
absl::StatusOr<std::vector<float>> ResampleMono(absl::Span<const float> samples,
                                                int from_rate, int to_rate);

}  // namespace swaserve::media
