#include "lib/metrics/registry.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/metrics/buckets.h"

namespace swaserve::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const FamilySnapshot* FindFamily(const std::vector<FamilySnapshot>& families,
                                 absl::string_view name) {
  for (const FamilySnapshot& family : families) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

TEST(RegistryTest, FullExpositionGolden) {
  Registry registry;
  CounterFamily* requests = *registry.AddCounter(
      "swaserve_requests_total", "Requests served.", {"model", "code"});
  GaugeFamily* depth =
      *registry.AddGauge("swaserve_queue_depth", "Queued requests.");
  HistogramFamily* ttft = *registry.AddHistogram(
      "swaserve_ttft_seconds", "Time to first token.", {"bucket"}, {0.1, 1});
  ASSERT_TRUE(registry
                  .AddCallbackGauge("swaserve_kv_pages", "KV pages.",
                                    {"pool", "state"},
                                    [] {
                                      return std::vector<CallbackSample>{
                                          {{"swa", "used"}, 7},
                                          {{"full", "free"}, 100},
                                          {{"full", "used"}, 28},
                                      };
                                    })
                  .ok());
  ASSERT_TRUE(registry
                  .AddCallbackCounter("swaserve_transfer_bytes_total",
                                      "Bytes sent.", [] { return 1e9; })
                  .ok());

  requests->WithLabels({"mimo", "500"}).Increment();
  requests->WithLabels({"mimo", "200"}).Increment(41);
  requests->WithLabels({"a \"quoted\" \\ model\n", "200"}).Increment(2);
  depth->WithLabels().Set(3);
  Histogram& short_ttft = ttft->WithLabels({"0-64K"});
  short_ttft.Observe(0.05);
  short_ttft.Observe(0.1);
  short_ttft.Observe(0.5);
  short_ttft.Observe(30);

  EXPECT_EQ(registry.RenderText(),
            "# HELP swaserve_kv_pages KV pages.\n"
            "# TYPE swaserve_kv_pages gauge\n"
            "swaserve_kv_pages{pool=\"full\",state=\"free\"} 100\n"
            "swaserve_kv_pages{pool=\"full\",state=\"used\"} 28\n"
            "swaserve_kv_pages{pool=\"swa\",state=\"used\"} 7\n"
            "# HELP swaserve_queue_depth Queued requests.\n"
            "# TYPE swaserve_queue_depth gauge\n"
            "swaserve_queue_depth 3\n"
            "# HELP swaserve_requests_total Requests served.\n"
            "# TYPE swaserve_requests_total counter\n"
            "swaserve_requests_total{model=\"a \\\"quoted\\\" \\\\ model\\n\","
            "code=\"200\"} 2\n"
            "swaserve_requests_total{model=\"mimo\",code=\"200\"} 41\n"
            "swaserve_requests_total{model=\"mimo\",code=\"500\"} 1\n"
            "# HELP swaserve_transfer_bytes_total Bytes sent.\n"
            "# TYPE swaserve_transfer_bytes_total counter\n"
            "swaserve_transfer_bytes_total 1000000000\n"
            "# HELP swaserve_ttft_seconds Time to first token.\n"
            "# TYPE swaserve_ttft_seconds histogram\n"
            "swaserve_ttft_seconds_bucket{bucket=\"0-64K\",le=\"0.1\"} 2\n"
            "swaserve_ttft_seconds_bucket{bucket=\"0-64K\",le=\"1\"} 3\n"
            "swaserve_ttft_seconds_bucket{bucket=\"0-64K\",le=\"+Inf\"} 4\n"
            "swaserve_ttft_seconds_sum{bucket=\"0-64K\"} 30.65\n"
            "swaserve_ttft_seconds_count{bucket=\"0-64K\"} 4\n");
}

TEST(RegistryTest, UnlabelledFamiliesExportZeroAtOnce) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("c_total", "c.").ok());
  ASSERT_TRUE(registry.AddHistogram("h_seconds", "h.", {}, {1}).ok());
  ASSERT_TRUE(registry.AddGauge("g", "g.", {"x"}).ok());  // labelled: nothing
  EXPECT_EQ(registry.RenderText(),
            "# HELP c_total c.\n"
            "# TYPE c_total counter\n"
            "c_total 0\n"
            "# HELP h_seconds h.\n"
            "# TYPE h_seconds histogram\n"
            "h_seconds_bucket{le=\"1\"} 0\n"
            "h_seconds_bucket{le=\"+Inf\"} 0\n"
            "h_seconds_sum 0\n"
            "h_seconds_count 0\n");
  const std::vector<FamilySnapshot> families = registry.Collect();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_THAT(FindFamily(families, "g")->metrics, IsEmpty());
}

