// jpeglib.h needs size_t and FILE declared first.
// clang-format off
#include <cstddef>
#include <cstdio>
#include <jpeglib.h>
// clang-format on

#include "tests/unit/media/media_test_util.h"

#include <png.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>
}

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <numbers>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace swaserve::media::testing {
namespace {

uint32_t Crc32(const uint8_t* data, size_t size) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & -(crc & 1));
  }
  return ~crc;
}

void PutBe32(uint8_t* p, uint32_t v) {
  p[0] = v >> 24;
  p[1] = v >> 16;
  p[2] = v >> 8;
  p[3] = v;
}

void PutLe(std::vector<uint8_t>* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back((v >> (8 * i)) & 0xFF);
}

}  // namespace

ImageRgb8 MakePattern(int width, int height, int seed) {
  ImageRgb8 image{.width = width, .height = height};
  image.pixels.resize(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &image.pixels[(static_cast<size_t>(y) * width + x) * 3];
      const bool checker = ((x / 8) + (y / 8) + seed) % 2 == 0;
      p[0] = static_cast<uint8_t>((x * 255) / std::max(1, width - 1));
      p[1] = static_cast<uint8_t>((y * 255) / std::max(1, height - 1));
      p[2] = static_cast<uint8_t>(checker ? 200 : (seed * 37) % 256);
    }
  }
  return image;
}

double MeanAbsDiff(const ImageRgb8& a, const ImageRgb8& b) {
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    sum += std::abs(int{a.pixels[i]} - int{b.pixels[i]});
  }
  return a.pixels.empty() ? 0 : sum / a.pixels.size();
}

std::vector<uint8_t> EncodePng(const ImageRgb8& image, PngKind kind) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = image.width;
  png.height = image.height;
  std::vector<uint8_t> buffer;
  const size_t n = static_cast<size_t>(image.width) * image.height;
  switch (kind) {
    case PngKind::kRgb:
      png.format = PNG_FORMAT_RGB;
      buffer = image.pixels;
      break;
    case PngKind::kRgba:
      png.format = PNG_FORMAT_RGBA;
      for (size_t i = 0; i < n; ++i) {
        buffer.insert(buffer.end(), &image.pixels[i * 3],
                      &image.pixels[i * 3 + 3]);
        buffer.push_back(static_cast<uint8_t>(i % 2 == 0 ? 255 : 0));
      }
      break;
    case PngKind::kGrey:
      png.format = PNG_FORMAT_GRAY;
      for (size_t i = 0; i < n; ++i) buffer.push_back(image.pixels[i * 3]);
      break;
    case PngKind::kRgb16: {
      png.format = PNG_FORMAT_LINEAR_RGB;
      buffer.resize(n * 3 * 2);
      auto* out = reinterpret_cast<uint16_t*>(buffer.data());
      for (size_t i = 0; i < n * 3; ++i) out[i] = image.pixels[i] * 257;
      break;
    }
  }
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&png, nullptr, &size, 0, buffer.data(), 0, nullptr);
  std::vector<uint8_t> out(size);
  if (!png_image_write_to_memory(&png, out.data(), &size, 0, buffer.data(), 0,
                                 nullptr)) {
    std::fprintf(stderr, "EncodePng: %s\n", png.message);
    return {};
  }
  out.resize(size);
  return out;
}

std::vector<uint8_t> EncodeJpeg(const ImageRgb8& image, int quality,
                                bool progressive, bool greyscale) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);  // test inputs are valid: default exit
  jpeg_create_compress(&cinfo);
  unsigned char* mem = nullptr;
  unsigned long mem_size = 0;
  jpeg_mem_dest(&cinfo, &mem, &mem_size);
  cinfo.image_width = image.width;
  cinfo.image_height = image.height;
  cinfo.input_components = greyscale ? 1 : 3;
  cinfo.in_color_space = greyscale ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<uint8_t> row(static_cast<size_t>(image.width) * 3);
  while (cinfo.next_scanline < cinfo.image_height) {
    const uint8_t* src =
        &image.pixels[static_cast<size_t>(cinfo.next_scanline) * image.width *
                      3];
    if (greyscale) {
      for (int x = 0; x < image.width; ++x) row[x] = src[x * 3];
    } else {
      std::memcpy(row.data(), src, row.size());
    }
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(mem, mem + mem_size);
  jpeg_destroy_compress(&cinfo);
  std::free(mem);
  return out;
}

