#include "lib/metrics/registry.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/status.h"
#include "lib/metrics/buckets.h"
#include "lib/metrics/names.h"

namespace swaserve::metrics {
namespace {

// Unambiguous map key for a list of label values.
std::string EncodeKey(absl::Span<const absl::string_view> values) {
  std::string key;
  for (const absl::string_view value : values) {
    absl::StrAppend(&key, value.size(), ":", value);
  }
  return key;
}

bool LabelValuesLess(const MetricSnapshot& a, const MetricSnapshot& b) {
  return a.label_values < b.label_values;
}

// The series names a family emits.
std::vector<std::string> SeriesNames(const internal::FamilyDefinition& def) {
  if (def.type == MetricType::kHistogram) {
    return {def.name + "_bucket", def.name + "_sum", def.name + "_count"};
  }
  return {def.name};
}

absl::Status ValidateDefinition(internal::FamilyDefinition& def) {
  RETURN_IF_ERROR(ValidateMetricName(def.name));
  if (def.help.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric \"", def.name, "\": help text is empty"));
  }
  if (def.type == MetricType::kCounter && !absl::EndsWith(def.name, "_total")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "counter \"", def.name, "\": counter names must end in \"_total\""));
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& label : def.label_names) {
    RETURN_IF_ERROR(base::Annotate(ValidateLabelName(label),
                                   absl::StrCat("metric \"", def.name, "\"")));
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric \"", def.name, "\": label \"", label, "\" is repeated"));
    }
    if (def.type == MetricType::kHistogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram \"", def.name,
                       "\": label \"le\" is reserved for buckets"));
    }
  }
  if (def.type == MetricType::kHistogram) {
    absl::StatusOr<std::vector<double>> bounds =
        NormalizeBuckets(std::move(def.bucket_bounds));
    if (!bounds.ok()) {
      return base::Annotate(bounds.status(),
                            absl::StrCat("histogram \"", def.name, "\""));
    }
    def.bucket_bounds = *std::move(bounds);
  } else {
    def.bucket_bounds.clear();
  }
  return absl::OkStatus();
}

std::string DescribeDefinition(const internal::FamilyDefinition& def) {
  std::string out =
      absl::StrCat(def.is_callback ? "callback " : "", MetricTypeName(def.type),
                   " [", absl::StrJoin(def.label_names, ","), "]");
  if (def.type == MetricType::kHistogram) {
    absl::StrAppend(&out, " buckets [", absl::StrJoin(def.bucket_bounds, ","),
                    "]");
  }
  absl::StrAppend(&out, " help \"", def.help, "\"");
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Family<T>

template <typename T>
absl::StatusOr<T*> Family<T>::TryWithLabels(
    absl::Span<const absl::string_view> label_values) {
  if (label_values.size() != definition_.label_names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric \"", definition_.name, "\" has ",
                     definition_.label_names.size(), " label(s) [",
                     absl::StrJoin(definition_.label_names, ","), "] but ",
                     label_values.size(), " value(s) were given"));
  }
  std::string key = EncodeKey(label_values);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = children_.try_emplace(std::move(key));
  if (inserted) {
    it->second.label_values.reserve(label_values.size());
    for (const absl::string_view value : label_values) {
      it->second.label_values.emplace_back(value);
    }
    if constexpr (std::is_same_v<T, Histogram>) {
      it->second.metric =
          std::make_unique<Histogram>(definition_.bucket_bounds);
    } else {
      it->second.metric = std::make_unique<T>();
    }
  }
  return it->second.metric.get();
}

template <typename T>
size_t Family<T>::size() const {
  absl::MutexLock lock(&mu_);
  return children_.size();
}

