#include "lib/media/audio.h"

extern "C" {
#include <libavutil/channel_layout.h>
#include <libavutil/samplefmt.h>
#include <libswresample/swresample.h>
}

#include <climits>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/media/image.h"

namespace swaserve::media {
namespace {

constexpr uint16_t kFormatPcm = 1;
constexpr uint16_t kFormatFloat = 3;
constexpr uint16_t kFormatExtensible = 0xFFFE;

uint32_t Le32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint16_t Le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("WAV: ", message));
}

struct WavFormat {
  uint16_t format = 0;  // kFormatPcm or kFormatFloat (extensible resolved)
  int channels = 0;
  int sample_rate = 0;
  int bits = 0;
  int block_align = 0;
};

absl::StatusOr<WavFormat> ParseFmt(const uint8_t* p, uint32_t size,
                                   const WavDecodeOptions& options) {
  if (size < 16)
    return Invalid(absl::StrCat("fmt chunk too short (", size, " bytes)"));
  WavFormat f;
  f.format = Le16(p);
  f.channels = Le16(p + 2);
  const uint32_t rate = Le32(p + 4);
  f.block_align = Le16(p + 12);
  f.bits = Le16(p + 14);
  if (f.format == kFormatExtensible) {
    if (size < 40) return Invalid("WAVE_FORMAT_EXTENSIBLE fmt chunk too short");
    f.format = Le16(p + 24);  // first two bytes of the SubFormat GUID
  }
  if (f.format != kFormatPcm && f.format != kFormatFloat) {
    return Invalid(absl::StrCat("unsupported format tag ", f.format,
                                " (only PCM and IEEE float)"));
  }
  const bool bits_ok = f.format == kFormatPcm ? (f.bits == 8 || f.bits == 16 ||
                                                 f.bits == 24 || f.bits == 32)
                                              : (f.bits == 32 || f.bits == 64);
  if (!bits_ok) {
    return Invalid(absl::StrCat("unsupported ", f.bits, "-bit ",
                                f.format == kFormatPcm ? "PCM" : "float",
                                " samples"));
  }
  if (f.channels <= 0 || f.channels > options.max_channels) {
    return Invalid(absl::StrCat(f.channels, " channels (limit ",
                                options.max_channels, ")"));
  }
  if (rate < static_cast<uint32_t>(options.min_sample_rate) ||
      rate > static_cast<uint32_t>(options.max_sample_rate)) {
    return Invalid(absl::StrCat("sample rate ", rate, " Hz outside [",
                                options.min_sample_rate, ", ",
                                options.max_sample_rate, "]"));
  }
  f.sample_rate = static_cast<int>(rate);
  if (f.block_align != f.channels * f.bits / 8) {
    return Invalid(absl::StrCat("block align ", f.block_align,
                                " does not match ", f.channels, " channels of ",
                                f.bits, " bits"));
  }
  return f;
}

// One sample at `p` as a float in [-1, 1].
float ReadSample(const uint8_t* p, const WavFormat& f) {
  if (f.format == kFormatFloat) {
    if (f.bits == 32) {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    double v;
    std::memcpy(&v, p, 8);
    return static_cast<float>(v);
  }
  switch (f.bits) {
    case 8:
      return (static_cast<int>(p[0]) - 128) / 128.0f;
    case 16:
      return static_cast<int16_t>(Le16(p)) / 32768.0f;
    case 24: {
      const int32_t v =
          static_cast<int32_t>((static_cast<uint32_t>(p[0]) << 8) |
                               (static_cast<uint32_t>(p[1]) << 16) |
                               (static_cast<uint32_t>(p[2]) << 24)) >>
          8;
      return static_cast<float>(v / 8388608.0);
    }
    default:
      return static_cast<float>(static_cast<int32_t>(Le32(p)) / 2147483648.0);
  }
}

struct SwrDeleter {
  void operator()(SwrContext* s) const { swr_free(&s); }
};

}  // namespace

namespace {

// The header walk both ProbeWav and DecodeWav start with.
struct WavLayout {
  WavFormat format;
  const uint8_t* data = nullptr;
  int64_t frames = 0;
};

absl::StatusOr<WavLayout> ReadLayout(absl::Span<const uint8_t> bytes,
                                     const WavDecodeOptions& options) {
  if (absl::Status s = CheckInputSize("WAV", bytes.size(), options.max_bytes);
      !s.ok()) {
    return s;
  }
  if (bytes.size() < 12 || std::memcmp(bytes.data(), "RIFF", 4) != 0 ||
      std::memcmp(bytes.data() + 8, "WAVE", 4) != 0) {
    return Invalid("not a RIFF/WAVE file");
  }
  const uint8_t* const end = bytes.data() + bytes.size();
  const uint8_t* p = bytes.data() + 12;
  std::optional<WavFormat> format;
  const uint8_t* data = nullptr;
  uint32_t data_size = 0;
  while (end - p >= 8) {
    const uint32_t size = Le32(p + 4);
    const uint8_t* body = p + 8;
    if (static_cast<uint64_t>(size) > static_cast<uint64_t>(end - body)) {
      return Invalid(absl::StrCat("truncated '",
                                  absl::CHexEscape(absl::string_view(
                                      reinterpret_cast<const char*>(p), 4)),
                                  "' chunk (", size, " bytes declared, ",
                                  end - body, " present)"));
    }
    if (std::memcmp(p, "fmt ", 4) == 0) {
      absl::StatusOr<WavFormat> f = ParseFmt(body, size, options);
      if (!f.ok()) return f.status();
      format = *f;
    } else if (std::memcmp(p, "data", 4) == 0) {
      data = body;
      data_size = size;
      break;
    }
    // Chunks are padded to even sizes; stop (no pointer past the end) when
    // nothing follows.
    const uint64_t advance = uint64_t{size} + (size & 1);
    if (advance >= static_cast<uint64_t>(end - body)) break;
    p = body + advance;
  }
  if (!format.has_value()) return Invalid("no fmt chunk before the data");
  if (data == nullptr) return Invalid("no data chunk");
  const WavFormat& f = *format;
  if (data_size % f.block_align != 0) {
    return Invalid(absl::StrCat("data size ", data_size,
                                " is not a whole number of ", f.block_align,
                                "-byte frames"));
  }
  const int64_t frames = data_size / f.block_align;
  if (frames == 0) return Invalid("no samples");
  const double duration = static_cast<double>(frames) / f.sample_rate;
  if (duration > options.max_duration_seconds) {
    return Invalid(absl::StrCat("audio too long: ", duration,
                                " s exceeds the limit of ",
                                options.max_duration_seconds, " s"));
  }
  return WavLayout{.format = f, .data = data, .frames = frames};
}

}  // namespace

