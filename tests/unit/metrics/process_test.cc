// lib/metrics/process: the process collector's figures against what the
// test itself does (allocates, opens files, burns CPU), and its families on
// a registry (rendered, linted by promtool when it is on PATH, which CI
// installs; promtool_test fails without it).
#include "lib/metrics/process.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/metrics/registry.h"

namespace swaserve::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ProcessMetricsTest, FiguresAreThisProcesss) {
  const ProcessSnapshot s = ReadProcess();
  EXPECT_GT(s.resident_bytes, 1 << 20);
  EXPECT_GE(s.virtual_bytes, s.resident_bytes);
  EXPECT_GE(s.open_fds, 3);  // stdin, stdout, stderr at least
  const double now = static_cast<double>(absl::ToUnixMicros(absl::Now())) / 1e6;
  EXPECT_LE(s.start_time_seconds, now + 1);
  EXPECT_GT(s.start_time_seconds, now - 3600);  // a test binary started within the hour
  EXPECT_GT(s.heap_allocated_bytes, 0);
  EXPECT_GE(s.heap_free_bytes, 0);
}

TEST(ProcessMetricsTest, HeapAllocatedFollowsMallocAndResidentFollowsTouchedPages) {
  const ProcessSnapshot before = ReadProcess();
  constexpr size_t kBytes = 64 << 20;
  auto block = std::make_unique<char[]>(kBytes);
  std::memset(block.get(), 1, kBytes);  // touched: resident
  // Keeps the compiler from eliding the allocation (new + memset + delete).
  asm volatile("" : : "r"(block.get()) : "memory");
  const ProcessSnapshot held = ReadProcess();
  EXPECT_GE(held.heap_allocated_bytes - before.heap_allocated_bytes, static_cast<int64_t>(kBytes));
  EXPECT_GE(held.resident_bytes - before.resident_bytes, static_cast<int64_t>(kBytes) * 9 / 10);
  block.reset();
  const ProcessSnapshot after = ReadProcess();
  EXPECT_LE(after.heap_allocated_bytes, held.heap_allocated_bytes - static_cast<int64_t>(kBytes));
}

TEST(ProcessMetricsTest, OpenFdsCountsDescriptors) {
  const int64_t before = ReadProcess().open_fds;
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) fds.push_back(open("/dev/null", O_RDONLY));
  EXPECT_EQ(ReadProcess().open_fds, before + 5);
  for (int fd : fds) close(fd);
  EXPECT_EQ(ReadProcess().open_fds, before);
}

TEST(ProcessMetricsTest, CpuSecondsGrowWithWork) {
  const double before = ReadProcess().cpu_seconds;
  const absl::Time until = absl::Now() + absl::Milliseconds(300);
  volatile uint64_t x = 0;
  while (absl::Now() < until) x = x + 1;
  EXPECT_GE(ReadProcess().cpu_seconds - before, 0.1);  // 10 ms clock ticks
}

TEST(ProcessMetricsTest, RegistersOnceAndRendersEveryFamily) {
  Registry registry;
  ASSERT_TRUE(RegisterProcessMetrics(&registry).ok());
  ASSERT_TRUE(RegisterProcessMetrics(&registry).ok());  // again: a no-op
  const std::string text = registry.RenderText();
  for (const char* name :
       {"# TYPE process_cpu_seconds_total counter", "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_virtual_memory_bytes gauge", "# TYPE process_open_fds gauge",
        "# TYPE process_start_time_seconds gauge",
        "# TYPE swaserve_process_heap_allocated_bytes gauge",
        "# TYPE swaserve_process_heap_free_bytes gauge"}) {
    EXPECT_THAT(text, HasSubstr(name));
  }
  if (access("/usr/bin/promtool", X_OK) == 0) {
    std::string output;
    absl::StatusOr<int> rc = base::RunCommand({"/usr/bin/promtool", "check", "metrics"}, &output,
                                              absl::Seconds(60), text);
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << output << "\n" << text;
  }
}

}  // namespace
}  // namespace swaserve::metrics
