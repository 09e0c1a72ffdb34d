// MTP speculative decoding benchmark (bench/RESULTS.md "MTP
// speculative decoding"): the trained demo model (models/demo, 3 MTP
// layers), greedy, through the real PrefillCore → local staging → DecodeCore
// pipeline, MTP off against MTP on (adaptive, and fixed at every layer), at
// batch 1 and 16, for output positions 0–128 and 128–256, on in-domain
// prompts (King James Version passages, the model's training domain, not its
// held-out split) and on random token ids.
//
// Each figure is the second of two identical rounds on one worker (the
// first lets it measure its draft cost and the workload's acceptance, as a
// serving worker has). Per request, decode tokens/s over positions [a, b) is (b − a) / (time of
// token b − 1 − time of token a − 1), token 0 being prefill's; a batch's
// figure is the sum over its concurrently running requests. Acceptance
// length is the mean number of tokens one verify step emitted for the
// request (1 without MTP).
//
// Then the verify step's parts timed alone (profile). A third prompt set runs
// a random-weight model of the tiny shape, whose drafts are almost never
// accepted: the cost of adaptive drafting where drafting does not pay.
//
//   mtp_bench [--model models/demo] [--tokens 256] [--reps 3]
//             [--only kjv|random|tiny-random] [--draft_vocab N] [--profile_only]
//             [--json FILE]
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "lib/base/subprocess.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/metrics/exposition.h"
#include "lib/metrics/registry.h"
#include "lib/model/checkpoint.h"
#include "lib/model/forward.h"
#include "lib/model/tokenizer.h"
#include "lib/worker/decode_core.h"
#include "lib/worker/engine_lock.h"
#include "lib/worker/local_ship.h"
#include "lib/worker/prefill_core.h"

