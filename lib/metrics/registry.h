// Registry: the set of metric families one process exports on /metrics.
//
//   Registry& registry = DefaultRegistry();
//   ASSIGN_OR_RETURN(CounterFamily* requests,
//       registry.AddCounter("swaserve_router_requests_total",
//                           "Requests routed, by decision reason.",
//                           {"reason"}));
//   Counter& by_prefix = requests->WithLabels({"prefix_affinity"});  // cache
//   by_prefix.Increment();                                          // hot path
//
// A family is a metric name with help text, a type, label names and (for
// histograms) bucket bounds; each distinct list of label values is one child
// (a Counter, Gauge or Histogram). Families without labels have exactly one
// child, created at registration so it exports 0 from the first scrape.
// Callback families compute their samples at scrape time (pool sizes, queue
// lengths owned elsewhere).
//
// Naming: names are validated (names.h); counters must end in "_total";
// histograms may not use the label "le". Project convention (not enforced):
// "swaserve_<module>_<what>[_<unit>]" with base units, e.g.
// swaserve_router_ttft_seconds, swaserve_kv_pages.
//
// Registering a name again with the same definition returns the existing
// family; a different definition (type, help, labels, buckets), or a name
// whose series would collide with another family's (a histogram "x" owns
// "x_bucket", "x_sum" and "x_count"), is AlreadyExists.
//
// Ownership: the Registry owns its families and they own their children;
// family and child pointers stay valid for the Registry's lifetime (children
// are never removed; callback families can be removed, see RemoveCallback).
// A child costs about 1 KiB (counter) or 3 KiB (histogram with the default
// buckets) for its per-thread shards, so label values must come from small
// bounded sets (reasons, pools, length buckets), never request or user ids.
//
// Thread-safety: thread-safe. Child updates are lock-free (instruments.h).
// WithLabels takes a per-family mutex (cache its result); registration and
// Collect take the registry mutex. Collect calls callbacks while holding the
// registry mutex, so callbacks must not call into the same Registry.
// Exposition order is stable: families by name, children by label values.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/metrics/exposition.h"
#include "lib/metrics/instruments.h"

namespace swaserve::metrics {

class Registry;

namespace internal {

// What a family is; compared on re-registration.
struct FamilyDefinition {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  std::vector<double> bucket_bounds;
  bool is_callback = false;

  bool operator==(const FamilyDefinition&) const = default;
};

class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const FamilyDefinition& definition() const { return definition_; }

  // Appends this family's children, in exposition order.
  virtual void CollectMetrics(std::vector<MetricSnapshot>* out) const = 0;

 protected:
  explicit FamilyBase(FamilyDefinition definition)
      : definition_(std::move(definition)) {}

  const FamilyDefinition definition_;
};

}  // namespace internal

// A family of Counters, Gauges or Histograms distinguished by label values.
// Owned by its Registry; thread-safe.
template <typename T>
class Family final : public internal::FamilyBase {
 public:
  // Returns the child for `label_values` (one per label name, in order),
  // creating it on first use. The reference is stable for the Registry's
  // lifetime: look it up once, keep it, update it lock-free.
  // A wrong number of values is a programming error: it aborts the process
  // with a message (TryWithLabels reports it instead).
  T& WithLabels(absl::Span<const absl::string_view> label_values) {
    absl::StatusOr<T*> child = TryWithLabels(label_values);
    if (!child.ok()) {
      std::fprintf(stderr, "swaserve::metrics: %s\n",
                   child.status().ToString().c_str());
      std::abort();
    }
    return **child;
  }
  T& WithLabels(std::initializer_list<absl::string_view> label_values) {
    return WithLabels(absl::Span<const absl::string_view>(label_values.begin(),
                                                          label_values.size()));
  }
  T& WithLabels(absl::Span<const std::string> label_values) {
    std::vector<absl::string_view> views(label_values.begin(),
                                         label_values.end());
    return WithLabels(absl::Span<const absl::string_view>(views));
  }
  // The only child of a family without labels.
  T& WithLabels() { return WithLabels(absl::Span<const absl::string_view>()); }

  // As WithLabels; InvalidArgument when the number of values does not match
  // the family's label names.
  absl::StatusOr<T*> TryWithLabels(
      absl::Span<const absl::string_view> label_values);

