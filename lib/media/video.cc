#include "lib/media/video.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/dict.h>
#include <libavutil/log.h>
#include <libavutil/mem.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/thread_pool.h"

namespace swaserve::media {
namespace {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("video: ", message));
}

std::string AvError(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(err, buf, sizeof(buf));
  return buf;
}

void SilenceFfmpegLog() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_level(AV_LOG_FATAL); });
}

// Where the container comes from: a path, or bytes in memory.
struct Source {
  const std::string* path = nullptr;
  absl::Span<const uint8_t> bytes;
};

// Read/seek callbacks of an AVIOContext over bytes in memory.
struct MemoryReader {
  absl::Span<const uint8_t> bytes;
  int64_t pos = 0;

  static int Read(void* opaque, uint8_t* buf, int size) {
    auto* r = static_cast<MemoryReader*>(opaque);
    const int64_t left = static_cast<int64_t>(r->bytes.size()) - r->pos;
    if (left <= 0) return AVERROR_EOF;
    const int n = static_cast<int>(std::min<int64_t>(left, size));
    std::memcpy(buf, r->bytes.data() + r->pos, n);
    r->pos += n;
    return n;
  }
  static int64_t Seek(void* opaque, int64_t offset, int whence) {
    auto* r = static_cast<MemoryReader*>(opaque);
    const int64_t size = static_cast<int64_t>(r->bytes.size());
    int64_t to = 0;
    switch (whence & ~AVSEEK_FORCE) {
      case AVSEEK_SIZE:
        return size;
      case SEEK_SET:
        to = offset;
        break;
      case SEEK_CUR:
        to = r->pos + offset;
        break;
      case SEEK_END:
        to = size + offset;
        break;
      default:
        return AVERROR(EINVAL);
    }
    if (to < 0 || to > size) return AVERROR(EINVAL);
    r->pos = to;
    return to;
  }
};

// One opened demuxer + decoder + scaler; owns every FFmpeg object.
// Not thread-safe: one per decoding thread.
class Decoder {
 public:
  Decoder() = default;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  ~Decoder() {
    sws_freeContext(sws_);
    av_frame_free(&frame_);
    av_frame_free(&prev_);
    av_packet_free(&packet_);
    avcodec_free_context(&codec_);
    avformat_close_input(&format_);
    if (avio_ != nullptr) {
      av_freep(&avio_->buffer);
      avio_context_free(&avio_);
    }
  }

  absl::Status Open(const Source& source, const VideoDecodeOptions& options);

  // Seeks to the keyframe at or before `seconds` (stream-relative).
  void Seek(double seconds);

  // Next decoded frame into frame() with its time; false at the end (or on
  // the decoded-frames limit, reported by status()).
  absl::StatusOr<bool> Next(double* seconds);

  AVFrame* frame() { return frame_; }
  AVFrame* prev() { return prev_; }
  double duration() const { return duration_; }
  int width() const { return width_; }
  int height() const { return height_; }

  // RGB8 of `f` at its own size or the model's (options.model_input),
  // checking its size against the limits.
  absl::StatusOr<ImageRgb8> ToRgb(const AVFrame* f);

 private:
  const VideoDecodeOptions* options_ = nullptr;
  MemoryReader reader_;
  AVIOContext* avio_ = nullptr;
  AVFormatContext* format_ = nullptr;
  AVCodecContext* codec_ = nullptr;
  AVFrame* frame_ = nullptr;
  AVFrame* prev_ = nullptr;
  AVPacket* packet_ = nullptr;
  SwsContext* sws_ = nullptr;
  std::vector<uint8_t> scratch_;  // padded RGB rows for sws_scale
  int stream_ = -1;
  AVRational time_base_{1, 1};
  int64_t start_pts_ = 0;
  double duration_ = 0;
  int width_ = 0;
  int height_ = 0;
  int64_t decoded_ = 0;
  bool draining_ = false;
  double last_time_ = -1;
};

