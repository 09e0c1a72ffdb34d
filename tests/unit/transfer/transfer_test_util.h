// Helpers shared by the transfer unit and integration tests: deterministic
// page contents and bounded waits for an engine to go idle.
// Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lib/transfer/transfer_engine.h"

namespace swaserve::transfer::testing {

// Fills `size` bytes with a pattern determined by (seed, position), so any
// byte can be checked independently.
void FillPattern(void* data, size_t size, uint64_t seed);
// Byte `i` of the pattern FillPattern(…, seed) writes.
uint8_t PatternByte(uint64_t seed, size_t i);

// Index of the first byte of [data, data + size) that differs from
// FillPattern(…, seed) shifted by `pattern_offset`; -1 when all match.
int64_t FirstPatternMismatch(const void* data, size_t size, uint64_t seed,
                             size_t pattern_offset = 0);

// Waits until the engine has no active sends/receives and no UCX request in
// flight (bounded by `timeout`); the final stats are written to *out.
bool WaitIdle(const TransferEngine& engine, absl::Duration timeout,
              EngineStats* out = nullptr);

// "sends=… receives=… inflight=… registrations=… endpoints=…"
std::string StatsString(const EngineStats& stats);

// UCX_TLS values the tests run on: shared memory and tcp.
inline constexpr const char* kShmTls = "posix,sysv,self";
inline constexpr const char* kTcpTls = "tcp";

}  // namespace swaserve::transfer::testing
