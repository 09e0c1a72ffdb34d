#include "lib/media/image.h"

#include <png.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace swaserve::media {
namespace {

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
constexpr uint8_t kJpegMagic[3] = {0xFF, 0xD8, 0xFF};
// The whole IEND chunk: length 0, type, CRC.
constexpr uint8_t kPngIend[12] = {0,   0,   0,    0,    'I',  'E',
                                  'N', 'D', 0xAE, 0x42, 0x60, 0x82};

// Frees the png_image's read state on every path (png_image_free is a no-op
// once png_image_finish_read has cleaned up).
struct PngImageGuard {
  png_image* image;
  ~PngImageGuard() { png_image_free(image); }
};

}  // namespace

absl::Status CheckInputSize(absl::string_view what, uint64_t size,
                            int64_t max_bytes) {
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty input"));
  }
  if (size > static_cast<uint64_t>(std::max<int64_t>(max_bytes, 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", size, " bytes exceeds the limit of ", max_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::string_view ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

ImageFormat SniffImageFormat(absl::Span<const uint8_t> bytes) {
  if (bytes.size() >= sizeof(kPngMagic) &&
      std::memcmp(bytes.data(), kPngMagic, sizeof(kPngMagic)) == 0) {
    return ImageFormat::kPng;
  }
  if (bytes.size() >= sizeof(kJpegMagic) &&
      std::memcmp(bytes.data(), kJpegMagic, sizeof(kJpegMagic)) == 0) {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kUnknown;
}

absl::Status CheckImageDimensions(absl::string_view what, int64_t width,
                                  int64_t height,
                                  const ImageDecodeOptions& options) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": zero-size image (", width, "x", height, ")"));
  }
  if (width > options.max_width || height > options.max_height) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": image ", width, "x", height, " exceeds the limit of ",
        options.max_width, "x", options.max_height));
  }
  if (width * height > options.max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": image ", width, "x", height, " has ", width * height,
        " pixels, over the decompression-bomb limit of ", options.max_pixels));
  }
  return absl::OkStatus();
}

absl::StatusOr<ImageRgb8> DecodeImage(absl::Span<const uint8_t> bytes,
                                      const ImageDecodeOptions& options) {
  if (absl::Status s = CheckInputSize("image", bytes.size(), options.max_bytes);
      !s.ok())
    return s;
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng:
      return DecodePng(bytes, options);
    case ImageFormat::kJpeg:
      return DecodeJpeg(bytes, options);
    case ImageFormat::kUnknown:
      break;
  }
  return absl::InvalidArgumentError(
      "image: unsupported format (not PNG or JPEG by its magic bytes)");
}

absl::StatusOr<ImageRgb8> DecodePng(absl::Span<const uint8_t> bytes,
                                    const ImageDecodeOptions& options) {
  if (absl::Status s = CheckInputSize("PNG", bytes.size(), options.max_bytes);
      !s.ok())
    return s;
  // The simplified API runs libpng under its own setjmp (png_safe_execute)
  // and reports errors in image.message; no longjmp reaches this frame.
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  PngImageGuard guard{&image};
  // libpng's simplified reader stops after the image data; a file cut in
  // its trailing chunks would decode, so require the IEND chunk.
  const uint8_t* end = bytes.data() + bytes.size();
  if (std::search(bytes.data(), end, kPngIend, kPngIend + sizeof(kPngIend)) ==
      end) {
    return absl::InvalidArgumentError("PNG: truncated (no IEND chunk)");
  }
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("PNG: corrupt header: ", image.message));
  }
  if (absl::Status s =
          CheckImageDimensions("PNG", image.width, image.height, options);
      !s.ok()) {
    return s;
  }
  image.format = PNG_FORMAT_RGB;
  ImageRgb8 out;
  out.width = static_cast<int>(image.width);
  out.height = static_cast<int>(image.height);
  out.pixels.resize(PNG_IMAGE_SIZE(image));
  const png_color background{options.alpha_background[0],
                             options.alpha_background[1],
                             options.alpha_background[2]};
  if (!png_image_finish_read(&image, &background, out.pixels.data(),
                             /*row_stride=*/0, /*colormap=*/nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PNG: corrupt or truncated data: ", image.message));
  }
  return out;
}

}  // namespace swaserve::media

namespace swaserve::media {
namespace {

bool IsJpegFrameHeader(uint8_t m) {
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

// Width and height of the first SOF segment.
absl::StatusOr<ImageHeader> JpegHeader(absl::Span<const uint8_t> b) {
  size_t p = 2;  // after SOI
  while (p + 4 <= b.size()) {
    if (b[p] != 0xFF) break;
    const uint8_t m = b[p + 1];
    if (m == 0xFF) {  // fill byte
      ++p;
      continue;
    }
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) {  // no length
      p += 2;
      continue;
    }
    if (m == 0xD9 || m == 0xDA) break;  // EOI or SOS before a frame header
    const size_t len = (size_t{b[p + 2]} << 8) | b[p + 3];
    if (len < 2) break;
    if (IsJpegFrameHeader(m)) {
      if (p + 9 > b.size() || len < 7) break;
      return ImageHeader{.format = ImageFormat::kJpeg,
                         .width = (b[p + 7] << 8) | b[p + 8],
                         .height = (b[p + 5] << 8) | b[p + 6]};
    }
    p += 2 + len;
  }
  return absl::InvalidArgumentError("JPEG: no frame header");
}

}  // namespace

absl::StatusOr<ImageHeader> ReadImageHeader(absl::Span<const uint8_t> bytes,
                                            const ImageDecodeOptions& options) {
  if (absl::Status s = CheckInputSize("image", bytes.size(), options.max_bytes);
      !s.ok())
    return s;
  absl::StatusOr<ImageHeader> h;
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng: {
      png_image image;
      std::memset(&image, 0, sizeof(image));
      image.version = PNG_IMAGE_VERSION;
      if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
        h = absl::InvalidArgumentError(
            absl::StrCat("PNG: bad header (", image.message, ")"));
      } else {
        h = ImageHeader{.format = ImageFormat::kPng,
                        .width = static_cast<int>(image.width),
                        .height = static_cast<int>(image.height)};
      }
      png_image_free(&image);
      break;
    }
    case ImageFormat::kJpeg:
      h = JpegHeader(bytes);
      break;
    case ImageFormat::kUnknown:
      return absl::InvalidArgumentError(
          "image: unsupported format (not PNG or JPEG by its magic bytes)");
  }
  if (!h.ok()) return h.status();
  if (absl::Status s =
          CheckImageDimensions(ImageFormatName(h->format) == "png" ? "PNG" : "JPEG",
                               h->width, h->height, options);
      !s.ok()) {
    return s;
  }
  return h;
}

}  // namespace swaserve::media
