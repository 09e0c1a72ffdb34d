#include "lib/rpc/stream_writer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

namespace swaserve::rpc {
namespace {

// A reactor stand-in: records what the writer asks of it; the test decides
// when a write completes (gRPC would call OnWriteDone).
struct FakeReactor {
  std::vector<std::string> written;
  int in_flight = 0;
  int max_in_flight = 0;
  int finishes = 0;
  int cancels = 0;
  bool finished_during_cancel = false;
  bool wrote_after_finish = false;
  grpc::Status status;
  std::shared_ptr<StreamWriter<std::string>> writer;

  FakeReactor() {
    writer = std::make_shared<StreamWriter<std::string>>(StreamWriter<std::string>::Ops{
        [this](const std::string* m) {
          if (finishes > 0) wrote_after_finish = true;
          written.push_back(*m);
          ++in_flight;
          max_in_flight = std::max(max_in_flight, in_flight);
        },
        [this](const grpc::Status& s) {
          ++finishes;
          status = s;
        },
        [this] {
          ++cancels;
          // The reactor must not be finished while its cancel hook runs.
          const int before = finishes;
          writer->Finish(grpc::Status::OK);  // a producer racing the cancel
          finished_during_cancel = finishes != before;
        }});
  }
  // Completes the write in flight.
  void Complete(bool ok = true) {
    ASSERT_EQ(in_flight, 1);
    --in_flight;
    writer->OnWriteDone(ok);
  }
};

TEST(StreamWriterTest, WritesInOrderOneAtATimeThenFinishes) {
  FakeReactor r;
  EXPECT_TRUE(r.writer->Write("a"));
  EXPECT_TRUE(r.writer->Write("b"));
  EXPECT_TRUE(r.writer->Write("c"));
  EXPECT_EQ(r.written, std::vector<std::string>({"a"}));
  r.writer->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "boom"));
  EXPECT_FALSE(r.writer->Write("d"));
  r.Complete();
  r.Complete();
  EXPECT_EQ(r.finishes, 0);  // "c" still in flight
  r.Complete();
  // Every message produced before the error went out, then the error.
  EXPECT_EQ(r.written, std::vector<std::string>({"a", "b", "c"}));
  EXPECT_EQ(r.finishes, 1);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(r.max_in_flight, 1);
}

TEST(StreamWriterTest, FinishOnceFirstStatusWins) {
  FakeReactor r;
  r.writer->Finish(grpc::Status::OK);
  r.writer->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "late"));
  EXPECT_EQ(r.finishes, 1);
  EXPECT_TRUE(r.status.ok());
}

