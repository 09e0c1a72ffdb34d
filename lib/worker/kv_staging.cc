#include "lib/worker/kv_staging.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"

namespace swaserve::worker {

namespace {
constexpr size_t kAlign = 4096;

uint8_t* AllocRegion(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  return static_cast<uint8_t*>(std::aligned_alloc(kAlign, rounded));
}
}  // namespace

StagedKvLayout StagedKvLayout::For(const kv::KvShape& shape, int num_tokens) {
  return For(shape, num_tokens,
             kv::SwaWindowStart(num_tokens, shape.sliding_window, shape.page_size));
}

StagedKvLayout StagedKvLayout::For(const kv::KvShape& shape, int num_tokens,
                                   int first_swa_token) {
  StagedKvLayout l;
  l.num_tokens = num_tokens;
  l.page_size = shape.page_size;
  l.first_swa_token = first_swa_token;
  l.full_page_bytes = shape.Full().PageBytes();
  l.swa_page_bytes = shape.Swa().PageBytes();
  return l;
}

namespace {
absl::Status ValidateLayout(const StagedKvLayout& layout) {
  if (layout.num_tokens <= 0 || layout.page_size <= 0 ||
      layout.first_swa_token % layout.page_size != 0 || layout.first_swa_token < 0 ||
      layout.first_swa_token >= layout.num_tokens + layout.page_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad KV staging layout: ", layout.num_tokens, " tokens, page ", layout.page_size,
        ", SWA from token ", layout.first_swa_token));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::unique_ptr<KvStaging>> KvStaging::Create(const StagedKvLayout& layout) {
  RETURN_IF_ERROR(ValidateLayout(layout));
  std::unique_ptr<KvStaging> s(new KvStaging(layout));
  s->full_ = AllocRegion(layout.total_bytes());
  if (s->full_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", layout.total_bytes(), " bytes of KV staging for ",
        layout.num_tokens, " tokens"));
  }
  s->swa_ = s->full_ + layout.full_bytes();
  return s;
}

absl::StatusOr<std::unique_ptr<KvStaging>> KvStaging::CreateIn(
    const StagedKvLayout& layout, std::shared_ptr<StagingArena> arena) {
  RETURN_IF_ERROR(ValidateLayout(layout));
  if (arena == nullptr) return absl::InvalidArgumentError("KvStaging::CreateIn needs an arena");
  const std::optional<StagingArena::Block> block = arena->Allocate(layout.total_bytes());
  if (!block.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV staging arena has no free run of ", layout.total_bytes(), " bytes for ",
        layout.num_tokens, " tokens (largest free ", arena->largest_free(), " of ",
        arena->capacity(), ")"));
  }
  std::unique_ptr<KvStaging> s(new KvStaging(layout));
  s->full_ = arena->base() + block->offset;
  s->swa_ = s->full_ + layout.full_bytes();
  s->arena_offset_ = block->offset;
  s->arena_block_bytes_ = block->size;
  s->arena_ = std::move(arena);
  return s;
}

KvStaging::~KvStaging() {
  if (arena_ != nullptr) {
    (void)arena_->Free(arena_offset_);  // cannot fail: the block is ours
  } else {
    std::free(full_);
  }
}

absl::Status CopySequenceToStaging(const kv::Sequence& seq, const kv::KvPools& pools,
                                   KvStaging* staging) {
  const StagedKvLayout& l = staging->layout();
  if (seq.length() < l.num_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence has ", seq.length(), " tokens, staging expects ", l.num_tokens));
  }
  if (pools.full().page_bytes() != l.full_page_bytes ||
      pools.swa().page_bytes() != l.swa_page_bytes) {
    return absl::InvalidArgumentError("KV page sizes differ between the pools and the staging");
  }
  for (int p = 0; p < l.full_pages(); ++p) {
    const uint8_t* src = pools.full().PageData(seq.full_pages()[p]);
    if (src == nullptr) return absl::FailedPreconditionError("full pool has no memory");
    std::memcpy(staging->full_region() + static_cast<size_t>(p) * l.full_page_bytes, src,
                l.full_page_bytes);
  }
  const int first = l.first_swa_token / l.page_size;
  for (int j = 0; j < l.swa_pages(); ++j) {
    const kv::PageId page = seq.swa_page(first + j);
    if (page == kv::kNoPage) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SWA page ", first + j, " (token ", (first + j) * l.page_size,
          ") was already released by the sequence"));
    }
    const uint8_t* src = pools.swa().PageData(page);
    if (src == nullptr) return absl::FailedPreconditionError("SWA pool has no memory");
    std::memcpy(staging->swa_region() + static_cast<size_t>(j) * l.swa_page_bytes, src,
                l.swa_page_bytes);
  }
  return absl::OkStatus();
}

absl::Status AdmitFromStaging(const KvStaging& staging, kv::KvPools& pools, kv::Sequence* seq) {
  const StagedKvLayout& l = staging.layout();
  if (pools.full().page_bytes() != l.full_page_bytes ||
      pools.swa().page_bytes() != l.swa_page_bytes) {
    return absl::InvalidArgumentError("KV page sizes differ between the pools and the staging");
  }
  RETURN_IF_ERROR(seq->AppendPrefilled(l.num_tokens, l.first_swa_token));
  for (int p = 0; p < l.full_pages(); ++p) {
    std::memcpy(pools.full().PageData(seq->full_pages()[p]),
                staging.full_region() + static_cast<size_t>(p) * l.full_page_bytes,
                l.full_page_bytes);
  }
  const int first = l.first_swa_token / l.page_size;
  for (int j = 0; j < l.swa_pages(); ++j) {
    std::memcpy(pools.swa().PageData(seq->swa_page(first + j)),
                staging.swa_region() + static_cast<size_t>(j) * l.swa_page_bytes,
                l.swa_page_bytes);
  }
  return absl::OkStatus();
}

}  // namespace swaserve::worker
