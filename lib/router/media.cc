#include "lib/router/media.h"

#include <algorithm>
#include <fstream>
#include <future>
#include <initializer_list>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/hash.h"
#include "lib/base/multimodal.h"
#include "lib/base/status.h"
#include "lib/model/config.h"
#include "lib/metrics/buckets.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/status_conversion.h"
#include "nlohmann/json.hpp"

namespace swaserve::router {
namespace {

class GrpcEncoderClient final : public EncoderClient {
 public:
  explicit GrpcEncoderClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::Encoder::NewStub(channel)) {}
  absl::StatusOr<v1::EncodeResponse> Encode(const v1::EncodeRequest& request,
                                            absl::Time deadline) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::EncodeResponse response;
    const grpc::Status s = stub_->Encode(&ctx, request, &response);
    if (!s.ok()) return rpc::FromGrpcStatus(s);
    return response;
  }

 private:
  std::unique_ptr<v1::Encoder::Stub> stub_;
};

const char* ModalityName(v1::Modality m) {
  switch (m) {
    case v1::MODALITY_IMAGE:
      return "image";
    case v1::MODALITY_AUDIO:
      return "audio";
    case v1::MODALITY_VIDEO:
      return "video";
    default:
      return "unspecified";
  }
}

// Marker index (MediaMarkers order) of a modality.
int MarkerOf(v1::Modality m) {
  return m == v1::MODALITY_IMAGE ? 0 : m == v1::MODALITY_VIDEO ? 1 : 2;
}

// An encoder's failure that another encoder may not have: try the next one.
bool TryAnother(const absl::Status& s) {
  return !absl::IsInvalidArgument(s) && !absl::IsFailedPrecondition(s) &&
         !absl::IsOutOfRange(s) && !absl::IsCancelled(s);
}

}  // namespace

std::unique_ptr<EncoderClient> NewGrpcEncoderClient(std::shared_ptr<grpc::Channel> channel) {
  return std::make_unique<GrpcEncoderClient>(std::move(channel));
}

struct MediaResolver::Metrics {
  metrics::CounterFamily* items = nullptr;       // {modality, cache}
  metrics::CounterFamily* failovers = nullptr;   // {}
  metrics::HistogramFamily* seconds = nullptr;   // {modality}
  metrics::CounterFamily* rejected = nullptr;    // {modality}
  metrics::CounterFamily* by_reference = nullptr;  // {}
};

MediaResolver::MediaResolver(MediaOptions options) : options_(std::move(options)) {}
MediaResolver::~MediaResolver() = default;

absl::StatusOr<std::unique_ptr<MediaResolver>> MediaResolver::Create(MediaOptions options) {
  if (options.max_items < 1 || options.encoder_attempts < 1 || options.max_data_url_bytes < 1) {
    return absl::InvalidArgumentError(
        "media: max_items, encoder_attempts and max_data_url_bytes must be >= 1");
  }
  if (!options.client_factory) {
    options.client_factory = [](const cluster::WorkerInfo& e)
        -> absl::StatusOr<std::shared_ptr<EncoderClient>> {
      ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> ch, rpc::CreateChannel(e.grpc_address));
      return std::shared_ptr<EncoderClient>(NewGrpcEncoderClient(std::move(ch)));
    };
  }
  metrics::Registry* reg = options.registry;
  std::unique_ptr<MediaResolver> r(new MediaResolver(std::move(options)));
  r->metrics_ = std::make_unique<Metrics>();
  if (reg != nullptr) {
    Metrics& m = *r->metrics_;
    ASSIGN_OR_RETURN(m.items, reg->AddCounter("swaserve_router_media_items_total",
                                              "Multimodal items encoded for requests, by "
                                              "modality and whether the encoder's embedding "
                                              "cache had them (cache=hit|miss).",
                                              {"modality", "cache"}));
    ASSIGN_OR_RETURN(m.failovers,
                     reg->AddCounter("swaserve_router_media_failovers_total",
                                     "Items sent to the next encoder on the hash ring because "
                                     "their encoder failed."));
    ASSIGN_OR_RETURN(m.seconds,
                     reg->AddHistogram("swaserve_router_media_seconds",
                                       "Time to turn one item into embeddings on the router's "
                                       "path: fetch, encoder call (queue, preprocessing, "
                                       "forward), by modality.",
                                       {"modality"}, metrics::DefaultLatencyBuckets()));
    ASSIGN_OR_RETURN(m.by_reference,
                     reg->AddCounter("swaserve_router_media_by_reference_total",
                                     "Items whose embeddings went to prefill by reference (the "
                                     "prefill worker fetched them from the encoder)."));
    ASSIGN_OR_RETURN(m.rejected, reg->AddCounter("swaserve_router_media_rejected_total",
                                                 "Items rejected as bad input (400), by "
                                                 "modality.",
                                                 {"modality"}));
  }
  return r;
}

