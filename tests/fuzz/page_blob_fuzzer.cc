// Fuzzes the L3 page-blob verifier (lib/kv/page_blob.h), which reads bytes
// from disk and from a shared Redis: any input must verify cleanly or fail
// with DataLoss / InvalidArgument, never crash, hang or read out of bounds.
// And verification must be exact: an input that verifies as a blob of key k
// is byte for byte EncodePageBlob(k, payload) — no other bytes pass (a
// violation traps). Seeds (corpus/page_blob/) are valid blobs and damaged
// ones, written by EncodePageBlob.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lib/kv/page_blob.h"

using swaserve::kv::DecodePageBlobHeader;
using swaserve::kv::EncodePageBlob;
using swaserve::kv::kPageBlobHeaderBytes;
using swaserve::kv::PageBlobHeader;
using swaserve::kv::PageKey;
using swaserve::kv::ReadPageBlob;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> blob(data, size);
  const size_t stored = size >= kPageBlobHeaderBytes
                            ? size - kPageBlobHeaderBytes
                            : 0;
  std::vector<uint8_t> out(stored);

  // A reader expecting a fixed key and the size present.
  const PageKey fixed{.hash = 0x0123456789abcdefULL, .layout = 42};
  const absl::Status s = ReadPageBlob(blob, fixed, absl::MakeSpan(out));
  if (!s.ok() && !absl::IsDataLoss(s) && !absl::IsInvalidArgument(s)) {
    __builtin_trap();
  }

  // A reader expecting whatever key the header names.
  absl::StatusOr<PageBlobHeader> header = DecodePageBlobHeader(blob);
  if (!header.ok()) return 0;
  const absl::Status t = ReadPageBlob(blob, header->key, absl::MakeSpan(out));
  if (t.ok()) {
    const std::string canonical = EncodePageBlob(header->key, out);
    if (canonical.size() != size ||
        std::memcmp(canonical.data(), data, size) != 0) {
      __builtin_trap();
    }
  } else if (!absl::IsDataLoss(t) && !absl::IsInvalidArgument(t)) {
    __builtin_trap();
  }
  return 0;
}
