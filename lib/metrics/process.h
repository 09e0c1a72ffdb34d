// Process metrics every swaserve service exports on /metrics: the standard
// Prometheus process collector's families (what client_golang and
// prometheus_client export, so the usual dashboards and alerts work
// unchanged) and the C heap's own accounting, which tells a leak from
// allocator retention:
//
//   process_cpu_seconds_total        user + system CPU time (counter)
//   process_resident_memory_bytes    RSS
//   process_virtual_memory_bytes     virtual size
//   process_open_fds                 open file descriptors
//   process_start_time_seconds       start time, Unix seconds
//   swaserve_process_heap_allocated_bytes  bytes malloc has handed out and
//                                          not had back (all arenas, mmapped
//                                          blocks included)
//   swaserve_process_heap_free_bytes       bytes malloc holds free in its
//                                          arenas (RSS the process keeps
//                                          without using; returned by
//                                          malloc_trim)
//
// RSS alone cannot tell a leak: glibc keeps freed memory in its arenas, and
// the workers ask it to keep up to 1 GiB (base::KeepFreedMemory: large
// transient buffers reuse pages instead of faulting them in again), so RSS
// rises in steps when a buffer outgrows its block (measured on the decode
// workers: ~20 MiB steps at random passes of the same replay while
// allocated bytes moved by at most 8 MiB; bench/RESULTS.md, the e2e load
// test).
// A leak grows heap_allocated_bytes.
//
// Linux only (reads /proc/self; the heap figures use glibc's mallinfo2).
// Thread-safe: the callbacks read the kernel's and malloc's own counters.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "lib/metrics/registry.h"

namespace swaserve::metrics {

struct ProcessSnapshot {
  double cpu_seconds = 0;
  int64_t resident_bytes = 0;
  int64_t virtual_bytes = 0;
  int64_t open_fds = 0;
  double start_time_seconds = 0;  // Unix seconds
  int64_t heap_allocated_bytes = 0;
  int64_t heap_free_bytes = 0;
};

// This process's figures now. Fields that could not be read stay 0.
ProcessSnapshot ReadProcess();

// Registers the families above on `registry` (callback families read at
// scrape time). Calling it again on the same registry is a no-op.
absl::Status RegisterProcessMetrics(Registry* registry);

}  // namespace swaserve::metrics