std::shared_ptr<const cluster::HashRing> MediaResolver::Ring(
    absl::Span<const cluster::WorkerInfo> encoders) {
  std::vector<std::string> nodes;
  for (const cluster::WorkerInfo& e : encoders) nodes.push_back(e.id);
  std::sort(nodes.begin(), nodes.end());
  absl::MutexLock lock(&mu_);
  if (ring_ == nullptr || nodes != ring_nodes_) {
    auto ring = std::make_shared<cluster::HashRing>(options_.ring);
    for (const std::string& n : nodes) ring->Add(n);
    ring_ = std::move(ring);
    ring_nodes_ = std::move(nodes);
  }
  return ring_;
}

absl::StatusOr<std::shared_ptr<EncoderClient>> MediaResolver::Client(
    const cluster::WorkerInfo& e) {
  const std::string key = absl::StrCat(e.id, "/", e.incarnation, "/", e.grpc_address);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = clients_.find(key); it != clients_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<EncoderClient> c, options_.client_factory(e));
  absl::MutexLock lock(&mu_);
  // Forget clients of encoders that left or restarted (bounded map).
  if (clients_.size() > 256) clients_.clear();
  return clients_.try_emplace(key, std::move(c)).first->second;
}

absl::StatusOr<v1::MultimodalItem> MediaResolver::ResolveOne(
    const v1::MultimodalItem& item, int index, absl::Span<const cluster::WorkerInfo> encoders,
    const std::string& model, const std::string& request_id, absl::Time deadline,
    bool force_inline) {
  const absl::Time start = absl::Now();
  const char* modality = ModalityName(item.modality());
  const std::string what = absl::StrCat("multimodal[", index, "] (", modality, ")");
  auto bad = [&](absl::string_view msg) {
    if (metrics_->rejected != nullptr) metrics_->rejected->WithLabels({modality}).Increment();
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", msg));
  };
  if (item.modality() == v1::MODALITY_UNSPECIFIED || !v1::Modality_IsValid(item.modality())) {
    return bad("modality must be image, audio or video");
  }
  if (options_.modalities.has_value() &&
      std::find(options_.modalities->begin(), options_.modalities->end(), item.modality()) ==
          options_.modalities->end()) {
    return bad(absl::StrCat("model ", model, " accepts no ", modality, " input (its checkpoint has no ",
                            item.modality() == v1::MODALITY_AUDIO ? "audio" : "vision", " tower)"));
  }
  v1::MultimodalItem out;
  out.set_modality(item.modality());
  out.set_mime_type(item.mime_type());
  std::string bytes;
  if (!item.data().empty()) {
    bytes = item.data();
  } else if (item.url().empty()) {
    return bad("has neither data nor url");
  } else if (absl::StartsWithIgnoreCase(item.url(), "data:")) {
    absl::StatusOr<api::FetchedMedia> m = api::ParseDataUrl(item.url(), options_.max_data_url_bytes);
    if (!m.ok()) return bad(m.status().message());
    bytes = std::move(m->bytes);
    if (out.mime_type().empty()) out.set_mime_type(m->mime_type);
  } else if (options_.fetcher == nullptr) {
    return bad("this router does not fetch http(s) URLs (send the bytes as a data: URL, or start "
               "the router with --media.fetch)");
  } else {
    absl::StatusOr<api::FetchedMedia> m = options_.fetcher->Fetch(item.url());
    if (!m.ok()) return bad(m.status().message());
    bytes = std::move(m->bytes);
    if (out.mime_type().empty()) out.set_mime_type(m->mime_type);
  }
  if (encoders.empty()) {
    return absl::UnavailableError(absl::StrCat(
        what, ": no encoder is registered (start swaserve-encoder for a model with a ",
        item.modality() == v1::MODALITY_AUDIO ? "audio" : "vision", " tower)"));
  }
  const std::shared_ptr<const cluster::HashRing> ring = Ring(encoders);
  const base::Hash128 key = base::Hash128Of(bytes);
  const std::vector<std::string> owners =
      ring->NodesFor(key.low, static_cast<size_t>(options_.encoder_attempts));
  v1::EncodeRequest req;
  req.set_model(model);
  req.set_request_id(request_id);
  req.set_inline_max_bytes(force_inline ? 0 : options_.inline_max_bytes);
  v1::MultimodalItem* sent = req.add_items();
  sent->set_modality(item.modality());
  sent->set_mime_type(out.mime_type());
  sent->set_data(std::move(bytes));
  std::vector<std::string> failures;
  for (const std::string& owner : owners) {
    const auto e = std::find_if(encoders.begin(), encoders.end(),
                                [&](const cluster::WorkerInfo& w) { return w.id == owner; });
    absl::StatusOr<v1::EncodeResponse> resp;
    absl::StatusOr<std::shared_ptr<EncoderClient>> client = Client(*e);
    if (!client.ok()) {
      resp = client.status();
    } else {
      resp = (*client)->Encode(req, std::min(deadline, absl::Now() + options_.encode_timeout));
    }
    if (resp.ok() && resp->embeddings_size() != 1) {
      resp = absl::InternalError(
          absl::StrCat("answered ", resp->embeddings_size(), " embeddings for 1 item"));
    }
    if (!resp.ok()) {
      if (!TryAnother(resp.status())) {
        if (absl::IsInvalidArgument(resp.status())) return bad(resp.status().message());
        return base::Annotate(resp.status(), absl::StrCat(what, ": encoder ", owner));
      }
      failures.push_back(absl::StrCat(owner, ": ", resp.status().ToString()));
      if (metrics_->failovers != nullptr) metrics_->failovers->WithLabels().Increment();
      if (absl::Now() >= deadline) break;
      continue;
    }
    v1::Embedding& emb = *resp->mutable_embeddings(0);
    const v1::Tensor& t = emb.embeddings();
    const bool by_ref = emb.by_reference() && !force_inline && options_.inline_max_bytes > 0;
    if (emb.content_hash().size() != 16 || t.dtype() != v1::DTYPE_F32 || t.shape_size() != 2 ||
        t.shape(0) <= 0 || t.shape(1) <= 0 ||
        t.data().size() !=
            (by_ref ? 0 : static_cast<size_t>(t.shape(0) * t.shape(1)) * sizeof(float))) {
      return absl::InternalError(absl::StrCat(
          what, ": encoder ", owner, " answered a malformed embedding (content hash ",
          emb.content_hash().size(), " bytes, ", t.shape_size(), "-d tensor)"));
    }
    out.set_content_hash(emb.content_hash());
    out.set_num_tokens(static_cast<uint32_t>(t.shape(0)));
    *out.mutable_embeddings() = std::move(*emb.mutable_embeddings());
    if (by_ref) {
      out.set_embeddings_address(e->grpc_address);
      if (metrics_->by_reference != nullptr) metrics_->by_reference->WithLabels().Increment();
    }
    if (metrics_->items != nullptr) {
      metrics_->items->WithLabels({modality, emb.cache_hit() ? "hit" : "miss"}).Increment();
      metrics_->seconds->WithLabels({modality}).Observe(absl::ToDoubleSeconds(absl::Now() - start));
    }
    return out;
  }
  return absl::UnavailableError(absl::StrCat(what, ": every encoder tried failed (",
                                             absl::StrJoin(failures, "; "), ")"));
}

