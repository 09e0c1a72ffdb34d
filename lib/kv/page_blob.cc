#include "lib/kv/page_blob.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

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

// Header bytes [0, kChecksumOffset): what a keyed blob's tag covers besides
// the payload.
void EncodePrefix(const PageBlobHeader& header, uint8_t* p) {
  std::memcpy(p, kPageBlobMagic, kMagicBytes);
  absl::little_endian::Store32(p + kVersionOffset,
                               header.keyed ? kKeyedPageBlobVersion : kPageBlobVersion);
  absl::little_endian::Store32(p + kHeaderSizeOffset,
                               static_cast<uint32_t>(kPageBlobHeaderBytes));
  absl::little_endian::Store64(p + kHashOffset, header.key.hash);
  absl::little_endian::Store64(p + kLayoutOffset, header.key.layout);
  absl::little_endian::Store64(p + kLengthOffset, header.payload_bytes);
}

base::Hash128 TagOf(const PageBlobMac& mac, const PageBlobHeader& header,
                    absl::Span<const uint8_t> payload) {
  uint8_t prefix[kChecksumOffset];
  EncodePrefix(header, prefix);
  return mac.Tag(absl::MakeConstSpan(prefix, kChecksumOffset), payload);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PageBlobMac>> PageBlobMac::FromKey(std::string key) {
  if (key.size() < kMinKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an L3 MAC key needs at least ", kMinKeyBytes,
                                                   " bytes, not ", key.size()));
  }
  return std::shared_ptr<const PageBlobMac>(new PageBlobMac(std::move(key)));
}

absl::StatusOr<std::shared_ptr<const PageBlobMac>> PageBlobMac::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the L3 MAC key file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string key = ss.str();
  if (!key.empty() && key.back() == '\n') key.pop_back();
  absl::StatusOr<std::shared_ptr<const PageBlobMac>> mac = FromKey(std::move(key));
  if (!mac.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", mac.status().message()));
  return mac;
}

base::Hash128 PageBlobMac::Tag(absl::Span<const uint8_t> prefix,
                               absl::Span<const uint8_t> payload) const {
  // The HMAC implementation, fetched once (EVP_MAC objects are shareable
  // across threads; each call has a context of its own).
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  unsigned char md[EVP_MAX_MD_SIZE];
  size_t len = 0;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  EVP_MAC_CTX* ctx = hmac != nullptr ? EVP_MAC_CTX_new(hmac) : nullptr;
  if (ctx == nullptr ||
      EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key_.data()), key_.size(),
                   params) != 1 ||
      EVP_MAC_update(ctx, prefix.data(), prefix.size()) != 1 ||
      EVP_MAC_update(ctx, payload.data(), payload.size()) != 1 ||
      EVP_MAC_final(ctx, md, &len, sizeof(md)) != 1 || len < 16) {
    std::fprintf(stderr, "PageBlobMac: HMAC-SHA256 failed\n");
    std::abort();
  }
  EVP_MAC_CTX_free(ctx);
  return {.low = absl::little_endian::Load64(md), .high = absl::little_endian::Load64(md + 8)};
}

PageBlobHeader MakePageBlobHeader(const PageKey& key,
                                  absl::Span<const uint8_t> payload,
                                  const PageBlobMac* mac) {
  PageBlobHeader h{
      .key = key,
      .payload_bytes = payload.size(),
      .keyed = mac != nullptr,
  };
  h.checksum = mac != nullptr ? TagOf(*mac, h, payload)
                              : base::Hash128Of(payload.data(), payload.size());
  return h;
}

void EncodePageBlobHeader(const PageBlobHeader& header,
                          absl::Span<uint8_t> out) {
  if (out.size() < kPageBlobHeaderBytes) {
    std::fprintf(stderr, "EncodePageBlobHeader: %zu-byte buffer\n", out.size());
    std::abort();
  }
  uint8_t* p = out.data();
  EncodePrefix(header, p);
  absl::little_endian::Store64(p + kChecksumOffset, header.checksum.low);
  absl::little_endian::Store64(p + kChecksumOffset + 8, header.checksum.high);
  absl::little_endian::Store64(p + kHeaderChecksumOffset, HeaderChecksum(p));
}

std::string EncodePageBlob(const PageKey& key,
                           absl::Span<const uint8_t> payload,
                           const PageBlobMac* mac) {
  std::string blob(kPageBlobHeaderBytes + payload.size(), '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(blob.data());
  EncodePageBlobHeader(MakePageBlobHeader(key, payload, mac),
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
  const uint32_t version = absl::little_endian::Load32(p + kVersionOffset);
  if (version != kPageBlobVersion && version != kKeyedPageBlobVersion) {
    return absl::DataLossError(
        absl::StrCat("page blob: unsupported format version ", version));
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
      .keyed = version == kKeyedPageBlobVersion,
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
                                  absl::Span<const uint8_t> payload,
                                  const PageBlobMac* mac) {
  if (header.keyed != (mac != nullptr)) {
    return absl::DataLossError(header.keyed ? "page blob: keyed, and this store has no MAC key"
                                            : "page blob: not keyed, and this store requires a MAC");
  }
  if (payload.size() != header.payload_bytes) {
    return absl::DataLossError("page blob: payload length mismatch");
  }
  if (mac != nullptr) {
    if (TagOf(*mac, header, payload) != header.checksum) {
      return absl::DataLossError("page blob: MAC mismatch (not written with this store's key)");
    }
    return absl::OkStatus();
  }
  if (base::Hash128Of(payload.data(), payload.size()) != header.checksum) {
    return absl::DataLossError("page blob: payload checksum mismatch");
  }
  return absl::OkStatus();
}

absl::Status ReadPageBlob(absl::Span<const uint8_t> blob, const PageKey& key,
                          absl::Span<uint8_t> out, const PageBlobMac* mac) {
  absl::StatusOr<PageBlobHeader> header = DecodePageBlobHeader(blob);
  if (!header.ok()) return header.status();
  const absl::Span<const uint8_t> payload = blob.subspan(kPageBlobHeaderBytes);
  if (absl::Status s =
          CheckPageBlobHeader(*header, key, payload.size(), out.size());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPageBlobPayload(*header, payload, mac); !s.ok()) {
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
