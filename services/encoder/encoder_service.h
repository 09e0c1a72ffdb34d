// swaserve.v1.Encoder over gRPC: the wire form of
// lib/encoder's EncoderCore. Each call's items are decoded and preprocessed
// on the call's thread, then batched with other calls' items in the core's
// per-modality batchers, so a sync service (one thread per call in flight,
// bounded by --max_concurrent_calls) is what feeds the batches.
//
//   MultimodalItem -> EncodeItem: modality from the field or, when
//   unspecified, the MIME type (image/*, audio/*, video/*); `data` required
//   (URLs are fetched by the router, never by the encoder); a content_hash
//   in the request must equal the one the encoder computes (a router with
//   other preprocessing parameters would otherwise key caches wrongly).
//   Embedding: content_hash, [num_tokens, hidden] f32 tensor, cache_hit;
//   by reference (shape only, by_reference) when larger than the request's
//   inline_max_bytes and held by the cache, fetched then with Fetch
//   (NOT_FOUND once evicted).
// Errors: INVALID_ARGUMENT naming the item and the problem; UNAVAILABLE
// while draining; RESOURCE_EXHAUSTED when the batch queue is full.
//
// Thread-safety: thread-safe. Ownership: does not own the core.
#pragma once

#include <atomic>

#include "lib/encoder/encoder_core.h"
#include "swaserve/v1/encoder.grpc.pb.h"

namespace swaserve::encoder_service {

class EncoderService final : public v1::Encoder::Service {
 public:
  // `fetch_chunk_bytes`: most bytes of rows per Fetch message (>= one row
  // is always sent).
  explicit EncoderService(encoder::EncoderCore* core, size_t fetch_chunk_bytes = size_t{4} << 20)
      : core_(core), fetch_chunk_bytes_(fetch_chunk_bytes) {}
  grpc::Status Encode(grpc::ServerContext* context, const v1::EncodeRequest* request,
                      v1::EncodeResponse* response) override;
  // Streams a cached embedding in chunks of at most fetch_chunk_bytes of rows.
  grpc::Status Fetch(grpc::ServerContext* context, const v1::FetchRequest* request,
                     grpc::ServerWriter<v1::FetchChunk>* writer) override;
  // New calls get UNAVAILABLE from now on (the router encodes elsewhere).
  void StartDraining() { draining_ = true; }

 private:
  encoder::EncoderCore* const core_;
  const size_t fetch_chunk_bytes_;
  std::atomic<bool> draining_{false};
};

}  // namespace swaserve::encoder_service
