// Multimodal input-layer timings: a generated 10-minute video's decode time
// single-threaded vs chunked-parallel, the scaling curve of chunks x threads,
// and preprocessing.
//
// Video: a generated --minutes long video (--width x --height at --fps,
// mpeg4 in Matroska, a keyframe every --gop frames; the frame content is the
// test pattern of tests/unit/media) is sampled at --sample_fps with
// DecodeVideoFile for every chunks x threads pair of --chunks and --threads
// (pairs with threads > chunks are skipped). Reported: the median wall time
// of --rounds runs after one warm-up run, and the speed-up over chunks =
// threads = 1 (the single-threaded decode, measured in the same run: the
// baseline), and the process CPU seconds per run (all threads: the work,
// whatever the load of the machine). Every run is checked to return the same
// frames as the baseline.
//
// Preprocessing: per item, the median of --rounds runs (after one warm-up) of
// PNG / JPEG decode, PreprocessImage (smart resize to <= 1280 tokens x 4
// patches of 14 px, normalise, patchify), WAV decode + resample (30 s 44.1 kHz
// stereo 16-bit -> 16 kHz mono) and the log-mel of 30 s at 16 kHz.
//
// The allocator is told to keep freed memory (mallopt: mmap threshold 32 MiB,
// no trimming), as a long-running server's allocator does; otherwise every
// multi-MB buffer is fresh pages, and on this VM page faults cost more than
// the computation (resize of 1920x1080: 17 ms -> 110 ms).
//
// Usage: video_decode_bench [--json FILE] [--minutes M] [--width W]
//          [--height H] [--fps F] [--gop G] [--sample_fps S]
//          [--chunks 1,2,4,8] [--threads 1,2] [--rounds N] [--video PATH]
//          [--no_preprocess]
//   --video  decode this file instead of generating one (kept).
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/common/bench_util.h"
#include "lib/base/hash.h"
#include "lib/media/audio.h"
#include "lib/media/image.h"
#include "lib/media/image_preprocess.h"
#include "lib/media/mel.h"
#include "lib/media/video.h"
#include "nlohmann/json.hpp"
#include "tests/unit/media/media_test_util.h"

namespace swaserve {
namespace {

namespace media_testing = media::testing;

struct Flags {
  std::string json;
  double minutes = 10;
  int width = 128;
  int height = 96;
  int fps = 25;
  int gop = 50;
  double sample_fps = 2;
  std::vector<int> chunks = {1, 2, 4, 8};
  std::vector<int> threads = {1, 2};
  int rounds = 3;
  std::string video;
  bool preprocess = true;
};

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0)
      bench::Die("bad list '" + s + "'");
    out.push_back(v);
  }
  return out;
}

double Seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// User + system CPU seconds of this process so far (all threads).
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `rounds` runs after one warm-up.
double Time(int rounds, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < rounds; ++i) t.push_back(Seconds(f));
  return Median(t);
}

uint64_t Fingerprint(const media::VideoFrames& v) {
  uint64_t h = v.frames.size();
  for (size_t i = 0; i < v.frames.size(); ++i) {
    h = base::Hash64(v.frames[i]->pixels.data(), v.frames[i]->pixels.size(), h);
    h = base::Hash64(&v.frame_times[i], sizeof(double), h);
  }
  return h;
}

nlohmann::json VideoRuns(const Flags& f, const std::string& path) {
  nlohmann::json rows = nlohmann::json::array();
  double baseline = 0;
  uint64_t want = 0;
  std::printf("\n%-8s %-8s %12s %10s %10s %8s\n", "chunks", "threads",
              "median_s", "speedup", "cpu_s/run", "frames");
  for (int chunks : f.chunks) {
    for (int threads : f.threads) {
      if (threads > chunks) continue;
      media::VideoDecodeOptions o;
      o.sample_fps = f.sample_fps;
      o.num_chunks = chunks;
      o.num_threads = threads;
      std::vector<double> times;
      media::VideoFrames out;
      // Warm-up (first-touch page faults of the frame buffers are costly on
      // this VM and would land on whichever configuration runs first).
      out = bench::Check(media::DecodeVideoFile(path, o), "decode");
      const double cpu_start = CpuSeconds();
      for (int r = 0; r < f.rounds; ++r) {
        times.push_back(Seconds([&] {
          out = bench::Check(media::DecodeVideoFile(path, o), "decode");
        }));
      }
      const double cpu = (CpuSeconds() - cpu_start) / f.rounds;
      const uint64_t got = Fingerprint(out);
      const double median = Median(times);
      if (chunks == 1 && threads == 1) {
        baseline = median;
        want = got;
      } else if (want != 0 && got != want) {
        bench::Die(
            absl::StrCat("chunks ", chunks, " threads ", threads,
                         ": frames differ from the single-threaded decode"));
      }
      const double speedup = baseline > 0 ? baseline / median : 0;
      std::printf("%-8d %-8d %12.3f %9.2fx %10.3f %8zu\n", chunks, threads,
                  median, speedup, cpu, out.frames.size());
      rows.push_back({{"chunks", chunks},
                      {"threads", threads},
                      {"median_seconds", median},
                      {"speedup", speedup},
                      {"cpu_seconds_per_run", cpu},
                      {"frames", out.frames.size()}});
    }
  }
  return rows;
}