TEST(StreamWriterTest, CancelDropsQueuedAndFinishesAfterTheWriteInFlight) {
  FakeReactor r;
  r.writer->Write("a");
  r.writer->Write("b");
  r.writer->Finish(grpc::Status::OK);
  r.writer->Cancel(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
  EXPECT_TRUE(r.writer->cancelled());
  EXPECT_EQ(r.finishes, 0);  // "a" is in flight: gRPC forbids Finish now
  r.Complete();
  EXPECT_EQ(r.written, std::vector<std::string>({"a"}));
  EXPECT_EQ(r.finishes, 1);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  r.writer->Cancel(grpc::Status::CANCELLED);
  EXPECT_EQ(r.cancels, 1);  // the hook runs once
}

TEST(StreamWriterTest, FailedWriteCancels) {
  FakeReactor r;
  r.writer->Write("a");
  r.writer->Write("b");
  r.Complete(/*ok=*/false);
  EXPECT_EQ(r.written, std::vector<std::string>({"a"}));
  EXPECT_EQ(r.cancels, 1);
  EXPECT_FALSE(r.finished_during_cancel);
  EXPECT_EQ(r.finishes, 1);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_FALSE(r.writer->Write("c"));
}

TEST(StreamWriterTest, NothingReachesADetachedReactor) {
  FakeReactor r;
  r.writer->Detach();
  EXPECT_FALSE(r.writer->Write("a"));
  r.writer->Finish(grpc::Status::OK);
  r.writer->Cancel(grpc::Status::CANCELLED);
  EXPECT_TRUE(r.written.empty());
  EXPECT_EQ(r.finishes, 0);
}

TEST(StreamWriterTest, WriteWhenRoomWaitsForTheClientAndWakesOnCancel) {
  FakeReactor r;
  ASSERT_TRUE(r.writer->WriteWhenRoom("a", 2));
  ASSERT_TRUE(r.writer->WriteWhenRoom("b", 2));
  std::atomic<int> done{0};
  std::atomic<bool> third_ok{false};
  std::thread producer([&] {
    third_ok = r.writer->WriteWhenRoom("c", 2);  // 2 queued: waits
    done = 1;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(done.load(), 0);
  r.Complete();  // "a" written: room for "c"
  producer.join();
  EXPECT_TRUE(third_ok);
  EXPECT_EQ(r.writer->queued(), 2u);
  std::thread blocked([&] { third_ok = r.writer->WriteWhenRoom("d", 2); });
  absl::SleepFor(absl::Milliseconds(50));
  r.writer->Cancel(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
  blocked.join();
  EXPECT_FALSE(third_ok);
}

// The asynchronous producer's pacing (the router's GenerateSink::OnReady):
// the callback runs at once while there is room, else from the write
// completion that makes room, and on cancel (so the producer notices).
TEST(StreamWriterTest, WhenRoomRunsOnceThereIsRoomOrTheStreamCloses) {
  FakeReactor r;
  int ran = 0;
  r.writer->WhenRoom(2, [&] { ++ran; });
  EXPECT_EQ(ran, 1);  // empty: room now
  ASSERT_TRUE(r.writer->Write("a"));
  ASSERT_TRUE(r.writer->Write("b"));
  r.writer->WhenRoom(2, [&] { ++ran; });
  EXPECT_EQ(ran, 1);  // 2 queued: waits
  r.Complete();       // "a" done: room
  EXPECT_EQ(ran, 2);
  ASSERT_TRUE(r.writer->Write("c"));
  r.writer->WhenRoom(2, [&] { ++ran; });
  EXPECT_EQ(ran, 2);
  r.writer->Cancel(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
  EXPECT_EQ(ran, 3);  // woken by the cancel
  EXPECT_FALSE(r.writer->Write("d"));
  r.writer->WhenRoom(2, [&] { ++ran; });
  EXPECT_EQ(ran, 4);  // closed: at once
}

// Random operation sequences; after each step: at most one write in flight,
// what was written is the accepted messages in order (a prefix of them once
// cancelled), finish at most once and never followed by a write.
TEST(StreamWriterTest, RandomOperationSequencesKeepTheInvariants) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    FakeReactor r;
    std::vector<std::string> accepted;
    bool cancelled = false;
    for (int step = 0; step < 40; ++step) {
      switch (rng() % 6) {
        case 0:
        case 1: {
          std::string m = std::to_string(step);
          if (r.writer->Write(m)) accepted.push_back(m);
          break;
        }
        case 2:
          if (r.in_flight == 1) r.Complete(rng() % 8 != 0);
          break;
        case 3:
          if (r.in_flight == 1) r.Complete();
          break;
        case 4:
          if (rng() % 4 == 0) r.writer->Finish(grpc::Status::OK);
          break;
        case 5:
          if (rng() % 8 == 0) {
            r.writer->Cancel(grpc::Status::CANCELLED);
            cancelled = true;
          }
          break;
      }
      ASSERT_LE(r.in_flight, 1);
      ASSERT_LE(r.finishes, 1);
      ASSERT_FALSE(r.wrote_after_finish);
      ASSERT_LE(r.written.size(), accepted.size());
      for (size_t i = 0; i < r.written.size(); ++i) ASSERT_EQ(r.written[i], accepted[i]);
      if (r.finishes == 1) {
        ASSERT_EQ(r.in_flight, 0);
      }
    }
    // Drain: everything accepted goes out unless the stream was cancelled.
    while (r.in_flight == 1) r.Complete();
    r.writer->Finish(grpc::Status::OK);
    EXPECT_EQ(r.finishes, 1);
    if (!cancelled && !r.writer->cancelled()) {
      EXPECT_EQ(r.written, accepted);
    }
  }
}

}  // namespace
}  // namespace swaserve::rpc
