#include "bench/kv/layer_group_shadow.h"

#include <algorithm>

#include "lib/kv/sequence.h"

namespace swaserve::kv::replay {

void BottomGroupShadow::OnEvent(const CacheEvent& e) {
  switch (e.type) {
    case CacheEvent::Type::kStored:
    case CacheEvent::Type::kSwaStored:
      for (uint64_t h : e.hashes) {
        swa_.insert(h);
        bottom_.insert(h);
      }
      break;
    case CacheEvent::Type::kSwaRemoved:
    case CacheEvent::Type::kRemoved:
      for (uint64_t h : e.hashes) {
        swa_.erase(h);
        bottom_.erase(h);
      }
      break;
    case CacheEvent::Type::kTierChanged:
      break;
  }
}

bool BottomGroupShadow::HasAll(absl::Span<const uint64_t> hashes, int first, int end) const {
  for (int p = std::max(first, 0); p < end; ++p) {
    if (!bottom_.contains(hashes[p])) return false;
  }
  return true;
}

void BottomGroupShadow::Put(absl::Span<const uint64_t> hashes, int first, int end) {
  for (int p = std::max(first, 0); p < end; ++p) {
    if (swa_.contains(hashes[p])) bottom_.insert(hashes[p]);
  }
}

void BottomGroupShadow::Trim(const PrefixCache& cache, int64_t reserved) {
  peak_ = std::max(peak_, size() + reserved);
  const int64_t room = capacity_ - reserved;
  if (size() <= room) return;
  cache.VisitSwaEvictionOrder([&](absl::Span<const uint64_t> node) {
    for (uint64_t h : node) evicted_ += bottom_.erase(h);
    return size() > room;
  });
}

LayerGroupModel::LayerGroupModel(const KvShape& shape, const std::vector<bool>& swa_layer,
                                 int bottom_layers, int64_t bottom_pages)
    : window_(shape.sliding_window), page_size_(shape.page_size), shadow_(bottom_pages) {
  // The layers up to the bottom group's last SWA layer; the work is averaged
  // over them, so scale it to the whole model's layers.
  std::vector<bool> low;
  int seen = 0;
  for (size_t l = 0; l < swa_layer.size() && seen < bottom_layers; ++l) {
    low.push_back(swa_layer[l]);
    seen += swa_layer[l];
  }
  if (!low.empty()) {
    bottom_work_ = double(WindowRestoreWorkPerRestore(window_, page_size_, low, 0)) *
                   double(low.size()) / double(swa_layer.size());
  }
}

std::function<void(const CacheEvent&)> LayerGroupModel::Listener() {
  return [this](const CacheEvent& e) { shadow_.OnEvent(e); };
}

std::pair<int, int> LayerGroupModel::WindowPages(int tokens) const {
  return {std::max(0, tokens - (window_ - 1)) / page_size_, tokens / page_size_};
}

double LayerGroupModel::Begin(absl::Span<const uint64_t> hashes, const CacheHit& hit,
                              bool restoring, bool from_window_safe) {
  // As Sequence keeps it: the divergence window below the full-KV match
  // when that passes the hit.
  divergence_end_ = hit.matched_tokens() / page_size_ * page_size_;
  divergence_from_ = std::max(hit.tokens(), divergence_end_ - (window_ - 1));
  const int tokens = hit.window_safe_tokens();
  if ((restoring && !from_window_safe) || tokens <= 0) return 0;
  const auto [first, end] = WindowPages(tokens);
  const bool whole = shadow_.HasAll(hashes, first, end);
  shadow_.Put(hashes, first, end);
  return whole ? 0 : std::min<double>(tokens, bottom_work_);
}

void LayerGroupModel::Running(int64_t running_pages, const PrefixCache& cache) {
  shadow_.Trim(cache, running_pages);
}

void LayerGroupModel::Finished(absl::Span<const uint64_t> hashes, int length, bool inserted,
                               const PrefixCache& cache) {
  if (inserted) {
    // The trailing window Sequence keeps (from KeepFromToken(length)) and
    // the divergence window: computed by this request, cached already or not.
    const int trail = std::max(0, length - (window_ - 1) - (page_size_ - 1)) / page_size_;
    const int complete = std::min<int>(length / page_size_, static_cast<int>(hashes.size()));
    shadow_.Put(hashes, trail, complete);
    shadow_.Put(hashes, divergence_from_ / page_size_,
                std::min(complete, divergence_end_ / page_size_));
  }
  shadow_.Trim(cache);
}

}  // namespace swaserve::kv::replay