nlohmann::json PreprocessRuns(const Flags& f) {
  nlohmann::json rows = nlohmann::json::array();
  auto row = [&](const std::string& name, double seconds) {
    std::printf("%-44s %10.3f ms\n", name.c_str(), seconds * 1e3);
    rows.push_back({{"item", name}, {"median_ms", seconds * 1e3}});
  };
  std::printf("\n%-44s %13s\n", "preprocessing item", "median");
  const media::ImagePreprocessOptions pre;
  for (const auto& [w, h] : {std::pair{640, 480}, std::pair{1920, 1080}}) {
    const media::ImageRgb8 img = media_testing::MakePattern(w, h, 3);
    const std::vector<uint8_t> png = media_testing::EncodePng(img);
    const std::vector<uint8_t> jpeg = media_testing::EncodeJpeg(img, 90);
    const std::string size = absl::StrCat(w, "x", h);
    row("PNG decode " + size,
        Time(f.rounds, [&] { (void)media::DecodeImage(png); }));
    row("JPEG decode " + size,
        Time(f.rounds, [&] { (void)media::DecodeImage(jpeg); }));
    const media::ImageSize target = *media::TargetImageSize(w, h, pre);
    row(absl::StrCat("resize+normalise+patchify ", size, " -> ", target.width,
                     "x", target.height),
        Time(f.rounds, [&] { (void)media::PreprocessImage(img, pre); }));
  }
  std::vector<float> stereo;
  for (float v : media_testing::Sine(440, 30, 44100))
    stereo.insert(stereo.end(), {v, v / 2});
  const std::vector<uint8_t> wav =
      media_testing::WriteWav(stereo, 2, 44100, 16);
  row("WAV decode + resample 30 s 44.1k stereo",
      Time(f.rounds, [&] { (void)media::DecodeWav(wav); }));
  const auto mel = bench::Check(media::MelFilterbank::Create({}), "mel");
  const std::vector<float> audio = media_testing::Sine(440, 30, 16000);
  row("log-mel 30 s 16k (80 mels)",
      Time(f.rounds, [&] { (void)mel->Compute(audio); }));
  return rows;
}

int Main(int argc, char** argv) {
  bench::SetProgramName("video_decode_bench");
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  Flags f;
  for (bench::FlagReader r(argc, argv); r.Next();) {
    if (r.flag() == "--json")
      f.json = r.Value();
    else if (r.flag() == "--minutes")
      r.Number(&f.minutes);
    else if (r.flag() == "--width")
      r.Integer(&f.width);
    else if (r.flag() == "--height")
      r.Integer(&f.height);
    else if (r.flag() == "--fps")
      r.Integer(&f.fps);
    else if (r.flag() == "--gop")
      r.Integer(&f.gop);
    else if (r.flag() == "--sample_fps")
      r.Number(&f.sample_fps);
    else if (r.flag() == "--chunks")
      f.chunks = ParseList(r.Value());
    else if (r.flag() == "--threads")
      f.threads = ParseList(r.Value());
    else if (r.flag() == "--rounds")
      r.Integer(&f.rounds);
    else if (r.flag() == "--video")
      f.video = r.Value();
    else if (r.flag() == "--no_preprocess")
      f.preprocess = false;
    else
      bench::Die("unknown flag " + r.flag());
  }
  nlohmann::json out;
  std::string path = f.video;
  if (path.empty()) {
    path = media_testing::TempPath("bench_video.mkv");
    media_testing::TestVideoOptions v{
        .width = f.width,
        .height = f.height,
        .fps = f.fps,
        .num_frames = static_cast<int>(f.minutes * 60 * f.fps),
        .gop = f.gop};
    const double s = Seconds([&] {
      bench::Check(media_testing::WriteTestVideo(path, v), "encode");
    });
    std::printf(
        "generated %s: %.1f min, %dx%d at %d fps, gop %d, %ju bytes (%.1f s)\n",
        path.c_str(), f.minutes, f.width, f.height, f.fps, f.gop,
        static_cast<uintmax_t>(std::filesystem::file_size(path)), s);
    out["video"] = {{"minutes", f.minutes}, {"width", f.width},
                    {"height", f.height},   {"fps", f.fps},
                    {"gop", f.gop},         {"codec", "mpeg4/matroska"}};
  } else {
    out["video"] = {{"path", path}};
  }
  std::printf("sampling at %.2f fps, median of %d rounds\n", f.sample_fps,
              f.rounds);
  out["sample_fps"] = f.sample_fps;
  out["rounds"] = f.rounds;
  out["decode"] = VideoRuns(f, path);
  if (f.video.empty()) std::filesystem::remove(path);
  if (f.preprocess) out["preprocess"] = PreprocessRuns(f);
  if (!f.json.empty()) bench::WriteJsonFile(f.json, out);
  return 0;
}

}  // namespace
}  // namespace swaserve

int main(int argc, char** argv) { return swaserve::Main(argc, argv); }