template <typename T>
void Family<T>::CollectMetrics(std::vector<MetricSnapshot>* out) const {
  const size_t first = out->size();
  {
    absl::MutexLock lock(&mu_);
    out->reserve(first + children_.size());
    for (const auto& [key, child] : children_) {
      MetricSnapshot& metric = out->emplace_back();
      metric.label_values = child.label_values;
      if constexpr (std::is_same_v<T, Histogram>) {
        metric.histogram = child.metric->Collect();
      } else {
        metric.value = child.metric->Value();
      }
    }
  }
  std::sort(out->begin() + first, out->end(), LabelValuesLess);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---------------------------------------------------------------------------
// Callback families

class Registry::CallbackFamily final : public internal::FamilyBase {
 public:
  CallbackFamily(internal::FamilyDefinition definition,
                 SamplesCallback callback)
      : FamilyBase(std::move(definition)), callback_(std::move(callback)) {}

  void CollectMetrics(std::vector<MetricSnapshot>* out) const override {
    std::vector<CallbackSample> samples = callback_();
    const size_t first = out->size();
    for (CallbackSample& sample : samples) {
      if (sample.label_values.size() != definition_.label_names.size()) {
        continue;
      }
      MetricSnapshot& metric = out->emplace_back();
      metric.label_values = std::move(sample.label_values);
      metric.value = sample.value;
    }
    // Stable sort + unique keeps the first of repeated label-value lists.
    std::stable_sort(out->begin() + first, out->end(), LabelValuesLess);
    out->erase(
        std::unique(out->begin() + first, out->end(),
                    [](const MetricSnapshot& a, const MetricSnapshot& b) {
                      return a.label_values == b.label_values;
                    }),
        out->end());
  }

 private:
  const SamplesCallback callback_;
};

// ---------------------------------------------------------------------------
// Registry

Registry::~Registry() = default;

absl::StatusOr<internal::FamilyBase*> Registry::AddFamily(
    internal::FamilyDefinition definition,
    const std::function<std::unique_ptr<internal::FamilyBase>(
        internal::FamilyDefinition)>& make) {
  RETURN_IF_ERROR(ValidateDefinition(definition));
  absl::MutexLock lock(&mu_);
  if (auto it = families_.find(definition.name); it != families_.end()) {
    const internal::FamilyDefinition& existing = it->second->definition();
    if (existing == definition && !definition.is_callback) {
      return it->second.get();
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "metric \"", definition.name, "\" is already registered as ",
        DescribeDefinition(existing), "; cannot register it as ",
        DescribeDefinition(definition)));
  }
  const std::vector<std::string> series = SeriesNames(definition);
  for (const std::string& name : series) {
    if (auto it = series_owner_.find(name); it != series_owner_.end()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric \"", definition.name, "\" would emit series \"", name,
          "\", which metric \"", it->second, "\" already emits"));
    }
  }
  for (const std::string& name : series) {
    series_owner_[name] = definition.name;
  }
  const std::string name = definition.name;
  std::unique_ptr<internal::FamilyBase> family = make(std::move(definition));
  internal::FamilyBase* raw = family.get();
  families_.emplace(name, std::move(family));
  return raw;
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names) {
  internal::FamilyDefinition def{std::string(name),
                                 std::string(help),
                                 MetricType::kCounter,
                                 std::move(label_names),
                                 {},
                                 false};
  ASSIGN_OR_RETURN(internal::FamilyBase * family,
                   AddFamily(std::move(def), [](internal::FamilyDefinition d) {
                     auto f = std::unique_ptr<CounterFamily>(
                         new CounterFamily(std::move(d)));
                     if (f->label_names().empty()) f->WithLabels();
                     return std::unique_ptr<internal::FamilyBase>(std::move(f));
                   }));
  return static_cast<CounterFamily*>(family);
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names) {
  internal::FamilyDefinition def{std::string(name),
                                 std::string(help),
                                 MetricType::kGauge,
                                 std::move(label_names),
                                 {},
                                 false};
  ASSIGN_OR_RETURN(
      internal::FamilyBase * family,
      AddFamily(std::move(def), [](internal::FamilyDefinition d) {
        auto f = std::unique_ptr<GaugeFamily>(new GaugeFamily(std::move(d)));
        if (f->label_names().empty()) f->WithLabels();
        return std::unique_ptr<internal::FamilyBase>(std::move(f));
      }));
  return static_cast<GaugeFamily*>(family);
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names, std::vector<double> bucket_bounds) {
  internal::FamilyDefinition def{
      std::string(name),      std::string(help),        MetricType::kHistogram,
      std::move(label_names), std::move(bucket_bounds), false};
  ASSIGN_OR_RETURN(internal::FamilyBase * family,
                   AddFamily(std::move(def), [](internal::FamilyDefinition d) {
                     auto f = std::unique_ptr<HistogramFamily>(
                         new HistogramFamily(std::move(d)));
                     if (f->label_names().empty()) f->WithLabels();
                     return std::unique_ptr<internal::FamilyBase>(std::move(f));
                   }));
  return static_cast<HistogramFamily*>(family);
}

