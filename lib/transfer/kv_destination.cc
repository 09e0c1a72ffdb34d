#include "lib/transfer/kv_destination.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace swaserve::transfer {
namespace {

v1::DType ToProtoDType(kv::DType dtype) {
  switch (dtype) {
    case kv::DType::kF32:
      return v1::DTYPE_F32;
    case kv::DType::kBF16:
      return v1::DTYPE_BF16;
    case kv::DType::kF16:
      return v1::DTYPE_F16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::KvPool ToProtoPool(kv::PoolKind kind) {
  return kind == kv::PoolKind::kFull ? v1::KV_POOL_FULL : v1::KV_POOL_SWA;
}

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

v1::KvPoolLayout PoolLayout(const kv::PoolGeometry& g) {
  v1::KvPoolLayout p;
  p.set_pool(ToProtoPool(g.kind));
  p.set_num_layers(g.num_layers);
  p.set_num_kv_heads(g.num_kv_heads);
  p.set_k_head_dim(g.k_head_dim);
  p.set_v_head_dim(g.v_head_dim);
  p.set_dtype(ToProtoDType(g.dtype));
  p.set_page_bytes(g.PageBytes());
  return p;
}

absl::Status Mismatch(absl::string_view field, uint64_t destination,
                      uint64_t local) {
  return absl::FailedPreconditionError(absl::StrCat(
      "KV layout mismatch: ", field, " is ", destination,
      " in the destination but ", local,
      " here: prefill and decode must serve the same model (KvShape)"));
}

}  // namespace

int FirstSwaToken(const kv::KvShape& shape, int num_tokens, int swa_slack) {
  // The window of the first generated token (position num_tokens) minus the
  // slack: kv::SwaWindowStart(num_tokens - swa_slack). Not keep_from (which
  // adds a page of margin): a sequence that started from a prefix-cache hit
  // holds SWA KV only from the hit's window, which covers this but not
  // necessarily the extra page.
  return kv::SwaWindowStart(std::max(0, num_tokens - swa_slack),
                            shape.sliding_window, shape.page_size);
}

absl::StatusOr<KvStagingPlan> PlanStaging(const kv::KvShape& shape,
                                          int num_tokens, int swa_slack) {
  if (absl::Status s = shape.Validate(); !s.ok()) return s;
  if (num_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV transfer needs num_tokens > 0, got ", num_tokens));
  }
  if (swa_slack < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("swa_slack must be >= 0, got ", swa_slack));
  }
  KvStagingPlan plan;
  plan.num_tokens = num_tokens;
  plan.first_swa_token = FirstSwaToken(shape, num_tokens, swa_slack);
  plan.full_pages = CeilDiv(num_tokens, shape.page_size);
  plan.swa_pages = plan.full_pages - plan.first_swa_token / shape.page_size;
  plan.full_page_bytes = shape.Full().PageBytes();
  plan.swa_page_bytes = shape.Swa().PageBytes();
  return plan;
}

uint64_t NaiveTransferBytes(const kv::KvShape& shape, int num_tokens) {
  const uint64_t pages = CeilDiv(num_tokens, shape.page_size);
  return pages * (shape.Full().PageBytes() + shape.Swa().PageBytes());
}

v1::KvLayout LayoutOf(const kv::KvShape& shape) {
  v1::KvLayout layout;
  layout.set_page_size(shape.page_size);
  layout.set_sliding_window(shape.sliding_window);
  *layout.add_pools() = PoolLayout(shape.Full());
  *layout.add_pools() = PoolLayout(shape.Swa());
  return layout;
}

absl::Status CheckLayout(const v1::KvLayout& layout, const kv::KvShape& shape) {
  if (layout.page_size() != static_cast<uint32_t>(shape.page_size)) {
    return Mismatch("page_size", layout.page_size(), shape.page_size);
  }
  if (layout.sliding_window() != static_cast<uint32_t>(shape.sliding_window)) {
    return Mismatch("sliding_window", layout.sliding_window(),
                    shape.sliding_window);
  }
  if (layout.pools_size() != 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV layout mismatch: the destination describes ",
                     layout.pools_size(), " pools, expected 2 (full and SWA)"));
  }
  for (const kv::PoolGeometry& g : {shape.Full(), shape.Swa()}) {
    const v1::KvPoolLayout* found = nullptr;
    for (const v1::KvPoolLayout& p : layout.pools()) {
      if (p.pool() == ToProtoPool(g.kind)) found = &p;
    }
    const std::string pool(kv::PoolKindName(g.kind));
    if (found == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KV layout mismatch: the destination has no ", pool, " pool"));
    }
    const v1::KvPoolLayout want = PoolLayout(g);
    if (found->num_layers() != want.num_layers()) {
      return Mismatch(pool + ".num_layers", found->num_layers(),
                      want.num_layers());
    }
    if (found->num_kv_heads() != want.num_kv_heads()) {
      return Mismatch(pool + ".num_kv_heads", found->num_kv_heads(),
                      want.num_kv_heads());
    }
    if (found->k_head_dim() != want.k_head_dim()) {
      return Mismatch(pool + ".k_head_dim", found->k_head_dim(),
                      want.k_head_dim());
    }
    if (found->v_head_dim() != want.v_head_dim()) {
      return Mismatch(pool + ".v_head_dim", found->v_head_dim(),
                      want.v_head_dim());
    }
    if (found->dtype() != want.dtype()) {
      return Mismatch(pool + ".dtype", found->dtype(), want.dtype());
    }
    if (found->page_bytes() != want.page_bytes()) {
      return Mismatch(pool + ".page_bytes", found->page_bytes(),
                      want.page_bytes());
    }
  }
  return absl::OkStatus();
}

