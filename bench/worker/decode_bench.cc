// Decode-worker benchmarks (bench/RESULTS.md "Prefill and decode
// workers"), on the real DecodeCore loop:
//   1. decode throughput (generated tokens/s) against batch size;
//   2. requests a decode worker accepts while waiting for capacity: with host
//      staging (the KV waits in host memory; pool pages only at admission)
//      against pre-allocating pool pages when the request arrives (measured
//      with the real allocator on an identical empty pool).
// Model: the engine benchmark's hybrid shape (hidden 256, 14 layers: 2 full
// + 12 SWA with W = 128, 8 experts top-2, f32), random weights.
//
//   decode_bench [--json FILE] [--prompt 512] [--tokens 32]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/common/bench_model.h"

#include "absl/synchronization/mutex.h"
#include "lib/base/subprocess.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/model/forward.h"
#include "lib/model/sampling.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/engine_lock.h"
#include "lib/worker/kv_staging.h"

namespace swaserve::worker {
namespace {

model::ModelConfig BenchConfig() { return bench::BenchModelConfig(); }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Prefills once and stages copies for many requests (the KV bytes do not
// matter for decode speed; the layout does).
std::unique_ptr<KvStaging> StagePrompt(EngineLock& engine, const kv::KvShape& shape,
                                       const std::vector<uint32_t>& prompt) {
  auto pools = *kv::KvPools::Create({shape, static_cast<int64_t>(prompt.size()) / 16 + 8,
                                     static_cast<int64_t>(prompt.size()) / 16 + 8, true});
  kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false});
  model::ForwardOutput out;
  if (!seq.Append(static_cast<int>(prompt.size())).ok()) std::exit(1);
  model::ForwardItem item{&seq, prompt, 0, false};
  if (!engine.Forward({&item, 1}, &out).ok()) std::exit(1);
  auto staging = *KvStaging::Create(StagedKvLayout::For(shape, static_cast<int>(prompt.size())));
  if (!CopySequenceToStaging(seq, *pools, staging.get()).ok()) std::exit(1);
  return staging;
}

std::unique_ptr<KvStaging> Clone(const KvStaging& s) {
  auto c = *KvStaging::Create(s.layout());
  std::memcpy(c->data(), s.full_region(), s.size());
  return c;
}

struct Done {
  absl::Mutex mu;
  int finished = 0;
  int64_t tokens = 0;
};

int Main(int argc, char** argv) {
  std::string json_path;
  int prompt_len = 512, gen = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--prompt" && i + 1 < argc) prompt_len = std::atoi(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) gen = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: decode_bench [--json FILE] [--prompt N] [--tokens N]\n");
      return 2;
    }
  }
  const model::ModelConfig config = BenchConfig();
  const std::string dir = *base::MakeTempDir("decode-bench");
  if (!model::WriteRandomCheckpoint(config, 3, dir).ok()) return 1;
  auto engine_or = model::Engine::Create({dir, 0});
  if (!engine_or.ok()) return 1;
  EngineLock engine(engine_or->get());
  const kv::KvShape shape = config.KvShape(16);
  std::vector<uint32_t> prompt(prompt_len);
  for (int i = 0; i < prompt_len; ++i) prompt[i] = (i * 31 + 7) % 2048;
  std::unique_ptr<KvStaging> staged = StagePrompt(engine, shape, prompt);
  nlohmann::json report;

  std::printf("== Decode throughput vs batch size (prompt %d tokens, %d generated each)\n",
              prompt_len, gen);
  std::printf("%6s %12s %12s %14s\n", "batch", "seconds", "tokens/s", "ms/iteration");
  for (int batch : {1, 2, 4, 8, 16, 32}) {
    auto pools = *kv::KvPools::Create({shape, 64L * (prompt_len + gen) / 16 + 64, 4096, true});
    DecodeCoreOptions o;
    o.engine = &engine;
    o.pools = pools.get();
    o.max_batch_size = batch;
    auto core = *DecodeCore::Create(o);
    Done done;
    const double t0 = Now();
    for (int r = 0; r < batch; ++r) {
      DecodeJob j;
      j.id = "r" + std::to_string(r);
      j.prompt = prompt;
      j.stop.max_tokens = gen;
      j.first_token.token = 1;
      j.staging = Clone(*staged);
      j.sink = [&done](const TokenEvent& e) {
        absl::MutexLock lock(&done.mu);
        done.tokens += static_cast<int64_t>(e.tokens.size());
        if (e.finish != FinishReason::kNone) ++done.finished;
      };
      if (!core->Submit(std::move(j)).ok()) return 1;
    }
    {
      absl::MutexLock lock(&done.mu);
      auto all = [&] { return done.finished == batch; };
      done.mu.Await(absl::Condition(&all));
    }
    const double secs = Now() - t0;
    const double tps = static_cast<double>(done.tokens) / secs;
    std::printf("%6d %12.3f %12.1f %14.2f\n", batch, secs, tps, secs * 1000 / gen);
    report["throughput"].push_back({{"batch", batch}, {"seconds", secs}, {"tokens_per_second", tps}});
  }

  std::printf("\n== Requests accepted while waiting for decode capacity\n");
  // A decode pool with room for 4 such requests, 64 arrivals at once.
  const int64_t per_request = (prompt_len + gen + 15) / 16;
  const int64_t pool_pages = 4 * per_request + 4;
  const int arrivals = 64;
  // Pre-allocation: how many arrivals get pool pages for their prompt at
  // arrival, on an identical empty pool (real allocator).
  int prealloc = 0;
  {
    auto pools = *kv::KvPools::Create({shape, pool_pages, 4096, false});
    std::vector<std::unique_ptr<kv::Sequence>> seqs;
    for (int r = 0; r < arrivals; ++r) {
      auto s = std::make_unique<kv::Sequence>(kv::SequenceOptions{pools.get(), nullptr, 0, false});
      if (!s->AppendPrefilled(prompt_len, staged->layout().first_swa_token).ok()) break;
      seqs.push_back(std::move(s));
      ++prealloc;
    }
  }
  // Host staging: every arrival is accepted (KV in host memory), admitted as
  // pages free up; all finish.
  auto pools = *kv::KvPools::Create({shape, pool_pages, 4096, true});
  DecodeCoreOptions o;
  o.engine = &engine;
  o.pools = pools.get();
  o.max_batch_size = 32;
  auto core = *DecodeCore::Create(o);
  Done done;
  int accepted = 0;
  const double t0 = Now();
  for (int r = 0; r < arrivals; ++r) {
    DecodeJob j;
    j.id = "a" + std::to_string(r);
    j.prompt = prompt;
    j.stop.max_tokens = gen;
    j.first_token.token = 1;
    j.staging = Clone(*staged);
    j.sink = [&done](const TokenEvent& e) {
      absl::MutexLock lock(&done.mu);
      if (e.finish != FinishReason::kNone) done.finished += e.finish == FinishReason::kLength;
    };
    accepted += core->Submit(std::move(j)).ok();
  }
  const DecodeLoad at_arrival = core->GetLoad();
  {
    absl::MutexLock lock(&done.mu);
    auto all = [&] { return done.finished == accepted; };
    done.mu.Await(absl::Condition(&all));
  }
  const double secs = Now() - t0;
  const double staging_mib = static_cast<double>(staged->size()) * arrivals / (1 << 20);
  std::printf("pool: %lld full pages (%d requests of %d+%d tokens fit at once), %d arrivals\n",
              static_cast<long long>(pool_pages), 4, prompt_len, gen, arrivals);
  std::printf("%-34s %10s\n", "design", "accepted");
  std::printf("%-34s %10d\n", "pre-allocate pool pages on arrival", prealloc);
  std::printf("%-34s %10d   (all %d completed in %.2f s; %.1f MiB host staging; "
              "staged %d / running %d right after the arrivals)\n",
              "host staging, admit on capacity", accepted, done.finished, secs, staging_mib,
              at_arrival.staged, at_arrival.running);
  report["acceptance"] = {{"pool_full_pages", pool_pages}, {"arrivals", arrivals},
                          {"preallocate_accepted", prealloc}, {"staging_accepted", accepted},
                          {"staging_completed", done.finished}, {"seconds", secs},
                          {"staging_mib", staging_mib}};
  if (!json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace swaserve::worker

int main(int argc, char** argv) { return swaserve::worker::Main(argc, argv); }