absl::Status Decoder::Open(const Source& source,
                           const VideoDecodeOptions& options) {
  options_ = &options;
  format_ = avformat_alloc_context();
  frame_ = av_frame_alloc();
  prev_ = av_frame_alloc();
  packet_ = av_packet_alloc();
  if (format_ == nullptr || frame_ == nullptr || prev_ == nullptr ||
      packet_ == nullptr) {
    return absl::ResourceExhaustedError("video: out of memory");
  }
  AVDictionary* dict = nullptr;
  av_dict_set(&dict, "format_whitelist", options.allowed_formats.c_str(), 0);
  const char* url = "";
  if (source.path != nullptr) {
    av_dict_set(&dict, "protocol_whitelist", "file", 0);
    url = source.path->c_str();
  } else {
    reader_.bytes = source.bytes;
    constexpr int kBufferSize = 64 << 10;
    auto* buffer = static_cast<unsigned char*>(av_malloc(kBufferSize));
    avio_ =
        avio_alloc_context(buffer, kBufferSize, 0, &reader_,
                           &MemoryReader::Read, nullptr, &MemoryReader::Seek);
    if (buffer == nullptr || avio_ == nullptr) {
      if (avio_ == nullptr) av_free(buffer);
      av_dict_free(&dict);
      return absl::ResourceExhaustedError("video: out of memory");
    }
    format_->pb = avio_;
    format_->flags |= AVFMT_FLAG_CUSTOM_IO;
  }
  int err = avformat_open_input(&format_, url, nullptr, &dict);
  av_dict_free(&dict);
  if (err < 0) {
    // avformat_open_input frees format_ on failure.
    return Invalid(absl::StrCat("cannot open the container (", AvError(err),
                                "; allowed formats: ", options.allowed_formats,
                                ")"));
  }
  if ((err = avformat_find_stream_info(format_, nullptr)) < 0) {
    return Invalid(
        absl::StrCat("cannot read stream info (", AvError(err), ")"));
  }
  for (unsigned i = 0; i < format_->nb_streams; ++i) {
    const AVStream* st = format_->streams[i];
    if (st->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
        !(st->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
      stream_ = static_cast<int>(i);
      break;
    }
  }
  if (stream_ < 0) return Invalid("no video stream");
  const AVStream* st = format_->streams[stream_];
  for (unsigned i = 0; i < format_->nb_streams; ++i) {
    if (static_cast<int>(i) != stream_)
      format_->streams[i]->discard = AVDISCARD_ALL;
  }
  if (absl::Status s =
          CheckImageDimensions("video", st->codecpar->width,
                               st->codecpar->height, options.frame_limits);
      !s.ok()) {
    return s;
  }
  width_ = st->codecpar->width;
  height_ = st->codecpar->height;
  time_base_ = st->time_base;
  if (time_base_.num <= 0 || time_base_.den <= 0)
    return Invalid("bad stream time base");
  start_pts_ = st->start_time != AV_NOPTS_VALUE ? st->start_time : 0;
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
    duration_ = st->duration * av_q2d(time_base_);
  } else if (format_->duration != AV_NOPTS_VALUE && format_->duration > 0) {
    duration_ = static_cast<double>(format_->duration) / AV_TIME_BASE;
  }
  if (!std::isfinite(duration_) || duration_ < 0) duration_ = 0;
  if (duration_ > options.max_duration_seconds) {
    return Invalid(absl::StrCat("video too long: ", duration_,
                                " s exceeds the limit of ",
                                options.max_duration_seconds, " s"));
  }
  const AVCodec* codec = avcodec_find_decoder(st->codecpar->codec_id);
  if (codec == nullptr) {
    return Invalid(absl::StrCat("unsupported codec ",
                                avcodec_get_name(st->codecpar->codec_id)));
  }
  codec_ = avcodec_alloc_context3(codec);
  if (codec_ == nullptr)
    return absl::ResourceExhaustedError("video: out of memory");
  if ((err = avcodec_parameters_to_context(codec_, st->codecpar)) < 0) {
    return Invalid(absl::StrCat("bad codec parameters (", AvError(err), ")"));
  }
  codec_->thread_count = 1;  // parallelism is the chunks'
  codec_->pkt_timebase = time_base_;
  if ((err = avcodec_open2(codec_, codec, nullptr)) < 0) {
    return Invalid(absl::StrCat("cannot open the ", codec->name, " decoder (",
                                AvError(err), ")"));
  }
  return absl::OkStatus();
}

