#include "lib/encoder/decoded_bytes_budget.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace swaserve::encoder {

DecodedBytesBudget::Reservation& DecodedBytesBudget::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->Release(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DecodedBytesBudget::Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Release(bytes_);
}

absl::StatusOr<DecodedBytesBudget::Reservation> DecodedBytesBudget::Acquire(int64_t bytes) {
  bytes = std::max<int64_t>(0, bytes);
  if (bytes > options_.capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("encoder busy: ", bytes, " decoded bytes exceed the encoder's budget of ",
                     options_.capacity, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  const uint64_t ticket = next_ticket_++;
  waiting_.push_back(ticket);
  auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return waiting_.front() == ticket && used_ + bytes <= options_.capacity;
  };
  const bool ok = mu_.AwaitWithTimeout(absl::Condition(&fits), options_.max_wait);
  waiting_.remove(ticket);
  if (!ok) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "encoder busy: ", used_, " bytes of decoded media in flight and ", bytes,
        " more requested exceed the encoder's budget of ", options_.capacity,
        " bytes (waited ", absl::FormatDuration(options_.max_wait), "); retry later"));
  }
  used_ += bytes;
  Reservation r;
  r.budget_ = this;
  r.bytes_ = bytes;
  return r;
}

void DecodedBytesBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
}

int64_t DecodedBytesBudget::in_flight() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace swaserve::encoder
