// The transfer wire format: round trips, and every truncation or corruption
// of a handshake blob or header is an error (never undefined behaviour in
// UCX, which parses addresses and rkeys without a length).
#include "lib/transfer/wire.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::transfer::wire {
namespace {

using ::testing::HasSubstr;

TEST(Wire, WorkerAddressRoundTrip) {
  WorkerAddress a{0x1234567890abcdefull, ProcessIdentity{11, 22, 33, 44},
                  std::string("\x01\x02\x00ucx", 6)};
  auto back = UnpackWorkerAddress(PackWorkerAddress(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->engine_id, a.engine_id);
  EXPECT_EQ(back->process.boot_id, 11u);
  EXPECT_EQ(back->process.pid_namespace, 22u);
  EXPECT_EQ(back->process.pid, 33u);
  EXPECT_EQ(back->process.start_time, 44u);
  EXPECT_EQ(back->ucx_address, a.ucx_address);
}

TEST(Wire, EveryTruncationAndBitFlipOfABlobIsRejected) {
  const std::string address =
      PackWorkerAddress(WorkerAddress{42, {1, 2, 3, 4}, std::string(200, 'a')});
  const std::string rkey = PackRkey(Rkey{7, 0x1000, 4096, std::string(9, 'k')});
  for (const std::string* blob : {&address, &rkey}) {
    const bool is_rkey = blob == &rkey;
    auto check = [&](const std::string& b) {
      return is_rkey ? UnpackRkey(b).status() : UnpackWorkerAddress(b).status();
    };
    ASSERT_TRUE(check(*blob).ok());
    for (size_t n = 0; n < blob->size(); ++n) {
      absl::Status s = check(blob->substr(0, n));
      ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
    }
    EXPECT_FALSE(check(*blob + "x").ok());
    for (size_t i = 0; i < blob->size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string b = *blob;
        b[i] ^= static_cast<char>(1 << bit);
        ASSERT_FALSE(check(b).ok()) << "byte " << i << " bit " << bit;
      }
    }
  }
}

TEST(Wire, RkeyRoundTripAndVersionCheck) {
  Rkey k{0xfeed, 0x7f0000001000, 1 << 20, "packed", kRkeyUcxAllocated};
  auto back = UnpackRkey(PackRkey(k));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->flags, kRkeyUcxAllocated);
  EXPECT_EQ(back->tag, k.tag);
  EXPECT_EQ(back->base_address, k.base_address);
  EXPECT_EQ(back->length, k.length);
  EXPECT_EQ(back->ucx_rkey, k.ucx_rkey);
  std::string other_version = PackRkey(k);
  other_version[4] = kVersion + 1;
  EXPECT_THAT(UnpackRkey(other_version).status().message(),
              HasSubstr("same swaserve release"));
  // An address is not an rkey and vice versa.
  EXPECT_THAT(UnpackRkey(PackWorkerAddress({1, {}, "x"})).status().message(),
              HasSubstr("wrong magic"));
}

TEST(Wire, HeadersRoundTrip) {
  DataHeader d;
  d.sender_engine = 1;
  d.send_id = 2;
  d.rkey_tag = 3;
  d.remote_address = 4;
  d.length = 5;
  d.region = 1;
  const std::string encoded = EncodeData(d, "transfer-7");
  auto dd = DecodeData(encoded.data(), encoded.size());
  ASSERT_TRUE(dd.ok()) << dd.status();
  EXPECT_EQ(dd->transfer_id, "transfer-7");
  EXPECT_EQ(dd->header.remote_address, 4u);
  EXPECT_EQ(dd->header.region, 1u);
  for (size_t n = 0; n < encoded.size(); ++n) {
    EXPECT_FALSE(DecodeData(encoded.data(), n).ok()) << n;
  }

  CommitHeader c;
  c.send_id = 9;
  c.am_bytes = 100;
  c.put_bytes = 200;
  const std::string ec = EncodeCommit(c, {11, 22}, "id");
  auto dc = DecodeCommit(ec.data(), ec.size());
  ASSERT_TRUE(dc.ok());
  EXPECT_EQ(dc->region_tags, (std::vector<uint64_t>{11, 22}));
  EXPECT_EQ(dc->header.put_bytes, 200u);
  EXPECT_EQ(dc->transfer_id, "id");
  for (size_t n = 0; n < ec.size(); ++n) {
    EXPECT_FALSE(DecodeCommit(ec.data(), n).ok()) << n;
  }

  ReplyHeader r;
  r.send_id = 5;
  r.code = 5;
  r.reply_kind = static_cast<uint8_t>(ReplyKind::kReject);
  const std::string er = EncodeReply(r);
  auto dr = DecodeReply(er.data(), er.size());
  ASSERT_TRUE(dr.ok());
  EXPECT_EQ(dr->send_id, 5u);

  // A header of one kind is not accepted as another.
  EXPECT_FALSE(DecodeCommit(encoded.data(), encoded.size()).ok());
  const std::string hello = EncodeHello(HelloHeader{});
  EXPECT_FALSE(DecodeReply(hello.data(), hello.size()).ok());
  EXPECT_TRUE(DecodeHello(hello.data(), hello.size()).ok());
}

TEST(Wire, OverlongTransferIdIsRejected) {
  const std::string encoded =
      EncodeData(DataHeader{}, std::string(kMaxTransferIdBytes + 1, 'x'));
  EXPECT_FALSE(DecodeData(encoded.data(), encoded.size()).ok());
}

TEST(Wire, CheckTransferIdBoundsTheLength) {
  EXPECT_TRUE(CheckTransferId("a").ok());
  EXPECT_TRUE(CheckTransferId(std::string(kMaxTransferIdBytes, 'x')).ok());
  const absl::Status empty = CheckTransferId("");
  EXPECT_TRUE(absl::IsInvalidArgument(empty));
  EXPECT_EQ(empty.message(), "transfer id must be 1..128 bytes, got 0");
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckTransferId(std::string(kMaxTransferIdBytes + 1, 'x'))));
}

}  // namespace
}  // namespace swaserve::transfer::wire
