// lib/transfer/transfer_metrics.h: the families, per direction, as the
// exposition renders them.
#include "lib/transfer/transfer_metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/metrics/registry.h"

namespace swaserve::transfer::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TransferMetrics, ReasonNames) {
  EXPECT_EQ(ReasonName(Reason::kTimeout), "timeout");
  EXPECT_EQ(ReasonName(Reason::kPeerFailure), "peer_failure");
  EXPECT_EQ(ReasonName(Reason::kRejected), "rejected");
  EXPECT_EQ(ReasonName(Reason::kInvalid), "invalid");
  EXPECT_EQ(ReasonName(Reason::kCancelled), "cancelled");
  EXPECT_EQ(ReasonName(Reason::kInternal), "internal");
  EXPECT_EQ(ReasonName(Reason::kCount), "?");
}

TEST(TransferMetrics, CountsEachDirectionSeparately) {
  metrics::Registry registry;
  TransferMetrics m;
  m.Export(&registry);
  ASSERT_TRUE(m.enabled());
  m.Started(Direction::kSend);
  m.Started(Direction::kSend);
  m.Started(Direction::kReceive);
  m.Succeeded(Direction::kSend, 4096, absl::Milliseconds(3));
  m.Failed(Direction::kReceive, Reason::kTimeout);
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_bytes_total{direction="
                              "\"send\"} 4096"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfers_total{direction=\"send\","
                              "result=\"ok\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfers_total{direction="
                              "\"receive\",result=\"failed\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_failures_total{direction="
                              "\"receive\",reason=\"timeout\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_failures_total{direction="
                              "\"send\",reason=\"timeout\"} 0"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_seconds_count{direction="
                              "\"send\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfer_seconds_count{direction="
                              "\"receive\"} 0"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfers_in_flight{direction="
                              "\"send\"} 1"));
  EXPECT_THAT(text, HasSubstr("swaserve_kv_transfers_in_flight{direction="
                              "\"receive\"} 0"));
}

TEST(TransferMetrics, TwoEnginesShareTheFamilies) {
  metrics::Registry registry;
  TransferMetrics a, b;
  a.Export(&registry);
  b.Export(&registry);
  ASSERT_TRUE(a.enabled() && b.enabled());
  a.Started(Direction::kReceive);
  b.Started(Direction::kReceive);
  a.Succeeded(Direction::kReceive, 10, absl::ZeroDuration());
  b.Succeeded(Direction::kReceive, 5, absl::ZeroDuration());
  EXPECT_THAT(registry.RenderText(),
              HasSubstr("swaserve_kv_transfer_bytes_total{direction="
                        "\"receive\"} 15"));
}

TEST(TransferMetrics, DisabledWithoutARegistryOrOnAConflict) {
  TransferMetrics none;
  none.Export(nullptr);
  EXPECT_FALSE(none.enabled());
  none.Started(Direction::kSend);  // no-ops
  none.Succeeded(Direction::kSend, 1, absl::Seconds(1));
  none.Failed(Direction::kSend, Reason::kInternal);

  metrics::Registry registry;
  ASSERT_TRUE(
      registry
          .AddGauge("swaserve_kv_transfers_in_flight", "not ours", {"other"})
          .ok());
  TransferMetrics conflicting;
  conflicting.Export(&registry);
  EXPECT_FALSE(conflicting.enabled());
  conflicting.Failed(Direction::kSend, Reason::kInternal);
  EXPECT_THAT(registry.RenderText(),
              Not(HasSubstr("swaserve_kv_transfers_total{")));
}

}  // namespace
}  // namespace swaserve::transfer::internal
