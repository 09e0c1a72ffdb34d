#include "services/encoder/encoder_service.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/rpc/status_conversion.h"

namespace swaserve::encoder_service {
namespace {

absl::StatusOr<encoder::Modality> ModalityOf(const v1::MultimodalItem& item, int index) {
  switch (item.modality()) {
    case v1::MODALITY_IMAGE:
      return encoder::Modality::kImage;
    case v1::MODALITY_AUDIO:
      return encoder::Modality::kAudio;
    case v1::MODALITY_VIDEO:
      return encoder::Modality::kVideo;
    default:
      break;
  }
  const std::string& mime = item.mime_type();
  if (absl::StartsWith(mime, "image/")) return encoder::Modality::kImage;
  if (absl::StartsWith(mime, "audio/")) return encoder::Modality::kAudio;
  if (absl::StartsWith(mime, "video/")) return encoder::Modality::kVideo;
  return absl::InvalidArgumentError(absl::StrCat(
      "item ", index, ": no modality and no image/, audio/ or video/ MIME type ('", mime, "')"));
}

}  // namespace

grpc::Status EncoderService::Encode(grpc::ServerContext* context,
                                    const v1::EncodeRequest* request,
                                    v1::EncodeResponse* response) {
  if (draining_) return rpc::ToGrpcStatus(absl::UnavailableError("the encoder is draining"));
  std::vector<encoder::EncodeItem> items;
  items.reserve(request->items_size());
  for (int i = 0; i < request->items_size(); ++i) {
    const v1::MultimodalItem& it = request->items(i);
    absl::StatusOr<encoder::Modality> m = ModalityOf(it, i);
    if (!m.ok()) return rpc::ToGrpcStatus(m.status());
    if (it.data().empty()) {
      return rpc::ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
          "item ", i, ": no data", it.url().empty() ? "" : " (URLs are fetched by the router)")));
    }
    items.push_back({*m, it.data()});
    if (!it.content_hash().empty()) {
      base::Hash128 given;
      if (!base::Hash128::FromBytes(it.content_hash(), &given) ||
          !(given == core_->ContentHash(items.back()))) {
        return rpc::ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
            "item ", i, ": content_hash does not match the bytes under this encoder's "
            "preprocessing parameters")));
      }
    }
  }
  absl::StatusOr<std::vector<encoder::EncodedItem>> out = core_->Encode(items);
  if (!out.ok()) return rpc::ToGrpcStatus(out.status());
  for (const encoder::EncodedItem& e : *out) {
    v1::Embedding* pb = response->add_embeddings();
    pb->set_content_hash(e.content_hash.ToBytes());
    pb->set_cache_hit(e.cache_hit);
    v1::Tensor* t = pb->mutable_embeddings();
    t->set_dtype(v1::DTYPE_F32);
    t->add_shape(e.embedding->num_tokens);
    t->add_shape(e.embedding->hidden);
    t->set_data(std::string(reinterpret_cast<const char*>(e.embedding->values.data()),
                            e.embedding->values.size() * sizeof(float)));
  }
  (void)context;
  return grpc::Status::OK;
}

}  // namespace swaserve::encoder_service
