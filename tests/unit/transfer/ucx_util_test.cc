// lib/transfer/ucx_util.h: UCX status mapping, transport names and the
// parsing of ucp_ep_print_info, the UCX_TLS shared-memory check.
#include "lib/transfer/ucx_util.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::transfer::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(FromUcs, MapsEveryClassOfStatus) {
  const struct {
    ucs_status_t ucs;
    absl::StatusCode code;
  } cases[] = {
      {UCS_OK, absl::StatusCode::kOk},
      {UCS_ERR_CANCELED, absl::StatusCode::kCancelled},
      {UCS_ERR_TIMED_OUT, absl::StatusCode::kDeadlineExceeded},
      {UCS_ERR_ENDPOINT_TIMEOUT, absl::StatusCode::kDeadlineExceeded},
      {UCS_ERR_UNREACHABLE, absl::StatusCode::kUnavailable},
      {UCS_ERR_CONNECTION_RESET, absl::StatusCode::kUnavailable},
      {UCS_ERR_NOT_CONNECTED, absl::StatusCode::kUnavailable},
      {UCS_ERR_IO_ERROR, absl::StatusCode::kUnavailable},
      {UCS_ERR_REJECTED, absl::StatusCode::kUnavailable},
      {UCS_ERR_NO_MEMORY, absl::StatusCode::kResourceExhausted},
      {UCS_ERR_NO_RESOURCE, absl::StatusCode::kResourceExhausted},
      {UCS_ERR_EXCEEDS_LIMIT, absl::StatusCode::kResourceExhausted},
      {UCS_ERR_INVALID_PARAM, absl::StatusCode::kInvalidArgument},
      {UCS_ERR_INVALID_ADDR, absl::StatusCode::kInvalidArgument},
      {UCS_ERR_UNSUPPORTED, absl::StatusCode::kUnimplemented},
      {UCS_ERR_NO_ELEM, absl::StatusCode::kInternal},
      {UCS_ERR_MESSAGE_TRUNCATED, absl::StatusCode::kInternal},
  };
  for (const auto& c : cases) {
    const absl::Status s = FromUcs(c.ucs, "doing it");
    EXPECT_EQ(s.code(), c.code) << ucs_status_string(c.ucs);
    if (!s.ok()) {
      EXPECT_EQ(std::string(s.message()),
                std::string("doing it: ") + ucs_status_string(c.ucs));
    }
  }
}

TEST(PeerError, IsUnavailableUnlessWeCancelled) {
  EXPECT_TRUE(absl::IsCancelled(PeerError(UCS_ERR_CANCELED, "x")));
  for (ucs_status_t st :
       {UCS_ERR_ENDPOINT_TIMEOUT, UCS_ERR_CONNECTION_RESET, UCS_ERR_NO_MEMORY,
        UCS_ERR_INVALID_PARAM, UCS_ERR_MESSAGE_TRUNCATED}) {
    const absl::Status s = PeerError(st, "sending data");
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()), StartsWith("sending data: "));
  }
}

TEST(TransportOfName, ClassifiesUcxTransports) {
  EXPECT_EQ(TransportOfName("self"), Transport::kSelf);
  EXPECT_EQ(TransportOfName("tcp"), Transport::kTcp);
  for (const char* shm : {"posix", "sysv", "cma", "xpmem", "knem"}) {
    EXPECT_EQ(TransportOfName(shm), Transport::kSharedMemory) << shm;
  }
  for (const char* rdma : {"rc_mlx5", "rc_verbs", "dc_mlx5", "ud_verbs"}) {
    EXPECT_EQ(TransportOfName(rdma), Transport::kRdma) << rdma;
  }
  EXPECT_EQ(TransportOfName("cuda_copy"), Transport::kUnknown);
  EXPECT_EQ(TransportOfName(""), Transport::kUnknown);
}

