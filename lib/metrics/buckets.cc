#include "lib/metrics/buckets.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace swaserve::metrics {

std::vector<double> DefaultLatencyBuckets() {
  return {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
          1,     2,     5,     10,   20,   50,   100, 200};
}

absl::StatusOr<std::vector<double>> ExponentialBuckets(double start,
                                                       double factor,
                                                       int count) {
  if (!std::isfinite(start) || !(start > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exponential buckets: start must be > 0, got ", start));
  }
  if (!std::isfinite(factor) || !(factor > 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exponential buckets: factor must be > 1, got ", factor));
  }
  if (count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("exponential buckets: count must be >= 1, got ", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i) {
    if (!std::isfinite(bound)) {
      return absl::InvalidArgumentError(
          "exponential buckets: bounds overflow to infinity");
    }
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width,
                                                  int count) {
  if (!std::isfinite(start)) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear buckets: start must be finite, got ", start));
  }
  if (!std::isfinite(width) || !(width > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear buckets: width must be > 0, got ", width));
  }
  if (count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear buckets: count must be >= 1, got ", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) {
    // start + i * width (not repeated addition) keeps rounding error from
    // accumulating, so LinearBuckets(0, 0.1, 10) ends at 0.9, not 0.8999...
    const double bound = start + i * width;
    if (!std::isfinite(bound)) {
      return absl::InvalidArgumentError(
          "linear buckets: bounds overflow to infinity");
    }
    if (!bounds.empty() && !(bound > bounds.back())) {
      return absl::InvalidArgumentError(
          "linear buckets: width too small for the magnitude of start");
    }
    bounds.push_back(bound);
  }
  return bounds;
}

absl::StatusOr<std::vector<double>> NormalizeBuckets(
    std::vector<double> bounds) {
  if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0) {
    bounds.pop_back();
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (std::isnan(bounds[i]) || std::isinf(bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram bucket bound ", i, " is ", bounds[i],
          "; bounds must be finite (+Inf is implicit and only allowed last)"));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram bucket bounds must be strictly increasing: bound ", i,
          " (", bounds[i], ") <= bound ", i - 1, " (", bounds[i - 1], ")"));
    }
  }
  return bounds;
}

}  // namespace swaserve::metrics