v1::KvDestination ToProto(const Destination& destination,
                          const kv::KvShape& shape, const KvStagingPlan& plan) {
  v1::KvDestination p;
  p.set_transfer_id(destination.transfer_id);
  p.set_ucx_worker_address(destination.worker_address);
  *p.mutable_layout() = LayoutOf(shape);
  for (const RemoteRegion& r : destination.regions) {
    v1::KvMemoryRegion* region = p.add_regions();
    region->set_pool(ToProtoPool(r.pool));
    region->set_base_address(r.base_address);
    region->set_length(r.length);
    region->set_rkey(r.rkey);
  }
  p.set_num_tokens(plan.num_tokens);
  p.set_first_swa_token(plan.first_swa_token);
  return p;
}

absl::StatusOr<Destination> DestinationFromProto(
    const v1::KvDestination& proto) {
  if (proto.transfer_id().empty()) {
    return absl::InvalidArgumentError("KvDestination has no transfer_id");
  }
  if (proto.ucx_worker_address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvDestination '", proto.transfer_id(), "' has no ucx_worker_address"));
  }
  Destination d;
  d.transfer_id = proto.transfer_id();
  d.worker_address = proto.ucx_worker_address();
  for (int i = 0; i < proto.regions_size(); ++i) {
    const v1::KvMemoryRegion& r = proto.regions(i);
    if (r.pool() != v1::KV_POOL_FULL && r.pool() != v1::KV_POOL_SWA) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvDestination '", proto.transfer_id(), "': region ", i,
                       " has no pool"));
    }
    RemoteRegion rr;
    rr.pool =
        r.pool() == v1::KV_POOL_FULL ? kv::PoolKind::kFull : kv::PoolKind::kSwa;
    rr.base_address = r.base_address();
    rr.length = r.length();
    rr.rkey = r.rkey();
    d.regions.push_back(std::move(rr));
  }
  return d;
}

absl::StatusOr<v1::KvDestination> ExpectKvTransfer(
    TransferEngine& engine, const KvReceiveOptions& options,
    ReceiveCallback done) {
  absl::StatusOr<KvStagingPlan> plan =
      PlanStaging(options.shape, options.num_tokens, options.swa_slack);
  if (!plan.ok()) return plan.status();
  if (options.staging == nullptr) {
    return absl::InvalidArgumentError("ExpectKvTransfer needs staging memory");
  }
  if (options.offset > options.staging->size() ||
      plan->total_bytes() > options.staging->size() - options.offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "transfer '%s': %d tokens need %d staging bytes at offset %d, the "
        "registration has %d",
        options.transfer_id, options.num_tokens, plan->total_bytes(),
        options.offset, options.staging->size()));
  }
  ReceiveRequest request;
  request.transfer_id = options.transfer_id;
  request.regions.push_back(LocalRegion{options.staging, options.offset,
                                        plan->full_bytes(),
                                        kv::PoolKind::kFull});
  request.regions.push_back(LocalRegion{options.staging,
                                        options.offset + plan->full_bytes(),
                                        plan->swa_bytes(), kv::PoolKind::kSwa});
  request.expected_bytes = plan->total_bytes();
  request.timeout = options.timeout;
  absl::StatusOr<Destination> d =
      engine.ExpectTransfer(std::move(request), std::move(done));
  if (!d.ok()) return d.status();
  return ToProto(*d, options.shape, *plan);
}

