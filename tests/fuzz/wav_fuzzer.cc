// Fuzzes the audio input path (lib/media/audio.h, mel.h): any bytes must
// decode to mono samples at the target rate or fail with InvalidArgument —
// never crash or read out of bounds; decoded audio then goes through the
// log-mel front end. Seeds (corpus/wav/) are tiny WAVs of every sample
// format written by media_fuzz_seeds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "lib/media/audio.h"
#include "lib/media/mel.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<swaserve::media::MelFilterbank> mel =
      *swaserve::media::MelFilterbank::Create({});
  swaserve::media::WavDecodeOptions options;
  options.max_duration_seconds = 2;  // fast per input (mel is O(frames))
  absl::StatusOr<swaserve::media::AudioMono> audio =
      swaserve::media::DecodeWav(absl::MakeConstSpan(data, size), options);
  if (!audio.ok()) {
    if (!absl::IsInvalidArgument(audio.status())) __builtin_trap();
    return 0;
  }
  if (audio->sample_rate != 16000 || audio->samples.empty()) __builtin_trap();
  absl::StatusOr<swaserve::media::MelSpectrogram> spec =
      mel->Compute(audio->samples);
  if (!spec.ok()) {
    if (!absl::IsInvalidArgument(spec.status())) __builtin_trap();
    return 0;
  }
  if (spec->frames != static_cast<int>(audio->samples.size() / 160))
    __builtin_trap();
  return 0;
}
