// JPEG decoding with libjpeg(-turbo)'s classic API.
//
// libjpeg reports errors by calling error_exit, which must not return; we
// longjmp back to the one frame that called setjmp (RunJpeg). That frame
// touches state only through pointers to objects owned by its caller (the
// JpegContext and the output image), and no C++ object with a destructor is
// constructed between setjmp and a libjpeg call, so the jump skips only C
// frames and no destructor. jpeg_destroy_decompress frees libjpeg's memory
// on every path.

// jpeglib.h needs size_t and FILE declared first.
// clang-format off
#include <cstddef>
#include <cstdio>
#include <jpeglib.h>
// clang-format on

#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/media/image.h"

namespace swaserve::media {
namespace {

struct JpegContext {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr error;  // cinfo.err points here
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int max_scans = 0;
  bool created = false;
};

JpegContext* ContextOf(j_common_ptr cinfo) {
  // cinfo is the first member of JpegContext.
  return reinterpret_cast<JpegContext*>(cinfo);
}

[[noreturn]] void OnJpegError(j_common_ptr cinfo) {
  JpegContext* ctx = ContextOf(cinfo);
  (*cinfo->err->format_message)(cinfo, ctx->message);
  std::longjmp(ctx->jump, 1);
}

// Warnings (msg_level < 0: corrupt data, premature end of data) are errors;
// trace messages (msg_level >= 0) are ignored.
void OnJpegMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) OnJpegError(cinfo);
}

void OnJpegProgress(j_common_ptr cinfo) {
  JpegContext* ctx = ContextOf(cinfo);
  if (ctx->cinfo.input_scan_number > ctx->max_scans) {
    std::snprintf(ctx->message, sizeof(ctx->message),
                  "more than %d scans (limit)", ctx->max_scans);
    std::longjmp(ctx->jump, 1);
  }
}

// Decodes into `out`. Returns OK, or an error; on a libjpeg error the message
// is in ctx->message and the return value is Unknown (the caller turns it
// into InvalidArgument). See the file comment for the setjmp rules.
absl::Status RunJpeg(JpegContext* ctx, absl::Span<const uint8_t> bytes,
                     const ImageDecodeOptions* options, ImageRgb8* out) {
  if (setjmp(ctx->jump) != 0) {
    return absl::UnknownError("libjpeg");
  }
  jpeg_create_decompress(&ctx->cinfo);
  ctx->created = true;
  ctx->cinfo.progress = &ctx->progress;
  jpeg_mem_src(&ctx->cinfo, bytes.data(),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&ctx->cinfo, /*require_image=*/TRUE);
  if (ctx->cinfo.jpeg_color_space == JCS_CMYK ||
      ctx->cinfo.jpeg_color_space == JCS_YCCK) {
    return absl::InvalidArgumentError(
        "JPEG: unsupported colour space (CMYK/YCCK)");
  }
  if (absl::Status s = CheckImageDimensions("JPEG", ctx->cinfo.image_width,
                                            ctx->cinfo.image_height, *options);
      !s.ok()) {
    return s;
  }
  ctx->cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&ctx->cinfo);
  if (ctx->cinfo.output_components != 3) {
    return absl::InvalidArgumentError("JPEG: cannot convert to RGB");
  }
  out->width = static_cast<int>(ctx->cinfo.output_width);
  out->height = static_cast<int>(ctx->cinfo.output_height);
  out->pixels.resize(static_cast<size_t>(out->width) * out->height * 3);
  const size_t stride = static_cast<size_t>(out->width) * 3;
  while (ctx->cinfo.output_scanline < ctx->cinfo.output_height) {
    JSAMPROW row = out->pixels.data() + stride * ctx->cinfo.output_scanline;
    if (jpeg_read_scanlines(&ctx->cinfo, &row, 1) != 1) {
      return absl::InvalidArgumentError("JPEG: truncated data");
    }
  }
  jpeg_finish_decompress(&ctx->cinfo);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImageRgb8> DecodeJpeg(absl::Span<const uint8_t> bytes,
                                     const ImageDecodeOptions& options) {
  if (absl::Status s = CheckInputSize("JPEG", bytes.size(), options.max_bytes);
      !s.ok()) {
    return s;
  }
  JpegContext ctx;
  std::memset(&ctx.cinfo, 0, sizeof(ctx.cinfo));
  ctx.message[0] = '\0';
  ctx.max_scans = options.max_jpeg_scans;
  ctx.cinfo.err = jpeg_std_error(&ctx.error);
  ctx.error.error_exit = OnJpegError;
  ctx.error.emit_message = OnJpegMessage;
  ctx.progress.progress_monitor = OnJpegProgress;
  ImageRgb8 out;
  absl::Status status = RunJpeg(&ctx, bytes, &options, &out);
  if (ctx.created) jpeg_destroy_decompress(&ctx.cinfo);
  if (absl::IsUnknown(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("JPEG: corrupt or truncated data: ", ctx.message));
  }
  if (!status.ok()) return status;
  return out;
}

}  // namespace swaserve::media
