// RoutingState: what a routing decision reads from and records in the shared
// cluster state: every prefill candidate's
// prefix-index match and every candidate's load report in one round trip,
// and the dispatch record (predicted index entries). ClusterViewState
// adapts cluster::ClusterView (Redis); unit tests of the router give it
// scripted answers (tests/unit/router/router_legs_test.cc).
//
// Thread-safety: implementations must be thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/cluster/cluster_view.h"

namespace swaserve::router {

class RoutingState {
 public:
  virtual ~RoutingState() = default;
  // cluster::ClusterView::MatchPrefixesAndLoads: depths (and window-safe
  // depths, L1 pages) of `candidates`, loads of `load_ids`. Unavailable when the
  // state cannot be read (the router then routes on loads it lacks: the
  // fallback).
  virtual absl::StatusOr<cluster::ClusterView::PrefixesAndLoads> MatchPrefixesAndLoads(
      absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
      absl::Span<const std::string> load_ids, int window_pages,
      absl::Span<const int64_t> window_scan_pages) = 0;
  // Records that `hashes` were dispatched to `worker_id` (off the path).
  virtual absl::Status RecordDispatch(absl::string_view worker_id,
                                      absl::Span<const uint64_t> hashes) = 0;
};

// The Redis-backed state. Does not own the view.
class ClusterViewState final : public RoutingState {
 public:
  explicit ClusterViewState(cluster::ClusterView* view) : view_(view) {}
  absl::StatusOr<cluster::ClusterView::PrefixesAndLoads> MatchPrefixesAndLoads(
      absl::Span<const uint64_t> hashes, absl::Span<const std::string> candidates,
      absl::Span<const std::string> load_ids, int window_pages,
      absl::Span<const int64_t> window_scan_pages) override {
    return view_->MatchPrefixesAndLoads(hashes, candidates, load_ids, window_pages,
                                        window_scan_pages);
  }
  absl::Status RecordDispatch(absl::string_view worker_id,
                              absl::Span<const uint64_t> hashes) override {
    return view_->RecordDispatch(worker_id, hashes);
  }

 private:
  cluster::ClusterView* const view_;
};

}  // namespace swaserve::router