absl::StatusOr<std::vector<v1::MultimodalItem>> MediaResolver::Resolve(
    absl::Span<const v1::MultimodalItem> items, absl::Span<const cluster::WorkerInfo> encoders,
    const std::string& model, const std::string& request_id, absl::Time deadline,
    bool force_inline) {
  if (static_cast<int>(items.size()) > options_.max_items) {
    return absl::InvalidArgumentError(absl::StrCat("a request may carry at most ",
                                                   options_.max_items, " multimodal items, not ",
                                                   items.size()));
  }
  // Items 1..n-1 on their own threads, item 0 on this one.
  std::vector<std::future<absl::StatusOr<v1::MultimodalItem>>> rest;
  for (size_t i = 1; i < items.size(); ++i) {
    rest.push_back(std::async(std::launch::async, [&, i] {
      return ResolveOne(items[i], static_cast<int>(i), encoders, model, request_id, deadline,
                        force_inline);
    }));
  }
  std::vector<absl::StatusOr<v1::MultimodalItem>> results;
  if (!items.empty()) {
    results.push_back(
        ResolveOne(items[0], 0, encoders, model, request_id, deadline, force_inline));
  }
  for (auto& f : rest) results.push_back(f.get());
  std::vector<v1::MultimodalItem> out;
  // The first bad-input error wins over unavailability (a 400 is final).
  for (auto& r : results) {
    if (!r.ok() && absl::IsInvalidArgument(r.status())) return r.status();
  }
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

absl::StatusOr<MediaTokenIds> MediaTokenIdsFor(const std::string& model_dir,
                                               const model::Tokenizer& tokenizer) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  auto pick = [&](std::initializer_list<const char*> keys,
                  std::string_view marker) -> absl::StatusOr<uint32_t> {
    for (const char* key : keys) {
      const auto it = config.find(key);
      if (it == config.end() || it->is_null()) continue;
      if (!it->is_number_unsigned() || it->get<uint64_t>() >= static_cast<uint64_t>(tokenizer.vocab_size())) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", key,
                                                       " must be a token id below ",
                                                       tokenizer.vocab_size()));
      }
      return it->get<uint32_t>();
    }
    return tokenizer.TokenId(absl::string_view(marker.data(), marker.size())).value_or(0);
  };
  MediaTokenIds ids;
  ASSIGN_OR_RETURN(ids.image, pick({"image_token_id"}, base::kImageMarker));
  ASSIGN_OR_RETURN(ids.video, pick({"video_token_id"}, base::kVideoMarker));
  ASSIGN_OR_RETURN(ids.audio, pick({"audio_token_id", "audio_token_index"}, base::kAudioMarker));
  return ids;
}

