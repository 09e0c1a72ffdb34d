// DecodedBytesBudget: the encoder's bound on decoded media in memory at once.
// Each request reserves the decoded bytes its items declare (EncoderCore
// estimates them from the headers before decoding) for as long as it holds
// them; a request that does not fit waits, in arrival order, up to max_wait
// for earlier ones to finish, and is then refused with ResourceExhausted
// ("encoder busy: ..."), which the router treats as a reason to try another
// encoder. A reservation larger than the whole capacity is refused at once.
//
// Thread-safe. A Reservation must not outlive its budget.
#pragma once

#include <cstdint>
#include <list>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace swaserve::encoder {

struct DecodedBytesBudgetOptions {
  // Decoded bytes in flight at most. Default 4 GiB.
  int64_t capacity = int64_t{4} << 30;
  // How long a request waits for room. Default 5 s.
  absl::Duration max_wait = absl::Seconds(5);
};

class DecodedBytesBudget {
 public:
  // Bytes held until destroyed (or moved from). Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept { *this = std::move(other); }
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();
    int64_t bytes() const { return bytes_; }

   private:
    friend class DecodedBytesBudget;
    DecodedBytesBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  explicit DecodedBytesBudget(DecodedBytesBudgetOptions options) : options_(options) {}

  // Waits (FIFO) up to max_wait for `bytes` to fit; ResourceExhausted
  // naming the bytes in flight and the capacity otherwise.
  absl::StatusOr<Reservation> Acquire(int64_t bytes);
  int64_t in_flight() const;
  int64_t capacity() const { return options_.capacity; }

 private:
  void Release(int64_t bytes);

  const DecodedBytesBudgetOptions options_;
  mutable absl::Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);  // tickets, oldest first
};

}  // namespace swaserve::encoder
