// Summary statistics of a sample (latencies in the replay report):
// count, mean, min, max and percentiles.
//
// Percentiles use linear interpolation between closest ranks (NumPy's
// default, "linear"): for sorted x[0..n-1] and q in [0, 100], the rank is
// q/100 * (n-1) and the result interpolates between its neighbours. So p0 is
// the minimum, p100 the maximum, and percentiles never decrease with q.
//
// Free functions, no state: thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace swaserve::loadgen {

struct Distribution {
  int64_t count = 0;
  // All 0 when count == 0.
  double mean = 0;
  double min = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

// The q-th percentile (q clamped to [0, 100]) of `sorted`, which must be
// sorted ascending; 0 when empty.
double Percentile(absl::Span<const double> sorted, double q);

// Sorts `values` and summarizes them.
Distribution Summarize(std::vector<double> values);

}  // namespace swaserve::loadgen
