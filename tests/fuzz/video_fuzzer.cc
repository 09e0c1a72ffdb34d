// Fuzzes the video-container path (lib/media/video.h) from memory: any bytes
// must yield sampled RGB8 frames or fail with InvalidArgument — never crash,
// hang or exceed the limits. Runs the chunked path (2 chunks, one thread) so
// seeking is exercised too; the limits keep each input fast. Seeds
// (corpus/video/) are tiny Matroska/MP4/AVI files written by media_fuzz_seeds.
#include <cstddef>
#include <cstdint>

#include "lib/media/video.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  swaserve::media::VideoDecodeOptions options;
  options.sample_fps = 4;
  options.max_bytes = 1 << 20;
  options.max_duration_seconds = 30;
  options.max_frames = 16;
  options.max_decoded_frames = 64;
  options.frame_limits.max_width = 256;
  options.frame_limits.max_height = 256;
  options.frame_limits.max_pixels = 256 * 256;
  options.num_chunks = 2;
  options.num_threads = 1;
  absl::StatusOr<swaserve::media::VideoFrames> video =
      swaserve::media::DecodeVideoMemory(absl::MakeConstSpan(data, size),
                                         options);
  if (!video.ok()) {
    if (!absl::IsInvalidArgument(video.status()) &&
        !absl::IsResourceExhausted(video.status())) {
      __builtin_trap();
    }
    return 0;
  }
  if (video->frames.empty() || video->frames.size() > 16 ||
      video->frames.size() != video->sample_times.size() ||
      video->frames.size() != video->frame_times.size()) {
    __builtin_trap();
  }
  for (const auto& frame : video->frames) {
    const swaserve::media::ImageRgb8& f = *frame;
    if (f.pixels.size() != static_cast<size_t>(f.width) * f.height * 3)
      __builtin_trap();
  }
  return 0;
}
