// Image preprocessing for a ViT encoder: resize to the model's
// size, normalise, cut into patches, and the placeholder-token count that
// follows. Every formula is written here so a PyTorch reference can
// reproduce it (tools/media_reference/check_preprocess.py does: patches
// within 1.2e-4 of PyTorch 1.13 in normalised units):
//
// Target size (TargetImageSize), factor f = patch_size * merge_size:
//   fixed_size > 0:  fixed_size x fixed_size (must be a multiple of f).
//   otherwise (Qwen2-VL "smart resize"; round = round-half-to-even):
//     h' = max(f, round(h / f) * f), w' = max(f, round(w / f) * f)
//     if h' * w' > max_pixels: b = sqrt(h * w / max_pixels),
//        h' = max(f, floor(h / b / f) * f), w' = max(f, floor(w / b / f) * f)
//     elif h' * w' < min_pixels: b = sqrt(min_pixels / (h * w)),
//        h' = ceil(h * b / f) * f, w' = ceil(w * b / f) * f
// Resize (ResizeBilinear): bilinear, half-pixel centres, no antialiasing,
//   edge-clamped — exactly torch.nn.functional.interpolate(x, size=(h', w'),
//   mode="bilinear", align_corners=False, antialias=False) on the uint8
//   values as float (src = max(0, (dst + 0.5) * in / out - 0.5); no rounding
//   back to uint8).
// Normalise: v = (x / 255 - mean[c]) / std[c].
// Patchify: the grid is (h' / p) x (w' / p) patches, taken in row-major grid
//   order (patch (gy, gx) is row gy * (w' / p) + gx); each row holds
//   3 * p * p values in [c][dy][dx] order (channel-major, as a Conv2d with
//   kernel = stride = p flattens its weight), i.e.
//   row[(c * p + dy) * p + dx] = v(c, gy * p + dy, gx * p + dx).
// Placeholder tokens: (h' / p) * (w' / p) / merge_size^2 (the merger joins
//   each merge_size x merge_size block of neighbouring patches into one
//   token).
//
// Pure and thread-safe; deterministic (fixed evaluation order, no threads).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/media/image.h"

namespace swaserve::media {

struct ImagePreprocessOptions {
  // ViT patch side, in pixels.
  int patch_size = 14;
  // Side of the square block of patches merged into one placeholder token.
  int merge_size = 2;
  // > 0: resize every image to fixed_size x fixed_size; 0: dynamic size.
  int fixed_size = 0;
  // Dynamic size: the pixel budget of the resized image.
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  // Per-channel normalisation (R, G, B), default CLIP's.
  float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
};

struct ImageSize {
  int width = 0;
  int height = 0;
  friend bool operator==(const ImageSize&, const ImageSize&) = default;
};

// The size an image of width x height is resized to (formula above).
// InvalidArgument for non-positive sizes or options that cannot be met.
absl::StatusOr<ImageSize> TargetImageSize(
    int width, int height, const ImagePreprocessOptions& options);

// Placeholder tokens of an image of width x height (before resizing).
absl::StatusOr<int64_t> ImagePlaceholderTokens(
    int width, int height, const ImagePreprocessOptions& options);

// A float image, height x width x 3 (HWC), row-major.
struct ImageF32 {
  int width = 0;
  int height = 0;
  std::vector<float> data;
};

// Bilinear resize (formula above); values stay in [0, 255].
ImageF32 ResizeBilinear(const ImageRgb8& image, int width, int height);

// (x / 255 - mean) / std in place.
void NormalizeImage(ImageF32& image, const ImagePreprocessOptions& options);

// [num_patches, 3 * p * p] row-major (order above).
struct ImagePatches {
  int grid_height = 0;  // patches per column
  int grid_width = 0;   // patches per row
  int patch_size = 0;
  std::vector<float> data;

  int64_t num_patches() const {
    return static_cast<int64_t>(grid_height) * grid_width;
  }
  int patch_dim() const { return 3 * patch_size * patch_size; }
};

// Cuts `image` into patches; its sides must be multiples of patch_size.
absl::StatusOr<ImagePatches> Patchify(const ImageF32& image, int patch_size);

// Resize + normalise + patchify, as above.
absl::StatusOr<ImagePatches> PreprocessImage(
    const ImageRgb8& image, const ImagePreprocessOptions& options);

}  // namespace swaserve::media