  const std::string& name() const { return definition_.name; }
  const std::vector<std::string>& label_names() const {
    return definition_.label_names;
  }
  // Number of children created so far.
  size_t size() const;

  void CollectMetrics(std::vector<MetricSnapshot>* out) const override;

 private:
  friend class Registry;
  explicit Family(internal::FamilyDefinition definition)
      : FamilyBase(std::move(definition)) {}

  struct Child {
    std::vector<std::string> label_values;
    std::unique_ptr<T> metric;
  };

  mutable absl::Mutex mu_;
  // Key: label values, each length-prefixed, concatenated.
  absl::flat_hash_map<std::string, Child> children_ ABSL_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// One sample a callback family reports at scrape time.
struct CallbackSample {
  // One per label name of the family, in order.
  std::vector<std::string> label_values;
  double value = 0;
};

class Registry {
 public:
  // Samples of a labelled callback family. Samples with the wrong number of
  // label values are dropped, as are repeats of a label-value list (the
  // first one wins).
  using SamplesCallback = std::function<std::vector<CallbackSample>()>;
  using ValueCallback = std::function<double()>;

  Registry() = default;
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers (or returns the identical existing) family. Errors:
  // InvalidArgument for a bad name, label name or bucket list (and for a
  // counter not ending in "_total", an empty help, repeated label names, a
  // histogram label "le"); AlreadyExists for a conflicting definition.
  absl::StatusOr<CounterFamily*> AddCounter(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names = {});
  // `bucket_bounds`: finite, strictly increasing upper bounds; a trailing
  // +Inf is accepted and dropped (see buckets.h for generators).
  absl::StatusOr<HistogramFamily*> AddHistogram(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names, std::vector<double> bucket_bounds);

  // Gauges whose value is computed by `callback` at each scrape (e.g. free
  // KV pages read from a pool). Same validation as AddGauge; registering a
  // name that exists in any form is AlreadyExists. `callback` runs on the
  // scraping thread, with the registry mutex held (see class comment), until
  // RemoveCallback returns.
  absl::Status AddCallbackGauge(absl::string_view name, absl::string_view help,
                                ValueCallback callback);
  absl::Status AddCallbackGauge(absl::string_view name, absl::string_view help,
                                std::vector<std::string> label_names,
                                SamplesCallback callback);
  // Counters maintained elsewhere (e.g. a transport library's byte count),
  // read at scrape time. The callback must return non-decreasing values.
  absl::Status AddCallbackCounter(absl::string_view name,
                                  absl::string_view help,
                                  ValueCallback callback);
  absl::Status AddCallbackCounter(absl::string_view name,
                                  absl::string_view help,
                                  std::vector<std::string> label_names,
                                  SamplesCallback callback);

  // Unregisters a callback family; once this returns its callback is not
  // running and will not run again (call it before destroying what the
  // callback reads). NotFound when no such family; FailedPrecondition when
  // `name` is not a callback family.
  absl::Status RemoveCallback(absl::string_view name);

  // Snapshot of every family (including ones without children yet), by name.
  std::vector<FamilySnapshot> Collect() const;

  // Collect() rendered in the text exposition format (exposition.h).
  std::string RenderText() const;

 private:
  class CallbackFamily;

  // Validates `definition`, then returns the existing identical family or
  // registers the one `make` builds. Caller holds no lock.
  absl::StatusOr<internal::FamilyBase*> AddFamily(
      internal::FamilyDefinition definition,
      const std::function<std::unique_ptr<internal::FamilyBase>(
          internal::FamilyDefinition)>& make);
  absl::Status AddCallback(internal::FamilyDefinition definition,
                           SamplesCallback callback);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<internal::FamilyBase>, std::less<>>
      families_ ABSL_GUARDED_BY(mu_);
  // Every series name a family emits ("x", or "x_bucket"/"x_sum"/"x_count")
  // -> the family's name; guards against collisions between families.
  absl::flat_hash_map<std::string, std::string> series_owner_
      ABSL_GUARDED_BY(mu_);
};

// The process-wide registry the services export. Never destroyed.
Registry& DefaultRegistry();

}  // namespace swaserve::metrics
