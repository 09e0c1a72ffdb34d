// Runs lib/media's preprocessing on raw inputs and writes raw float32
// outputs, for tools/media_reference/check_preprocess.py (the PyTorch check
// of the formulas in image_preprocess.h and mel.h). Not a test.
//
//   media_preprocess_dump image W H IN.rgb OUT.f32 PATCH MERGE MIN_PX MAX_PX
//       IN.rgb: H*W*3 bytes (RGB8); OUT.f32: [num_patches, 3*p*p] float32.
//       Prints "grid_h grid_w".
//   media_preprocess_dump mel IN.f32 OUT.f32 N_MELS
//       IN.f32: mono float32 samples at 16 kHz; OUT.f32: [frames, n_mels].
//       Prints "frames n_mels".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "lib/media/image_preprocess.h"
#include "lib/media/mel.h"

namespace {

std::vector<char> Read(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void Write(const char* path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()),
             static_cast<std::streamsize>(v.size() * sizeof(float)));
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "media_preprocess_dump: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace swaserve::media;  // NOLINT: a small tool
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "image" && argc == 10) {
    ImageRgb8 image{.width = std::atoi(argv[2]), .height = std::atoi(argv[3])};
    const std::vector<char> bytes = Read(argv[4]);
    image.pixels.assign(bytes.begin(), bytes.end());
    if (image.pixels.size() !=
        static_cast<size_t>(image.width) * image.height * 3) {
      return Fail("image size does not match W*H*3");
    }
    ImagePreprocessOptions o;
    o.patch_size = std::atoi(argv[6]);
    o.merge_size = std::atoi(argv[7]);
    o.min_pixels = std::atoll(argv[8]);
    o.max_pixels = std::atoll(argv[9]);
    absl::StatusOr<ImagePatches> patches = PreprocessImage(image, o);
    if (!patches.ok()) return Fail(patches.status().ToString());
    Write(argv[5], patches->data);
    std::printf("%d %d\n", patches->grid_height, patches->grid_width);
    return 0;
  }
  if (mode == "mel" && argc == 5) {
    const std::vector<char> bytes = Read(argv[2]);
    std::vector<float> samples(bytes.size() / sizeof(float));
    std::memcpy(samples.data(), bytes.data(), samples.size() * sizeof(float));
    MelOptions o;
    o.n_mels = std::atoi(argv[4]);
    absl::StatusOr<std::unique_ptr<MelFilterbank>> mel =
        MelFilterbank::Create(o);
    if (!mel.ok()) return Fail(mel.status().ToString());
    absl::StatusOr<MelSpectrogram> spec = (*mel)->Compute(samples);
    if (!spec.ok()) return Fail(spec.status().ToString());
    Write(argv[3], spec->data);
    std::printf("%d %d\n", spec->frames, spec->n_mels);
    return 0;
  }
  return Fail(
      "usage: image W H IN OUT PATCH MERGE MIN_PX MAX_PX | mel IN OUT N_MELS");
}
