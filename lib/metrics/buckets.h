// Histogram bucket bounds: defaults for latencies, exponential and linear
// generators, and the validation the Registry applies to any bounds.
//
// Bounds are the inclusive upper edges ("le") of the finite buckets, strictly
// increasing; the +Inf bucket is implicit and always present.
//
// Stateless free functions; thread-safe.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace swaserve::metrics {

// Latency buckets in seconds, 1 ms to 200 s in 1-2-5 steps: covers TPOT
// (milliseconds) through TTFT of million-token prefills (minutes).
std::vector<double> DefaultLatencyBuckets();

// `count` bounds start, start*factor, start*factor^2, ...
// InvalidArgument unless start > 0, factor > 1 and count >= 1 (all finite).
absl::StatusOr<std::vector<double>> ExponentialBuckets(double start,
                                                       double factor,
                                                       int count);

// `count` bounds start, start+width, start+2*width, ...
// InvalidArgument unless width > 0 and count >= 1 (all finite).
absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width,
                                                  int count);

// Checks and normalizes bounds for a histogram: NaN, -Inf and non-increasing
// bounds are InvalidArgument; one trailing +Inf is dropped (it is implicit).
// An empty list is valid (only the +Inf bucket).
absl::StatusOr<std::vector<double>> NormalizeBuckets(
    std::vector<double> bounds);

}  // namespace swaserve::metrics