TEST(RegistryTest, WithLabelsReturnsStableChildren) {
  Registry registry;
  CounterFamily* family = *registry.AddCounter("x_total", "x.", {"a", "b"});
  Counter* first = &family->WithLabels({"1", "2"});
  for (int i = 0; i < 100; ++i) {
    family->WithLabels({std::to_string(i), "z"});
  }
  EXPECT_EQ(&family->WithLabels({"1", "2"}), first);
  const std::vector<std::string> owned = {"1", "2"};
  EXPECT_EQ(&family->WithLabels(owned), first);
  EXPECT_EQ(family->size(), 101u);
  // Label values that would collide under naive concatenation stay apart.
  EXPECT_NE(&family->WithLabels({"ab", "c"}), &family->WithLabels({"a", "bc"}));
}

TEST(RegistryTest, TryWithLabelsRejectsWrongArity) {
  Registry registry;
  GaugeFamily* family = *registry.AddGauge("g", "g.", {"a"});
  absl::StatusOr<Gauge*> child = family->TryWithLabels({});
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(child.status().message(), HasSubstr("1 label(s) [a]"));
  EXPECT_FALSE(family->TryWithLabels({"x", "y"}).ok());
  EXPECT_TRUE(family->TryWithLabels({"x"}).ok());
}

TEST(RegistryDeathTest, WithLabelsWrongArityAborts) {
  Registry registry;
  GaugeFamily* family = *registry.AddGauge("g", "g.", {"a"});
  EXPECT_DEATH(family->WithLabels({"x", "y"}), "2 value\\(s\\) were given");
}

TEST(RegistryTest, SameDefinitionReturnsExistingFamily) {
  Registry registry;
  absl::StatusOr<HistogramFamily*> a =
      registry.AddHistogram("h", "help", {"x"}, {1, 2});
  // A trailing +Inf normalizes to the same definition.
  absl::StatusOr<HistogramFamily*> b = registry.AddHistogram(
      "h", "help", {"x"}, {1, 2, std::numeric_limits<double>::infinity()});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*registry.AddCounter("c_total", "c"),
            *registry.AddCounter("c_total", "c"));
}

