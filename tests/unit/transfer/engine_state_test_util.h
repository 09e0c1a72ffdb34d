// Helpers for the unit tests of the transfer engine's internal parts
// (lib/transfer/engine_state.h and what it owns): EngineStates driven by the
// test thread itself, which plays the progress thread — so the tests can
// step the protocol deterministically (one Progress at a time, deadlines at
// a chosen `now`) without TransferEngine's thread.
// Thread-compatible: use each EngineState from one thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "lib/transfer/engine_state.h"
#include "lib/transfer/transfer_engine.h"

namespace swaserve::transfer::testing {

// Options of the states the tests make: small messages and window, a 10 s
// default timeout.
TransferEngineOptions StateOptions(const std::string& name,
                                   const std::string& tls);

// An EngineState (UCP context + worker, no thread) on `tls`, or null with a
// test failure.
std::unique_ptr<internal::EngineState> MakeState(const std::string& name,
                                                 const std::string& tls);
std::unique_ptr<internal::EngineState> MakeState(
    const TransferEngineOptions& options);

// States "a" and "b" on shared memory; false (with a test failure) when
// either cannot be made.
bool MakeTwoStates(std::unique_ptr<internal::EngineState>* a,
                   std::unique_ptr<internal::EngineState>* b);

// One progress-loop iteration of each state (like the engine's loop, minus
// tasks and sleeping): progress, deferred work, due deadlines.
void Step(const std::vector<internal::EngineState*>& states);

// Steps until `done()` holds; false when `timeout` passed first.
bool DriveUntil(const std::vector<internal::EngineState*>& states,
                const std::function<bool()>& done,
                absl::Duration timeout = absl::Seconds(10));

// Shuts `states` down together the way the engine does (BeginShutdown,
// step until quiescent or 10 s, destroy the workers). False when one never
// became quiescent. Null entries are skipped.
bool ShutDown(const std::vector<internal::EngineState*>& states);

// Maps a page-aligned heap buffer of `size` bytes (filled with `fill`) in a
// state's registrations; frees it (after unmapping) when destroyed.
class MappedBuffer {
 public:
  MappedBuffer(internal::EngineState* state, uint64_t id, size_t size,
               uint8_t fill = 0);
  ~MappedBuffer();
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;

  bool ok() const { return ok_; }
  uint64_t id() const { return id_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  internal::EngineState* state_;
  uint64_t id_;
  size_t size_;
  uint8_t* data_;
  bool ok_ = false;
};

}  // namespace swaserve::transfer::testing
