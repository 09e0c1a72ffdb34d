#include "lib/kv/page_pool.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace swaserve::kv {
namespace {

constexpr size_t kPageAlignment = 4096;

const char* StateName(PageState s) {
  switch (s) {
    case PageState::kFree:
      return "free";
    case PageState::kReserved:
      return "reserved";
    case PageState::kInUse:
      return "in-use";
    case PageState::kCached:
      return "cached";
  }
  return "?";
}

constexpr uint8_t Bit(PageState s) { return uint8_t{1} << static_cast<int>(s); }

}  // namespace

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(
    const PagePoolOptions& options) {
  if (absl::Status s = options.geometry.Validate(); !s.ok()) return s;
  if (options.num_pages <= 0 || options.num_pages > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(PoolKindName(options.geometry.kind),
                     " pool: num_pages must be in [1, 2^31), got ",
                     options.num_pages));
  }
  uint8_t* base = nullptr;
  if (options.allocate_memory && options.geometry.PageBytes() > 0) {
    const size_t bytes = options.geometry.PageBytes() * options.num_pages;
    const size_t rounded = (bytes + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
    base = static_cast<uint8_t*>(std::aligned_alloc(kPageAlignment, rounded));
    if (base == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes for the ",
                       PoolKindName(options.geometry.kind), " KV pool"));
    }
  }
  return std::unique_ptr<PagePool>(
      new PagePool(options.geometry, options.num_pages, base));
}

PagePool::PagePool(const PoolGeometry& geometry, int64_t num_pages,
                   uint8_t* base)
    : geometry_(geometry),
      page_bytes_(geometry.PageBytes()),
      base_(base),
      state_(num_pages, PageState::kFree) {
  free_list_.reserve(num_pages);
  // Popped from the back: hand out low page ids first.
  for (int64_t p = num_pages - 1; p >= 0; --p) {
    free_list_.push_back(static_cast<PageId>(p));
  }
  count_[0] = num_pages;
  for (int i = 1; i < 4; ++i) count_[i] = 0;
}

PagePool::~PagePool() { std::free(base_); }

bool PagePool::Reserve(int64_t n, std::vector<PageId>* out) {
  if (n < 0 || n > static_cast<int64_t>(free_list_.size())) return false;
  for (int64_t i = 0; i < n; ++i) {
    PageId p = free_list_.back();
    free_list_.pop_back();
    state_[p] = PageState::kReserved;
    out->push_back(p);
  }
  count_[0].fetch_sub(n, std::memory_order_relaxed);
  count_[1].fetch_add(n, std::memory_order_relaxed);
  return true;
}

void PagePool::Move(absl::Span<const PageId> pages, uint8_t from_mask,
                    PageState to, const char* what) {
  for (PageId p : pages) {
    if (!Valid(p) || (Bit(state_[p]) & from_mask) == 0) {
      std::fprintf(stderr, "PagePool(%s)::%s: page %d is %s\n",
                   std::string(PoolKindName(kind())).c_str(), what, p,
                   Valid(p) ? StateName(state_[p]) : "out of range");
      std::abort();
    }
    count_[static_cast<int>(state_[p])].fetch_sub(1, std::memory_order_relaxed);
    count_[static_cast<int>(to)].fetch_add(1, std::memory_order_relaxed);
    state_[p] = to;
    if (to == PageState::kFree) free_list_.push_back(p);
  }
}

void PagePool::Commit(absl::Span<const PageId> pages) {
  Move(pages, Bit(PageState::kReserved), PageState::kInUse, "Commit");
}
void PagePool::Unreserve(absl::Span<const PageId> pages) {
  Move(pages, Bit(PageState::kReserved), PageState::kFree, "Unreserve");
}
void PagePool::Free(absl::Span<const PageId> pages) {
  Move(pages, Bit(PageState::kInUse) | Bit(PageState::kCached),
       PageState::kFree, "Free");
}
void PagePool::ToCache(absl::Span<const PageId> pages) {
  Move(pages, Bit(PageState::kInUse), PageState::kCached, "ToCache");
}

absl::StatusOr<std::unique_ptr<KvPools>> KvPools::Create(
    const KvPoolsOptions& options) {
  if (absl::Status s = options.shape.Validate(); !s.ok()) return s;
  auto full = PagePool::Create({options.shape.Full(), options.full_pages,
                                options.allocate_memory});
  if (!full.ok()) return full.status();
  auto swa = PagePool::Create({options.shape.Swa(), options.swa_pages,
                               options.allocate_memory});
  if (!swa.ok()) return swa.status();
  return std::unique_ptr<KvPools>(
      new KvPools(options.shape, *std::move(full), *std::move(swa)));
}

absl::StatusOr<std::unique_ptr<KvPools>> KvPools::CreateForBudget(
    const KvShape& shape, int64_t byte_budget, double swa_full_token_ratio,
    bool allocate_memory) {
  absl::StatusOr<PoolSizes> sizes =
      SizePools(shape, byte_budget, swa_full_token_ratio);
  if (!sizes.ok()) return sizes.status();
  return Create({shape, sizes->full_pages, sizes->swa_pages, allocate_memory});
}

bool KvPools::CanReserve(int64_t full_pages, int64_t swa_pages) const {
  return full_pages <= full_->num_free() && swa_pages <= swa_->num_free();
}

absl::StatusOr<Reservation> KvPools::Reserve(int64_t full_pages,
                                             int64_t swa_pages) {
  if (full_pages < 0 || swa_pages < 0) {
    return absl::InvalidArgumentError("negative page count");
  }
  if (!CanReserve(full_pages, swa_pages)) {
    std::string why;
    if (full_pages > full_->num_free()) {
      absl::StrAppend(&why, "full pool short by ", full_pages - full_->num_free(),
                      " pages (need ", full_pages, ", free ", full_->num_free(), ")");
    }
    if (swa_pages > swa_->num_free()) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", "swa pool short by ",
                      swa_pages - swa_->num_free(), " pages (need ", swa_pages,
                      ", free ", swa_->num_free(), ")");
    }
    return absl::ResourceExhaustedError(why);
  }
  Reservation r;
  r.full.reserve(full_pages);
  r.swa.reserve(swa_pages);
  full_->Reserve(full_pages, &r.full);
  swa_->Reserve(swa_pages, &r.swa);
  return r;
}

void KvPools::Commit(Reservation& reservation) {
  full_->Commit(reservation.full);
  swa_->Commit(reservation.swa);
  reservation.full.clear();
  reservation.swa.clear();
}

void KvPools::Cancel(Reservation& reservation) {
  full_->Unreserve(reservation.full);
  swa_->Unreserve(reservation.swa);
  reservation.full.clear();
  reservation.swa.clear();
}

}  // namespace swaserve::kv