TEST(TransportOfEpInfo, PicksTheActiveMessageLane) {
  // As UCX 1.13 prints it: the first lane is an RMA lane over tcp, the AM
  // lane is sysv.
  const std::string info =
      "#\n# UCP endpoint\n#\n"
      "#               peer: <no debug data>\n"
      "#                 lane[0]:  1:tcp/lo.0 md[1]  -> md[1]/tcp/sysdev[255] "
      "rma_bw#0\n"
      "#                 lane[1]:  3:sysv/memory.0 md[2]  -> "
      "md[2]/sysv/sysdev[255] am am_bw#0\n";
  EXPECT_EQ(TransportOfEpInfo(info), Transport::kSharedMemory);
}

TEST(TransportOfEpInfo, FallsBackToTheFirstLaneThenUnknown) {
  EXPECT_EQ(TransportOfEpInfo("#  lane[0]:  1:tcp/lo.0 md[1]  -> md[1]/tcp "
                              "rma_bw#0\n#  lane[1]:  2:posix/memory md[0] "
                              "-> md[0]/posix rma#0\n"),
            Transport::kTcp);
  // "am_bw" alone is not the AM lane's word.
  EXPECT_EQ(TransportOfEpInfo("#  lane[0]:  0:self/memory md[0] am_bw#0\n"),
            Transport::kSelf);
  EXPECT_EQ(TransportOfEpInfo(""), Transport::kUnknown);
  EXPECT_EQ(TransportOfEpInfo("# lane[0] nothing parsable here\n"),
            Transport::kUnknown);
  EXPECT_EQ(TransportOfEpInfo("#  lane[0]:  tcp/lo:0 am\n"),
            Transport::kUnknown);  // '/' before ':'
}

// Restores UCX_TLS when done.
class ScopedUcxTls {
 public:
  explicit ScopedUcxTls(const char* value) {
    if (const char* old = std::getenv("UCX_TLS")) old_ = old;
    if (value == nullptr) {
      unsetenv("UCX_TLS");
    } else {
      setenv("UCX_TLS", value, 1);
    }
  }
  ~ScopedUcxTls() {
    if (old_.has_value()) {
      setenv("UCX_TLS", old_->c_str(), 1);
    } else {
      unsetenv("UCX_TLS");
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST(MayUseSharedMemory, ReadsTheOptionFirst) {
  ScopedUcxTls env("tcp");
  EXPECT_TRUE(MayUseSharedMemory("posix,sysv,self"));
  EXPECT_TRUE(MayUseSharedMemory("tcp,sm"));
  EXPECT_TRUE(MayUseSharedMemory("shm"));
  EXPECT_TRUE(MayUseSharedMemory("mm"));
  EXPECT_TRUE(MayUseSharedMemory("all"));
  EXPECT_TRUE(MayUseSharedMemory("^tcp"));  // everything but tcp
  EXPECT_FALSE(MayUseSharedMemory("tcp"));
  EXPECT_FALSE(MayUseSharedMemory("tcp,self,cma"));
  EXPECT_FALSE(MayUseSharedMemory("rc,ud"));
}

TEST(MayUseSharedMemory, FallsBackToTheEnvironmentThenAll) {
  {
    ScopedUcxTls env("tcp");
    EXPECT_FALSE(MayUseSharedMemory(""));
  }
  {
    ScopedUcxTls env("sysv,tcp");
    EXPECT_TRUE(MayUseSharedMemory(""));
  }
  {
    ScopedUcxTls env("");
    EXPECT_TRUE(MayUseSharedMemory(""));
  }
  {
    ScopedUcxTls env(nullptr);
    EXPECT_TRUE(MayUseSharedMemory(""));
  }
}

TEST(Hex, SixteenLowerCaseDigits) {
  EXPECT_EQ(Hex(0), "0000000000000000");
  EXPECT_EQ(Hex(0xABCDEF), "0000000000abcdef");
  EXPECT_EQ(Hex(~uint64_t{0}), "ffffffffffffffff");
}

TEST(Clock, SinceMeasuresFromAStart) {
  const int64_t start = NowNanos() - DurationNanos(absl::Seconds(2));
  EXPECT_GE(Since(start), absl::Seconds(2));
  EXPECT_LT(Since(start), absl::Seconds(60));
  EXPECT_EQ(DurationNanos(absl::Milliseconds(5)), 5'000'000);
}

}  // namespace
}  // namespace swaserve::transfer::internal
