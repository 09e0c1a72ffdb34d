#include "lib/worker/staging_arena.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace swaserve::worker {

absl::StatusOr<std::unique_ptr<StagingArena>> StagingArena::Create(
    const StagingArenaOptions& options) {
  const size_t a = options.alignment;
  if (a == 0 || (a & (a - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging arena alignment must be a power of two, got ", a));
  }
  if (options.base == nullptr) {
    return absl::InvalidArgumentError(
        "staging arena needs memory (base is null)");
  }
  if (reinterpret_cast<uintptr_t>(options.base) % a != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging arena base is not aligned to ", a, " bytes"));
  }
  const size_t capacity = options.size / a * a;
  if (capacity == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging arena of ", options.size,
                     " bytes is smaller than its alignment ", a));
  }
  return std::unique_ptr<StagingArena>(new StagingArena(options, capacity));
}

StagingArena::StagingArena(const StagingArenaOptions& options, size_t capacity)
    : base_(static_cast<uint8_t*>(options.base)),
      alignment_(options.alignment),
      capacity_(capacity),
      owner_(options.owner) {
  absl::MutexLock lock(&mu_);
  InsertFreeLocked(0, capacity_);
}

void StagingArena::InsertFreeLocked(size_t offset, size_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void StagingArena::EraseFreeLocked(std::map<size_t, size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<StagingArena::Block> StagingArena::Allocate(size_t bytes) {
  if (bytes == 0 || bytes > capacity_) return std::nullopt;
  const size_t need = (bytes + alignment_ - 1) / alignment_ * alignment_;
  absl::MutexLock lock(&mu_);
  // Smallest run >= need; among equal sizes the lowest offset.
  auto fit = free_by_size_.lower_bound({need, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const auto [run_size, run_offset] = *fit;
  EraseFreeLocked(free_by_offset_.find(run_offset));
  if (run_size > need) InsertFreeLocked(run_offset + need, run_size - need);
  used_.emplace(run_offset, need);
  bytes_in_use_ += need;
  return Block{run_offset, need};
}

absl::Status StagingArena::Free(size_t offset) {
  absl::MutexLock lock(&mu_);
  auto u = used_.find(offset);
  if (u == used_.end()) {
    return absl::NotFoundError(absl::StrCat("no staging arena block at offset ",
                                            offset, " (double free?)"));
  }
  size_t start = offset;
  size_t size = u->second;
  used_.erase(u);
  bytes_in_use_ -= size;
  // Merge with the free run after, then with the one before.
  auto next = free_by_offset_.lower_bound(start);
  if (next != free_by_offset_.end() && next->first == start + size) {
    size += next->second;
    next = std::next(next);
    EraseFreeLocked(std::prev(next));
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      EraseFreeLocked(prev);
    }
  }
  InsertFreeLocked(start, size);
  return absl::OkStatus();
}

size_t StagingArena::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return bytes_in_use_;
}

size_t StagingArena::largest_free() const {
  absl::MutexLock lock(&mu_);
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

size_t StagingArena::num_blocks() const {
  absl::MutexLock lock(&mu_);
  return used_.size();
}

size_t StagingArena::num_free_runs() const {
  absl::MutexLock lock(&mu_);
  return free_by_offset_.size();
}

}  // namespace swaserve::worker
