// Fast non-cryptographic hashing (XXH3) and the chained page hashes that key
// the prefix cache and the router's prefix-affinity index.
//
// Chained page hash (docs/architecture.md#kv-cache, #redis-state): a prompt is cut into pages of
// `page_size` tokens; only complete pages are hashed. The hash of page i is
//   XXH3-64( parent || tokens of page i as u32 LE || content hashes of the
//            multimodal items overlapping page i ),
// where parent is the hash of page i-1 (for page 0, the chain's seed). So
// equal hashes mean equal whole prefixes, not just equal pages, and two
// prompts that differ only in an image never share a page hash.
//
// All functions are pure and thread-safe. Values are stable across processes,
// machines and releases (they are stored in Redis): never change the recipe
// without changing kPageHashVersion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swaserve::base {

// Bumped whenever the page-hash recipe changes; mixed into the default seed.
inline constexpr uint64_t kPageHashVersion = 1;

// XXH3 64-bit hash of `data` with `seed`.
uint64_t Hash64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t Hash64(absl::string_view s, uint64_t seed = 0) {
  return Hash64(s.data(), s.size(), seed);
}

// A 128-bit hash (XXH3-128), e.g. the content hash of an image.
struct Hash128 {
  uint64_t low = 0;
  uint64_t high = 0;

  // 16 bytes, little-endian low then high (the wire form in
  // MultimodalItem.content_hash).
  std::string ToBytes() const;
  // Parses ToBytes()' output; false when `bytes` is not 16 bytes long.
  static bool FromBytes(absl::string_view bytes, Hash128* out);
  // 32 lowercase hex digits, high first.
  std::string ToHex() const;

  friend bool operator==(const Hash128&, const Hash128&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Hash128& v) {
    return H::combine(std::move(h), v.low, v.high);
  }
};

Hash128 Hash128Of(const void* data, size_t size, uint64_t seed = 0);
inline Hash128 Hash128Of(absl::string_view s, uint64_t seed = 0) {
  return Hash128Of(s.data(), s.size(), seed);
}

// A multimodal item's placement in the token sequence, for page hashing:
// tokens [token_offset, token_offset + num_tokens) are its placeholders.
struct HashedSpan {
  uint32_t token_offset = 0;
  uint32_t num_tokens = 0;
  Hash128 content;
};

// The seed of every chain unless a caller namespaces its chains (e.g. per
// model): derived from kPageHashVersion.
uint64_t DefaultPageHashSeed();

// The chain seed of a prefix-cache domain: DefaultPageHashSeed() for an
// empty `domain` and `salt`, else a seed derived from both (length-prefixed,
// so no two (domain, salt) pairs collide by concatenation). Requests whose
// seeds differ never share a page hash, so never share cached KV: the
// router seeds each tenant's chains apart (its domain) and a request's
// `cache_salt` narrows that further. Never 0.
uint64_t PageHashSeedFor(absl::string_view domain, absl::string_view salt);

// Hash of one page given its parent's hash (or the seed for page 0), its
// tokens and the content hashes of the items that overlap it (in order).
uint64_t NextPageHash(uint64_t parent, absl::Span<const uint32_t> page_tokens,
                      absl::Span<const Hash128> overlapping_items = {});

// Chained hashes of every complete page of `tokens` (tokens.size() /
// page_size entries; a trailing partial page is not hashed). `items` must be
// sorted by token_offset; each is mixed into every page it overlaps.
// page_size must be > 0.
std::vector<uint64_t> ChainedPageHashes(absl::Span<const uint32_t> tokens,
                                        int page_size,
                                        absl::Span<const HashedSpan> items = {},
                                        uint64_t seed = DefaultPageHashSeed());

}  // namespace swaserve::base
