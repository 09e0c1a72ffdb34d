// Fuzzes ModelConfig::FromJson (lib/model/config.h): any config.json text
// must give OK or a clean error naming the problem, never a crash, hang or
// sanitizer report. An accepted config must validate, round-trip through
// ToJson, and give a valid KV shape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/model/config.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<swaserve::model::ModelConfig> c =
      swaserve::model::ModelConfig::FromJson(text, "fuzz.json");
  if (!c.ok()) {
    Check(!c.status().message().empty());
    return 0;
  }
  Check(c->Validate().ok());
  absl::StatusOr<swaserve::model::ModelConfig> back =
      swaserve::model::ModelConfig::FromJson(c->ToJson(), "roundtrip");
  Check(back.ok() && *back == *c);
  for (int l = 0; l < c->num_layers; ++l) {
    Check(c->pool_layer(l) >= 0);
  }
  const swaserve::kv::KvShape shape = c->KvShape();
  Check(shape.full_layers + shape.swa_layers ==
        c->num_layers + c->num_mtp_layers);
  return 0;
}
