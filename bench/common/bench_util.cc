#include "bench/common/bench_util.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "benchmark/benchmark.h"
#include "nlohmann/json.hpp"

namespace swaserve::bench {
namespace {

std::string& ProgramName() {
  static std::string* name = new std::string("bench");
  return *name;
}

}  // namespace

int RunBenchmarkMain(int argc, char** argv,
                     benchmark::BenchmarkReporter* display,
                     const std::function<void()>& after_run) {
  // Translate --json FILE / --json=FILE into Google Benchmark's out flags.
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string json;
    if (arg == "--json") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "--json needs a file name\n");
        return 2;
      }
      json = argv[++i];
    } else if (arg.rfind("--json=", 0) == 0) {
      json = arg.substr(7);
    } else {
      args.push_back(arg);
      continue;
    }
    args.push_back("--benchmark_out=" + json);
    args.push_back("--benchmark_out_format=json");
  }
  std::vector<char*> new_argv;
  for (std::string& arg : args) new_argv.push_back(arg.data());
  new_argv.push_back(nullptr);
  int new_argc = static_cast<int>(args.size());
  benchmark::Initialize(&new_argc, new_argv.data());
  if (benchmark::ReportUnrecognizedArguments(new_argc, new_argv.data())) {
    return 1;
  }
  if (display != nullptr) {
    benchmark::RunSpecifiedBenchmarks(display);
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  if (after_run) after_run();
  benchmark::Shutdown();
  return 0;
}

void SetProgramName(absl::string_view name) {
  ProgramName() = std::string(name);
}

void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", ProgramName().c_str(), what.c_str());
  std::exit(1);
}

bool FlagReader::Next() {
  if (++i_ >= argc_) return false;
  flag_ = argv_[i_];
  return true;
}

std::string FlagReader::Value() {
  if (i_ + 1 >= argc_) Die("missing value for " + flag_);
  return argv_[++i_];
}

void FlagReader::Number(double* out) {
  const std::string v = Value();
  if (!absl::SimpleAtod(v, out)) Die("bad number for " + flag_ + ": " + v);
}

void FlagReader::Integer(int* out) {
  const std::string v = Value();
  if (!absl::SimpleAtoi(v, out)) Die("bad integer for " + flag_ + ": " + v);
}

void FlagReader::Integer(int64_t* out) {
  const std::string v = Value();
  if (!absl::SimpleAtoi(v, out)) Die("bad integer for " + flag_ + ": " + v);
}

int64_t FlagReader::Integer() {
  int64_t v = 0;
  Integer(&v);
  return v;
}

double ParseCount(absl::string_view s) {
  double mult = 1;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) {
    mult = 1e6;
    s.remove_suffix(1);
  } else if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) {
    mult = 1e3;
    s.remove_suffix(1);
  }
  double v = 0;
  if (!absl::SimpleAtod(s, &v) || v <= 0) {
    Die("bad count '" + std::string(s) + "'");
  }
  return v * mult;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t idx = static_cast<size_t>(
      std::max(0.0, std::ceil(q * static_cast<double>(v.size())) - 1));
  return v[std::min(idx, v.size() - 1)];
}

void WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) Die("cannot write " + path);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string RepoPath(const std::string& path, const char* source_dir) {
  if (FileExists(path)) return path;
  return std::string(source_dir) + "/" + path;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double ProcessCpuSeconds(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double ticks = 0;
  // After "pid (comm) ": state is field 3; utime, stime are fields 14, 15.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::strtod(field.c_str(), nullptr);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace swaserve::bench