absl::Status Registry::AddCallback(internal::FamilyDefinition definition,
                                   SamplesCallback callback) {
  if (!callback) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric \"", definition.name, "\": callback is empty"));
  }
  return AddFamily(std::move(definition),
                   [&callback](internal::FamilyDefinition d) {
                     return std::unique_ptr<internal::FamilyBase>(
                         new CallbackFamily(std::move(d), std::move(callback)));
                   })
      .status();
}

namespace {

Registry::SamplesCallback WrapValueCallback(Registry::ValueCallback callback) {
  if (!callback) return nullptr;
  return [callback = std::move(callback)] {
    return std::vector<CallbackSample>{CallbackSample{{}, callback()}};
  };
}

}  // namespace

absl::Status Registry::AddCallbackGauge(absl::string_view name,
                                        absl::string_view help,
                                        ValueCallback callback) {
  return AddCallbackGauge(name, help, {},
                          WrapValueCallback(std::move(callback)));
}

absl::Status Registry::AddCallbackGauge(absl::string_view name,
                                        absl::string_view help,
                                        std::vector<std::string> label_names,
                                        SamplesCallback callback) {
  return AddCallback({std::string(name),
                      std::string(help),
                      MetricType::kGauge,
                      std::move(label_names),
                      {},
                      true},
                     std::move(callback));
}

absl::Status Registry::AddCallbackCounter(absl::string_view name,
                                          absl::string_view help,
                                          ValueCallback callback) {
  return AddCallbackCounter(name, help, {},
                            WrapValueCallback(std::move(callback)));
}

absl::Status Registry::AddCallbackCounter(absl::string_view name,
                                          absl::string_view help,
                                          std::vector<std::string> label_names,
                                          SamplesCallback callback) {
  return AddCallback({std::string(name),
                      std::string(help),
                      MetricType::kCounter,
                      std::move(label_names),
                      {},
                      true},
                     std::move(callback));
}

absl::Status Registry::RemoveCallback(absl::string_view name) {
  std::unique_ptr<internal::FamilyBase> removed;
  {
    absl::MutexLock lock(&mu_);
    auto it = families_.find(name);
    if (it == families_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no metric \"", name, "\" is registered"));
    }
    if (!it->second->definition().is_callback) {
      return absl::FailedPreconditionError(
          absl::StrCat("metric \"", name,
                       "\" is not a callback metric; only callback "
                       "metrics can be removed"));
    }
    for (const std::string& series : SeriesNames(it->second->definition())) {
      series_owner_.erase(series);
    }
    removed = std::move(it->second);
    families_.erase(it);
  }
  // `removed` (and the callback's captures) are destroyed outside the lock.
  return absl::OkStatus();
}

std::vector<FamilySnapshot> Registry::Collect() const {
  absl::MutexLock lock(&mu_);
  std::vector<FamilySnapshot> snapshots;
  snapshots.reserve(families_.size());
  for (const auto& [name, family] : families_) {
    const internal::FamilyDefinition& def = family->definition();
    FamilySnapshot& snapshot = snapshots.emplace_back();
    snapshot.name = def.name;
    snapshot.help = def.help;
    snapshot.type = def.type;
    snapshot.label_names = def.label_names;
    snapshot.bucket_bounds = def.bucket_bounds;
    family->CollectMetrics(&snapshot.metrics);
  }
  return snapshots;
}

std::string Registry::RenderText() const { return RenderTextFormat(Collect()); }

Registry& DefaultRegistry() {
  static Registry* const registry = new Registry();
  return *registry;
}

}  // namespace swaserve::metrics