absl::StatusOr<WavInfo> ProbeWav(absl::Span<const uint8_t> bytes,
                                 const WavDecodeOptions& options) {
  absl::StatusOr<WavLayout> l = ReadLayout(bytes, options);
  if (!l.ok()) return l.status();
  return WavInfo{.sample_rate = l->format.sample_rate,
                 .channels = l->format.channels,
                 .frames = l->frames};
}

absl::StatusOr<AudioMono> DecodeWav(absl::Span<const uint8_t> bytes,
                                    const WavDecodeOptions& options) {
  absl::StatusOr<WavLayout> layout = ReadLayout(bytes, options);
  if (!layout.ok()) return layout.status();
  const WavFormat& f = layout->format;
  const uint8_t* const data = layout->data;
  const int64_t frames = layout->frames;
  std::vector<float> mono(frames);
  const int sample_bytes = f.bits / 8;
  for (int64_t i = 0; i < frames; ++i) {
    const uint8_t* frame = data + i * f.block_align;
    float sum = 0;
    for (int c = 0; c < f.channels; ++c)
      sum += ReadSample(frame + c * sample_bytes, f);
    mono[i] = f.channels == 1 ? sum : sum / f.channels;
  }
  AudioMono out;
  if (options.target_sample_rate <= 0 ||
      options.target_sample_rate == f.sample_rate) {
    out.sample_rate = f.sample_rate;
    out.samples = std::move(mono);
    return out;
  }
  absl::StatusOr<std::vector<float>> resampled =
      ResampleMono(mono, f.sample_rate, options.target_sample_rate);
  if (!resampled.ok()) return resampled.status();
  if (resampled->empty()) {
    return Invalid(absl::StrCat("audio too short: ", frames, " samples at ",
                                f.sample_rate, " Hz are none at ",
                                options.target_sample_rate, " Hz"));
  }
  out.sample_rate = options.target_sample_rate;
  out.samples = *std::move(resampled);
  return out;
}

absl::StatusOr<std::vector<float>> ResampleMono(absl::Span<const float> samples,
                                                int from_rate, int to_rate) {
  if (from_rate <= 0 || to_rate <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("resample: bad rates ", from_rate, " -> ", to_rate));
  }
  if (samples.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError("resample: too many samples");
  }
  if (from_rate == to_rate)
    return std::vector<float>(samples.begin(), samples.end());
  const int64_t want =
      (static_cast<int64_t>(samples.size()) * to_rate + from_rate / 2) /
      from_rate;
  SwrContext* raw = nullptr;
  AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
  if (swr_alloc_set_opts2(&raw, &mono, AV_SAMPLE_FMT_FLT, to_rate, &mono,
                          AV_SAMPLE_FMT_FLT, from_rate, 0, nullptr) < 0) {
    return absl::InternalError("resample: swr_alloc_set_opts2 failed");
  }
  std::unique_ptr<SwrContext, SwrDeleter> swr(raw);
  if (swr_init(swr.get()) < 0)
    return absl::InternalError("resample: swr_init failed");
  // Room for the whole output plus the filter's delay and flush.
  std::vector<float> out(static_cast<size_t>(want) + 1024);
  int64_t produced = 0;
  const uint8_t* in = reinterpret_cast<const uint8_t*>(samples.data());
  uint8_t* dst = reinterpret_cast<uint8_t*>(out.data());
  int n = swr_convert(swr.get(), &dst, static_cast<int>(out.size()), &in,
                      static_cast<int>(samples.size()));
  while (n > 0) {
    produced += n;
    if (produced >= static_cast<int64_t>(out.size())) break;
    dst = reinterpret_cast<uint8_t*>(out.data() + produced);
    n = swr_convert(swr.get(), &dst, static_cast<int>(out.size() - produced),
                    nullptr, 0);
  }
  if (n < 0) return absl::InternalError("resample: swr_convert failed");
  out.resize(static_cast<size_t>(want), 0.0f);  // pads with 0 if short
  return out;
}

}  // namespace swaserve::media
