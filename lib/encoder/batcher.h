// DynamicBatcher: cross-request batching for the multimodal encoder
// (dynamic batching across requests). Requests hand in their items and
// wait; one thread forms batches of items from several requests, runs ONE
// encode call per batch and splits the results back to the requests, in
// order. This is what doubled encoder throughput in the reference system:
// a forward over 8 images costs far less than 8 forwards over one.
//
// Batch formation: the batcher waits for the first queued item, then until
// either max_batch_items items are queued or batch_window has passed since
// that item was queued (whichever comes first), and takes up to
// max_batch_items items in arrival order. A request with more items than fit
// spans several batches; its results come back in its own order. So an item
// waits at most batch_window for company, plus the batches ahead of it.
//
// Errors: an encode call that fails (or returns the wrong number of results)
// fails every request with an item in that batch, with that status; other
// requests are unaffected. A request beyond max_queued_items queued items is
// refused at once (ResourceExhausted: back-pressure to the router, which
// retries another encoder replica). Destroying the batcher fails the
// requests still queued (Unavailable) after the batch in flight ends.
//
// The encode function must be thread-compatible: it is only ever called from
// the batcher's thread, one batch at a time.
//
// Metrics (on options.registry; none when null), label modality:
//   swaserve_encoder_batch_items{modality}          histogram: items per batch
//   swaserve_encoder_queue_wait_seconds{modality}   histogram: per item, queued
//                                                   -> its batch starts
//   swaserve_encoder_items_total{modality}          items encoded
//   swaserve_encoder_batches_total{modality,result} ok | error
//
// Thread-safe: Encode may be called from any number of threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/metrics/buckets.h"
#include "lib/metrics/registry.h"

namespace swaserve::encoder {

struct DynamicBatcherOptions {
  // How long the first item of a batch waits for others (>= 0). Default 5 ms.
  absl::Duration batch_window = absl::Milliseconds(5);
  // Most items per encode call (> 0). Default 16.
  int max_batch_items = 16;
  // Most items queued (not yet in a batch) before new requests are refused
  // (> 0). Default 1024.
  int max_queued_items = 1024;
  // The metrics' modality label ("image", "audio", "video").
  std::string modality = "image";
  // Not owned; null: no metrics.
  metrics::Registry* registry = nullptr;
};

template <typename Item, typename Result>
class DynamicBatcher {
 public:
  // Encodes a batch: one result per item, in order.
  using EncodeFn = std::function<absl::StatusOr<std::vector<Result>>(absl::Span<const Item>)>;

  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      const DynamicBatcherOptions& options, EncodeFn encode) {
    if (options.batch_window < absl::ZeroDuration() || options.max_batch_items < 1 ||
        options.max_queued_items < 1 || !encode) {
      return absl::InvalidArgumentError(
          "DynamicBatcher needs batch_window >= 0, max_batch_items >= 1, "
          "max_queued_items >= 1 and an encode function");
    }
    std::unique_ptr<DynamicBatcher> b(new DynamicBatcher(options, std::move(encode)));
    if (options.registry != nullptr) {
      metrics::Registry& reg = *options.registry;
      const absl::string_view m = options.modality;
      absl::StatusOr<metrics::HistogramFamily*> items = reg.AddHistogram(
          "swaserve_encoder_batch_items", "Items per encoder batch (across requests).",
          {"modality"}, {1, 2, 4, 8, 16, 32, 64, 128});
      if (!items.ok()) return items.status();
      b->m_batch_items_ = &(*items)->WithLabels({m});
      absl::StatusOr<metrics::HistogramFamily*> wait = reg.AddHistogram(
          "swaserve_encoder_queue_wait_seconds",
          "Time an item waited from its request's arrival to the start of its batch.",
          {"modality"}, metrics::DefaultLatencyBuckets());
      if (!wait.ok()) return wait.status();
      b->m_wait_ = &(*wait)->WithLabels({m});
      absl::StatusOr<metrics::CounterFamily*> n =
          reg.AddCounter("swaserve_encoder_items_total", "Items encoded.", {"modality"});
      if (!n.ok()) return n.status();
      b->m_items_ = &(*n)->WithLabels({m});
      absl::StatusOr<metrics::CounterFamily*> batches = reg.AddCounter(
          "swaserve_encoder_batches_total", "Encode calls by result (ok, error).",
          {"modality", "result"});
      if (!batches.ok()) return batches.status();
      b->m_ok_ = &(*batches)->WithLabels({m, "ok"});
      b->m_error_ = &(*batches)->WithLabels({m, "error"});
    }
    b->thread_ = std::thread([p = b.get()] { p->Loop(); });
    return b;
  }