void Decoder::Seek(double seconds) {
  if (seconds <= 0) {
    seconds = 0;
  }
  const int64_t ts = start_pts_ + static_cast<int64_t>(
                                      std::floor(seconds / av_q2d(time_base_)));
  if (av_seek_frame(format_, stream_, ts, AVSEEK_FLAG_BACKWARD) < 0 &&
      seconds == 0) {
    // Some demuxers cannot seek to 0 by timestamp; rewind by bytes.
    av_seek_frame(format_, stream_, 0, AVSEEK_FLAG_BYTE | AVSEEK_FLAG_BACKWARD);
  }
  avcodec_flush_buffers(codec_);
  draining_ = false;
  last_time_ = -1;
}

absl::StatusOr<bool> Decoder::Next(double* seconds) {
  while (true) {
    int err = avcodec_receive_frame(codec_, frame_);
    if (err == 0) {
      if (++decoded_ > options_->max_decoded_frames) {
        return Invalid(absl::StrCat("more than ", options_->max_decoded_frames,
                                    " frames decoded (limit)"));
      }
      const int64_t pts = frame_->best_effort_timestamp;
      double t;
      if (pts != AV_NOPTS_VALUE) {
        t = static_cast<double>(pts - start_pts_) * av_q2d(time_base_);
      } else {
        // No timestamp: one nominal frame after the previous one.
        const AVRational rate = format_->streams[stream_]->avg_frame_rate;
        t = last_time_ +
            (rate.num > 0 && rate.den > 0 ? av_q2d(av_inv_q(rate)) : 0.04);
      }
      last_time_ = t;
      *seconds = t;
      return true;
    }
    if (err == AVERROR_EOF) return false;
    if (err != AVERROR(EAGAIN)) {
      return Invalid(absl::StrCat("decode error (", AvError(err), ")"));
    }
    if (draining_) return false;
    // Feed the next packet of our stream.
    err = av_read_frame(format_, packet_);
    if (err < 0) {
      draining_ = true;
      avcodec_send_packet(codec_, nullptr);
      continue;
    }
    if (packet_->stream_index == stream_) {
      // A corrupt packet is skipped, as players do; the frames that do decode
      // still count against max_decoded_frames.
      avcodec_send_packet(codec_, packet_);
    }
    av_packet_unref(packet_);
  }
}

absl::StatusOr<ImageRgb8> Decoder::ToRgb(const AVFrame* f) {
  if (absl::Status s = CheckImageDimensions("video frame", f->width, f->height,
                                            options_->frame_limits);
      !s.ok()) {
    return s;
  }
  ImageSize out_size{.width = f->width, .height = f->height};
  if (options_->model_input.has_value()) {
    absl::StatusOr<ImageSize> target =
        TargetImageSize(f->width, f->height, *options_->model_input);
    if (!target.ok()) return target.status();
    out_size = *target;
  }
  sws_ = sws_getCachedContext(sws_, f->width, f->height,
                              static_cast<AVPixelFormat>(f->format),
                              out_size.width, out_size.height,
                              AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr,
                              nullptr);
  if (sws_ == nullptr) {
    const char* name =
        av_get_pix_fmt_name(static_cast<AVPixelFormat>(f->format));
    return Invalid(
        absl::StrCat("cannot convert pixel format ", name ? name : "?"));
  }
  // libswscale's SIMD paths may write past the end of a row (whole vectors
  // of pixels), so convert into a padded scratch image and copy the rows out.
  const size_t row = static_cast<size_t>(out_size.width) * 3;
  const size_t stride = (row + 63) / 64 * 64 + 64;
  scratch_.resize(stride * (static_cast<size_t>(out_size.height) + 1));
  uint8_t* dst[4] = {scratch_.data(), nullptr, nullptr, nullptr};
  const int dst_stride[4] = {static_cast<int>(stride), 0, 0, 0};
  if (sws_scale(sws_, f->data, f->linesize, 0, f->height, dst, dst_stride) !=
      out_size.height) {
    return Invalid("pixel conversion failed");
  }
  ImageRgb8 out{.width = out_size.width, .height = out_size.height};
  out.pixels.resize(row * out_size.height);
  for (int y = 0; y < out_size.height; ++y) {
    std::memcpy(&out.pixels[row * y], &scratch_[stride * y], row);
  }
  return out;
}

