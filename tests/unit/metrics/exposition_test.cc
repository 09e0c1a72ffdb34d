#include "lib/metrics/exposition.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(FormatValueTest, SpecialValues) {
  EXPECT_EQ(FormatValue(kInf), "+Inf");
  EXPECT_EQ(FormatValue(-kInf), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(0.0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
}

TEST(FormatValueTest, IntegersHaveNoExponentOrFraction) {
  EXPECT_EQ(FormatValue(1), "1");
  EXPECT_EQ(FormatValue(-5), "-5");
  EXPECT_EQ(FormatValue(1e6), "1000000");
  EXPECT_EQ(FormatValue(123456789012345.0), "123456789012345");
  EXPECT_EQ(FormatValue(9007199254740.0), "9007199254740");
}

TEST(FormatValueTest, FractionsAreShortestRoundTrip) {
  EXPECT_EQ(FormatValue(1.5), "1.5");
  EXPECT_EQ(FormatValue(0.005), "0.005");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(-2.25), "-2.25");
  EXPECT_EQ(FormatValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatValue(1e-7), "1e-07");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  for (double v : {0.1 + 0.2, 1e-300, 6.02214076e23, 1.0 / 3, -1e-5}) {
    EXPECT_EQ(std::strtod(FormatValue(v).c_str(), nullptr), v) << v;
  }
}

TEST(EscapeTest, Help) {
  EXPECT_EQ(EscapeHelp("plain"), "plain");
  EXPECT_EQ(EscapeHelp("a\\b\nc\"d"), "a\\\\b\\nc\"d");  // quotes stay
}

TEST(EscapeTest, LabelValue) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
  EXPECT_EQ(EscapeLabelValue("ünïcode"), "ünïcode");
}

TEST(MetricTypeNameTest, Names) {
  EXPECT_EQ(MetricTypeName(MetricType::kCounter), "counter");
  EXPECT_EQ(MetricTypeName(MetricType::kGauge), "gauge");
  EXPECT_EQ(MetricTypeName(MetricType::kHistogram), "histogram");
}

TEST(RenderTextFormatTest, CounterAndGaugeGolden) {
  FamilySnapshot counter;
  counter.name = "swaserve_requests_total";
  counter.help = "Requests.\nBy code \\ path.";
  counter.type = MetricType::kCounter;
  counter.label_names = {"code", "path"};
  counter.metrics.push_back({{"200", "/v1/chat"}, 42, {}});
  counter.metrics.push_back({{"500", "say \"hi\"\\\n"}, 1.5, {}});

  FamilySnapshot gauge;
  gauge.name = "swaserve_queue_depth";
  gauge.help = "Queue depth.";
  gauge.type = MetricType::kGauge;
  gauge.metrics.push_back({{}, -kInf, {}});

  FamilySnapshot empty;  // labelled family without children: omitted
  empty.name = "swaserve_empty";
  empty.help = "Nothing yet.";
  empty.label_names = {"x"};

  const FamilySnapshot families[] = {counter, gauge, empty};
  EXPECT_EQ(
      RenderTextFormat(families),
      "# HELP swaserve_requests_total Requests.\\nBy code \\\\ path.\n"
      "# TYPE swaserve_requests_total counter\n"
      "swaserve_requests_total{code=\"200\",path=\"/v1/chat\"} 42\n"
      "swaserve_requests_total{code=\"500\",path=\"say \\\"hi\\\"\\\\\\n\"}"
      " 1.5\n"
      "# HELP swaserve_queue_depth Queue depth.\n"
      "# TYPE swaserve_queue_depth gauge\n"
      "swaserve_queue_depth -Inf\n");
}

TEST(RenderTextFormatTest, HistogramGolden) {
  FamilySnapshot histogram;
  histogram.name = "swaserve_ttft_seconds";
  histogram.help = "Time to first token.";
  histogram.type = MetricType::kHistogram;
  histogram.label_names = {"model"};
  histogram.bucket_bounds = {0.005, 1, 1e6};
  MetricSnapshot metric;
  metric.label_values = {"mimo"};
  metric.histogram.cumulative_counts = {1, 3, 3, 4};
  metric.histogram.sum = 2000001.25;
  metric.histogram.count = 4;
  histogram.metrics.push_back(metric);

  std::string out;
  AppendTextFormat(histogram, &out);
  EXPECT_EQ(out,
            "# HELP swaserve_ttft_seconds Time to first token.\n"
            "# TYPE swaserve_ttft_seconds histogram\n"
            "swaserve_ttft_seconds_bucket{model=\"mimo\",le=\"0.005\"} 1\n"
            "swaserve_ttft_seconds_bucket{model=\"mimo\",le=\"1\"} 3\n"
            "swaserve_ttft_seconds_bucket{model=\"mimo\",le=\"1000000\"} 3\n"
            "swaserve_ttft_seconds_bucket{model=\"mimo\",le=\"+Inf\"} 4\n"
            "swaserve_ttft_seconds_sum{model=\"mimo\"} 2000001.25\n"
            "swaserve_ttft_seconds_count{model=\"mimo\"} 4\n");
}

TEST(RenderTextFormatTest, UnlabelledHistogramHasOnlyLe) {
  FamilySnapshot histogram;
  histogram.name = "h";
  histogram.help = "h.";
  histogram.type = MetricType::kHistogram;
  MetricSnapshot metric;
  metric.histogram.cumulative_counts = {0};
  histogram.metrics.push_back(metric);
  EXPECT_EQ(RenderTextFormat({&histogram, 1}),
            "# HELP h h.\n"
            "# TYPE h histogram\n"
            "h_bucket{le=\"+Inf\"} 0\n"
            "h_sum 0\n"
            "h_count 0\n");
}

}  // namespace
}  // namespace swaserve::metrics