  ~DynamicBatcher() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
    absl::MutexLock lock(&mu_);
    for (const auto& p : queue_) Fail(*p, absl::UnavailableError("the encoder is shutting down"));
    queue_.clear();
  }
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Encodes one request's items together with other requests' items; blocks
  // until they are done. Empty input: empty output at once.
  absl::StatusOr<std::vector<Result>> Encode(std::vector<Item> items) {
    if (items.empty()) return std::vector<Result>{};
    auto p = std::make_shared<Pending>();
    p->items = std::move(items);
    p->results.resize(p->items.size());
    p->enqueued = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("the encoder is shutting down");
      if (queued_items_ + p->items.size() > static_cast<size_t>(options_.max_queued_items)) {
        return absl::ResourceExhaustedError(
            absl::StrCat("encoder queue full: ", queued_items_, " items queued (limit ",
                         options_.max_queued_items, ")"));
      }
      queued_items_ += p->items.size();
      queue_.push_back(p);
    }
    p->finished.WaitForNotification();
    if (!p->status.ok()) return p->status;
    return std::move(p->results);
  }

  // Items queued, not yet in a batch.
  int64_t queued_items() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(queued_items_);
  }
  // Encode calls made so far.
  int64_t batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }

 private:
  struct Pending {
    std::vector<Item> items;
    std::vector<Result> results;
    size_t next = 0;  // first item not yet handed to a batch
    size_t done = 0;  // results filled in
    bool failed = false;
    absl::Status status;
    absl::Time enqueued;
    absl::Notification finished;
  };

  DynamicBatcher(const DynamicBatcherOptions& options, EncodeFn encode)
      : options_(options), encode_(std::move(encode)) {}

  static void Fail(Pending& p, const absl::Status& s) {
    if (p.failed || p.finished.HasBeenNotified()) return;
    p.failed = true;
    p.status = s;
    p.finished.Notify();
  }

  void Loop() {
    while (true) {
      std::vector<Item> batch;
      std::vector<std::pair<std::shared_ptr<Pending>, size_t>> owners;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        // Wait for company: until the batch is full or the window since
        // the oldest queued request's arrival has passed.
        const absl::Time deadline = queue_.front()->enqueued + options_.batch_window;
        auto full = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ ||
                 queued_items_ >= static_cast<size_t>(options_.max_batch_items);
        };
        mu_.AwaitWithDeadline(absl::Condition(&full), deadline);
        if (stopping_) return;
        const absl::Time now = absl::Now();
        while (!queue_.empty() && batch.size() < static_cast<size_t>(options_.max_batch_items)) {
          const std::shared_ptr<Pending>& p = queue_.front();
          while (p->next < p->items.size() &&
                 batch.size() < static_cast<size_t>(options_.max_batch_items)) {
            batch.push_back(std::move(p->items[p->next]));
            owners.emplace_back(p, p->next);
            ++p->next;
            --queued_items_;
            if (m_wait_ != nullptr) m_wait_->Observe(absl::ToDoubleSeconds(now - p->enqueued));
          }
          if (p->next == p->items.size()) queue_.pop_front();
        }
        ++batches_;
      }
      absl::StatusOr<std::vector<Result>> out = encode_(absl::MakeConstSpan(batch));
      if (out.ok() && out->size() != batch.size()) {
        out = absl::InternalError(absl::StrCat("encode returned ", out->size(), " results for ",
                                               batch.size(), " items"));
      }
      if (m_batch_items_ != nullptr) {
        m_batch_items_->Observe(static_cast<double>(batch.size()));
        (out.ok() ? m_ok_ : m_error_)->Increment();
        if (out.ok()) m_items_->Increment(static_cast<double>(batch.size()));
      }
      absl::MutexLock lock(&mu_);
      for (size_t k = 0; k < owners.size(); ++k) {
        Pending& p = *owners[k].first;
        if (!out.ok()) {
          if (!p.failed) {
            // Its items not yet in a batch are dropped from the queue.
            queued_items_ -= p.items.size() - p.next;
            p.next = p.items.size();
            std::erase_if(queue_, [&p](const auto& q) { return q.get() == &p; });
          }
          Fail(p, out.status());
          continue;
        }
        if (p.failed) continue;
        p.results[owners[k].second] = std::move((*out)[k]);
        if (++p.done == p.items.size()) p.finished.Notify();
      }
    }
  }

  const DynamicBatcherOptions options_;
  const EncodeFn encode_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_items_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  metrics::Histogram* m_batch_items_ = nullptr;
  metrics::Histogram* m_wait_ = nullptr;
  metrics::Counter* m_items_ = nullptr;
  metrics::Counter* m_ok_ = nullptr;
  metrics::Counter* m_error_ = nullptr;
  std::thread thread_;
};

}  // namespace swaserve::encoder
