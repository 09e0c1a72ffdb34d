// Validation of Prometheus metric and label names.
//
// Metric names match [a-zA-Z_:][a-zA-Z0-9_:]* and label names match
// [a-zA-Z_][a-zA-Z0-9_]*; names starting with "__" are reserved for
// Prometheus itself and rejected. Counters must end in "_total" (the
// OpenMetrics convention Prometheus follows); the Registry enforces that.
//
// Project convention (docs/architecture.md#observability), not enforced here: every metric a
// swaserve service exports is named "swaserve_<module>_<what>[_<unit>]", with
// base units (seconds, bytes) and "_total" on counters.
//
// Stateless free functions; thread-safe.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace swaserve::metrics {

// OK when `name` is a valid metric name; InvalidArgument (saying why)
// otherwise.
absl::Status ValidateMetricName(absl::string_view name);

// OK when `name` is a valid label name; InvalidArgument (saying why)
// otherwise.
absl::Status ValidateLabelName(absl::string_view name);

}  // namespace swaserve::metrics
