#include "lib/media/image_preprocess.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve::media {
namespace {

TEST(ImagePreprocess, TargetSizeFollowsTheSmartResizeFormula) {
  const ImagePreprocessOptions o;  // p = 14, merge 2: factor 28
  struct Case {
    int w, h;
    ImageSize want;
    int64_t tokens;
  };
  // Expected values from the Python formula in the header.
  for (const Case& c :
       {Case{640, 480, {644, 476}, 391}, Case{4000, 3000, {1148, 840}, 1230},
        Case{10, 10, {56, 56}, 4}, Case{1, 1000, {28, 1008}, 36},
        Case{42, 42, {56, 56}, 4},  // round(1.5) = 2
        Case{70, 14, {140, 28}, 5}}) {
    absl::StatusOr<ImageSize> size = TargetImageSize(c.w, c.h, o);
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, c.want) << c.w << "x" << c.h;
    EXPECT_EQ(*ImagePlaceholderTokens(c.w, c.h, o), c.tokens)
        << c.w << "x" << c.h;
  }
  ImagePreprocessOptions fixed;
  fixed.fixed_size = 224;
  EXPECT_EQ(*TargetImageSize(640, 480, fixed), (ImageSize{224, 224}));
  EXPECT_EQ(*ImagePlaceholderTokens(640, 480, fixed), 64);  // 16 * 16 / 4
  fixed.fixed_size = 225;
  EXPECT_TRUE(
      absl::IsInvalidArgument(TargetImageSize(640, 480, fixed).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TargetImageSize(0, 480, o).status()));
}

TEST(ImagePreprocess, BilinearResizeMatchesHalfPixelCentres) {
  const ImageRgb8 img = testing::MakePattern(8, 6, 1);
  // Same size: identity.
  ImageF32 same = ResizeBilinear(img, 8, 6);
  for (size_t i = 0; i < img.pixels.size(); ++i)
    ASSERT_EQ(same.data[i], img.pixels[i]);
  // Halving: each output pixel is the mean of a 2x2 block.
  ImageF32 half = ResizeBilinear(img, 4, 3);
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 4; ++x) {
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int yy, int xx) {
          return static_cast<float>(img.pixels[(yy * 8 + xx) * 3 + c]);
        };
        const float want = (at(2 * y, 2 * x) + at(2 * y, 2 * x + 1) +
                            at(2 * y + 1, 2 * x) + at(2 * y + 1, 2 * x + 1)) /
                           4;
        EXPECT_NEAR(half.data[(y * 4 + x) * 3 + c], want, 1e-4);
      }
    }
  }
  // Doubling: output 0 clamps to source 0; output 1 is 3/4 px0 + 1/4 px1.
  ImageF32 twice = ResizeBilinear(img, 16, 12);
  EXPECT_EQ(twice.data[0], img.pixels[0]);
  EXPECT_NEAR(twice.data[3], 0.75f * img.pixels[0] + 0.25f * img.pixels[3],
              1e-4);
}

TEST(ImagePreprocess, PatchifyOrderIsGridRowMajorThenChannelRowColumn) {
  const int p = 2;
  ImageF32 img{.width = 4, .height = 6};
  img.data.resize(4 * 6 * 3);
  // value = c * 1000 + y * 10 + x
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c)
        img.data[(y * 4 + x) * 3 + c] = c * 1000 + y * 10 + x;
  absl::StatusOr<ImagePatches> patches = Patchify(img, p);
  ASSERT_TRUE(patches.ok()) << patches.status();
  EXPECT_EQ(patches->grid_height, 3);
  EXPECT_EQ(patches->grid_width, 2);
  EXPECT_EQ(patches->patch_dim(), 12);
  for (int gy = 0; gy < 3; ++gy)
    for (int gx = 0; gx < 2; ++gx)
      for (int c = 0; c < 3; ++c)
        for (int dy = 0; dy < p; ++dy)
          for (int dx = 0; dx < p; ++dx) {
            const float got =
                patches->data[(gy * 2 + gx) * 12 + (c * p + dy) * p + dx];
            EXPECT_EQ(got, c * 1000 + (gy * p + dy) * 10 + gx * p + dx);
          }
  EXPECT_FALSE(Patchify(img, 3).ok());
}

TEST(ImagePreprocess, NormalizeAndTheWholePipeline) {
  ImagePreprocessOptions o;
  o.patch_size = 4;
  o.merge_size = 2;
  o.min_pixels = 64;
  o.max_pixels = 32 * 32;
  ImageRgb8 white{.width = 20, .height = 10};
  white.pixels.assign(20 * 10 * 3, 255);
  absl::StatusOr<ImagePatches> patches = PreprocessImage(white, o);
  ASSERT_TRUE(patches.ok()) << patches.status();
  const ImageSize size = *TargetImageSize(20, 10, o);
  EXPECT_EQ(patches->grid_width, size.width / 4);
  EXPECT_EQ(patches->grid_height, size.height / 4);
  EXPECT_EQ(patches->num_patches() / 4, *ImagePlaceholderTokens(20, 10, o));
  for (int64_t i = 0; i < patches->num_patches(); ++i) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(patches->data[i * 48 + c * 16], (1.0f - o.mean[c]) / o.std[c],
                  1e-5);
    }
  }
  // Deterministic.
  const ImageRgb8 img = testing::MakePattern(33, 17, 4);
  EXPECT_EQ(PreprocessImage(img, o)->data, PreprocessImage(img, o)->data);
}

}  // namespace
}  // namespace swaserve::media
