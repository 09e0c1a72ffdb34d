// Router::Metrics: the router's metric families (names in router.h), kept
// out of router.cc so that file holds the request path only. Internal to
// lib/router. Thread-safety: the families are thread-safe; the struct is
// written once by Create.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "lib/metrics/registry.h"
#include "lib/router/router.h"

namespace swaserve::router {

struct Router::Metrics {
  metrics::CounterFamily* requests = nullptr;
  metrics::CounterFamily* decisions = nullptr;
  metrics::Histogram* decision_seconds = nullptr;
  metrics::CounterFamily* retries = nullptr;
  metrics::HistogramFamily* ttft = nullptr;
  metrics::HistogramFamily* tpot = nullptr;
  metrics::HistogramFamily* e2e = nullptr;
  metrics::CounterFamily* prompt_tokens = nullptr;  // {bucket}
  metrics::CounterFamily* cached_tokens = nullptr;  // {bucket}
  metrics::Counter* generated_tokens = nullptr;
  metrics::Gauge* inflight = nullptr;
  metrics::Gauge* stalled = nullptr;
  metrics::Counter* redis_fallbacks = nullptr;
  metrics::Counter* mirror_fallbacks = nullptr;
  metrics::Counter* window_unsafe_matches = nullptr;
  metrics::CounterFamily* migrations = nullptr;
  metrics::CounterFamily* shed = nullptr;  // {reason}
  metrics::CounterFamily* bucket_fallbacks = nullptr;  // {bucket}: the prompt's

  // Registers every family on `reg` (names and help in router.h).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(metrics::Registry* reg);
};

}  // namespace swaserve::router
