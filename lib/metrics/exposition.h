// Point-in-time snapshots of metric families and their rendering in the
// Prometheus text exposition format, version 0.0.4:
//
//   # HELP swaserve_requests_total Requests served.
//   # TYPE swaserve_requests_total counter
//   swaserve_requests_total{code="ok"} 42
//
// HELP text escapes backslash and newline; label values escape backslash,
// double quote and newline. Values print as Prometheus parses them: "+Inf",
// "-Inf", "NaN", integral values without exponent or fraction ("1000000"),
// others in the shortest form that round-trips ("0.005", "1e+20").
// Histograms render cumulative `_bucket{le="..."}` series ending with
// le="+Inf", then `_sum` and `_count`.
//
// Free functions and plain structs; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/metrics/instruments.h"

namespace swaserve::metrics {

// Content-Type of the text format, for HTTP responses.
inline constexpr absl::string_view kTextFormatContentType =
    "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as in `# TYPE` lines.
absl::string_view MetricTypeName(MetricType type);

// One child (one label-value combination) of a family.
struct MetricSnapshot {
  // Parallel to FamilySnapshot::label_names.
  std::vector<std::string> label_values;
  // Counter and gauge value.
  double value = 0;
  // Histogram state (empty for counters and gauges).
  HistogramSnapshot histogram;
};

struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  // Histograms: the finite bucket bounds (the +Inf bucket is implicit).
  std::vector<double> bucket_bounds;
  // In exposition order.
  std::vector<MetricSnapshot> metrics;
};

// A sample value or `le` bound as Prometheus parses it (see above).
std::string FormatValue(double value);

// Escapes `\` and newline for `# HELP` lines.
std::string EscapeHelp(absl::string_view help);

// Escapes `\`, `"` and newline for label values.
std::string EscapeLabelValue(absl::string_view value);

// Appends `family` in the text format to *out. A family without metrics
// renders nothing (as the reference Go client does).
void AppendTextFormat(const FamilySnapshot& family, std::string* out);

// Renders the families, in the given order.
std::string RenderTextFormat(absl::Span<const FamilySnapshot> families);

}  // namespace swaserve::metrics
