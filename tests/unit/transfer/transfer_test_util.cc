#include "tests/unit/transfer/transfer_test_util.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

// LeakSanitizer (the ASan CI stage): UCX 1.13 leaks a few hundred bytes
// inside libuct when connecting to a shared-memory peer that has exited
// (mm_ep.c failure path) — not ours to fix, so suppress UCX's own
// allocations. Linked into every test that uses these helpers.
extern "C" __attribute__((used, visibility("default"))) const char*
__lsan_default_suppressions() {
  return "leak:libuct.so\nleak:libucs.so\nleak:libucp.so\n";
}

namespace swaserve::transfer::testing {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

uint8_t PatternByte(uint64_t seed, size_t i) {
  return static_cast<uint8_t>(Mix(seed * 0x9e3779b97f4a7c15ull + i / 8) >>
                              (8 * (i % 8)));
}

void FillPattern(void* data, size_t size, uint64_t seed) {
  auto* p = static_cast<uint8_t*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t word = Mix(seed * 0x9e3779b97f4a7c15ull + i / 8);
    std::memcpy(p + i, &word, 8);
  }
  for (; i < size; ++i) p[i] = PatternByte(seed, i);
}

int64_t FirstPatternMismatch(const void* data, size_t size, uint64_t seed,
                             size_t pattern_offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    if (p[i] != PatternByte(seed, pattern_offset + i)) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

bool WaitIdle(const TransferEngine& engine, absl::Duration timeout,
              EngineStats* out) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    const EngineStats s = engine.Stats();
    if (out != nullptr) *out = s;
    if (s.active_sends == 0 && s.active_receives == 0 &&
        s.inflight_requests == 0) {
      return true;
    }
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

std::string StatsString(const EngineStats& s) {
  return absl::StrCat(
      "sends=", s.active_sends, " receives=", s.active_receives,
      " inflight=", s.inflight_requests, " registrations=", s.registrations,
      " registered_bytes=", s.registered_bytes, " endpoints=", s.endpoints);
}

}  // namespace swaserve::transfer::testing
