#include "lib/transfer/registration_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/transfer/ucx_util.h"

namespace swaserve::transfer::internal {

absl::StatusOr<void*> RegistrationTable::Map(uint64_t id, void* data,
                                             size_t size, bool allocate) {
  ucp_mem_map_params_t mp{};
  mp.field_mask =
      UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = data;
  mp.length = size;
  if (allocate) {
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
  }
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(ctx_->context, &mp, &memh);
  if (st != UCS_OK) {
    return FromUcs(
        st, allocate ? absl::StrCat("allocating ", size, " bytes of UCX memory")
                     : absl::StrCat("registering ", size, " bytes at ",
                                    absl::StrFormat("%p", data)));
  }
  if (allocate) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK || attr.address == nullptr || attr.length < size) {
      ucp_mem_unmap(ctx_->context, memh);
      return FromUcs(st == UCS_OK ? UCS_ERR_NO_MEMORY : st,
                     "querying UCX-allocated memory");
    }
    data = attr.address;
  }
  void* rkey = nullptr;
  size_t rkey_size = 0;
  st = ucp_rkey_pack(ctx_->context, memh, &rkey, &rkey_size);
  if (st != UCS_OK) {
    ucp_mem_unmap(ctx_->context, memh);
    return FromUcs(st, "packing the rkey of a registration");
  }
  RegionRec rec;
  rec.id = id;
  rec.data = static_cast<uint8_t*>(data);
  rec.size = size;
  rec.memh = memh;
  rec.allocated = allocate;
  rec.ucx_rkey.assign(static_cast<const char*>(rkey), rkey_size);
  ucp_rkey_buffer_release(rkey);
  by_address_[reinterpret_cast<uintptr_t>(data)] = id;
  regions_.emplace(id, std::move(rec));
  count_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed);
  return data;
}

void RegistrationTable::Erase(
    absl::flat_hash_map<uint64_t, RegionRec>::iterator it) {
  RegionRec& rec = it->second;
  ucp_mem_unmap(ctx_->context, rec.memh);
  by_address_.erase(reinterpret_cast<uintptr_t>(rec.data));
  count_.fetch_sub(1, std::memory_order_relaxed);
  bytes_.fetch_sub(static_cast<int64_t>(rec.size), std::memory_order_relaxed);
  regions_.erase(it);
}

void RegistrationTable::Unmap(uint64_t id) {
  auto it = regions_.find(id);
  if (it != regions_.end()) Erase(it);
}

void RegistrationTable::UnmapAll() {
  for (auto& [id, rec] : regions_) {
    if (rec.memh != nullptr) ucp_mem_unmap(ctx_->context, rec.memh);
  }
  regions_.clear();
  by_address_.clear();
}

void RegistrationTable::ReapReleased() {
  for (auto it = regions_.begin(); it != regions_.end();) {
    RegionRec& rec = it->second;
    if (rec.releasing && rec.users == 0) {
      absl::Notification* n = rec.released;
      Erase(it++);
      if (n != nullptr) n->Notify();
    } else {
      ++it;
    }
  }
}

RegionRec* RegistrationTable::Find(uint64_t id) {
  auto it = regions_.find(id);
  return it == regions_.end() ? nullptr : &it->second;
}

ucp_mem_h RegistrationTable::FindMemh(const void* p, size_t n,
                                      uint64_t* registration) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = by_address_.upper_bound(addr);
  if (it == by_address_.begin()) return nullptr;
  --it;
  auto rec = regions_.find(it->second);
  if (rec == regions_.end() || rec->second.releasing) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(rec->second.data);
  if (addr < base || addr - base > rec->second.size ||
      n > rec->second.size - (addr - base)) {
    return nullptr;
  }
  *registration = rec->second.id;
  return rec->second.memh;
}

void RegistrationTable::AddUser(uint64_t id) {
  if (RegionRec* rec = Find(id)) ++rec->users;
}

void RegistrationTable::RemoveUser(uint64_t id) {
  if (RegionRec* rec = Find(id)) --rec->users;
}

}  // namespace swaserve::transfer::internal
