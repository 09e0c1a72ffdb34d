#include "lib/media/image.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/media/media_test_util.h"

namespace swaserve::media {
namespace {

using testing::EncodeJpeg;
using testing::EncodePng;
using ::testing::HasSubstr;
using testing::MakePattern;
using testing::PngKind;

MATCHER_P(IsInvalidArgument, substring, "") {
  if (arg.ok() || !absl::IsInvalidArgument(arg.status())) {
    *result_listener << "status " << arg.status();
    return false;
  }
  return std::string(arg.status().message()).find(substring) !=
             std::string::npos ||
         (*result_listener << "message " << arg.status().message(), false);
}

int MaxAbsDiff(const ImageRgb8& a, const ImageRgb8& b) {
  int max = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    max = std::max(max, std::abs(int{a.pixels[i]} - int{b.pixels[i]}));
  }
  return max;
}

TEST(ImageDecode, SniffsByMagicBytes) {
  const ImageRgb8 img = MakePattern(4, 4);
  EXPECT_EQ(SniffImageFormat(EncodePng(img)), ImageFormat::kPng);
  EXPECT_EQ(SniffImageFormat(EncodeJpeg(img)), ImageFormat::kJpeg);
  const std::vector<uint8_t> gif = {'G', 'I', 'F', '8', '9', 'a'};
  EXPECT_EQ(SniffImageFormat(gif), ImageFormat::kUnknown);
  EXPECT_EQ(SniffImageFormat({}), ImageFormat::kUnknown);
  EXPECT_THAT(DecodeImage(gif), IsInvalidArgument("unsupported format"));
  EXPECT_THAT(DecodeImage({}), IsInvalidArgument("empty"));
}

TEST(ImageDecode, PngRoundTripsExactly) {
  const ImageRgb8 img = MakePattern(37, 23, 3);
  absl::StatusOr<ImageRgb8> out = DecodeImage(EncodePng(img));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->width, 37);
  EXPECT_EQ(out->height, 23);
  EXPECT_EQ(out->pixels, img.pixels);

  // 16-bit linear light is converted to 8-bit sRGB: endpoints stay put.
  out = DecodeImage(EncodePng(img, PngKind::kRgb16));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->pixels[0], 0);                      // x = 0: red 0
  EXPECT_EQ(out->pixels[(img.width - 1) * 3], 255);  // last column: red 255

  out = DecodeImage(EncodePng(img, PngKind::kGrey));
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t i = 0; i < out->pixels.size(); i += 3) {
    EXPECT_EQ(out->pixels[i], img.pixels[i]);
    EXPECT_EQ(out->pixels[i + 2], img.pixels[i]);
  }
}

TEST(ImageDecode, PngAlphaIsCompositedOntoTheBackground) {
  const ImageRgb8 img = MakePattern(8, 2);
  ImageDecodeOptions options;
  options.alpha_background[0] = 10;
  options.alpha_background[1] = 20;
  options.alpha_background[2] = 30;
  absl::StatusOr<ImageRgb8> out =
      DecodeImage(EncodePng(img, PngKind::kRgba), options);
  ASSERT_TRUE(out.ok()) << out.status();
  // Even pixels opaque, odd transparent.
  EXPECT_EQ(out->pixels[0], img.pixels[0]);
  EXPECT_EQ(out->pixels[3], 10);
  EXPECT_EQ(out->pixels[4], 20);
  EXPECT_EQ(out->pixels[5], 30);
}

TEST(ImageDecode, JpegDecodesCloseToTheSource) {
  const ImageRgb8 img = MakePattern(40, 24, 1);
  for (bool progressive : {false, true}) {
    absl::StatusOr<ImageRgb8> out =
        DecodeImage(EncodeJpeg(img, 98, progressive));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->width, 40);
    EXPECT_EQ(out->height, 24);
    EXPECT_LE(MaxAbsDiff(*out, img), 80) << progressive;
    EXPECT_LE(testing::MeanAbsDiff(*out, img), 8.0) << progressive;
  }
  absl::StatusOr<ImageRgb8> grey =
      DecodeImage(EncodeJpeg(img, 95, false, /*greyscale=*/true));
  ASSERT_TRUE(grey.ok()) << grey.status();
  EXPECT_EQ(grey->pixels[0], grey->pixels[1]);
}