void PatchPngDimensions(std::vector<uint8_t>* png, uint32_t width,
                        uint32_t height) {
  // Signature (8), IHDR length (4), "IHDR" (4), data (13), CRC (4).
  uint8_t* ihdr = png->data() + 12;
  PutBe32(ihdr + 4, width);
  PutBe32(ihdr + 8, height);
  PutBe32(ihdr + 17, Crc32(ihdr, 17));
}

void PatchJpegDimensions(std::vector<uint8_t>* jpeg, uint16_t width,
                         uint16_t height) {
  for (size_t i = 2; i + 9 < jpeg->size(); ++i) {
    uint8_t* p = jpeg->data() + i;
    if (p[0] == 0xFF && (p[1] == 0xC0 || p[1] == 0xC2)) {
      p[5] = height >> 8;
      p[6] = height & 0xFF;
      p[7] = width >> 8;
      p[8] = width & 0xFF;
      return;
    }
  }
}

std::vector<uint8_t> WriteWav(const std::vector<float>& interleaved,
                              int channels, int sample_rate, int bits,
                              int format, bool extensible) {
  std::vector<uint8_t> data;
  for (float v : interleaved) {
    const double c = std::clamp(static_cast<double>(v), -1.0, 1.0);
    if (format == 3) {
      uint32_t u;
      const float f = static_cast<float>(c);
      std::memcpy(&u, &f, 4);
      PutLe(&data, u, 4);
    } else if (bits == 8) {
      data.push_back(static_cast<uint8_t>(std::lround(c * 127.0) + 128));
    } else {
      const double scale = std::ldexp(1.0, bits - 1) - 1;
      PutLe(&data, static_cast<uint64_t>(std::llround(c * scale)), bits / 8);
    }
  }
  std::vector<uint8_t> fmt;
  const int block = channels * bits / 8;
  PutLe(&fmt, extensible ? 0xFFFE : format, 2);
  PutLe(&fmt, channels, 2);
  PutLe(&fmt, sample_rate, 4);
  PutLe(&fmt, static_cast<uint64_t>(sample_rate) * block, 4);
  PutLe(&fmt, block, 2);
  PutLe(&fmt, bits, 2);
  if (extensible) {
    PutLe(&fmt, 22, 2);    // cbSize
    PutLe(&fmt, bits, 2);  // valid bits
    PutLe(&fmt, 0, 4);     // channel mask
    // SubFormat GUID: format code, then 00000000-0010-8000-00AA00389B71.
    const uint8_t tail[14] = {0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80,
                              0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71};
    PutLe(&fmt, format, 2);
    fmt.insert(fmt.end(), tail, tail + 14);
  }
  std::vector<uint8_t> out = {'R', 'I', 'F', 'F'};
  PutLe(&out, 4 + 8 + fmt.size() + 8 + 12 + 8 + data.size(), 4);
  out.insert(out.end(), {'W', 'A', 'V', 'E', 'f', 'm', 't', ' '});
  PutLe(&out, fmt.size(), 4);
  out.insert(out.end(), fmt.begin(), fmt.end());
  // An unknown chunk the reader must skip.
  out.insert(out.end(), {'L', 'I', 'S', 'T'});
  PutLe(&out, 12, 4);
  out.insert(out.end(), 12, 'x');
  out.insert(out.end(), {'d', 'a', 't', 'a'});
  PutLe(&out, data.size(), 4);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<float> Sine(double hz, double seconds, int sample_rate,
                        double amplitude) {
  const int64_t n = std::llround(seconds * sample_rate);
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(
        amplitude * std::sin(2 * std::numbers::pi * hz * i / sample_rate));
  }
  return out;
}

