// Test inputs for lib/media, generated in the tests (no binary fixtures):
// PNG and JPEG encoders, WAV writer, a tiny video encoder (FFmpeg), CRC
// fix-ups. Not thread-safe against concurrent use of one output; otherwise
// pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/media/image.h"

namespace swaserve::media::testing {

// A deterministic test pattern: gradients plus a checker, so resizes and
// crops are visible.
ImageRgb8 MakePattern(int width, int height, int seed = 0);

// Mean |a - b| over the bytes of two images of the same size.
double MeanAbsDiff(const ImageRgb8& a, const ImageRgb8& b);

// PNG of `image` (8-bit RGB), or of its RGBA/grey variants.
enum class PngKind { kRgb, kRgba, kGrey, kRgb16 };
std::vector<uint8_t> EncodePng(const ImageRgb8& image,
                               PngKind kind = PngKind::kRgb);
// JPEG of `image` at `quality`; greyscale encodes the luma only.
std::vector<uint8_t> EncodeJpeg(const ImageRgb8& image, int quality = 95,
                                bool progressive = false,
                                bool greyscale = false);
// Rewrites a PNG's IHDR width/height (fixing the CRC), for limit tests.
void PatchPngDimensions(std::vector<uint8_t>* png, uint32_t width,
                        uint32_t height);
// Rewrites a JPEG's SOF width/height.
void PatchJpegDimensions(std::vector<uint8_t>* jpeg, uint16_t width,
                         uint16_t height);

// A RIFF/WAVE file. format 1 = PCM integer (bits 8/16/24/32), 3 = IEEE float
// (bits 32); `extensible` writes WAVE_FORMAT_EXTENSIBLE. `interleaved` holds
// frames * channels samples in [-1, 1].
std::vector<uint8_t> WriteWav(const std::vector<float>& interleaved,
                              int channels, int sample_rate, int bits,
                              int format = 1, bool extensible = false);
// A sine of `hz` at `amplitude`, `seconds` long, one channel.
std::vector<float> Sine(double hz, double seconds, int sample_rate,
                        double amplitude = 0.5);

struct TestVideoOptions {
  int width = 64;
  int height = 48;
  int fps = 10;
  int num_frames = 30;
  int gop = 5;                  // keyframe every `gop` frames
  int frame_step = 1;           // frame i at i * frame_step / fps seconds
  std::string codec = "mpeg4";  // FFmpeg encoder name
  std::string format = "matroska";
};
// Encodes frames whose content encodes the frame index (MakePattern(w, h, i))
// into `path`.
absl::Status WriteTestVideo(const std::string& path,
                            const TestVideoOptions& options);
// Reads a whole file.
absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);
// A path under this process's temp directory (removed at normal exit).
std::string TempPath(const std::string& name);

}  // namespace swaserve::media::testing