double SampleTime(int64_t k, double fps) {
  return static_cast<double>(k) / fps;
}

// The samples of one chunk: [first, last) (last < 0: to the end of the video).
struct ChunkResult {
  std::vector<std::shared_ptr<const ImageRgb8>> frames;
  std::vector<double> sample_times;
  std::vector<double> frame_times;
};

// The decoded bytes of one call, shared by its chunks.
struct DecodeBudget {
  std::atomic<int64_t> used{0};
  int64_t limit = 0;
};

std::string OverBudget(int64_t bytes, int64_t limit) {
  return absl::StrCat("decoding would take ", bytes,
                      " bytes, over the decoded-bytes budget of ", limit,
                      " bytes");
}

// Appends sample k's choice to `out`, converting `f` unless it is the frame
// the previous sample chose (then the image is shared).
absl::Status Emit(Decoder& decoder, const AVFrame* f, double frame_time,
                  int64_t k, double fps, DecodeBudget& budget,
                  ChunkResult* out) {
  if (!out->frame_times.empty() && out->frame_times.back() == frame_time) {
    out->frames.push_back(out->frames.back());
  } else {
    absl::StatusOr<ImageRgb8> rgb = decoder.ToRgb(f);
    if (!rgb.ok()) return rgb.status();
    const int64_t size = static_cast<int64_t>(rgb->pixels.size());
    const int64_t used = budget.used.fetch_add(size) + size;
    if (used > budget.limit) {
      return Invalid(absl::StrCat(OverBudget(used, budget.limit),
                                  " (counted while decoding)"));
    }
    out->frames.push_back(
        std::make_shared<const ImageRgb8>(*std::move(rgb)));
  }
  out->sample_times.push_back(SampleTime(k, fps));
  out->frame_times.push_back(frame_time);
  return absl::OkStatus();
}

