// Feeds the registry's exposition through `promtool check metrics`, the
// Prometheus project's own parser and linter. promtool must be on PATH (CI
// installs the prometheus package); the test fails, not skips, without it.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/metrics/buckets.h"
#include "lib/metrics/registry.h"

namespace swaserve::metrics {
namespace {

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (const absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = std::string(dir) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Runs `promtool check metrics` on `exposition`; returns its exit code.
int PromtoolCheck(const std::string& exposition, std::string* output) {
  absl::StatusOr<int> rc = base::RunCommand(
      {"promtool", "check", "metrics"}, output, absl::Seconds(60), exposition);
  EXPECT_TRUE(rc.ok()) << rc.status();
  return rc.ok() ? *rc : -1;
}

class PromtoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!OnPath("promtool")) {
      GTEST_FAIL() << "promtool not found on PATH: install Prometheus "
                      "(Debian: apt-get install prometheus) — CI has it";
    }
  }
};

TEST_F(PromtoolTest, RealisticExpositionPassesCheckMetrics) {
  Registry registry;
  CounterFamily* prompt_tokens = *registry.AddCounter(
      "swaserve_prompt_tokens_total", "Prompt tokens received.", {"model"});
  CounterFamily* decisions = *registry.AddCounter(
      "swaserve_router_decisions_total",
      "Routing decisions by reason.\nMulti-line help with a \\ backslash.",
      {"reason", "target"});
  GaugeFamily* queue = *registry.AddGauge("swaserve_sched_queue_depth",
                                          "Requests waiting.", {"role"});
  HistogramFamily* ttft =
      *registry.AddHistogram("swaserve_ttft_seconds", "Time to first token.",
                             {"bucket"}, DefaultLatencyBuckets());
  HistogramFamily* batch = *registry.AddHistogram("swaserve_encoder_batch_size",
                                                  "Encoder batch size.", {},
                                                  *ExponentialBuckets(1, 2, 8));
  ASSERT_TRUE(registry
                  .AddCallbackGauge("swaserve_kv_pages", "KV pages.",
                                    {"pool", "state"},
                                    [] {
                                      return std::vector<CallbackSample>{
                                          {{"full", "free"}, 1024},
                                          {{"swa", "used"}, 3.5e9},
                                      };
                                    })
                  .ok());
  ASSERT_TRUE(registry
                  .AddCallbackCounter("swaserve_transfer_bytes_total",
                                      "KV bytes transferred.",
                                      [] { return 1.25e12; })
                  .ok());

  prompt_tokens->WithLabels({"mimo-v2"}).Increment(123456);
  decisions->WithLabels({"prefix_affinity", "decode-0"}).Increment();
  decisions->WithLabels({"quote\"back\\slash\nnewline", "x"}).Increment(2);
  decisions->WithLabels({"", "empty reason"}).Increment();
  decisions->WithLabels({"ünïcødé ✓", "y"}).Increment();
  queue->WithLabels({"prefill"}).Set(-1);
  queue->WithLabels({"decode"}).Set(std::numeric_limits<double>::infinity());
  queue->WithLabels({"encoder"}).Set(std::nan(""));
  for (double v : {0.0004, 0.02, 0.3, 7.0, 500.0}) {
    ttft->WithLabels({"0-64K"}).Observe(v);
  }
  ttft->WithLabels({"64K-256K"});  // present but empty
  batch->WithLabels().Observe(3);

  const std::string exposition = registry.RenderText();
  std::string output;
  EXPECT_EQ(PromtoolCheck(exposition, &output), 0)
      << "promtool output:\n"
      << output << "\nexposition:\n"
      << exposition;
}

// Guards against a promtool that accepts anything: a malformed label value
// (unescaped newline) and a lint failure (counter without _total) fail.
TEST_F(PromtoolTest, PromtoolRejectsBadInput) {
  std::string output;
  EXPECT_NE(PromtoolCheck("# TYPE a counter\na{l=\"b\n\"} 1\n", &output), 0);
  EXPECT_NE(PromtoolCheck("# HELP a x\n# TYPE a counter\na 1\n", &output), 0);
}

}  // namespace
}  // namespace swaserve::metrics
