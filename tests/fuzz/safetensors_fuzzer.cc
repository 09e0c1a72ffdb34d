// Fuzzes the safetensors header parser (lib/model/checkpoint.h): any input
// must give OK or a clean error, never a crash, hang or sanitizer report;
// and whatever is accepted must satisfy the format's rules.
//
// The input is read as a file image, as SafetensorsFile::Open sees it: a
// u64 little-endian header length N, N bytes of JSON, then the data. When N
// does not fit the input, the bytes after the prefix are taken as the header
// and N (mod 2^32) as the data size, so mutations of the JSON are exercised
// whatever the prefix says.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lib/model/checkpoint.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  absl::string_view header;
  uint64_t data_size = 0;
  if (n <= size - 8) {
    header = absl::string_view(reinterpret_cast<const char*>(data) + 8, n);
    data_size = size - 8 - n;
  } else {
    header =
        absl::string_view(reinterpret_cast<const char*>(data) + 8, size - 8);
    data_size = n & 0xffffffffu;
  }
  absl::StatusOr<std::vector<swaserve::model::TensorInfo>> tensors =
      swaserve::model::ParseSafetensorsHeader(header, data_size);
  if (!tensors.ok()) {
    Check(!tensors.status().message().empty());
    return 0;
  }
  for (size_t i = 0; i < tensors->size(); ++i) {
    const swaserve::model::TensorInfo& t = (*tensors)[i];
    Check(t.begin <= t.end && t.end <= data_size);
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      Check(d >= 0);
      numel *= d;  // cannot overflow once accepted
    }
    Check(numel == t.numel());
    const size_t esize = swaserve::model::TensorDTypeSize(t.dtype);
    if (esize > 0) {
      Check(static_cast<uint64_t>(numel) * esize == t.end - t.begin);
    }
    for (size_t j = i + 1; j < tensors->size(); ++j) {
      const swaserve::model::TensorInfo& u = (*tensors)[j];
      Check(t.name != u.name);
      const bool disjoint = t.end <= u.begin || u.end <= t.begin ||
                            t.begin == t.end || u.begin == u.end;
      Check(disjoint);
    }
  }
  return 0;
}
