#include "lib/media/content_hash.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace swaserve::media {
namespace {

std::string Header(absl::string_view modality) {
  return absl::StrCat("swaserve-media-v", kContentHashVersion, ";", modality);
}

std::string PreprocessParams(const ImagePreprocessOptions& p) {
  return absl::StrFormat(
      ";patch=%d;merge=%d;fixed=%d;min_px=%d;max_px=%d;mean=%a,%a,%a;std=%a,%a,"
      "%a",
      p.patch_size, p.merge_size, p.fixed_size, p.min_pixels, p.max_pixels,
      p.mean[0], p.mean[1], p.mean[2], p.std[0], p.std[1], p.std[2]);
}

}  // namespace

std::string ImageHashParams(const ImageDecodeOptions& decode,
                            const ImagePreprocessOptions& preprocess) {
  return absl::StrCat(
      Header("image"), PreprocessParams(preprocess),
      absl::StrFormat(";alpha_bg=%d,%d,%d", decode.alpha_background[0],
                      decode.alpha_background[1], decode.alpha_background[2]));
}

std::string AudioHashParams(const WavDecodeOptions& decode,
                            const MelOptions& mel) {
  return absl::StrCat(
      Header("audio"),
      absl::StrFormat(";rate=%d;mel_rate=%d;n_fft=%d;hop=%d;n_mels=%d",
                      decode.target_sample_rate, mel.sample_rate, mel.n_fft,
                      mel.hop_length, mel.n_mels));
}

std::string VideoHashParams(const VideoDecodeOptions& decode,
                            const ImagePreprocessOptions& preprocess) {
  return absl::StrCat(Header("video"),
                      absl::StrFormat(";fps=%a", decode.sample_fps),
                      decode.model_input.has_value() ? ";frames=model-size" : "",
                      PreprocessParams(preprocess));
}

base::Hash128 ContentHash(absl::Span<const uint8_t> bytes,
                          const std::string& params) {
  return base::Hash128Of(bytes.data(), bytes.size(), base::Hash64(params));
}

}  // namespace swaserve::media
