// The stored form of one L3 page (lib/kv/page_store.h), shared by every
// PageStore backend: a fixed 64-byte header followed by the payload (the
// page's bytes). All integers little-endian:
//
//   offset size  field
//        0    8  magic "SWKVPAGE"
//        8    4  format version (kPageBlobVersion)
//       12    4  header size (64)
//       16    8  PageKey::hash    (chained page hash)
//       24    8  PageKey::layout  (KvLayoutFingerprint)
//       32    8  payload length in bytes
//       40   16  XXH3-128 of the payload (low 64 bits, then high)
//       56    8  XXH3-64 of header bytes [0, 56)
//
// The header checksum makes any change to the header detectable (a flipped
// bit in a reserved or length field is not mistaken for another valid
// blob); the payload checksum catches torn and corrupted payloads; the key
// catches a blob stored under the wrong name (a renamed file, a Redis value
// SET under another key). A reader checks, in order: DecodePageBlobHeader
// (magic, version, header checksum), CheckPageBlobHeader (key, length
// against the bytes actually present and against what the caller wants),
// CheckPageBlobPayload (checksum). ReadPageBlob does all three on a blob held
// in memory (Redis); the file store reads the header and the payload
// separately so the payload lands in the caller's buffer without a copy.
//
// Keyed blobs (format version 2): with a PageBlobMac, the 16 bytes at
// offset 40 are not XXH3 but a keyed MAC — HMAC-SHA256 under the store's
// secret key of header bytes [0, 40) followed by the payload, truncated to
// 128 bits — so that whoever can write to a shared L3 (its Redis, its
// directory) but does not hold the key cannot plant KV: a blob whose tag
// does not verify is DataLoss like any corrupt one. A reader with a key
// accepts only keyed blobs; a reader without one only unkeyed blobs.
//
// Verification failures are DataLoss (the message says which check); a
// self-consistent blob of another size than the caller asked for is
// InvalidArgument. Backends turn DataLoss into "erase, count corrupt,
// NotFound" through CountGet().
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/base/hash.h"
#include "lib/kv/page_store.h"

namespace swaserve::kv {

inline constexpr char kPageBlobMagic[] = "SWKVPAGE";  // 8 bytes, no NUL
inline constexpr uint32_t kPageBlobVersion = 1;
inline constexpr uint32_t kKeyedPageBlobVersion = 2;
inline constexpr size_t kPageBlobHeaderBytes = 64;

// The secret key of a store's blob MACs. Immutable; thread-safe.
class PageBlobMac {
 public:
  // At least kMinKeyBytes bytes of key material.
  static constexpr size_t kMinKeyBytes = 32;
  static absl::StatusOr<std::shared_ptr<const PageBlobMac>> FromKey(std::string key);
  // The file's bytes (one trailing newline dropped): NotFound when it
  // cannot be read, InvalidArgument when it is too short; both name the
  // file, never the key.
  static absl::StatusOr<std::shared_ptr<const PageBlobMac>> FromFile(const std::string& path);

  // HMAC-SHA256 of `prefix` then `payload`, truncated to 128 bits.
  base::Hash128 Tag(absl::Span<const uint8_t> prefix, absl::Span<const uint8_t> payload) const;

 private:
  explicit PageBlobMac(std::string key) : key_(std::move(key)) {}
  const std::string key_;
};

struct PageBlobHeader {
  PageKey key;
  uint64_t payload_bytes = 0;
  // XXH3-128 (seed 0) of the payload, or for a keyed blob its MAC tag.
  base::Hash128 checksum;
  bool keyed = false;

  bool operator==(const PageBlobHeader&) const = default;
};

// The header of `payload` stored under `key` (hashes the payload).
// With `mac`: a keyed header (the tag in place of the checksum).
PageBlobHeader MakePageBlobHeader(const PageKey& key,
                                  absl::Span<const uint8_t> payload,
                                  const PageBlobMac* mac = nullptr);

// Writes the kPageBlobHeaderBytes bytes of `header` to `out`, which must be
// at least that long (checked: a shorter span is a bug and aborts).
void EncodePageBlobHeader(const PageBlobHeader& header,
                          absl::Span<uint8_t> out);

// Header + payload in one string (the Redis value).
std::string EncodePageBlob(const PageKey& key,
                           absl::Span<const uint8_t> payload,
                           const PageBlobMac* mac = nullptr);

// Decodes the header at the start of `bytes`. DataLoss when `bytes` is
// shorter than a header, or the magic, version, header size or header
// checksum is wrong. Bytes after the header are not looked at.
absl::StatusOr<PageBlobHeader> DecodePageBlobHeader(
    absl::Span<const uint8_t> bytes);

// Checks a decoded header against the reader's expectations:
//   DataLoss        header.key != key (a blob under another key's name), or
//                   header.payload_bytes != stored_payload_bytes, the bytes
//                   actually present after the header (torn, truncated or
//                   extended);
//   InvalidArgument the blob is consistent but holds header.payload_bytes
//                   bytes and the caller wants want_bytes.
absl::Status CheckPageBlobHeader(const PageBlobHeader& header,
                                 const PageKey& key,
                                 uint64_t stored_payload_bytes,
                                 size_t want_bytes);

// DataLoss unless `payload` is header.payload_bytes long and hashes to
// header.checksum (its tag under `mac` for a keyed blob; a keyed blob
// without `mac`, or an unkeyed one with it, is DataLoss too).
absl::Status CheckPageBlobPayload(const PageBlobHeader& header,
                                  absl::Span<const uint8_t> payload,
                                  const PageBlobMac* mac = nullptr);

// All checks on a whole blob (header + payload) read back for `key`; on
// success copies the payload into `out` (whose size is the wanted length).
// `out` is left untouched on error.
absl::Status ReadPageBlob(absl::Span<const uint8_t> blob, const PageKey& key,
                          absl::Span<uint8_t> out, const PageBlobMac* mac = nullptr);

// For backends: records the outcome of one Get in `stats` and returns what
// the Get returns. OK: a hit of `bytes` payload bytes. NotFound: a miss.
// DataLoss: corrupt (the caller has erased, or is erasing, the entry);
// returned as NotFound with the reason. Anything else: a get error,
// returned as is. `gets` is counted here too.
absl::Status CountGet(PageStoreStats& stats, absl::Status status, size_t bytes);

}  // namespace swaserve::kv
