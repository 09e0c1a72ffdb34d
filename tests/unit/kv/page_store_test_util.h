// Test data shared by the PageStore backend tests (file_page_store_test,
// tests/integration/cluster/redis_page_store_test): deterministic page
// bytes per (key, version) that say which version they are, so a reader can
// check it got exactly the bytes of some Put. Header-only; pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace swaserve::kv::testing {

// `size` pseudo-random bytes determined by (key, version); the version is
// stored little-endian in the first 8 bytes (when size >= 8).
inline std::vector<uint8_t> Payload(uint64_t key, uint64_t version,
                                    size_t size) {
  std::vector<uint8_t> p(size);
  std::mt19937_64 rng(key * 1000003 + version);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < 8 && i < size; ++i) {
    p[i] = static_cast<uint8_t>(version >> (8 * i));
  }
  return p;
}

// The version a Payload() of at least 8 bytes carries.
inline uint64_t VersionOf(const std::vector<uint8_t>& bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) {
    v |= uint64_t{bytes[i]} << (8 * i);
  }
  return v;
}

// Whether `bytes` are exactly the Payload() of `key` for a version in
// [1, max_version].
inline bool IsSomeVersion(const std::vector<uint8_t>& bytes, uint64_t key,
                          uint64_t max_version) {
  const uint64_t v = VersionOf(bytes);
  return v >= 1 && v <= max_version && bytes == Payload(key, v, bytes.size());
}

}  // namespace swaserve::kv::testing
