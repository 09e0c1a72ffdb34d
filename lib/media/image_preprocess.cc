#include "lib/media/image_preprocess.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace swaserve::media {
namespace {

// Source index and weight of one output coordinate (torch's
// area_pixel_compute_source_index + the linear neighbours).
struct Tap {
  int i0 = 0;
  int i1 = 0;
  float w1 = 0;  // weight of i1; i0 gets 1 - w1
};

std::vector<Tap> Taps(int in, int out) {
  std::vector<Tap> taps(out);
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int d = 0; d < out; ++d) {
    const float src = std::max(0.0f, (d + 0.5f) * scale - 0.5f);
    const int i0 = std::min(static_cast<int>(src), in - 1);
    taps[d] = {i0, std::min(i0 + 1, in - 1), src - static_cast<float>(i0)};
  }
  return taps;
}

absl::Status CheckOptions(const ImagePreprocessOptions& o) {
  if (o.patch_size <= 0 || o.merge_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image preprocess: patch_size ", o.patch_size,
                     " and merge_size ", o.merge_size, " must be positive"));
  }
  const int f = o.patch_size * o.merge_size;
  if (o.fixed_size < 0 || o.fixed_size % f != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image preprocess: fixed_size ", o.fixed_size,
                     " is not a multiple of patch_size * merge_size = ", f));
  }
  if (o.fixed_size == 0 && (o.min_pixels <= 0 || o.max_pixels < o.min_pixels ||
                            o.max_pixels < static_cast<int64_t>(f) * f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("image preprocess: bad pixel budget [", o.min_pixels, ", ",
                     o.max_pixels, "] for factor ", f));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImageSize> TargetImageSize(
    int width, int height, const ImagePreprocessOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image preprocess: zero-size image (", width, "x", height, ")"));
  }
  if (options.fixed_size > 0) {
    return ImageSize{options.fixed_size, options.fixed_size};
  }
  const double f = options.patch_size * options.merge_size;
  const double h = height, w = width;
  // std::nearbyint rounds half to even under the default rounding mode, as
  // Python's round() does.
  double hb = std::max(f, std::nearbyint(h / f) * f);
  double wb = std::max(f, std::nearbyint(w / f) * f);
  if (hb * wb > static_cast<double>(options.max_pixels)) {
    const double beta =
        std::sqrt(h * w / static_cast<double>(options.max_pixels));
    hb = std::max(f, std::floor(h / beta / f) * f);
    wb = std::max(f, std::floor(w / beta / f) * f);
  } else if (hb * wb < static_cast<double>(options.min_pixels)) {
    const double beta =
        std::sqrt(static_cast<double>(options.min_pixels) / (h * w));
    hb = std::ceil(h * beta / f) * f;
    wb = std::ceil(w * beta / f) * f;
  }
  if (hb > (1 << 20) || wb > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image preprocess: ", width, "x", height, " resizes out of range"));
  }
  return ImageSize{static_cast<int>(wb), static_cast<int>(hb)};
}

absl::StatusOr<int64_t> ImagePlaceholderTokens(
    int width, int height, const ImagePreprocessOptions& options) {
  absl::StatusOr<ImageSize> size = TargetImageSize(width, height, options);
  if (!size.ok()) return size.status();
  const int64_t grid_h = size->height / options.patch_size;
  const int64_t grid_w = size->width / options.patch_size;
  return grid_h * grid_w / (options.merge_size * options.merge_size);
}

ImageF32 ResizeBilinear(const ImageRgb8& image, int width, int height) {
  ImageF32 out{.width = width, .height = height};
  out.data.resize(static_cast<size_t>(width) * height * 3);
  if (image.width <= 0 || image.height <= 0) return out;
  const std::vector<Tap> xs = Taps(image.width, width);
  const std::vector<Tap> ys = Taps(image.height, height);
  // Horizontal pass into two cached source rows, then the vertical blend.
  std::vector<float> row0(static_cast<size_t>(width) * 3);
  std::vector<float> row1(row0.size());
  auto horizontal = [&](int y, std::vector<float>& dst) {
    const uint8_t* src =
        &image.pixels[static_cast<size_t>(y) * image.width * 3];
    for (int x = 0; x < width; ++x) {
      const Tap& t = xs[x];
      for (int c = 0; c < 3; ++c) {
        const float a = src[t.i0 * 3 + c];
        const float b = src[t.i1 * 3 + c];
        dst[x * 3 + c] = a * (1.0f - t.w1) + b * t.w1;
      }
    }
  };
  int cached0 = -1, cached1 = -1;
  for (int y = 0; y < height; ++y) {
    const Tap& t = ys[y];
    if (cached0 != t.i0) {
      if (cached1 == t.i0) {
        std::swap(row0, row1);
        std::swap(cached0, cached1);
      } else {
        horizontal(t.i0, row0);
        cached0 = t.i0;
      }
    }
    if (cached1 != t.i1) {
      horizontal(t.i1, row1);
      cached1 = t.i1;
    }
    float* dst = &out.data[static_cast<size_t>(y) * width * 3];
    for (int i = 0; i < width * 3; ++i) {
      dst[i] = row0[i] * (1.0f - t.w1) + row1[i] * t.w1;
    }
  }
  return out;
}

void NormalizeImage(ImageF32& image, const ImagePreprocessOptions& options) {
  const size_t n = image.data.size() / 3;
  for (size_t i = 0; i < n; ++i) {
    for (int c = 0; c < 3; ++c) {
      float& v = image.data[i * 3 + c];
      v = (v / 255.0f - options.mean[c]) / options.std[c];
    }
  }
}

absl::StatusOr<ImagePatches> Patchify(const ImageF32& image, int patch_size) {
  const int p = patch_size;
  if (p <= 0 || image.width <= 0 || image.height <= 0 || image.width % p != 0 ||
      image.height % p != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("patchify: image ", image.width, "x", image.height,
                     " is not a positive multiple of patch size ", p));
  }
  ImagePatches out{.grid_height = image.height / p,
                   .grid_width = image.width / p,
                   .patch_size = p};
  out.data.resize(static_cast<size_t>(out.num_patches()) * out.patch_dim());
  float* dst = out.data.data();
  for (int gy = 0; gy < out.grid_height; ++gy) {
    for (int gx = 0; gx < out.grid_width; ++gx) {
      for (int c = 0; c < 3; ++c) {
        for (int dy = 0; dy < p; ++dy) {
          const float* src =
              &image.data[(static_cast<size_t>(gy * p + dy) * image.width +
                           gx * p) *
                              3 +
                          c];
          for (int dx = 0; dx < p; ++dx) *dst++ = src[dx * 3];
        }
      }
    }
  }
  return out;
}

absl::StatusOr<ImagePatches> PreprocessImage(
    const ImageRgb8& image, const ImagePreprocessOptions& options) {
  absl::StatusOr<ImageSize> size =
      TargetImageSize(image.width, image.height, options);
  if (!size.ok()) return size.status();
  ImageF32 resized = ResizeBilinear(image, size->width, size->height);
  NormalizeImage(resized, options);
  return Patchify(resized, options.patch_size);
}

}  // namespace swaserve::media
