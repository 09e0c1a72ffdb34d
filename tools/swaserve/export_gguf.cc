// swaserve export-gguf: a MiMo-V2-family checkpoint as a GGUF file that
// llama.cpp's mimo2 architecture loads (lib/model/gguf_export.h).
//
//   swaserve export-gguf --model=models/demo --out=/tmp/demo.gguf
//   swaserve export-gguf --model=DIR --out=F.gguf --dtype=f32   # oracle runs
#include <cstdio>
#include <string>

#include "lib/base/config.h"
#include "lib/base/logging.h"
#include "lib/model/gguf_export.h"
#include "tools/swaserve/commands.h"

namespace swaserve::cli {

int ExportGguf(int argc, const char* const* argv) {
  std::string model;
  std::string out;
  model::GgufExportOptions options;
  int64_t context_length = 0;
  std::string log_level;
  base::Config config(
      "swaserve export-gguf",
      "Writes a checkpoint directory (config.json, safetensors, tokenizer.json) as a GGUF "
      "file for llama.cpp's mimo2 architecture: its metadata keys and tensor names, the "
      "SWA/full pattern, per-layer KV heads, sinks, both RoPE thetas, MoE routing, the MTP "
      "layers and the tokenizer. What mimo2 cannot express is an error naming it.");
  config.Add("model", &model, "checkpoint directory (required)")
      .Add("out", &out, "GGUF file to write (required)")
      .Add("dtype", &options.dtype,
           "matrices as: stored (the checkpoint's dtype, bytes unchanged; not FP8), f32 "
           "(exact, FP8 dequantised: for oracle runs), bf16 or f16")
      .Add("name", &options.name, "general.name (default: the directory's name)")
      .Add("context_length", &context_length,
           "mimo2.context_length (0: config.json's max_position_embeddings)")
      .Add("log_level", &log_level, "log level (default $SWASERVE_LOG_LEVEL or info)");
  base::ParseConfigOrExit(config, argc, argv);
  if (absl::Status s = base::InitLogging({.level = log_level, .name = "swaserve"}); !s.ok()) {
    std::fprintf(stderr, "swaserve export-gguf: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (model.empty() || out.empty()) {
    std::fprintf(stderr, "swaserve export-gguf: --model and --out are required\n");
    return 2;
  }
  options.context_length = static_cast<int>(context_length);
  absl::StatusOr<model::GgufExportSummary> s = model::ExportGguf(model, out, options);
  if (!s.ok()) {
    std::fprintf(stderr, "swaserve export-gguf: %s\n", std::string(s.status().message()).c_str());
    return 1;
  }
  std::printf("%s: %d tensors, matrices %s, %llu bytes\n", out.c_str(), s->tensors,
              std::string(model::GgmlTypeName(s->matrix_type)).c_str(),
              static_cast<unsigned long long>(s->bytes));
  return 0;
}

}  // namespace swaserve::cli
