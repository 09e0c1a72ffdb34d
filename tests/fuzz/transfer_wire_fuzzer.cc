// libFuzzer target: the KV transfer protocol's wire decoders (lib/transfer/
// wire.h), which read what a peer sends over UCX and the handshake blobs
// that travel through gRPC. The first byte picks the decoder. Oracles: never
// a crash; whatever decodes re-encodes into bytes that decode to the same
// fields (a decoder accepts only what an encoder can produce).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "lib/transfer/wire.h"

namespace w = swaserve::transfer::wire;

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  const std::string bytes(reinterpret_cast<const char*>(p), n);
  switch (data[0] % 7) {
    case 0:
      if (auto a = w::UnpackWorkerAddress(bytes); a.ok()) {
        auto again = w::UnpackWorkerAddress(w::PackWorkerAddress(*a));
        Check(again.ok() && again->engine_id == a->engine_id &&
              again->ucx_address == a->ucx_address && again->process.pid == a->process.pid);
      }
      break;
    case 1:
      if (auto r = w::UnpackRkey(bytes); r.ok()) {
        auto again = w::UnpackRkey(w::PackRkey(*r));
        Check(again.ok() && again->tag == r->tag && again->length == r->length &&
              again->ucx_rkey == r->ucx_rkey && again->flags == r->flags);
      }
      break;
    case 2:
      if (auto h = w::DecodeHello(p, n); h.ok()) {
        const std::string e = w::EncodeHello(*h);
        Check(w::DecodeHello(e.data(), e.size()).ok());
      }
      break;
    case 3:
      if (auto d = w::DecodeData(p, n); d.ok()) {
        const std::string e = w::EncodeData(d->header, d->transfer_id);
        auto again = w::DecodeData(e.data(), e.size());
        Check(again.ok() && again->transfer_id == d->transfer_id &&
              again->header.length == d->header.length);
      }
      break;
    case 4:
      if (auto c = w::DecodeCommit(p, n); c.ok()) {
        const std::string e = w::EncodeCommit(c->header, c->region_tags, c->transfer_id);
        auto again = w::DecodeCommit(e.data(), e.size());
        Check(again.ok() && again->region_tags == c->region_tags &&
              again->transfer_id == c->transfer_id);
      }
      break;
    case 5:
      if (auto c = w::DecodeBegin(p, n); c.ok()) {
        const std::string e = w::EncodeBegin(c->header, c->region_tags, c->transfer_id);
        Check(w::DecodeBegin(e.data(), e.size()).ok());
      }
      break;
    default:
      if (auto r = w::DecodeReply(p, n); r.ok()) {
        const std::string e = w::EncodeReply(*r);
        Check(w::DecodeReply(e.data(), e.size()).ok());
      }
      break;
  }
  return 0;
}
