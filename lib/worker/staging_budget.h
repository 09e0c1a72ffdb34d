// StagingBudget: the byte budget of a decode worker's host KV staging
// (decode staging stays bounded).
//
// Every staged request's KV (a KvStaging, in the arena or on the heap) is
// covered by a Reservation of its bytes, taken when the prefill worker is
// about to ship (Decode.GetKvDestination) and returned when the staging is
// freed (admission into the pools, or failure). While the budget is full,
// new reservations wait in arrival order (FIFO: a large request is not
// starved by small ones behind it) and are granted as bytes come back; a
// waiter whose caller gives up (deadline, cancel) is removed with Cancel().
// So staged memory never exceeds the budget, and overcommit cannot turn a
// burst of long prompts into an OOM kill of every stream on the worker.
//
// A request larger than the whole budget can never be granted: Acquire
// answers ResourceExhausted at once (a request error the router reports,
// not a worker fault).
//
// Ownership: reservations keep the budget's state alive (shared), so they
// may outlive the StagingBudget object.
// Thread-safety: thread-safe. Grant callbacks run without the budget's lock,
// on the thread of Acquire (granted at once) or of the Release that made
// room; they must not block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace swaserve::worker {

class StagingBudget {
 public:
  // Returns its bytes to the budget on destruction.
  class Reservation {
   public:
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    size_t bytes() const { return bytes_; }

   private:
    friend class StagingBudget;
    struct State;
    Reservation(std::shared_ptr<State> state, size_t bytes)
        : state_(std::move(state)), bytes_(bytes) {}
    std::shared_ptr<State> state_;
    size_t bytes_;
  };
  using Grant = std::function<void(std::unique_ptr<Reservation>)>;

  // `capacity_bytes` > 0.
  explicit StagingBudget(size_t capacity_bytes);
  ~StagingBudget();
  StagingBudget(const StagingBudget&) = delete;
  StagingBudget& operator=(const StagingBudget&) = delete;

  // Reserves `bytes` for `key` (unique among waiters): `grant` runs now if
  // they fit and nobody waits ahead, else later, in FIFO order.
  // ResourceExhausted if bytes exceed the capacity; AlreadyExists if `key`
  // is already waiting.
  absl::Status Acquire(const std::string& key, size_t bytes, Grant grant);
  // Removes `key` from the waiters; true if it was waiting (its grant will
  // not run). Waiters behind it may be granted (on this thread).
  bool Cancel(const std::string& key);

  size_t capacity() const;
  size_t in_use() const;
  size_t waiting_bytes() const;
  int waiters() const;
  // Reservations ever granted after waiting (for a metric).
  int64_t waited_total() const;

 private:
  std::shared_ptr<Reservation::State> state_;
};

}  // namespace swaserve::worker
