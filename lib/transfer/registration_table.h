// The transfer engine's memory registrations (internal to lib/transfer):
// ucp_mem_map'ed ranges, their packed rkeys, the transfers using each, and
// lookup of the registration that covers a local pointer (so a send of
// registered memory passes its memory handle to UCX).
//
// A registration in use by transfers is not unmapped when released: it is
// marked releasing (no new transfer may use it), its users are failed by the
// engine, and ReapReleased unmaps it once they have drained, then notifies
// the releasing thread.
//
// Thread-safety: progress-thread state (see engine_context.h), except
// count() and bytes(), which any thread may read.
// Ownership: the records own their UCX memory handles; the memory itself is
// the caller's (or UCX's, for Allocate).
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "lib/transfer/engine_context.h"

namespace swaserve::transfer::internal {

struct RegionRec {
  uint64_t id = 0;
  uint8_t* data = nullptr;
  size_t size = 0;
  ucp_mem_h memh = nullptr;
  std::string ucx_rkey;    // packed (ucp_rkey_pack)
  bool allocated = false;  // by UCX (Allocate)
  int users = 0;           // transfers using it
  bool releasing = false;
  // Notified once unmapped after a release that had to wait; may be null.
  absl::Notification* released = nullptr;
};

class RegistrationTable {
 public:
  // Maps with ctx->context (set before the first Map); `ctx` must outlive
  // the table, and the context its records (UnmapAll before cleanup).
  explicit RegistrationTable(EngineContext* ctx) : ctx_(ctx) {}
  RegistrationTable(const RegistrationTable&) = delete;
  RegistrationTable& operator=(const RegistrationTable&) = delete;

  // Maps [data, data + size) (allocate: `size` bytes UCX allocates; `data`
  // is ignored) and packs its rkey, as registration `id`. Returns the
  // address (UCX's for allocate). Errors: FromUcs with what was attempted.
  absl::StatusOr<void*> Map(uint64_t id, void* data, size_t size,
                            bool allocate);
  // Unmaps registration `id` now, whatever its users. No-op when unknown.
  void Unmap(uint64_t id);
  // Unmaps every remaining registration (engine teardown).
  void UnmapAll();
  // Unmaps the releasing registrations that no transfer uses any more and
  // notifies their waiters.
  void ReapReleased();

  // The record of `id`; null when unknown.
  RegionRec* Find(uint64_t id);
  // The memory handle of the (not releasing) registration that holds all of
  // [p, p + n), and its id in *registration; null when none does.
  ucp_mem_h FindMemh(const void* p, size_t n, uint64_t* registration);
  // A transfer starts / stops using registration `id` (no-op when unknown).
  void AddUser(uint64_t id);
  void RemoveUser(uint64_t id);

  // Live registrations and their bytes; thread-safe.
  int64_t count() const { return count_.load(std::memory_order_relaxed); }
  int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  void Erase(absl::flat_hash_map<uint64_t, RegionRec>::iterator it);

  EngineContext* const ctx_;
  absl::flat_hash_map<uint64_t, RegionRec> regions_;
  std::map<uintptr_t, uint64_t> by_address_;
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> bytes_{0};
};

}  // namespace swaserve::transfer::internal
