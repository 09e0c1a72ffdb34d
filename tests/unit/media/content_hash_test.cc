#include "lib/media/content_hash.h"

#include "gtest/gtest.h"

namespace swaserve::media {
namespace {

TEST(ContentHash, BytesAndOutputChangingParametersChangeTheHash) {
  const std::vector<uint8_t> a = {1, 2, 3, 4};
  const std::vector<uint8_t> b = {1, 2, 3, 5};
  const std::string params = ImageHashParams({}, {});
  EXPECT_EQ(ContentHash(a, params), ContentHash(a, params));
  EXPECT_NE(ContentHash(a, params), ContentHash(b, params));

  ImagePreprocessOptions patch16;
  patch16.patch_size = 16;
  EXPECT_NE(ContentHash(a, params),
            ContentHash(a, ImageHashParams({}, patch16)));
  ImagePreprocessOptions mean;
  mean.mean[1] = 0.5f;
  EXPECT_NE(ContentHash(a, params), ContentHash(a, ImageHashParams({}, mean)));
  ImageDecodeOptions black;
  black.alpha_background[0] = 0;
  EXPECT_NE(ContentHash(a, params), ContentHash(a, ImageHashParams(black, {})));
  // Limits do not change the output, so not the hash either.
  ImageDecodeOptions small;
  small.max_pixels = 100;
  EXPECT_EQ(ContentHash(a, params), ContentHash(a, ImageHashParams(small, {})));

  // Modalities never collide on the same bytes.
  EXPECT_NE(ContentHash(a, params), ContentHash(a, AudioHashParams({}, {})));
  EXPECT_NE(ContentHash(a, AudioHashParams({}, {})),
            ContentHash(a, VideoHashParams({}, {})));
  MelOptions mels128;
  mels128.n_mels = 128;
  EXPECT_NE(ContentHash(a, AudioHashParams({}, {})),
            ContentHash(a, AudioHashParams({}, mels128)));
  VideoDecodeOptions fps1, chunked;
  fps1.sample_fps = 1;
  chunked.num_chunks = 8;
  chunked.num_threads = 4;
  EXPECT_NE(ContentHash(a, VideoHashParams({}, {})),
            ContentHash(a, VideoHashParams(fps1, {})));
  EXPECT_EQ(ContentHash(a, VideoHashParams({}, {})),
            ContentHash(a, VideoHashParams(chunked, {})));
}

TEST(ContentHash, IsStable) {
  // Pinned: the hash is stored (embedding cache keys, page hashes); a change
  // here needs kContentHashVersion bumped.
  EXPECT_EQ(
      ImageHashParams({}, {}),
      "swaserve-media-v1;image;patch=14;merge=2;fixed=0;min_px=3136;max_px="
      "1003520;"
      "mean=0x1.ed0274p-2,0x1.d4d0bcp-2,0x1.a201fep-2;"
      "std=0x1.1313ap-2,0x1.0b92e8p-2,0x1.1a655p-2;alpha_bg=255,255,255");
  const std::vector<uint8_t> bytes = {'s', 'w', 'a'};
  const base::Hash128 h = ContentHash(bytes, ImageHashParams({}, {}));
  EXPECT_EQ(h, ContentHash(bytes, ImageHashParams({}, {})));
  EXPECT_EQ(h.ToHex(), "e725047913c7a8f97e0d320e67594dc3");
}

}  // namespace
}  // namespace swaserve::media
