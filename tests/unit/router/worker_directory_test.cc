// WorkerDirectory's circuit breaker: opens after N consecutive failures,
// skips the worker while open, offers it once per period when half-open,
// closes on success. Redis is not needed (no refresh happens).
#include "lib/router/worker_directory.h"

#include "gtest/gtest.h"
#include "lib/cluster/redis_client.h"

namespace swaserve::router {
namespace {

class BreakerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster::RedisOptions ro;
    ro.port = 1;  // nothing listens: the first refresh fails, which is fine
    ro.connect_timeout = absl::Milliseconds(50);
    auto redis = cluster::RedisClient::Create(ro);
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = std::move(*redis);
    auto view = cluster::ClusterView::Create({.redis = redis_.get()});
    ASSERT_TRUE(view.ok());
    view_ = std::move(*view);
    WorkerDirectoryOptions o;
    o.view = view_.get();
    o.clock = &clock_;
    o.background_refresh = false;
    o.breaker.failures_to_open = 3;
    o.breaker.open_for = absl::Seconds(10);
    auto d = WorkerDirectory::Create(o);
    ASSERT_TRUE(d.ok()) << d.status();
    dir_ = std::move(*d);
  }

  base::FakeClock clock_;
  std::unique_ptr<cluster::RedisClient> redis_;
  std::unique_ptr<cluster::ClusterView> view_;
  std::unique_ptr<WorkerDirectory> dir_;
};

TEST_F(BreakerTest, OpensAfterConsecutiveFailuresAndRecovers) {
  EXPECT_TRUE(dir_->Healthy("w"));
  dir_->ReportFailure("w");
  dir_->ReportFailure("w");
  EXPECT_TRUE(dir_->Healthy("w"));  // 2 < 3
  dir_->ReportSuccess("w");          // resets the count
  dir_->ReportFailure("w");
  dir_->ReportFailure("w");
  EXPECT_TRUE(dir_->Healthy("w"));
  dir_->ReportFailure("w");
  EXPECT_FALSE(dir_->Healthy("w"));
  EXPECT_EQ(dir_->OpenBreakers(), 1);
  EXPECT_TRUE(dir_->Healthy("other"));
  clock_.Advance(absl::Seconds(9));
  EXPECT_FALSE(dir_->Healthy("w"));
  clock_.Advance(absl::Seconds(2));
  // Half-open: offered to the policy as often as it asks, without taking
  // the trial (a policy that looks and picks another worker wastes none).
  EXPECT_TRUE(dir_->Healthy("w"));
  EXPECT_TRUE(dir_->Healthy("w"));
  EXPECT_TRUE(dir_->Pick("w"));      // picked: the one trial of the period
  EXPECT_FALSE(dir_->Healthy("w"));  // re-armed for another period
  EXPECT_FALSE(dir_->Pick("w"));     // a second request cannot take it too
  dir_->ReportFailure("w");          // the trial failed: open again
  clock_.Advance(absl::Seconds(5));
  EXPECT_FALSE(dir_->Healthy("w"));
  clock_.Advance(absl::Seconds(6));
  EXPECT_TRUE(dir_->Healthy("w"));
  EXPECT_TRUE(dir_->Pick("w"));
  dir_->ReportSuccess("w");  // the trial succeeded: closed
  EXPECT_TRUE(dir_->Healthy("w"));
  EXPECT_TRUE(dir_->Healthy("w"));
  EXPECT_EQ(dir_->OpenBreakers(), 0);
}

TEST_F(BreakerTest, ClosedBreakersAlwaysPick) {
  EXPECT_TRUE(dir_->Pick("fresh"));
  dir_->ReportFailure("fresh");
  EXPECT_TRUE(dir_->Pick("fresh"));  // 1 < 3: still closed
  EXPECT_TRUE(dir_->Pick("fresh"));
}

TEST_F(BreakerTest, WorkersUnavailableWithoutRedis) {
  auto w = dir_->Workers();
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable) << w.status();
}

TEST(WorkerDirectoryOptionsTest, RejectsBadOptions) {
  EXPECT_FALSE(WorkerDirectory::Create({}).ok());
}

}  // namespace
}  // namespace swaserve::router
