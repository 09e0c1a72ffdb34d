// Still-image decoding for the multimodal encoder: PNG (libpng) and
// JPEG (libjpeg-turbo) bytes from memory to packed RGB8, the format sniffed
// from the magic bytes, never from a file name or a MIME type.
//
// Untrusted input: every decode checks the byte size first, then the
// dimensions from the header (width, height and width*height, the
// decompression-bomb limit) BEFORE any pixel buffer is allocated. Every bad
// input (empty, truncated, corrupt, unsupported format or colour space, too
// large) returns InvalidArgument with a message naming the problem; nothing
// crashes or leaks (libpng is driven through its simplified API, which
// contains its own longjmp; libjpeg's longjmp never crosses a C++ frame with
// live objects, see image_jpeg.cc).
//
// All functions are pure and thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swaserve::media {

// A decoded image: `height` rows of `width` pixels, each 3 bytes R, G, B;
// row-major, no padding: pixel (x, y) channel c is pixels[(y*width + x)*3 + c].
struct ImageRgb8 {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

enum class ImageFormat { kUnknown, kPng, kJpeg };

// "png", "jpeg" or "unknown".
absl::string_view ImageFormatName(ImageFormat format);

// The format named by the leading magic bytes (PNG: 89 50 4E 47 0D 0A 1A 0A;
// JPEG: FF D8 FF), kUnknown otherwise (including inputs shorter than that).
ImageFormat SniffImageFormat(absl::Span<const uint8_t> bytes);

struct ImageDecodeOptions {
  // Largest encoded input accepted, in bytes.
  int64_t max_bytes = 32 << 20;
  // Largest width and height accepted, each.
  int max_width = 16384;
  int max_height = 16384;
  // Largest width*height accepted: the decompression-bomb limit, checked from
  // the header before the pixel buffer (3 bytes per pixel) is allocated.
  int64_t max_pixels = 40'000'000;
  // JPEG: most scans accepted (progressive files with thousands of tiny scans
  // cost time out of proportion to their size).
  int max_jpeg_scans = 256;
  // PNG with alpha: composited onto this sRGB colour (default white).
  uint8_t alpha_background[3] = {255, 255, 255};
};

// Sniffs the format and decodes. InvalidArgument for every bad input.
absl::StatusOr<ImageRgb8> DecodeImage(absl::Span<const uint8_t> bytes,
                                      const ImageDecodeOptions& options = {});

// The format and size from the header alone (PNG IHDR, JPEG SOF), checked
// against the limits like DecodeImage; nothing is decoded. InvalidArgument
// for every bad input.
struct ImageHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0;
  int height = 0;
};
absl::StatusOr<ImageHeader> ReadImageHeader(absl::Span<const uint8_t> bytes,
                                            const ImageDecodeOptions& options = {});

// The decoders behind DecodeImage, for callers that already know the format.
// Any PNG colour type and bit depth (16-bit reduced to 8, palette expanded,
// grey replicated, alpha composited onto options.alpha_background). The file
// must contain its IEND chunk (bytes after it are ignored).
absl::StatusOr<ImageRgb8> DecodePng(absl::Span<const uint8_t> bytes,
                                    const ImageDecodeOptions& options = {});
// Baseline and progressive JPEG, greyscale or YCbCr (CMYK/YCCK are rejected).
// Strict: every libjpeg warning (corrupt data, premature end of data) is an
// error, so a truncated file never decodes to a grey-filled image.
absl::StatusOr<ImageRgb8> DecodeJpeg(absl::Span<const uint8_t> bytes,
                                     const ImageDecodeOptions& options = {});

// The header checks shared by every decoder (and the video path): OK when
// width and height are positive and within the limits, InvalidArgument
// naming the limit otherwise. `what` prefixes the message ("PNG", "video").
absl::Status CheckImageDimensions(absl::string_view what, int64_t width,
                                  int64_t height,
                                  const ImageDecodeOptions& options);

// The input-size check every decoder starts with (and the video path): OK
// when 0 < size <= max_bytes, InvalidArgument "<what>: empty input" or
// "<what>: N bytes exceeds the limit of M bytes" otherwise.
absl::Status CheckInputSize(absl::string_view what, uint64_t size,
                            int64_t max_bytes);

}  // namespace swaserve::media
