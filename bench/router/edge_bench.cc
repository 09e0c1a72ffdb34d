// What the edge's defences cost per request on the router's CPU, beside the
// per-request work they sit next to (Google Benchmark):
//   ApiKeyAuthorize     the bearer-key check (constant-time compare of every
//                       stored key; 100 keys)
//   CallerAdmit         CallerPolicy::Admit: the tenant, its cache domain,
//                       priority floor and request-rate bucket
//   AdmitTokens         the token-rate bucket once the prompt is tokenized
//   PageHashSeed        the tenant's chain seed (base::PageHashSeedFor)
//   PageHashes/N        the chained page hashes of an N-token prompt with
//                       the default seed and with a tenant's (the seed costs
//                       nothing per page: it only starts the chain)
#include <fstream>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "lib/api/api_keys.h"
#include "lib/api/tenants.h"
#include "lib/base/hash.h"
#include "lib/router/caller_policy.h"

namespace swaserve {
namespace {

api::ApiKeyStore* Keys() {
  static api::ApiKeyStore* keys = [] {
    const std::string path = "/tmp/edge_bench_keys.txt";
    std::ofstream f(path);
    for (int i = 0; i < 100; ++i) f << "tenant-" << i << ":sk-" << std::string(40, 'a' + i % 26) << i << "\n";
    f.close();
    return api::ApiKeyStore::Create({.path = path, .reload_interval = absl::InfiniteDuration()})
        ->release();
  }();
  return keys;
}

void BM_ApiKeyAuthorize(benchmark::State& state) {
  const std::string header = "Bearer sk-" + std::string(40, 'a' + 57 % 26) + "57";
  for (auto _ : state) benchmark::DoNotOptimize(Keys()->Authorize(header));
}
BENCHMARK(BM_ApiKeyAuthorize);

router::CallerPolicy* Policy() {
  static api::TenantMap* map = new api::TenantMap(*api::TenantMap::Parse(
      "tenant acme: k1 k2\nlimit acme: requests_per_minute=1e12 tokens_per_minute=1e15\n"));
  static router::CallerPolicy* p = new router::CallerPolicy({.tenants = map});
  return p;
}

void BM_CallerAdmit(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Policy()->Admit("k1"));
}
BENCHMARK(BM_CallerAdmit);

void BM_AdmitTokens(benchmark::State& state) {
  router::Caller c = *Policy()->Admit("k2");
  for (auto _ : state) benchmark::DoNotOptimize(c.admit_tokens(100000));
}
BENCHMARK(BM_AdmitTokens);

void BM_PageHashSeed(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(base::PageHashSeedFor("tenant:acme", "user-17"));
}
BENCHMARK(BM_PageHashSeed);

void BM_PageHashes(benchmark::State& state) {
  std::vector<uint32_t> tokens(static_cast<size_t>(state.range(0)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
  const uint64_t seed = state.range(1) != 0 ? base::PageHashSeedFor("tenant:acme", "")
                                            : base::DefaultPageHashSeed();
  for (auto _ : state) benchmark::DoNotOptimize(base::ChainedPageHashes(tokens, 16, {}, seed));
  state.SetItemsProcessed(state.iterations() * state.range(0) / 16);  // pages
}
BENCHMARK(BM_PageHashes)->Args({131072, 0})->Args({131072, 1})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace swaserve

BENCHMARK_MAIN();