namespace swaserve::worker {
namespace {

// KJV (public domain) openings, one per request.
const char* const kPassages[] = {
    "In the beginning God created the heaven and the earth. And the earth was without form,",
    "And it came to pass, when men began to multiply on the face of the earth, and daughters",
    "Now the LORD had said unto Abram, Get thee out of thy country, and from thy kindred,",
    "And Moses went up from the plains of Moab unto the mountain of Nebo, to the top of",
    "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures:",
    "Blessed is the man that walketh not in the counsel of the ungodly, nor standeth in the",
    "And when the day of Pentecost was fully come, they were all with one accord in one",
    "Then Jesus was led up of the spirit into the wilderness to be tempted of the devil. And",
    "Now after the death of Joshua it came to pass, that the children of Israel asked the",
    "And the word of the LORD came unto Jonah the son of Amittai, saying, Arise, go to",
    "Hear, O Israel: The LORD our God is one LORD: And thou shalt love the LORD thy God",
    "And there was a man in the land of Uz, whose name was Job; and that man was perfect",
    "Comfort ye, comfort ye my people, saith your God. Speak ye comfortably to Jerusalem,",
    "And he opened his mouth, and taught them, saying, Blessed are the poor in spirit: for",
    "Paul, an apostle of Jesus Christ by the will of God, to the saints which are at",
    "And I saw a new heaven and a new earth: for the first heaven and the first earth were",
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Trace {
  std::vector<double> t;      // emission time of each token (0 = prefill's)
  std::vector<int> per_event; // tokens of each decode event
  std::vector<int> event_pos; // index of its first token
  bool done = false;
};

struct RangeFigures {
  double tokens_per_s = 0;
  double acceptance_length = 0;
};

struct RunFigures {
  RangeFigures early, late;  // [0, 128) and [128, 256)
  double mean_acceptance_all = 0;
};

RangeFigures Range(const std::vector<Trace>& traces, int a, int b) {
  RangeFigures f;
  double events = 0, tokens = 0;
  for (const Trace& tr : traces) {
    if (static_cast<int>(tr.t.size()) <= b) continue;
    const double lo = tr.t[std::max(0, a)], hi = tr.t[b];
    if (hi > lo) f.tokens_per_s += (b - a) / (hi - lo);
    for (size_t e = 0; e < tr.event_pos.size(); ++e) {
      if (tr.event_pos[e] > a && tr.event_pos[e] <= b) {
        events += 1;
        tokens += tr.per_event[e];
      }
    }
  }
  f.acceptance_length = events > 0 ? tokens / events : 0;
  return f;
}

RunFigures RunOnce(EngineLock& engine, const std::vector<std::vector<uint32_t>>& prompts,
                   int tokens, MtpOptions mtp) {
  const kv::KvShape shape = engine.config().KvShape(16);
  auto prefill_pools = *kv::KvPools::Create({shape, 2048, 2048, true});
  auto decode_pools = *kv::KvPools::Create({shape, 4096, 4096, true});
  DecodeCoreOptions d;
  d.engine = &engine;
  d.pools = decode_pools.get();
  d.max_batch_size = 64;
  d.mtp = mtp;
  metrics::Registry registry;
  d.registry = &registry;
  auto decode = *DecodeCore::Create(d);
  PrefillCoreOptions p;
  p.engine = &engine;
  p.pools = prefill_pools.get();
  auto prefill = *PrefillCore::Create(p);
  absl::Mutex mu;
  std::vector<Trace> traces(prompts.size());
  int finished = 0;
  // Twice: a warm-up round (the worker learns its draft cost and the
  // workload's acceptance, as a serving worker has), then the measured one.
  for (int round = 0; round < 2; ++round) {
    {
      absl::MutexLock lock(&mu);
      traces.assign(prompts.size(), Trace());
      finished = 0;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      LocalDecodeParams ld;
      ld.id = absl::StrCat("r", round, "-", i);
      ld.prompt = prompts[i];
      ld.stop.max_tokens = tokens + 1;
      ld.mtp_lookback = engine.config().num_mtp_layers;
      ld.sink = [&, i](const TokenEvent& e) {
        const double now = Now();
        absl::MutexLock lock(&mu);
        Trace& tr = traces[i];
        if (!e.tokens.empty()) {
          if (!tr.t.empty()) {
            tr.per_event.push_back(static_cast<int>(e.tokens.size()));
            tr.event_pos.push_back(static_cast<int>(tr.t.size()));
          }
          for (size_t k = 0; k < e.tokens.size(); ++k) tr.t.push_back(now);
        }
        if (e.finish != FinishReason::kNone) {
          if (!e.error.ok()) std::fprintf(stderr, "request %zu: %s\n", i, e.error.ToString().c_str());
          tr.done = true;
          ++finished;
        }
      };
      PrefillJob j;
      j.id = ld.id;
      j.prompt = prompts[i];
      j.ship = MakeLocalShip(decode.get(), prefill_pools.get(), std::move(ld));
      j.done = [](absl::StatusOr<PrefillResult>) {};
      if (!prefill->Submit(std::move(j)).ok()) std::exit(1);
    }
    absl::MutexLock lock(&mu);
    const int n = static_cast<int>(prompts.size());
    auto all_done = [&] { return finished >= n; };
    mu.Await(absl::Condition(&all_done));
  }
  prefill->Stop();
  decode->Stop();
  RunFigures f;
  if (getenv("MTP_BENCH_STEP_TIMES") != nullptr) {  // where a run's time went
    for (const metrics::FamilySnapshot& fam : registry.Collect()) {
      if (fam.type != metrics::MetricType::kHistogram || fam.metrics.empty()) continue;
      if (fam.name.find("seconds") == std::string::npos) continue;
      const auto& h = fam.metrics[0].histogram;
      if (h.count == 0) continue;
      std::printf("    %s: %ld, mean %.1f us\n", fam.name.c_str(), (long)h.count, h.sum / h.count * 1e6);
    }
  }
  f.early = Range(traces, 0, 128);
  f.late = Range(traces, 128, std::min(256, tokens));
  const DecodeLoad l = decode->GetLoad();
  f.mean_acceptance_all =
      l.mtp_steps_total > 0
          ? 1.0 + static_cast<double>(l.mtp_accepted_total) / l.mtp_steps_total
          : 1.0;
  return f;
}

// Where a verify step's time goes at batch 1: the engine calls of one step
// timed alone (median of many), after a 64-token prompt.
void Profile(EngineLock& engine, nlohmann::json* out) {
  const model::ModelConfig& c = engine.config();
  const kv::KvShape shape = c.KvShape(16);
  auto pools = *kv::KvPools::Create({shape, 256, 256, true});
  kv::Sequence seq(kv::SequenceOptions{.pools = pools.get()});
  std::vector<uint32_t> prompt;
  for (int i = 0; i < 64; ++i) prompt.push_back(100 + i);
  model::ForwardOutput o;
  if (!seq.Append(64 + 8).ok()) std::exit(1);
  model::ForwardItem item{.seq = &seq, .tokens = prompt};
  if (!engine.Forward({&item, 1}, &o, true).ok()) std::exit(1);
  auto median = [](auto&& fn) {
    std::vector<double> v;
    for (int r = 0; r < 200; ++r) {
      const double t0 = Now();
      fn();
      v.push_back(Now() - t0);
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("\nverify-step profile (batch 1, median of 200 calls, microseconds):\n");
  std::vector<uint32_t> toks = {5, 6, 7, 8, 9};
  for (int n : {1, 2, 3, 4}) {
    model::ForwardItem it{.seq = &seq, .tokens = absl::MakeConstSpan(toks).first(n), .start = 64,
                          .all_logits = n > 1};
    const double s = median([&] { (void)engine.Forward({&it, 1}, &o, true); });
    std::printf("  main forward, %d token(s) (all logits): %8.1f\n", n, s * 1e6);
    out->push_back({{"call", "forward"}, {"tokens", n}, {"us", s * 1e6}});
  }
  std::vector<float> hidden(static_cast<size_t>(8) * c.hidden_size, 0.1f);
  for (int n : {1, 2, 4}) {
    for (bool logits : {true, false}) {
      model::ForwardItem it{.seq = &seq, .tokens = absl::MakeConstSpan(toks).first(n),
                            .start = 60, .no_logits = !logits};
      const double s = median([&] {
        (void)engine.ForwardMtp(0, {&it, 1},
                                absl::MakeConstSpan(hidden).first(static_cast<size_t>(n) *
                                                                  c.hidden_size),
                                &o);
      });
      std::printf("  one MTP layer, %d position(s), %s: %8.1f\n", n,
                  logits ? "draft logits" : "no logits", s * 1e6);
      out->push_back({{"call", "mtp_layer"}, {"positions", n}, {"logits", logits}, {"us", s * 1e6}});
    }
  }
  // The same with a draft vocabulary of a quarter of the vocabulary (any
  // ids: the cost does not depend on which).
  const int dv = c.vocab_size / 4;
  if (dv == 0) return;
  std::vector<int32_t> ids(dv);
  for (int i = 0; i < dv; ++i) ids[i] = i;
  auto head = engine.engine().MakeDraftHead(ids);
  if (!head.ok()) std::exit(1);
  for (int n : {1, 4}) {
    model::ForwardItem it{.seq = &seq, .tokens = absl::MakeConstSpan(toks).first(n), .start = 60};
    const double s = median([&] {
      (void)engine.ForwardMtp(
          0, {&it, 1}, absl::MakeConstSpan(hidden).first(static_cast<size_t>(n) * c.hidden_size),
          &o, head->get());
    });
    std::printf("  one MTP layer, %d position(s), draft logits over %d tokens: %8.1f\n", n, dv,
                s * 1e6);
    out->push_back({{"call", "mtp_layer"}, {"positions", n}, {"draft_vocab", dv}, {"us", s * 1e6}});
  }
}

int Main(int argc, char** argv) {
  std::string model_dir = "models/demo", json_path;
  int tokens = 256, reps = 3;
  bool profile_only = false;
  std::string only;  // one prompt set: kjv | random | tiny-random
  int draft_vocab = MtpOptions{}.draft_vocab_tokens;  // MtpOptions::draft_vocab_tokens
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model") model_dir = next();
    else if (a == "--tokens") tokens = std::stoi(next());
    else if (a == "--json") json_path = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--profile_only") profile_only = true;
    else if (a == "--only") only = next();
    else if (a == "--draft_vocab") draft_vocab = std::stoi(next());
    else {
      std::fprintf(stderr,
                   "usage: mtp_bench [--model DIR] [--tokens N] [--reps N] [--only SET] "
                   "[--draft_vocab N (-1 auto, 0 whole vocabulary)] [--profile_only] "
                   "[--json FILE]\n");
      return 2;
    }
  }
  auto engine_or = model::Engine::Create({.checkpoint_dir = model_dir});
  if (!engine_or.ok()) {
    std::fprintf(stderr, "%s\n", engine_or.status().ToString().c_str());
    return 1;
  }
  EngineLock engine(engine_or->get());
  auto tok = model::Tokenizer::Load(model_dir + "/tokenizer.json");
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::vector<std::vector<uint32_t>> kjv, random;
  std::mt19937 rng(7);
  for (const char* p : kPassages) {
    auto ids = (*tok)->Encode(p);
    if (!ids.ok()) return 1;
    kjv.push_back(*ids);
    std::vector<uint32_t> r;
    for (size_t k = 0; k < kjv.back().size(); ++k) r.push_back(rng() % 4000);
    random.push_back(r);
  }
  // Text where drafts are (almost) never accepted: a random-weight model of
  // the tiny shape (2 MTP layers), random prompts.
  const std::string tiny_dir = *base::MakeTempDir("mtp-bench-tiny");
  if (!model::WriteRandomCheckpoint(*model::BuiltinConfig("tiny", 4096), 3, tiny_dir).ok()) {
    return 1;
  }
  auto tiny_engine = model::Engine::Create({.checkpoint_dir = tiny_dir});
  if (!tiny_engine.ok()) return 1;
  EngineLock tiny(tiny_engine->get());
  std::vector<std::vector<uint32_t>> tiny_prompts = random;
  MtpOptions off;
  off.draft_tokens = 0;
  MtpOptions adaptive;  // the defaults
  adaptive.draft_vocab_tokens = draft_vocab;
  MtpOptions fixed = adaptive;
  fixed.adaptive = false;
  nlohmann::json out = nlohmann::json::array();
  std::printf("%-8s %-6s %-9s %10s %10s %12s %12s %8s %8s\n", "prompts", "batch", "mtp",
              "acc 0-128", "acc 128-", "tok/s 0-128", "tok/s 128-", "x 0-128", "x 128-");
  struct Set {
    const char* name;
    EngineLock* engine;
    std::vector<std::vector<uint32_t>>* prompts;
  };
  for (const Set& set : {Set{"kjv", &engine, &kjv}, Set{"random", &engine, &random},
                         Set{"tiny-random", &tiny, &tiny_prompts}}) {
    if (profile_only) break;
    if (!only.empty() && only != set.name) continue;
    const char* name = set.name;
    EngineLock* engine = set.engine;
    for (int batch : {1, 16}) {
      std::vector<std::vector<uint32_t>> prompts(set.prompts->begin(),
                                                 set.prompts->begin() + batch);
      // Modes interleaved, `reps` rounds; each figure is the median round
      // (this VM's speed drifts by tens of percent between runs).
      const std::vector<std::pair<const char*, MtpOptions>> modes = {
          {"off", off}, {"adaptive", adaptive}, {"fixed", fixed}};
      std::vector<std::vector<RunFigures>> runs(modes.size());
      for (int rep = 0; rep < reps; ++rep) {
        for (size_t m = 0; m < modes.size(); ++m) {
          runs[m].push_back(RunOnce(*engine, prompts, tokens, modes[m].second));
        }
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      std::vector<RunFigures> med(modes.size());
      for (size_t m = 0; m < modes.size(); ++m) {
        std::vector<double> a, b, c, d;
        for (const RunFigures& f : runs[m]) {
          a.push_back(f.early.tokens_per_s);
          b.push_back(f.late.tokens_per_s);
          c.push_back(f.early.acceptance_length);
          d.push_back(f.late.acceptance_length);
        }
        med[m].early = {median(a), median(c)};
        med[m].late = {median(b), median(d)};
      }
      const RunFigures base = med[0];
      for (size_t m = 0; m < modes.size(); ++m) {
        const char* mode = modes[m].first;
        const RunFigures& f = med[m];
        const double x0 = f.early.tokens_per_s / base.early.tokens_per_s;
        const double x1 = f.late.tokens_per_s / base.late.tokens_per_s;
        std::printf("%-8s %-6d %-9s %10.2f %10.2f %12.1f %12.1f %8.2f %8.2f\n", name, batch, mode,
                    f.early.acceptance_length, f.late.acceptance_length, f.early.tokens_per_s,
                    f.late.tokens_per_s, x0, x1);
        std::fflush(stdout);
        out.push_back({{"prompts", name}, {"batch", batch}, {"mtp", mode},
                       {"acceptance_length_0_128", f.early.acceptance_length},
                       {"acceptance_length_128_256", f.late.acceptance_length},
                       {"tokens_per_s_0_128", f.early.tokens_per_s},
                       {"tokens_per_s_128_256", f.late.tokens_per_s},
                       {"speedup_0_128", x0}, {"speedup_128_256", x1}});
      }
    }
  }
  nlohmann::json profile = nlohmann::json::array();
  Profile(engine, &profile);
  std::filesystem::remove_all(tiny_dir);
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"runs", out}, {"profile", profile}}.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace swaserve::worker

int main(int argc, char** argv) { return swaserve::worker::Main(argc, argv); }
