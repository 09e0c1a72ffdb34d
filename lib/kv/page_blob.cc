#include "lib/kv/page_blob.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace swaserve::kv {
namespace {

constexpr size_t kMagicBytes = 8;
constexpr size_t kVersionOffset = 8;
constexpr size_t kHeaderSizeOffset = 12;
constexpr size_t kHashOffset = 16;
constexpr size_t kLayoutOffset = 24;
constexpr size_t kLengthOffset = 32;
constexpr size_t kChecksumOffset = 40;
constexpr size_t kHeaderChecksumOffset = 56;
static_assert(kHeaderChecksumOffset + 8 == kPageBlobHeaderBytes);
static_assert(sizeof(kPageBlobMagic) == kMagicBytes + 1);

uint64_t HeaderChecksum(const uint8_t* header) {
  return base::Hash64(header, kHeaderChecksumOffset);
}

}  // namespace

PageBlobHeader MakePageBlobHeader(const PageKey& key,
                                  absl::Span<const uint8_t> payload) {
  return PageBlobHeader{
      .key = key,
      .payload_bytes = payload.size(),
      .checksum = base::Hash128Of(payload.data(), payload.size()),
  };
}

void EncodePageBlobHeader(const PageBlobHeader& header,
                          absl::Span<uint8_t> out) {
  if (out.size() < kPageBlobHeaderBytes) {
    std::fprintf(stderr, "EncodePageBlobHeader: %zu-byte buffer\n", out.size());
    std::abort();
  }
  uint8_t* p = out.data();
  std::memcpy(p, kPageBlobMagic, kMagicBytes);
  absl::little_endian::Store32(p + kVersionOffset, kPageBlobVersion);
  absl::little_endian::Store32(p + kHeaderSizeOffset,
                               static_cast<uint32_t>(kPageBlobHeaderBytes));
  absl::little_endian::Store64(p + kHashOffset, header.key.hash);
  absl::little_endian::Store64(p + kLayoutOffset, header.key.layout);
  absl::little_endian::Store64(p + kLengthOffset, header.payload_bytes);
  absl::little_endian::Store64(p + kChecksumOffset, header.checksum.low);
  absl::little_endian::Store64(p + kChecksumOffset + 8, header.checksum.high);
  absl::little_endian::Store64(p + kHeaderChecksumOffset, HeaderChecksum(p));
}

std::string EncodePageBlob(const PageKey& key,
                           absl::Span<const uint8_t> payload) {
  std::string blob(kPageBlobHeaderBytes + payload.size(), '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(blob.data());
  EncodePageBlobHeader(MakePageBlobHeader(key, payload),
                       absl::MakeSpan(p, kPageBlobHeaderBytes));
  if (!payload.empty()) {
    std::memcpy(p + kPageBlobHeaderBytes, payload.data(), payload.size());
  }
  return blob;
}

absl::StatusOr<PageBlobHeader> DecodePageBlobHeader(
    absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kPageBlobHeaderBytes) {
    return absl::DataLossError(absl::StrCat("page blob: ", bytes.size(),
                                            " bytes, shorter than a header"));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kPageBlobMagic, kMagicBytes) != 0) {
    return absl::DataLossError("page blob: bad magic");
  }
  if (const uint32_t v = absl::little_endian::Load32(p + kVersionOffset);
      v != kPageBlobVersion) {
    return absl::DataLossError(
        absl::StrCat("page blob: unsupported format version ", v));
  }
  if (absl::little_endian::Load32(p + kHeaderSizeOffset) !=
      kPageBlobHeaderBytes) {
    return absl::DataLossError("page blob: bad header size");
  }
  if (absl::little_endian::Load64(p + kHeaderChecksumOffset) !=
      HeaderChecksum(p)) {
    return absl::DataLossError("page blob: header checksum mismatch");
  }
  return PageBlobHeader{
      .key = {.hash = absl::little_endian::Load64(p + kHashOffset),
              .layout = absl::little_endian::Load64(p + kLayoutOffset)},
      .payload_bytes = absl::little_endian::Load64(p + kLengthOffset),
      .checksum = {.low = absl::little_endian::Load64(p + kChecksumOffset),
                   .high =
                       absl::little_endian::Load64(p + kChecksumOffset + 8)},
  };
}

absl::Status CheckPageBlobHeader(const PageBlobHeader& header,
                                 const PageKey& key,
                                 uint64_t stored_payload_bytes,
                                 size_t want_bytes) {
  if (header.key != key) {
    return absl::DataLossError("page blob: stored under another key");
  }
  if (header.payload_bytes != stored_payload_bytes) {
    return absl::DataLossError(absl::StrCat(
        "page blob: header says ", header.payload_bytes, " payload bytes, ",
        stored_payload_bytes, " present (torn or truncated)"));
  }
  if (header.payload_bytes != want_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("page blob holds ", header.payload_bytes,
                     " bytes, the caller's buffer is ", want_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckPageBlobPayload(const PageBlobHeader& header,
                                  absl::Span<const uint8_t> payload) {
  if (payload.size() != header.payload_bytes ||
      base::Hash128Of(payload.data(), payload.size()) != header.checksum) {
    return absl::DataLossError("page blob: payload checksum mismatch");
  }
  return absl::OkStatus();
}

absl::Status ReadPageBlob(absl::Span<const uint8_t> blob, const PageKey& key,
                          absl::Span<uint8_t> out) {
  absl::StatusOr<PageBlobHeader> header = DecodePageBlobHeader(blob);
  if (!header.ok()) return header.status();
  const absl::Span<const uint8_t> payload = blob.subspan(kPageBlobHeaderBytes);
  if (absl::Status s =
          CheckPageBlobHeader(*header, key, payload.size(), out.size());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPageBlobPayload(*header, payload); !s.ok()) {
    return s;
  }
  if (!payload.empty()) std::memcpy(out.data(), payload.data(), payload.size());
  return absl::OkStatus();
}

absl::Status CountGet(PageStoreStats& stats, absl::Status status,
                      size_t bytes) {
  stats.gets.fetch_add(1, std::memory_order_relaxed);
  switch (status.code()) {
    case absl::StatusCode::kOk:
      stats.hits.fetch_add(1, std::memory_order_relaxed);
      stats.get_bytes.fetch_add(static_cast<int64_t>(bytes),
                                std::memory_order_relaxed);
      return status;
    case absl::StatusCode::kNotFound:
      stats.misses.fetch_add(1, std::memory_order_relaxed);
      return status;
    case absl::StatusCode::kDataLoss:
      stats.corrupt.fetch_add(1, std::memory_order_relaxed);
      return absl::NotFoundError(
          absl::StrCat("corrupt (erased): ", status.message()));
    default:
      stats.get_errors.fetch_add(1, std::memory_order_relaxed);
      return status;
  }
}

}  // namespace swaserve::kv
