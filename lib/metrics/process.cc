#include "lib/metrics/process.h"

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "lib/base/sanitizers.h"
#include "lib/base/status.h"

#if SWASERVE_ASAN
#include <sanitizer/allocator_interface.h>
#endif

namespace swaserve::metrics {
namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Seconds since the epoch at boot ("btime" in /proc/stat), 0 if unknown.
double BootTime() {
  std::istringstream in(ReadFile("/proc/stat"));
  for (std::string line; std::getline(in, line);) {
    int64_t t = 0;
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "btime ")) continue;
    if (absl::SimpleAtoi(rest, &t)) return static_cast<double>(t);
  }
  return 0;
}

int64_t CountFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  int64_t n = 0;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

// The /proc/self/stat figures of `s` (CPU, RSS, virtual size, start time).
void ReadStat(ProcessSnapshot* s) {
  // /proc/self/stat: "pid (comm) state ppid ..."; comm may hold spaces and
  // parentheses, so fields are counted from the last ')'. After it, field 3
  // (state) is index 0: utime 14 -> 11, stime 15 -> 12, starttime 22 -> 19,
  // vsize 23 -> 20, rss 24 -> 21.
  const std::string stat = ReadFile("/proc/self/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return;
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  int64_t utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
  if (f.size() <= 21 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime) ||
      !absl::SimpleAtoi(f[19], &start) || !absl::SimpleAtoi(f[20], &vsize) ||
      !absl::SimpleAtoi(f[21], &rss) || tick <= 0) {
    return;
  }
  s->cpu_seconds = static_cast<double>(utime + stime) / tick;
  s->virtual_bytes = vsize;
  s->resident_bytes = static_cast<int64_t>(static_cast<double>(rss) * page);
  static const double boot = BootTime();  // fixed while the system runs
  if (boot > 0) {
    s->start_time_seconds = boot + static_cast<double>(start) / tick;
  }
}

// The heap figures of `s`.
void ReadHeap(ProcessSnapshot* s) {
#if SWASERVE_ASAN
  // The sanitizer's allocator replaces malloc; glibc's arenas are unused.
  s->heap_allocated_bytes = static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
  s->heap_free_bytes = static_cast<int64_t>(__sanitizer_get_free_bytes());
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  // Walks every arena under its lock: read once per scrape, not per sample.
  const struct mallinfo2 mi = mallinfo2();
  s->heap_allocated_bytes = static_cast<int64_t>(mi.uordblks + mi.hblkhd);
  s->heap_free_bytes = static_cast<int64_t>(mi.fordblks);
#else
  (void)s;
#endif
}

ProcessSnapshot Stat() {
  ProcessSnapshot s;
  ReadStat(&s);
  return s;
}

ProcessSnapshot Heap() {
  ProcessSnapshot s;
  ReadHeap(&s);
  return s;
}

}  // namespace

ProcessSnapshot ReadProcess() {
  ProcessSnapshot s;
  ReadStat(&s);
  s.open_fds = CountFds();
  ReadHeap(&s);
  return s;
}

absl::Status RegisterProcessMetrics(Registry* registry) {
  const absl::Status first = registry->AddCallbackCounter(
      "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
      [] { return Stat().cpu_seconds; });
  if (absl::IsAlreadyExists(first)) return absl::OkStatus();  // registered before
  RETURN_IF_ERROR(first);
  RETURN_IF_ERROR(registry->AddCallbackGauge(
      "process_resident_memory_bytes", "Resident memory size in bytes.",
      [] { return static_cast<double>(Stat().resident_bytes); }));
  RETURN_IF_ERROR(registry->AddCallbackGauge(
      "process_virtual_memory_bytes", "Virtual memory size in bytes.",
      [] { return static_cast<double>(Stat().virtual_bytes); }));
  RETURN_IF_ERROR(registry->AddCallbackGauge(
      "process_open_fds", "Number of open file descriptors.",
      [] { return static_cast<double>(CountFds()); }));
  const double start = Stat().start_time_seconds;
  RETURN_IF_ERROR(registry->AddCallbackGauge(
      "process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
      [start] { return start; }));
  RETURN_IF_ERROR(registry->AddCallbackGauge(
      "swaserve_process_heap_allocated_bytes",
      "Bytes malloc has handed out and not had back (every arena, mmapped blocks included): "
      "a leak grows this, allocator retention does not.",
      [] { return static_cast<double>(Heap().heap_allocated_bytes); }));
  return registry->AddCallbackGauge(
      "swaserve_process_heap_free_bytes",
      "Bytes malloc holds free in its arenas: resident memory kept without use.",
      [] { return static_cast<double>(Heap().heap_free_bytes); });
}

}  // namespace swaserve::metrics
