// Header-only (it needs lib/kv, which bench_util does not link): the
// interleaving of SWA and full layers the KV benches assume for a KvShape,
// MiMo-V2.5-Pro's hybrid pattern: a full layer first, then every
// (layers / full layers)-th. The window-restore pyramid
// (kv::WindowRestoreRows) depends on where the full layers sit.
#pragma once

#include <vector>

#include "lib/kv/kv_shape.h"

namespace swaserve::bench {

// Whether each layer of `shape` is a SWA layer.
inline std::vector<bool> SwaPattern(const kv::KvShape& shape) {
  const int n = shape.full_layers + shape.swa_layers;
  const int step = shape.full_layers > 0 ? n / shape.full_layers : n + 1;
  std::vector<bool> swa;
  int full = 0;
  for (int l = 0; l < n; ++l) {
    const bool f = full < shape.full_layers && l % step == 0;
    full += f;
    swa.push_back(!f);
  }
  return swa;
}

}  // namespace swaserve::bench
