// Fuzzes the image input path of the multimodal encoder (lib/media/image.h,
// image_preprocess.h): any bytes must decode to a consistent RGB8 image or
// fail with InvalidArgument — never crash, leak, hang or allocate past the
// limits. Decoded images then go through a small preprocessing run. Seeds
// (corpus/image/) are tiny PNGs and JPEGs written by media_fuzz_seeds
// (tests/unit/media/media_fuzz_seeds.cc).
#include <cstddef>
#include <cstdint>

#include "lib/media/image.h"
#include "lib/media/image_preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  swaserve::media::ImageDecodeOptions options;
  options.max_bytes = 1 << 20;
  options.max_width = 2048;
  options.max_height = 2048;
  options.max_pixels = 1 << 20;  // fast per input
  absl::StatusOr<swaserve::media::ImageRgb8> image =
      swaserve::media::DecodeImage(absl::MakeConstSpan(data, size), options);
  if (!image.ok()) {
    if (!absl::IsInvalidArgument(image.status())) __builtin_trap();
    return 0;
  }
  if (image->width <= 0 || image->height <= 0 ||
      image->pixels.size() !=
          static_cast<size_t>(image->width) * image->height * 3) {
    __builtin_trap();
  }
  swaserve::media::ImagePreprocessOptions pre;
  pre.patch_size = 4;
  pre.merge_size = 2;
  pre.min_pixels = 64;
  pre.max_pixels = 32 * 32;
  absl::StatusOr<swaserve::media::ImagePatches> patches =
      swaserve::media::PreprocessImage(*image, pre);
  if (!patches.ok()) __builtin_trap();
  absl::StatusOr<int64_t> tokens =
      swaserve::media::ImagePlaceholderTokens(image->width, image->height, pre);
  if (!tokens.ok() || *tokens * 4 != patches->num_patches()) __builtin_trap();
  return 0;
}
