#include "services/encoder/encoder_service.h"

#include <algorithm>
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
    const uint64_t bytes = e.embedding->values.size() * sizeof(float);
    if (request->inline_max_bytes() > 0 && bytes > request->inline_max_bytes() &&
        core_->Cached(e.content_hash) != nullptr) {
      pb->set_by_reference(true);
      continue;
    }
    t->set_data(std::string(reinterpret_cast<const char*>(e.embedding->values.data()), bytes));
  }
  (void)context;
  return grpc::Status::OK;
}

grpc::Status EncoderService::Fetch(grpc::ServerContext* context, const v1::FetchRequest* request,
                                   grpc::ServerWriter<v1::FetchChunk>* writer) {
  base::Hash128 key;
  if (!base::Hash128::FromBytes(request->content_hash(), &key)) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("content_hash must be 16 bytes"));
  }
  const std::shared_ptr<const encoder::ItemEmbedding> e = core_->Cached(key);
  if (e == nullptr) {
    return rpc::ToGrpcStatus(absl::NotFoundError(
        "the embedding is no longer in this encoder's cache (evicted or never encoded here)"));
  }
  const size_t row_bytes = static_cast<size_t>(e->hidden) * sizeof(float);
  const int rows_per_chunk = static_cast<int>(std::max<size_t>(1, fetch_chunk_bytes_ / row_bytes));
  v1::FetchChunk chunk;
  for (int r = 0; r < e->num_tokens; r += rows_per_chunk) {
    const int n = std::min(rows_per_chunk, e->num_tokens - r);
    chunk.Clear();
    chunk.set_first_row(static_cast<uint32_t>(r));
    v1::Tensor* t = chunk.mutable_rows();
    t->set_dtype(v1::DTYPE_F32);
    t->add_shape(n);
    t->add_shape(e->hidden);
    t->set_data(std::string(reinterpret_cast<const char*>(e->values.data() +
                                                          static_cast<size_t>(r) * e->hidden),
                            static_cast<size_t>(n) * row_bytes));
    if (context->IsCancelled() || !writer->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
    }
  }
  return grpc::Status::OK;
}

}  // namespace swaserve::encoder_service
