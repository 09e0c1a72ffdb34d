#include "lib/base/hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>
#include <string>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_format.h"

namespace swaserve::base {

uint64_t Hash64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

Hash128 Hash128Of(const void* data, size_t size, uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(data, size, seed);
  return Hash128{h.low64, h.high64};
}

std::string Hash128::ToBytes() const {
  std::string out(16, '\0');
  absl::little_endian::Store64(out.data(), low);
  absl::little_endian::Store64(out.data() + 8, high);
  return out;
}

bool Hash128::FromBytes(absl::string_view bytes, Hash128* out) {
  if (bytes.size() != 16) return false;
  out->low = absl::little_endian::Load64(bytes.data());
  out->high = absl::little_endian::Load64(bytes.data() + 8);
  return true;
}

std::string Hash128::ToHex() const {
  return absl::StrFormat("%016x%016x", high, low);
}

uint64_t DefaultPageHashSeed() {
  static const uint64_t seed = [] {
    const std::string tag =
        absl::StrFormat("swaserve-page-hash-v%d", kPageHashVersion);
    return Hash64(tag);
  }();
  return seed;
}

uint64_t NextPageHash(uint64_t parent, absl::Span<const uint32_t> page_tokens,
                      absl::Span<const Hash128> overlapping_items) {
  // The hashed bytes: parent (8) || tokens (4 each) || items (16 each), all
  // little-endian. Typical pages fit a stack buffer and hash in one shot
  // (several times faster than the streaming API, same value).
  constexpr size_t kBuf = 1024;
  const size_t bytes = 8 + 4 * page_tokens.size() + 16 * overlapping_items.size();
  if (bytes <= kBuf) {
    unsigned char buf[kBuf];
    absl::little_endian::Store64(buf, parent);
    unsigned char* p = buf + 8;
    for (uint32_t t : page_tokens) {
      absl::little_endian::Store32(p, t);
      p += 4;
    }
    for (const Hash128& item : overlapping_items) {
      absl::little_endian::Store64(p, item.low);
      absl::little_endian::Store64(p + 8, item.high);
      p += 16;
    }
    return XXH3_64bits(buf, bytes);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  unsigned char buf[16];
  absl::little_endian::Store64(buf, parent);
  XXH3_64bits_update(&state, buf, 8);
  unsigned char tok[256 * 4];
  size_t i = 0;
  while (i < page_tokens.size()) {
    size_t n = std::min<size_t>(256, page_tokens.size() - i);
    for (size_t j = 0; j < n; ++j) {
      absl::little_endian::Store32(tok + 4 * j, page_tokens[i + j]);
    }
    XXH3_64bits_update(&state, tok, 4 * n);
    i += n;
  }
  for (const Hash128& item : overlapping_items) {
    absl::little_endian::Store64(buf, item.low);
    absl::little_endian::Store64(buf + 8, item.high);
    XXH3_64bits_update(&state, buf, 16);
  }
  return XXH3_64bits_digest(&state);
}

uint64_t PageHashSeedFor(absl::string_view domain, absl::string_view salt) {
  if (domain.empty() && salt.empty()) return DefaultPageHashSeed();
  std::string buf = "swaserve-cache-domain";
  for (absl::string_view part : {domain, salt}) {
    char len[8];
    absl::little_endian::Store64(len, part.size());
    buf.append(len, sizeof(len));
    buf.append(part.data(), part.size());
  }
  const uint64_t seed = Hash64(buf, DefaultPageHashSeed());
  return seed == 0 ? 1 : seed;
}

std::vector<uint64_t> ChainedPageHashes(absl::Span<const uint32_t> tokens,
                                        int page_size,
                                        absl::Span<const HashedSpan> items,
                                        uint64_t seed) {
  std::vector<uint64_t> out;
  if (page_size <= 0) return out;
  const size_t pages = tokens.size() / static_cast<size_t>(page_size);
  out.reserve(pages);
  uint64_t parent = seed;
  std::vector<Hash128> overlapping;
  size_t first_item = 0;  // items before this end before the current page
  for (size_t p = 0; p < pages; ++p) {
    const uint64_t begin = p * page_size;
    const uint64_t end = begin + page_size;
    overlapping.clear();
    while (first_item < items.size() &&
           uint64_t{items[first_item].token_offset} +
                   items[first_item].num_tokens <=
               begin) {
      ++first_item;
    }
    for (size_t k = first_item; k < items.size(); ++k) {
      const HashedSpan& it = items[k];
      if (it.token_offset >= end) break;
      if (uint64_t{it.token_offset} + it.num_tokens > begin) {
        overlapping.push_back(it.content);
      }
    }
    parent = NextPageHash(parent, tokens.subspan(begin, page_size), overlapping);
    out.push_back(parent);
  }
  return out;
}

}  // namespace swaserve::base