TEST(ImageDecode, TruncatedAndCorruptInputsAreInvalidArgument) {
  const ImageRgb8 img = MakePattern(32, 32, 2);
  for (const std::vector<uint8_t>& full : {EncodePng(img), EncodeJpeg(img)}) {
    for (size_t keep :
         {size_t{3}, size_t{10}, full.size() / 2, full.size() - 3}) {
      const std::vector<uint8_t> cut(full.begin(), full.begin() + keep);
      absl::StatusOr<ImageRgb8> out = DecodeImage(cut);
      EXPECT_FALSE(out.ok()) << keep;
      EXPECT_TRUE(absl::IsInvalidArgument(out.status())) << out.status();
    }
  }
  std::vector<uint8_t> png = EncodePng(img);
  png[png.size() / 2] ^= 0x55;  // inside IDAT: CRC mismatch
  EXPECT_THAT(DecodeImage(png), IsInvalidArgument("PNG"));
  std::vector<uint8_t> jpeg = EncodeJpeg(img);
  for (size_t i = 2; i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 1] = 0xC3;  // SOF0 -> SOF3 (lossless): unsupported process
      break;
    }
  }
  EXPECT_THAT(DecodeImage(jpeg), IsInvalidArgument("JPEG"));
  // Garbage in the entropy-coded data may decode (JPEG has no checksum) or
  // fail; either way no crash, and only InvalidArgument.
  jpeg = EncodeJpeg(img);
  for (size_t i = jpeg.size() / 2; i < jpeg.size() / 2 + 40; ++i)
    jpeg[i] ^= 0x5A;
  absl::StatusOr<ImageRgb8> garbage = DecodeImage(jpeg);
  EXPECT_TRUE(garbage.ok() || absl::IsInvalidArgument(garbage.status()));
}

TEST(ImageDecode, DimensionLimitsAreCheckedFromTheHeader) {
  const ImageRgb8 img = MakePattern(16, 16);
  std::vector<uint8_t> png = EncodePng(img);
  testing::PatchPngDimensions(&png, 100000, 100000);
  EXPECT_THAT(DecodeImage(png), IsInvalidArgument("exceeds the limit"));
  testing::PatchPngDimensions(&png, 16000, 16000);  // within w/h, a bomb
  EXPECT_THAT(DecodeImage(png), IsInvalidArgument("decompression-bomb"));
  testing::PatchPngDimensions(&png, 0, 16);
  EXPECT_THAT(DecodeImage(png), IsInvalidArgument("PNG"));

  std::vector<uint8_t> jpeg = EncodeJpeg(img);
  testing::PatchJpegDimensions(&jpeg, 65000, 65000);
  EXPECT_THAT(DecodeImage(jpeg), IsInvalidArgument("exceeds the limit"));
  testing::PatchJpegDimensions(&jpeg, 16000, 16000);
  EXPECT_THAT(DecodeImage(jpeg), IsInvalidArgument("decompression-bomb"));
  testing::PatchJpegDimensions(&jpeg, 16, 0);
  EXPECT_THAT(DecodeImage(jpeg), IsInvalidArgument("JPEG"));

  ImageDecodeOptions small;
  small.max_bytes = 100;
  EXPECT_THAT(DecodeImage(EncodePng(MakePattern(64, 64)), small),
              IsInvalidArgument("exceeds the limit of 100 bytes"));
  small = {};
  small.max_pixels = 255;
  EXPECT_THAT(DecodeImage(EncodeJpeg(img), small),
              IsInvalidArgument("decompression-bomb"));
}

TEST(ImageDecode, CheckImageDimensionsNamesTheProblem) {
  const ImageDecodeOptions options;
  EXPECT_TRUE(CheckImageDimensions("x", 10, 10, options).ok());
  EXPECT_THAT(CheckImageDimensions("x", 0, 10, options).message(),
              HasSubstr("zero-size"));
}

TEST(ReadImageHeader, GivesTheSizeWithoutDecodingAndChecksTheLimits) {
  const ImageRgb8 img = MakePattern(123, 45);
  for (const bool progressive : {false, true}) {
    absl::StatusOr<ImageHeader> j = ReadImageHeader(EncodeJpeg(img, 90, progressive));
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(j->format, ImageFormat::kJpeg);
    EXPECT_EQ(j->width, 123);
    EXPECT_EQ(j->height, 45);
  }
  absl::StatusOr<ImageHeader> p = ReadImageHeader(EncodePng(img));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->format, ImageFormat::kPng);
  EXPECT_EQ(p->width, 123);
  EXPECT_EQ(p->height, 45);
  std::vector<uint8_t> bomb = EncodePng(MakePattern(8, 8));
  testing::PatchPngDimensions(&bomb, 100000, 100000);
  EXPECT_THAT(std::string(ReadImageHeader(bomb).status().message()), HasSubstr("exceeds"));
  std::vector<uint8_t> jbomb = EncodeJpeg(MakePattern(8, 8));
  testing::PatchJpegDimensions(&jbomb, 60000, 60000);
  EXPECT_THAT(std::string(ReadImageHeader(jbomb).status().message()), HasSubstr("exceeds"));
  const std::vector<uint8_t> soi_only = {0xFF, 0xD8, 0xFF, 0xD9};
  EXPECT_EQ(ReadImageHeader(soi_only).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace swaserve::media
