// DynamicBatcher (cross-request batching): results equal what
// encoding each request alone gives, in order; concurrent requests share
// batches; no batch exceeds max_batch_items and a large request spans
// several; a failed batch fails only its requests; a full queue refuses at
// once; shutdown fails what is still queued; the metrics count batches.
#include "lib/encoder/batcher.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace swaserve::encoder {
namespace {

using Batcher = DynamicBatcher<int, std::string>;

// The "model": a pure function of each item, whatever the batch.
std::string Embed(int item) { return absl::StrCat("e", item * 7 + 1); }

struct Recorder {
  absl::Mutex mu;
  std::vector<size_t> sizes;
  void Add(size_t n) {
    absl::MutexLock lock(&mu);
    sizes.push_back(n);
  }
};

Batcher::EncodeFn Encoder(Recorder* rec, absl::Duration cost = absl::ZeroDuration()) {
  return [rec, cost](absl::Span<const int> items) -> absl::StatusOr<std::vector<std::string>> {
    rec->Add(items.size());
    absl::SleepFor(cost);
    std::vector<std::string> out;
    for (int i : items) {
      if (i < 0) return absl::InvalidArgumentError(absl::StrCat("bad item ", i));
      out.push_back(Embed(i));
    }
    return out;
  };
}

std::unique_ptr<Batcher> Make(DynamicBatcherOptions o, Batcher::EncodeFn fn) {
  auto b = Batcher::Create(o, std::move(fn));
  EXPECT_TRUE(b.ok()) << b.status();
  return *std::move(b);
}

TEST(DynamicBatcher, ConcurrentRequestsShareBatchesAndGetTheirOwnResultsInOrder) {
  Recorder rec;
  DynamicBatcherOptions o;
  o.batch_window = absl::Milliseconds(200);  // wide: slow sanitizer runs too
  o.max_batch_items = 64;
  metrics::Registry reg;
  o.registry = &reg;
  auto b = Make(o, Encoder(&rec));
  constexpr int kRequests = 12;
  std::vector<std::vector<int>> inputs(kRequests);
  std::mt19937 rng(5);
  for (int r = 0; r < kRequests; ++r) {
    for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) {
      inputs[r].push_back(r * 100 + k);
    }
  }
  std::vector<absl::StatusOr<std::vector<std::string>>> outs(kRequests);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRequests; ++r) {
    threads.emplace_back([&, r] { outs[r] = b->Encode(inputs[r]); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRequests; ++r) {
    ASSERT_TRUE(outs[r].ok()) << outs[r].status();
    std::vector<std::string> want;
    for (int i : inputs[r]) want.push_back(Embed(i));
    EXPECT_EQ(*outs[r], want) << r;  // = the request encoded alone
  }
  // Requests arriving within one window share batches.
  EXPECT_LT(b->batches(), kRequests);
  EXPECT_NE(reg.RenderText().find("swaserve_encoder_batches_total{modality=\"image\",result=\"ok\"}"),
            std::string::npos);
}

TEST(DynamicBatcher, BatchesNeverExceedTheMaximumAndLargeRequestsSpanSeveral) {
  Recorder rec;
  DynamicBatcherOptions o;
  o.batch_window = absl::Milliseconds(20);
  o.max_batch_items = 4;
  auto b = Make(o, Encoder(&rec));
  std::vector<int> big(11);
  for (int i = 0; i < 11; ++i) big[i] = i;
  std::vector<absl::StatusOr<std::vector<std::string>>> outs(3);
  std::thread t0([&] { outs[0] = b->Encode(big); });
  std::thread t1([&] { outs[1] = b->Encode({50, 51}); });
  std::thread t2([&] { outs[2] = b->Encode({60}); });
  t0.join();
  t1.join();
  t2.join();
  for (const auto& out : outs) ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(outs[0]->size(), 11u);
  for (int i = 0; i < 11; ++i) EXPECT_EQ((*outs[0])[i], Embed(i));
  EXPECT_EQ(*outs[1], (std::vector<std::string>{Embed(50), Embed(51)}));
  absl::MutexLock lock(&rec.mu);
  size_t total = 0;
  for (size_t s : rec.sizes) {
    EXPECT_LE(s, 4u);
    total += s;
  }
  EXPECT_EQ(total, 14u);
  EXPECT_GE(rec.sizes.size(), 4u);  // ceil(14 / 4)
}

TEST(DynamicBatcher, AFullBatchStartsWithoutWaitingForTheWindow) {
  Recorder rec;
  DynamicBatcherOptions o;
  o.batch_window = absl::Seconds(30);  // never reached
  o.max_batch_items = 3;
  auto b = Make(o, Encoder(&rec));
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::vector<std::string>> out = b->Encode({1, 2, 3});
  ASSERT_TRUE(out.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

TEST(DynamicBatcher, AFailedBatchFailsOnlyItsRequests) {
  Recorder rec;
  DynamicBatcherOptions o;
  o.batch_window = absl::ZeroDuration();  // every request alone
  o.max_batch_items = 8;
  auto b = Make(o, Encoder(&rec));
  absl::StatusOr<std::vector<std::string>> bad = b->Encode({1, -1, 2});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  absl::StatusOr<std::vector<std::string>> good = b->Encode({3});
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, std::vector<std::string>{Embed(3)});
  // A wrong result count is an internal error, not a crash.
  auto short_encoder = Make(o, [](absl::Span<const int>) -> absl::StatusOr<std::vector<std::string>> {
    return std::vector<std::string>{"only one"};
  });
  EXPECT_EQ(short_encoder->Encode({1, 2}).status().code(), absl::StatusCode::kInternal);
  // A request failed mid-way (its first items in a failed batch) has its
  // other items dropped: later requests still run.
  o.max_batch_items = 2;
  auto split = Make(o, Encoder(&rec));
  EXPECT_FALSE(split->Encode({-5, 1, 2, 3}).ok());
  EXPECT_TRUE(split->Encode({4, 5, 6}).ok());
}

TEST(DynamicBatcher, AFullQueueRefusesAtOnceAndShutdownFailsWhatIsQueued) {
  Recorder rec;
  DynamicBatcherOptions o;
  o.batch_window = absl::ZeroDuration();
  o.max_batch_items = 1;
  o.max_queued_items = 3;
  std::atomic<bool> release{false}, entered{false};
  auto slow = [&](absl::Span<const int> items) -> absl::StatusOr<std::vector<std::string>> {
    entered = true;
    while (!release) absl::SleepFor(absl::Milliseconds(1));
    return std::vector<std::string>(items.size(), "x");
  };
  auto b = Make(o, slow);
  std::vector<absl::Status> results(2);
  std::thread first([&] { results[0] = b->Encode({1}).status(); });  // in the encoder
  while (!entered) absl::SleepFor(absl::Milliseconds(1));
  std::thread queued([&] { results[1] = b->Encode({2, 3}).status(); });  // queued
  while (b->queued_items() < 2) absl::SleepFor(absl::Milliseconds(1));
  // 2 queued + 2 more > 3.
  EXPECT_TRUE(absl::IsResourceExhausted(b->Encode({4, 5}).status()));
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release = true;
  });
  b.reset();  // waits for the batch in flight, fails the queued request
  stopper.join();
  first.join();
  queued.join();
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(absl::IsUnavailable(results[1])) << results[1];
}

TEST(DynamicBatcher, BadOptionsAreRejected) {
  DynamicBatcherOptions o;
  o.max_batch_items = 0;
  EXPECT_FALSE(Batcher::Create(o, [](absl::Span<const int>) {
                 return absl::StatusOr<std::vector<std::string>>(std::vector<std::string>{});
               }).ok());
  EXPECT_FALSE(Batcher::Create(DynamicBatcherOptions{}, nullptr).ok());
}

}  // namespace
}  // namespace swaserve::encoder
