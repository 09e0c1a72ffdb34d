// Writes the seed corpora of the lib/media fuzzers (tests/fuzz/corpus/image,
// wav, video): tiny valid inputs of each format the decoders accept.
//   build/tests/unit/media/media_fuzz_seeds tests/fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/unit/media/media_test_util.h"

namespace {

using namespace swaserve::media::testing;  // NOLINT: a small tool

void Write(const std::filesystem::path& path,
           const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const auto img = MakePattern(8, 8, 1);
  Write(dir / "image/rgb.png", EncodePng(img));
  Write(dir / "image/rgba.png", EncodePng(img, PngKind::kRgba));
  Write(dir / "image/grey.png", EncodePng(img, PngKind::kGrey));
  Write(dir / "image/rgb16.png", EncodePng(img, PngKind::kRgb16));
  Write(dir / "image/baseline.jpg", EncodeJpeg(img, 80));
  Write(dir / "image/progressive.jpg", EncodeJpeg(img, 80, true));
  Write(dir / "image/grey.jpg", EncodeJpeg(img, 80, false, true));

  const std::vector<float> s = Sine(440, 0.02, 8000);
  std::vector<float> stereo;
  for (float v : s) stereo.insert(stereo.end(), {v, -v / 2});
  Write(dir / "wav/pcm16_mono_8k.wav", WriteWav(s, 1, 8000, 16));
  Write(dir / "wav/pcm8_stereo.wav", WriteWav(stereo, 2, 8000, 8));
  Write(dir / "wav/pcm24_ext.wav", WriteWav(s, 1, 8000, 24, 1, true));
  Write(dir / "wav/pcm32.wav", WriteWav(s, 1, 22050, 32));
  Write(dir / "wav/float32_stereo.wav", WriteWav(stereo, 2, 44100, 32, 3));

  struct V {
    const char* name;
    const char* codec;
    const char* format;
  };
  for (const V& v :
       {V{"mpeg4.mkv", "mpeg4", "matroska"}, V{"ffv1.mkv", "ffv1", "matroska"},
        V{"mpeg4.mp4", "mpeg4", "mp4"}, V{"mpeg4.avi", "mpeg4", "avi"}}) {
    TestVideoOptions o;
    o.width = 16;
    o.height = 16;
    o.fps = 4;
    o.num_frames = 6;
    o.gop = 3;
    o.codec = v.codec;
    o.format = v.format;
    const std::string tmp = TempPath(v.name);
    if (absl::Status st = WriteTestVideo(tmp, o); !st.ok()) {
      std::fprintf(stderr, "%s: %s\n", v.name,
                   std::string(st.message()).c_str());
      return 1;
    }
    Write(dir / "video" / v.name, *ReadFileBytes(tmp));
    std::filesystem::remove(tmp);
  }
  return 0;
}