absl::StatusOr<std::vector<v1::Modality>> ModalitiesFor(const std::string& model_dir) {
  ASSIGN_OR_RETURN(const model::EncoderTowers towers, model::EncoderTowersOf(model_dir));
  std::vector<v1::Modality> out;
  if (towers.vision) {
    out.push_back(v1::MODALITY_IMAGE);
    out.push_back(v1::MODALITY_VIDEO);
  }
  if (towers.audio) out.push_back(v1::MODALITY_AUDIO);
  return out;
}

const std::vector<std::string>& MediaMarkers() {
  static const std::vector<std::string>* markers = new std::vector<std::string>{
      std::string(base::kImageMarker), std::string(base::kVideoMarker),
      std::string(base::kAudioMarker)};
  return *markers;
}

absl::Status CheckMarkers(absl::Span<const model::MarkerCut> cuts,
                          absl::Span<const v1::MultimodalItem> items) {
  if (cuts.size() != items.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", cuts.size(), " multimodal marker(s) (",
        absl::StrJoin(MediaMarkers(), ", "), ") but the request has ", items.size(),
        " multimodal item(s); each item needs one marker where it goes"));
  }
  for (size_t k = 0; k < cuts.size(); ++k) {
    if (cuts[k].marker != MarkerOf(items[k].modality())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multimodal[", k, "] is ", ModalityName(items[k].modality()), " but marker ", k,
          " in the prompt is ", MediaMarkers()[cuts[k].marker]));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> ExpandMarkers(absl::Span<const uint32_t> ids,
                                                    absl::Span<const model::MarkerCut> cuts,
                                                    const MediaTokenIds& token_ids,
                                                    std::vector<v1::MultimodalItem>* items) {
  RETURN_IF_ERROR(CheckMarkers(cuts, *items));
  std::vector<uint32_t> out;
  size_t copied = 0;
  for (size_t k = 0; k < cuts.size(); ++k) {
    v1::MultimodalItem& item = (*items)[k];
    out.insert(out.end(), ids.begin() + copied, ids.begin() + cuts[k].token_offset);
    copied = cuts[k].token_offset;
    const uint32_t pad = item.modality() == v1::MODALITY_IMAGE   ? token_ids.image
                         : item.modality() == v1::MODALITY_VIDEO ? token_ids.video
                                                                 : token_ids.audio;
    item.set_token_offset(static_cast<uint32_t>(out.size()));
    out.insert(out.end(), item.num_tokens(), pad);
  }
  out.insert(out.end(), ids.begin() + copied, ids.end());
  return out;
}

}  // namespace swaserve::router
