// Content hashes of multimodal items: the embedding-cache key and
// what the router's consistent hashing and the prefix-cache page hashes mix
// in (lib/base/hash.h HashedSpan).
//
//   hash = XXH3-128(bytes, seed = XXH3-64(params))
//
// where params is a canonical text of every preprocessing parameter that
// changes the encoder's input for the same bytes (and a version), e.g.
//   "swaserve-media-v1;image;patch=14;merge=2;fixed=0;min_px=3136;..."
// Floats are written exactly (hex). Limits (max_bytes, max_pixels, ...) and
// the chunking/threads of video decode are left out: they decide whether an
// input is accepted or how fast, never what it becomes. Bump
// kContentHashVersion whenever a preprocessing formula changes.
//
// Pure and thread-safe. Stable across processes and machines.
#pragma once

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "lib/base/hash.h"
#include "lib/media/audio.h"
#include "lib/media/image.h"
#include "lib/media/image_preprocess.h"
#include "lib/media/mel.h"
#include "lib/media/video.h"

namespace swaserve::media {

inline constexpr int kContentHashVersion = 1;

// Canonical parameter texts, one per modality.
std::string ImageHashParams(const ImageDecodeOptions& decode,
                            const ImagePreprocessOptions& preprocess);
std::string AudioHashParams(const WavDecodeOptions& decode,
                            const MelOptions& mel);
std::string VideoHashParams(const VideoDecodeOptions& decode,
                            const ImagePreprocessOptions& preprocess);

// XXH3-128 of `bytes` seeded with XXH3-64 of `params`.
base::Hash128 ContentHash(absl::Span<const uint8_t> bytes,
                          const std::string& params);

}  // namespace swaserve::media
