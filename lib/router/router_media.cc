// Router's multimodal part of Prepare: markers checked, items
// resolved through the encoders (media.h), placeholders expanded, and the
// inline re-encode after a by-reference embedding could not be fetched.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status.h"
#include "lib/router/media.h"
#include "lib/router/router.h"
#include "lib/router/router_request.h"
#include "lib/rpc/status_conversion.h"

namespace swaserve::router {

absl::Status Router::PrepareMedia(const v1::GenerateRequest& in,
                                  absl::Span<const model::MarkerCut> cuts, Request& r) {
  std::vector<v1::MultimodalItem> given(in.multimodal().begin(), in.multimodal().end());
  if (absl::Status s = CheckMarkers(cuts, given); !s.ok()) {
    return rpc::ErrorWithDetail(s.code(), v1::ERROR_CODE_INVALID_REQUEST, s.message());
  }
  absl::StatusOr<std::vector<v1::MultimodalItem>> items = ResolveMedia(given, in.request_id(), false);
  if (!items.ok()) return items.status();
  ASSIGN_OR_RETURN(r.tokens, ExpandMarkers(r.tokens, cuts, options_.media_token_ids, &*items));
  r.media = *std::move(items);
  r.media_source = std::move(given);
  for (const v1::MultimodalItem& m : r.media) {
    base::HashedSpan span{.token_offset = m.token_offset(), .num_tokens = m.num_tokens()};
    base::Hash128::FromBytes(m.content_hash(), &span.content);
    r.spans.push_back(span);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::MultimodalItem>> Router::ResolveMedia(
    absl::Span<const v1::MultimodalItem> items, const std::string& request_id, bool force_inline) {
  std::vector<cluster::WorkerInfo> encoders;
  absl::StatusOr<std::vector<std::shared_ptr<const WorkerEndpoint>>> all =
      options_.directory->Workers();
  if (all.ok()) {
    for (const auto& w : *all) {
      if (w->info.role == v1::ROLE_ENCODER &&
          (w->info.model.empty() || w->info.model == options_.model_name)) {
        encoders.push_back(w->info);
      }
    }
  }
  absl::StatusOr<std::vector<v1::MultimodalItem>> out =
      options_.media->Resolve(items, encoders, options_.model_name, request_id,
                              options_.request_timeout > absl::ZeroDuration()
                                  ? absl::Now() + options_.request_timeout
                                  : absl::InfiniteFuture(),
                              force_inline);
  if (!out.ok()) {
    const bool bad = absl::IsInvalidArgument(out.status());
    return rpc::ErrorWithDetail(out.status().code(),
                                bad ? v1::ERROR_CODE_INVALID_REQUEST : v1::ERROR_CODE_NO_WORKERS,
                                out.status().message(), "", /*retryable=*/!bad);
  }
  return out;
}

absl::Status Router::MediaInline(Request& r) {
  ASSIGN_OR_RETURN(std::vector<v1::MultimodalItem> items,
                   ResolveMedia(r.media_source, r.id, /*force_inline=*/true));
  for (size_t k = 0; k < items.size(); ++k) {
    if (items[k].num_tokens() != r.media[k].num_tokens()) {
      return absl::InternalError(absl::StrCat("multimodal[", k, "] encoded again to ",
                                              items[k].num_tokens(), " tokens, not ",
                                              r.media[k].num_tokens()));
    }
    items[k].set_token_offset(r.media[k].token_offset());
  }
  r.media = std::move(items);
  r.media_inline = true;
  return absl::OkStatus();
}

}  // namespace swaserve::router