absl::StatusOr<ChunkResult> DecodeChunk(const Source& source,
                                        const VideoDecodeOptions& options,
                                        DecodeBudget& budget, int64_t first,
                                        int64_t last) {
  Decoder decoder;
  if (absl::Status s = decoder.Open(source, options); !s.ok()) return s;
  const double fps = options.sample_fps;
  const double t_first = SampleTime(first, fps);
  // Seek so that the last frame at or before t_first is decoded; if the
  // demuxer lands after t_first, or at the end (a file shorter than its
  // header says), back off (1 s, 2 s, 4 s, ... then 0).
  double target = t_first;
  double first_time = 0;
  bool have_frame = false;
  for (double backoff = 1.0; first > 0; backoff *= 2) {
    decoder.Seek(target);
    absl::StatusOr<bool> got = decoder.Next(&first_time);
    if (!got.ok()) return got.status();
    have_frame = *got;
    if ((have_frame && first_time <= t_first) || target <= 0) break;
    target = std::max(0.0, t_first - backoff);
  }
  if (first == 0) {
    absl::StatusOr<bool> got = decoder.Next(&first_time);
    if (!got.ok()) return got.status();
    have_frame = *got;
  }
  ChunkResult out;
  bool have_prev = false;
  double prev_time = 0;
  int64_t k = first;
  double t = first_time;
  while (have_frame && (last < 0 || k < last)) {
    while ((last < 0 || k < last) && SampleTime(k, fps) <= t) {
      const double tk = SampleTime(k, fps);
      const bool use_prev = have_prev && (tk - prev_time) <= (t - tk);
      // A run to the end (unknown duration) has no sample bound of its own:
      // one timestamp far ahead (a hostile or broken file) would emit a
      // sample every 1/fps up to it. Stop past max_frames.
      if (last < 0 && static_cast<int64_t>(out.frames.size()) >= options.max_frames) {
        return Invalid(absl::StrCat("too many frames: more than ", options.max_frames));
      }
      absl::Status s =
          use_prev ? Emit(decoder, decoder.prev(), prev_time, k, fps, budget, &out)
                   : Emit(decoder, decoder.frame(), t, k, fps, budget, &out);
      if (!s.ok()) return s;
      ++k;
    }
    if (last >= 0 && k >= last) break;
    av_frame_unref(decoder.prev());
    av_frame_move_ref(decoder.prev(), decoder.frame());
    have_prev = true;
    prev_time = t;
    absl::StatusOr<bool> got = decoder.Next(&t);
    if (!got.ok()) return got.status();
    have_frame = *got;
  }
  if (!have_prev && out.frames.empty()) return Invalid("no decodable frames");
  // Past the last frame: the last frame. A bounded run fills up to `last`;
  // an unbounded one (unknown duration) whose frames all precede t_first
  // still returns sample `first`.
  const int64_t end = last >= 0 ? last : (out.frames.empty() ? first + 1 : k);
  while (k < end) {
    if (absl::Status s = Emit(decoder, decoder.prev(), prev_time, k, fps, budget, &out);
        !s.ok()) {
      return s;
    }
    ++k;
  }
  return out;
}

// The header's declaration and its cost (VideoInfo), with the sample-count
// and decoded-bytes limits checked.
absl::StatusOr<VideoInfo> InfoOf(const Decoder& d,
                                 const VideoDecodeOptions& options) {
  VideoInfo info;
  info.width = d.width();
  info.height = d.height();
  info.duration_seconds = d.duration();
  if (info.duration_seconds > 0) {
    const double want =
        std::ceil(info.duration_seconds * options.sample_fps - 1e-9);
    if (want > options.max_frames) {
      return Invalid(absl::StrCat(
          "too many frames: ", want, " samples at ", options.sample_fps,
          " fps exceed the limit of ", options.max_frames));
    }
    info.samples = std::max<int64_t>(1, static_cast<int64_t>(want));
  }
  info.frame_width = info.width;
  info.frame_height = info.height;
  if (options.model_input.has_value()) {
    absl::StatusOr<ImageSize> target =
        TargetImageSize(info.width, info.height, *options.model_input);
    if (!target.ok()) return target.status();
    info.frame_width = target->width;
    info.frame_height = target->height;
  }
  const int64_t chunks =
      info.samples > 0 ? std::clamp<int64_t>(options.num_chunks, 1, info.samples)
                       : 1;
  const int64_t full = int64_t{info.width} * info.height * 3;
  info.decoded_bytes =
      info.samples * info.frame_width * info.frame_height * 3 +
      chunks * kVideoWorkingFrames * full;
  if (info.samples > 0 && info.decoded_bytes > options.max_decoded_bytes) {
    return Invalid(absl::StrCat(
        OverBudget(info.decoded_bytes, options.max_decoded_bytes), " (",
        info.samples, " frames of ", info.frame_width, "x", info.frame_height,
        " declared by the header, from ", info.width, "x", info.height, ", ",
        info.duration_seconds, " s)"));
  }
  return info;
}

