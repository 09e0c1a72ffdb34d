// Video input for the multimodal encoder: frames sampled at a
// fixed rate from a container (file or memory buffer) through Debian's FFmpeg
// libraries (libavformat demuxing, libavcodec decoding, libswscale to RGB8).
//
// Sampling: the video's duration D (container or stream header; time 0 is
// the video stream's start time) gives S = max(1, ceil(D * sample_fps))
// sample times t_k = k / sample_fps, k = 0 .. S-1. Sample k is the decoded
// frame whose presentation time is nearest to t_k (ties: the earlier frame;
// samples past the last frame get the last frame). Without a known duration
// the video is decoded to its end and samples run up to the last frame's time
// (at least sample 0).
//
// Chunked parallel decode (num_chunks > 1): the samples are split into
// num_chunks contiguous runs; each run is decoded by its own demuxer and
// decoder (one FFmpeg thread each), which seeks to the keyframe at or before
// its first sample time (backing off further when a demuxer lands late) and
// decodes until its last sample is decided; num_threads threads share the
// chunks. Because each run starts at a keyframe at or before its first
// sample, it sees the same candidate frames as a single pass, so the result
// equals the single-threaded decode for closed-GOP streams (every intra-only
// codec, and mpeg4/H.264 without open-GOP B-frames; tested).
//
// Frames at the model's size (model_input set): each chosen frame goes from
// the decoder's frame straight to the size the model's preprocessing would
// resize it to (TargetImageSize; libswscale, bilinear), so no full-size RGB
// image is made or kept. Consecutive samples that choose the same decoded
// frame share one image (a pointer, not a copy).
//
// Untrusted input: the demuxer must be in allowed_formats (no playlists or
// network protocols), the byte size, duration, frame dimensions (checked
// from the stream header and again per decoded frame) and sample count are
// limited, and so is the number of frames any one chunk decodes. The decoded
// bytes (VideoInfo::decoded_bytes) are budgeted: checked from the header
// before anything is decoded when the duration is known, and counted while
// decoding (each image once however many samples share it). Every bad
// input returns InvalidArgument naming the problem ("no video stream",
// "video too long", ...). FFmpeg's own log is silenced (AV_LOG_FATAL) on
// first use; errors are reported only as Status.
//
// Thread-safe: the functions share no state (beyond that one-time log
// setting); each call owns its threads, joined before it returns.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/media/image.h"
#include "lib/media/image_preprocess.h"

namespace swaserve::media {

struct VideoDecodeOptions {
  // Samples per second of video.
  double sample_fps = 2.0;
  // Largest in-memory input accepted, in bytes (files: the file size).
  int64_t max_bytes = int64_t{2} << 30;
  // Longest video accepted, in seconds (from the header).
  double max_duration_seconds = 3 * 3600;
  // Most sampled frames returned (S above); more is InvalidArgument.
  int max_frames = 8192;
  // Most frames one chunk may decode (bounds the work on a hostile file).
  int64_t max_decoded_frames = 2'000'000;
  // Frame width/height/pixel limits (max_bytes there is unused).
  ImageDecodeOptions frame_limits = {
      .max_width = 8192, .max_height = 8192, .max_pixels = 8192LL * 4320};
  // Chunked parallel decode: chunks (clamped to the sample count) and the
  // threads that decode them (clamped to the chunks). 1 and 1: one pass on
  // the calling thread.
  int num_chunks = 1;
  int num_threads = 1;
  // Set: frames are returned at TargetImageSize(width, height, *model_input)
  // (above). Default unset: at the video's own size.
  std::optional<ImagePreprocessOptions> model_input;
  // Budget of decoded bytes (VideoInfo::decoded_bytes; while decoding, the
  // working set plus every distinct image returned). Over it:
  // InvalidArgument "... decoded-bytes budget ...". Default 4 GiB.
  int64_t max_decoded_bytes = int64_t{4} << 30;
  // Demuxers FFmpeg may pick (its format_whitelist).
  std::string allowed_formats =
      "matroska,webm,mov,mp4,m4a,3gp,3g2,mj2,avi,mpegts,mpeg,flv,ogg,ivf,gif";
};

struct VideoFrames {
  // One per sample, RGB8 at the video's own size or the model's
  // (model_input); consecutive samples of the same decoded frame share it.
  std::vector<std::shared_ptr<const ImageRgb8>> frames;
  // t_k for each sample, and the presentation time of the frame chosen.
  std::vector<double> sample_times;
  std::vector<double> frame_times;
  // The duration used for sampling (0 when the header had none).
  double duration_seconds = 0;
};

// What the header declares, and what decoding it would cost.
struct VideoInfo {
  int width = 0;  // the video stream's frame size
  int height = 0;
  double duration_seconds = 0;  // 0: unknown
  int64_t samples = 0;          // S; 0 when the duration is unknown
  // The size frames are returned at (the stream's, or the model's).
  int frame_width = 0;
  int frame_height = 0;
  // Declared decoded bytes: samples * frame_width * frame_height * 3 (every
  // sample counted as a distinct image) plus the decoders' working set,
  // kVideoWorkingFrames full-size frames at 3 bytes per pixel per chunk.
  int64_t decoded_bytes = 0;
};
inline constexpr int kVideoWorkingFrames = 4;

// Opens the container and reads the header only (the limits above apply,
// max_decoded_bytes too when the duration is known); nothing is decoded.
absl::StatusOr<VideoInfo> ProbeVideoMemory(absl::Span<const uint8_t> bytes,
                                           const VideoDecodeOptions& options = {});

// Decodes the file at `path`.
absl::StatusOr<VideoFrames> DecodeVideoFile(
    const std::string& path, const VideoDecodeOptions& options = {});

// Decodes a container held in memory; `bytes` must stay valid for the call.
absl::StatusOr<VideoFrames> DecodeVideoMemory(
    absl::Span<const uint8_t> bytes, const VideoDecodeOptions& options = {});

}  // namespace swaserve::media
