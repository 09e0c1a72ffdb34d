#include "lib/kv/page_store.h"

#include "absl/base/internal/endian.h"
#include "lib/base/hash.h"

namespace swaserve::kv {
namespace {

// Mixed into every fingerprint: bump when the recipe below changes, so keys
// written by an older recipe never match.
constexpr uint64_t kLayoutFingerprintVersion = 1;

}  // namespace

uint64_t KvLayoutFingerprint(const KvShape& shape, PoolKind kind,
                             uint64_t model) {
  const PoolGeometry g = kind == PoolKind::kFull ? shape.Full() : shape.Swa();
  // Fixed-width little-endian fields, so the value is the same on every
  // machine and compiler.
  const uint64_t fields[] = {
      kLayoutFingerprintVersion,
      static_cast<uint64_t>(g.kind),
      static_cast<uint64_t>(g.num_layers),
      static_cast<uint64_t>(g.num_kv_heads),
      static_cast<uint64_t>(g.k_head_dim),
      static_cast<uint64_t>(g.v_head_dim),
      static_cast<uint64_t>(g.dtype),
      static_cast<uint64_t>(g.page_size),
      model,
  };
  constexpr size_t kFields = sizeof(fields) / sizeof(fields[0]);
  unsigned char buf[kFields * 8];
  for (size_t i = 0; i < kFields; ++i) {
    absl::little_endian::Store64(buf + 8 * i, fields[i]);
  }
  return base::Hash64(buf, sizeof(buf),
                      base::Hash64("swaserve-kv-layout-fingerprint"));
}

}  // namespace swaserve::kv
