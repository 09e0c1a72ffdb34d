// Helpers every benchmark binary in bench/ shares: the Google Benchmark
// main() with --json FILE, fatal errors, command-line flag reading, the
// nearest-rank percentile, JSON output files and paths relative to the
// repository. Library swaserve::bench_util (bench/common/CMakeLists.txt).
//
// Not thread-safe where it says so (SetProgramName); everything else is
// stateless. Errors end the process: these are command-line tools.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace benchmark {
class BenchmarkReporter;
}  // namespace benchmark

namespace swaserve::bench {

// Google Benchmark's main(): translates --json FILE / --json=FILE into
// --benchmark_out=FILE --benchmark_out_format=json ("--json needs a file
// name", exit 2, when FILE is missing), initializes the library (exit 1 on
// unrecognized arguments), runs the selected benchmarks with `display` (the
// console reporter when null), calls `after_run` (e.g. a summary table)
// when given, and shuts the library down. Returns main()'s exit code.
int RunBenchmarkMain(int argc, char** argv,
                     benchmark::BenchmarkReporter* display = nullptr,
                     const std::function<void()>& after_run = {});

// The name Die() prints before its message; call first thing in main().
// Not thread-safe (set it before starting threads). Default: "bench".
void SetProgramName(absl::string_view name);
// Prints "<program>: <what>" to stderr and exits with status 1.
[[noreturn]] void Die(const std::string& what);

// The value of `v`, or Die("<what>: <status>").
template <typename T>
T Check(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().ToString());
  return *std::move(v);
}
// Die("<what>: <status>") unless `s` is OK.
inline void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

// Reads flags from argv[1..] one at a time:
//
//   for (FlagReader r(argc, argv); r.Next();) {
//     if (r.flag() == "--json") f.json = r.Value();
//     else if (r.flag() == "--rate") r.Number(&f.rate);
//     ...
//   }
//
// Value() and the numeric readers consume the next argument; a missing or
// malformed one is fatal (Die: "missing value for --x", "bad number for
// --x: <v>", "bad integer for --x: <v>").
class FlagReader {
 public:
  FlagReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next argument; false when there is none.
  bool Next();
  // The current argument.
  const std::string& flag() const { return flag_; }

  std::string Value();
  void Number(double* out);
  void Integer(int* out);
  void Integer(int64_t* out);
  // The same, returning the value.
  int64_t Integer();

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string flag_;
};

// "3M", "16.8M", "500K", "3000000" (> 0); fatal otherwise ("bad count
// '<s>'").
double ParseCount(absl::string_view s);

// Nearest-rank percentile: the smallest element with at least q of `v` at
// or below it (q in [0, 1]); 0 for an empty vector.
double Percentile(std::vector<double> v, double q);

// Writes `j` as indented JSON (dump(2)) and a newline to `path`; fatal
// ("cannot write <path>") when that fails.
void WriteJsonFile(const std::string& path, const nlohmann::json& j);

bool FileExists(const std::string& path);

// CPU seconds of the calling thread (CLOCK_THREAD_CPUTIME_ID).
double ThreadCpuSeconds();
// utime + stime of a process in seconds (/proc/<pid>/stat fields 14 and
// 15); 0 when unreadable.
double ProcessCpuSeconds(int pid);
// /proc/loadavg's 1, 5 and 15 minute averages ("0.52 0.61 0.70").
std::string LoadAverage();
// `path` (relative to the working directory) when it exists, else the same
// path below `source_dir` (the repository root, SWASERVE_SOURCE_DIR), so
// that a benchmark finds its inputs from the repository root and from the
// build directory alike.
std::string RepoPath(const std::string& path, const char* source_dir);

// The Mooncake conversation trace, relative to the repository root: a data
// input outside the repository (docs/benchmarks.md#traces).
inline constexpr char kMooncakeTracePath[] =
    "../shared/traces/mooncake_conversation_trace.jsonl";

}  // namespace swaserve::bench
