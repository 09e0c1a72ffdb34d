#include "lib/metrics/exposition.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace swaserve::metrics {
namespace {

// `text` with backslash and newline escaped (and double quotes, for label
// values), as the text format wants them.
std::string EscapeText(absl::string_view text, bool escape_quotes) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '"':
        if (escape_quotes) {
          out += "\\\"";
          break;
        }
        out.push_back(c);
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Appends `{name="value",...}` for the label pairs plus an optional extra
// pair (the histogram `le`). Appends nothing when there are no pairs.
void AppendLabels(const std::vector<std::string>& names,
                  const std::vector<std::string>& values,
                  absl::string_view extra_name, absl::string_view extra_value,
                  std::string* out) {
  if (names.empty() && extra_name.empty()) return;
  out->push_back('{');
  bool first = true;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    if (!first) out->push_back(',');
    first = false;
    absl::StrAppend(out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) {
    if (!first) out->push_back(',');
    absl::StrAppend(out, extra_name, "=\"", extra_value, "\"");
  }
  out->push_back('}');
}

void AppendSample(absl::string_view name, absl::string_view suffix,
                  const FamilySnapshot& family, const MetricSnapshot& metric,
                  absl::string_view extra_name, absl::string_view extra_value,
                  absl::string_view value, std::string* out) {
  absl::StrAppend(out, name, suffix);
  AppendLabels(family.label_names, metric.label_values, extra_name, extra_value,
               out);
  absl::StrAppend(out, " ", value, "\n");
}

}  // namespace

absl::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == 0) return "0";  // also -0
  // Integral values below 2^53-ish print exactly, without exponent noise.
  if (std::fabs(value) < 1e15 && std::trunc(value) == value) {
    return absl::StrFormat("%.0f", value);
  }
  // Shortest representation that round-trips; fixed when not longer than
  // scientific. Go's strconv.ParseFloat (Prometheus) reads both.
  char buf[64];
  const std::to_chars_result result =
      std::to_chars(buf, buf + sizeof(buf), value);
  if (result.ec != std::errc()) return absl::StrFormat("%.17g", value);
  return std::string(buf, result.ptr);
}

std::string EscapeHelp(absl::string_view help) {
  return EscapeText(help, /*escape_quotes=*/false);
}

std::string EscapeLabelValue(absl::string_view value) {
  return EscapeText(value, /*escape_quotes=*/true);
}

void AppendTextFormat(const FamilySnapshot& family, std::string* out) {
  if (family.metrics.empty()) return;
  absl::StrAppend(out, "# HELP ", family.name, " ", EscapeHelp(family.help),
                  "\n");
  absl::StrAppend(out, "# TYPE ", family.name, " ", MetricTypeName(family.type),
                  "\n");
  if (family.type != MetricType::kHistogram) {
    for (const MetricSnapshot& metric : family.metrics) {
      AppendSample(family.name, "", family, metric, "", "",
                   FormatValue(metric.value), out);
    }
    return;
  }
  std::vector<std::string> les;
  les.reserve(family.bucket_bounds.size() + 1);
  for (const double bound : family.bucket_bounds) {
    les.push_back(FormatValue(bound));
  }
  les.push_back("+Inf");
  for (const MetricSnapshot& metric : family.metrics) {
    const std::vector<uint64_t>& counts = metric.histogram.cumulative_counts;
    for (size_t i = 0; i < les.size(); ++i) {
      const uint64_t count = i < counts.size() ? counts[i] : 0;
      AppendSample(family.name, "_bucket", family, metric, "le", les[i],
                   absl::StrCat(count), out);
    }
    AppendSample(family.name, "_sum", family, metric, "", "",
                 FormatValue(metric.histogram.sum), out);
    AppendSample(family.name, "_count", family, metric, "", "",
                 absl::StrCat(metric.histogram.count), out);
  }
}

std::string RenderTextFormat(absl::Span<const FamilySnapshot> families) {
  std::string out;
  for (const FamilySnapshot& family : families) {
    AppendTextFormat(family, &out);
  }
  return out;
}

}  // namespace swaserve::metrics