absl::StatusOr<std::vector<PageCopy>> PlanKvCopies(
    const kv::Sequence& sequence, const kv::KvPools& pools,
    const v1::KvDestination& destination) {
  const kv::KvShape& shape = pools.shape();
  if (absl::Status s = CheckLayout(destination.layout(), shape); !s.ok()) {
    return s;
  }
  const int n = static_cast<int>(destination.num_tokens());
  const std::string& id = destination.transfer_id();
  if (n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvDestination '", id, "' has num_tokens 0"));
  }
  if (sequence.length() < n) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer '", id, "': the destination expects KV for ", n,
                     " tokens but the sequence has ", sequence.length()));
  }
  const int ps = shape.page_size;
  const int first_swa = static_cast<int>(destination.first_swa_token());
  if (first_swa % ps != 0 || first_swa >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer '", id, "': first_swa_token ", first_swa,
                     " is not a page boundary below num_tokens ", n));
  }
  int full_region = -1, swa_region = -1;
  for (int i = 0; i < destination.regions_size(); ++i) {
    const v1::KvPool pool = destination.regions(i).pool();
    if (pool == v1::KV_POOL_FULL && full_region < 0) full_region = i;
    if (pool == v1::KV_POOL_SWA && swa_region < 0) swa_region = i;
  }
  if (full_region < 0 || swa_region < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", id, "': the destination needs a FULL and a SWA region"));
  }
  const int pages = CeilDiv(n, ps);
  const uint64_t full_bytes = pools.full().page_bytes();
  const uint64_t swa_bytes = pools.swa().page_bytes();
  const int first_swa_page = first_swa / ps;
  if (destination.regions(full_region).length() < pages * full_bytes ||
      destination.regions(swa_region).length() <
          (pages - first_swa_page) * swa_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer '", id, "': the destination's regions are smaller than ", n,
        " tokens need"));
  }
  std::vector<PageCopy> copies;
  copies.reserve(pages + (pages - first_swa_page));
  absl::Span<const kv::PageId> full_pages = sequence.full_pages();
  for (int i = 0; i < pages; ++i) {
    if (i >= static_cast<int>(full_pages.size()) ||
        full_pages[i] == kv::kNoPage) {
      return absl::FailedPreconditionError(absl::StrCat(
          "transfer '", id, "': the sequence has no full page ", i));
    }
    copies.push_back(PageCopy{pools.full().PageData(full_pages[i]),
                              static_cast<uint32_t>(full_region),
                              static_cast<uint64_t>(i) * full_bytes,
                              full_bytes});
  }
  for (int p = first_swa_page; p < pages; ++p) {
    const kv::PageId page = sequence.swa_page(p);
    if (page == kv::kNoPage) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "transfer '%s': the sequence already released the SWA page of "
          "tokens [%d, %d) that the receiver expects (first_swa_token %d): "
          "give the prefill sequence a swa_slack at least the decode "
          "worker's, or trim only after shipping",
          id, p * ps, (p + 1) * ps, first_swa));
    }
    copies.push_back(PageCopy{
        pools.swa().PageData(page), static_cast<uint32_t>(swa_region),
        static_cast<uint64_t>(p - first_swa_page) * swa_bytes, swa_bytes});
  }
  return copies;
}

uint64_t TotalBytes(const std::vector<PageCopy>& copies) {
  uint64_t total = 0;
  for (const PageCopy& c : copies) total += c.bytes;
  return total;
}

std::string EncodeCommitPayload(const v1::CommitKvRequest& commit) {
  return commit.SerializeAsString();
}

absl::StatusOr<v1::CommitKvRequest> DecodeCommitPayload(
    absl::string_view payload) {
  v1::CommitKvRequest commit;
  if (!commit.ParseFromArray(payload.data(),
                             static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(
        "the commit payload is not a serialized swaserve.v1.CommitKvRequest");
  }
  return commit;
}

}  // namespace swaserve::transfer
