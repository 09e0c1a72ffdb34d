// A tiny random checkpoint and straight-line reference runs for lib/worker
// tests: prefill a prompt (chunked), greedy-generate with one request at a
// time, copy a prefilled sequence into a KV staging area.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/model/forward.h"
#include "lib/worker/engine_lock.h"
#include "lib/worker/kv_staging.h"

namespace swaserve::worker::testing {

constexpr int kPage = 4;

// The shared engine over a tiny random checkpoint (vocab 256), created once,
// behind the lock every user (tests and cores) goes through.
EngineLock& TestEngine();

std::unique_ptr<kv::KvPools> NewPools(int full_pages, int swa_pages);

std::vector<uint32_t> RandomPrompt(uint64_t seed, int n);

// Greedy generation of n tokens after `prompt`, alone, in fresh pools.
std::vector<uint32_t> ReferenceGreedy(const std::vector<uint32_t>& prompt, int n);

// Prefills `prompt` in `pools` (chunks of `chunk`), returns the greedy first
// token and the KV staged for a decode worker.
struct Prefilled {
  uint32_t first_token = 0;
  std::unique_ptr<KvStaging> staging;
};
Prefilled PrefillAndStage(kv::KvPools& pools, const std::vector<uint32_t>& prompt, int chunk);

}  // namespace swaserve::worker::testing