absl::Status CheckOptions(const VideoDecodeOptions& options) {
  if (!(options.sample_fps > 0) || options.max_frames <= 0 ||
      options.max_decoded_bytes <= 0) {
    return Invalid(absl::StrCat("bad options: sample_fps ", options.sample_fps,
                                ", max_frames ", options.max_frames,
                                ", max_decoded_bytes ",
                                options.max_decoded_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<VideoInfo> Probe(const Source& source,
                                const VideoDecodeOptions& options) {
  SilenceFfmpegLog();
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  Decoder probe;
  if (absl::Status s = probe.Open(source, options); !s.ok()) return s;
  return InfoOf(probe, options);
}

absl::StatusOr<VideoFrames> DecodeVideo(const Source& source,
                                        const VideoDecodeOptions& options) {
  // The header: what it declares, checked against the limits before
  // anything is decoded.
  absl::StatusOr<VideoInfo> info = Probe(source, options);
  if (!info.ok()) return info.status();
  const double duration = info->duration_seconds;
  VideoFrames result;
  result.duration_seconds = duration;
  DecodeBudget budget;
  budget.limit = options.max_decoded_bytes;
  budget.used = info->decoded_bytes - info->samples * info->frame_width *
                                          info->frame_height * 3;
  std::vector<ChunkResult> chunks;
  if (duration <= 0) {
    // Unknown duration: one pass to the end.
    absl::StatusOr<ChunkResult> all = DecodeChunk(source, options, budget, 0, -1);
    if (!all.ok()) return all.status();
    if (static_cast<int64_t>(all->frames.size()) > options.max_frames) {
      return Invalid(
          absl::StrCat("too many frames: more than ", options.max_frames));
    }
    chunks.push_back(*std::move(all));
  } else {
    const int64_t samples = info->samples;
    const int64_t num_chunks =
        std::clamp<int64_t>(options.num_chunks, 1, samples);
    const int num_threads = static_cast<int>(
        std::clamp<int64_t>(options.num_threads, 1, num_chunks));
    std::vector<absl::StatusOr<ChunkResult>> parts(num_chunks);
    auto run = [&](int64_t c) {
      parts[c] = DecodeChunk(source, options, budget, c * samples / num_chunks,
                             (c + 1) * samples / num_chunks);
    };
    if (num_threads == 1) {
      for (int64_t c = 0; c < num_chunks; ++c) run(c);
    } else {
      base::ThreadPool pool(num_threads, "video-decode");
      for (int64_t c = 0; c < num_chunks; ++c)
        pool.Schedule([&run, c] { run(c); });
      pool.WaitIdle();
    }
    for (absl::StatusOr<ChunkResult>& part : parts) {
      if (!part.ok()) return part.status();
      chunks.push_back(*std::move(part));
    }
  }
  for (ChunkResult& c : chunks) {
    for (size_t i = 0; i < c.frames.size(); ++i) {
      result.frames.push_back(std::move(c.frames[i]));
      result.sample_times.push_back(c.sample_times[i]);
      result.frame_times.push_back(c.frame_times[i]);
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<VideoFrames> DecodeVideoFile(const std::string& path,
                                            const VideoDecodeOptions& options) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec)
    return Invalid(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (absl::Status s = CheckInputSize("video", size, options.max_bytes);
      !s.ok()) {
    return s;
  }
  return DecodeVideo(Source{.path = &path}, options);
}

absl::StatusOr<VideoInfo> ProbeVideoMemory(absl::Span<const uint8_t> bytes,
                                           const VideoDecodeOptions& options) {
  if (absl::Status s = CheckInputSize("video", bytes.size(), options.max_bytes);
      !s.ok()) {
    return s;
  }
  return Probe(Source{.bytes = bytes}, options);
}

absl::StatusOr<VideoFrames> DecodeVideoMemory(
    absl::Span<const uint8_t> bytes, const VideoDecodeOptions& options) {
  if (absl::Status s = CheckInputSize("video", bytes.size(), options.max_bytes);
      !s.ok()) {
    return s;
  }
  return DecodeVideo(Source{.bytes = bytes}, options);
}

}  // namespace swaserve::media
