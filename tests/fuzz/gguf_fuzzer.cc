// Fuzzes the GGUF reader (lib/model/gguf.h): any input must give OK or a
// clean error, never a crash, hang or sanitizer report; and whatever is
// accepted must satisfy the format's rules (tensor data inside the input and
// aligned, metadata values matching their types).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "lib/model/gguf.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  swaserve::model::GgufReadLimits limits;
  limits.max_array_elements = 1 << 16;
  limits.max_string_bytes = 1 << 16;
  absl::StatusOr<swaserve::model::GgufContents> c = swaserve::model::ParseGguf(bytes, limits);
  if (!c.ok()) {
    Check(!c.status().message().empty());
    return 0;
  }
  Check(c->version == 2 || c->version == 3);
  for (const auto& [key, value] : c->metadata) {
    Check(value.is_array || value.size() == 1);
    (void)value.DebugString();
  }
  for (const swaserve::model::GgufTensorInfo& t : c->tensors) {
    Check(t.data.data() >= bytes.data() &&
          t.data.data() + t.data.size() <= bytes.data() + bytes.size());
    Check(t.offset % c->alignment == 0);
    Check(t.data.size() ==
          static_cast<size_t>(t.numel()) * swaserve::model::GgmlTypeSize(t.type));
  }
  return 0;
}