TEST(RegistryTest, ConflictingDefinitionsAreAlreadyExists) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge("m", "help", {"a"}).ok());
  EXPECT_EQ(registry.AddGauge("m", "help", {"b"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge("m", "other help", {"a"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddHistogram("m", "help", {"a"}, {1}).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.AddHistogram("h", "help", {}, {1}).ok());
  EXPECT_EQ(registry.AddHistogram("h", "help", {}, {2}).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.AddCounter("m_total", "help").ok());
  const absl::Status status =
      registry.AddCallbackCounter("m_total", "help", [] { return 1.0; });
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("already registered as counter"));
}

TEST(RegistryTest, SeriesNameCollisionsAreAlreadyExists) {
  Registry registry;
  ASSERT_TRUE(registry.AddHistogram("lat", "h", {}, {1}).ok());
  EXPECT_EQ(registry.AddGauge("lat_count", "g").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge("lat_bucket", "g").status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.AddGauge("q_sum", "g").ok());
  const absl::Status status = registry.AddHistogram("q", "h", {}, {1}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("q_sum"));
}

TEST(RegistryTest, ValidationErrors) {
  Registry registry;
  auto code = [](const absl::Status& s) { return s.code(); };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(registry.AddCounter("requests", "h").status()), kInvalid);
  EXPECT_EQ(code(registry.AddCounter("bad-name_total", "h").status()),
            kInvalid);
  EXPECT_EQ(code(registry.AddGauge("__g", "h").status()), kInvalid);
  EXPECT_EQ(code(registry.AddGauge("g", "").status()), kInvalid);
  EXPECT_EQ(code(registry.AddGauge("g", "h", {"__x"}).status()), kInvalid);
  EXPECT_EQ(code(registry.AddGauge("g", "h", {"a:b"}).status()), kInvalid);
  EXPECT_EQ(code(registry.AddGauge("g", "h", {"a", "a"}).status()), kInvalid);
  EXPECT_EQ(code(registry.AddHistogram("h", "h", {"le"}, {1}).status()),
            kInvalid);
  EXPECT_EQ(code(registry.AddHistogram("h", "h", {}, {2, 1}).status()),
            kInvalid);
  EXPECT_EQ(code(registry.AddCallbackGauge("cb", "h", nullptr)), kInvalid);
  EXPECT_TRUE(registry.AddGauge("g", "h", {"le"}).ok());  // only histograms
  EXPECT_EQ(registry.Collect().size(), 1u);  // nothing half-registered
}

TEST(RegistryTest, CallbackSamplesAreValidatedSortedAndDeduplicated) {
  Registry registry;
  ASSERT_TRUE(registry
                  .AddCallbackGauge("g", "g.", {"k"},
                                    [] {
                                      return std::vector<CallbackSample>{
                                          {{"b"}, 2},      {{"a"}, 1},
                                          {{"b"}, 3},       // repeat: dropped
                                          {{"x", "y"}, 4},  // arity: dropped
                                          {{}, 5},          // arity: dropped
                                      };
                                    })
                  .ok());
  const std::vector<FamilySnapshot> families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  ASSERT_EQ(families[0].metrics.size(), 2u);
  EXPECT_THAT(families[0].metrics[0].label_values, ElementsAre("a"));
  EXPECT_EQ(families[0].metrics[0].value, 1);
  EXPECT_THAT(families[0].metrics[1].label_values, ElementsAre("b"));
  EXPECT_EQ(families[0].metrics[1].value, 2);
}

TEST(RegistryTest, CallbackRunsAtEachScrapeUntilRemoved) {
  Registry registry;
  std::atomic<int> calls{0};
  ASSERT_TRUE(registry
                  .AddCallbackGauge("swaserve_pool_pages", "Pages.",
                                    [&calls] { return double(++calls); })
                  .ok());
  EXPECT_THAT(registry.RenderText(), HasSubstr("swaserve_pool_pages 1\n"));
  EXPECT_THAT(registry.RenderText(), HasSubstr("swaserve_pool_pages 2\n"));
  // A callback family cannot be re-registered, even identically.
  EXPECT_EQ(
      registry
          .AddCallbackGauge("swaserve_pool_pages", "Pages.", [] { return 0.0; })
          .code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(registry.RemoveCallback("swaserve_pool_pages").ok());
  EXPECT_EQ(registry.RenderText(), "");
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(registry.RemoveCallback("swaserve_pool_pages").code(),
            absl::StatusCode::kNotFound);
  // The name is free again, in any form.
  EXPECT_TRUE(registry.AddGauge("swaserve_pool_pages", "Pages.").ok());
  EXPECT_EQ(registry.RemoveCallback("swaserve_pool_pages").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RegistryTest, ConcurrentUpdatesRegistrationAndScrapes) {
  Registry registry;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      const std::string text = registry.RenderText();
      ASSERT_EQ(text.empty() || text.back() == '\n', true);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, t] {
      // Every thread registers the same families (same definition).
      CounterFamily* tokens =
          *registry.AddCounter("swaserve_tokens_total", "Tokens.", {"kind"});
      HistogramFamily* latency = *registry.AddHistogram(
          "swaserve_latency_seconds", "Latency.", {}, DefaultLatencyBuckets());
      Counter& shared = tokens->WithLabels({"shared"});
      Counter& own = tokens->WithLabels({"thread" + std::to_string(t)});
      Histogram& histogram = latency->WithLabels();
      for (int i = 0; i < kPerThread; ++i) {
        shared.Increment();
        own.Increment(2);
        histogram.Observe(0.003);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done = true;
  scraper.join();

  const std::vector<FamilySnapshot> families = registry.Collect();
  const FamilySnapshot* tokens = FindFamily(families, "swaserve_tokens_total");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->metrics.size(), kThreads + 1u);
  double own_total = 0;
  for (const MetricSnapshot& metric : tokens->metrics) {
    if (metric.label_values[0] == "shared") {
      EXPECT_EQ(metric.value, double{kThreads} * kPerThread);
    } else {
      EXPECT_EQ(metric.value, 2.0 * kPerThread);
      own_total += metric.value;
    }
  }
  EXPECT_EQ(own_total, 2.0 * kThreads * kPerThread);
  const FamilySnapshot* latency =
      FindFamily(families, "swaserve_latency_seconds");
  ASSERT_NE(latency, nullptr);
  ASSERT_EQ(latency->metrics.size(), 1u);
  const HistogramSnapshot& histogram = latency->metrics[0].histogram;
  EXPECT_EQ(histogram.count, uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(histogram.cumulative_counts[1], 0u);               // le=0.002
  EXPECT_EQ(histogram.cumulative_counts[2], histogram.count);  // le=0.005
}

TEST(DefaultRegistryTest, IsOneInstance) {
  EXPECT_EQ(&DefaultRegistry(), &DefaultRegistry());
}

}  // namespace
}  // namespace swaserve::metrics