absl::Status WriteTestVideo(const std::string& path,
                            const TestVideoOptions& options) {
  AVFormatContext* oc = nullptr;
  if (avformat_alloc_output_context2(&oc, nullptr, options.format.c_str(),
                                     path.c_str()) < 0) {
    return absl::InternalError("no muxer " + options.format);
  }
  const AVCodec* codec = avcodec_find_encoder_by_name(options.codec.c_str());
  if (codec == nullptr)
    return absl::InternalError("no encoder " + options.codec);
  AVStream* st = avformat_new_stream(oc, nullptr);
  AVCodecContext* c = avcodec_alloc_context3(codec);
  c->width = options.width;
  c->height = options.height;
  c->time_base = AVRational{1, options.fps};
  c->framerate = AVRational{options.fps, 1};
  c->gop_size = options.gop;
  c->max_b_frames = 0;
  c->pix_fmt = AV_PIX_FMT_YUV420P;
  c->thread_count = 1;
  c->flags |= AV_CODEC_FLAG_QSCALE;
  c->strict_std_compliance = FF_COMPLIANCE_UNOFFICIAL;  // mjpeg from yuv420p
  if (oc->oformat->flags & AVFMT_GLOBALHEADER) {
    c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  }
  absl::Status status;
  if (avcodec_open2(c, codec, nullptr) < 0) {
    status = absl::InternalError("avcodec_open2");
  }
  AVFrame* frame = av_frame_alloc();
  AVPacket* pkt = av_packet_alloc();
  SwsContext* sws =
      sws_getContext(options.width, options.height, AV_PIX_FMT_RGB24,
                     options.width, options.height, AV_PIX_FMT_YUV420P,
                     SWS_BILINEAR, nullptr, nullptr, nullptr);
  if (status.ok()) {
    avcodec_parameters_from_context(st->codecpar, c);
    st->time_base = c->time_base;
    if (avio_open(&oc->pb, path.c_str(), AVIO_FLAG_WRITE) < 0 ||
        avformat_write_header(oc, nullptr) < 0) {
      status = absl::InternalError("cannot open " + path);
    }
  }
  frame->format = AV_PIX_FMT_YUV420P;
  frame->width = options.width;
  frame->height = options.height;
  if (status.ok()) av_frame_get_buffer(frame, 0);
  auto drain = [&]() {
    while (avcodec_receive_packet(c, pkt) == 0) {
      av_packet_rescale_ts(pkt, c->time_base, st->time_base);
      pkt->stream_index = st->index;
      av_interleaved_write_frame(oc, pkt);
    }
  };
  for (int i = 0; status.ok() && i <= options.num_frames; ++i) {
    if (i == options.num_frames) {
      avcodec_send_frame(c, nullptr);
    } else {
      const ImageRgb8 rgb = MakePattern(options.width, options.height, i);
      const uint8_t* src[1] = {rgb.pixels.data()};
      const int src_stride[1] = {options.width * 3};
      av_frame_make_writable(frame);
      sws_scale(sws, src, src_stride, 0, options.height, frame->data,
                frame->linesize);
      frame->pts = static_cast<int64_t>(i) * options.frame_step;
      frame->quality = FF_QP2LAMBDA * 3;
      if (avcodec_send_frame(c, frame) < 0)
        status = absl::InternalError("encode");
    }
    drain();
  }
  if (status.ok()) av_write_trailer(oc);
  sws_freeContext(sws);
  av_packet_free(&pkt);
  av_frame_free(&frame);
  avcodec_free_context(&c);
  if (oc->pb != nullptr) avio_closep(&oc->pb);
  avformat_free_context(oc);
  return status;
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

namespace {

std::filesystem::path TempDir() {
  return std::filesystem::temp_directory_path() /
         absl::StrCat("swaserve_media_", getpid());
}

}  // namespace

std::string TempPath(const std::string& name) {
  static std::once_flag once;
  std::call_once(once, [] {
    // Removed when the process exits normally.
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(TempDir(), ec);
    });
  });
  std::filesystem::create_directories(TempDir());
  return (TempDir() / name).string();
}

}  // namespace swaserve::media::testing
