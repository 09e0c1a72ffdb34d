// Helpers of the whole-cluster tests: deterministic prompts and a gRPC
// Generate call that collects the stream.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "lib/loadgen/replay.h"
#include "swaserve/v1/router.grpc.pb.h"

namespace swaserve::e2e {

// Runs `command` (a shell command line; stderr joins stdout) and parses what
// it printed as one JSON value; {"error": ...} when it exits non-zero or
// prints something else (the official-client scripts of tests/e2e).
inline nlohmann::json RunJsonCommand(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return nlohmann::json{{"error", "popen failed"}};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int rc = pclose(p);
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (rc != 0 || j.is_discarded()) {
    return nlohmann::json{{"error", "rc " + std::to_string(rc) + ": " + out}};
  }
  return j;
}

inline std::vector<uint32_t> RandomPrompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> ids(n);
  for (uint32_t& t : ids) t = 100 + rng() % 50000;
  return ids;
}

struct GrpcResult {
  grpc::Status status;
  std::vector<uint32_t> tokens;
  std::string text;
  v1::Usage usage;
  double seconds = 0;  // request start to stream end
};

// Sends `g` and collects its stream; `on_tokens` gets the token count after
// each message.
inline GrpcResult Generate(v1::Router::Stub& stub, const v1::GenerateRequest& g,
                           std::function<void(int)> on_tokens = nullptr,
                           int deadline_seconds = 120) {
  GrpcResult r;
  const auto t0 = std::chrono::steady_clock::now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(deadline_seconds));
  auto stream = stub.Generate(&ctx, g);
  v1::GenerateResponse resp;
  while (stream->Read(&resp)) {
    r.tokens.insert(r.tokens.end(), resp.token_ids().begin(),
                    resp.token_ids().end());
    r.text += resp.text();
    if (resp.has_usage()) r.usage = resp.usage();
    if (on_tokens) on_tokens(static_cast<int>(r.tokens.size()));
  }
  r.status = stream->Finish();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Greedy, ignore_eos, token ids in (model "tiny": the local cluster's name).
inline GrpcResult GenerateIds(v1::Router::Stub& stub,
                              const std::vector<uint32_t>& prompt,
                              int max_tokens,
                              std::function<void(int)> on_tokens = nullptr,
                              int deadline_seconds = 120) {
  v1::GenerateRequest g;
  g.set_model("tiny");
  g.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  g.mutable_sampling()->set_max_tokens(max_tokens);
  g.mutable_sampling()->set_ignore_eos(true);
  return Generate(stub, g, std::move(on_tokens), deadline_seconds);
}

// The e2e replay of the shared conversation trace, scaled for the tiny
// model on this CPU: 512-token blocks become 8 tokens, as fast as the
// concurrency allows, at most 16 output tokens, continuations rebuilt.
inline loadgen::ReplayOptions TraceReplayOptions(const std::string& router_address) {
  loadgen::ReplayOptions ro;
  ro.router = router_address;
  ro.concurrency = 16;
  ro.scale.length_scale = 1.0 / 64;
  ro.scale.time_scale = 0;
  ro.scale.max_output_tokens = 16;
  ro.vocab_size = 50000;
  ro.first_token_id = 100;
  ro.reconstruct_continuations = true;
  ro.model = "tiny";
  ro.request_deadline = absl::Seconds(120);
  return ro;
}

inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// One row of bench/RESULTS.md's fault table: the same requests without
// (`ref`) and with the fault (`got`), matched by index.
inline void PrintFaultRow(const std::string& fault, const std::vector<GrpcResult>& ref,
                          const std::vector<GrpcResult>& got) {
  int completed = 0, identical = 0;
  std::vector<double> added;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].status.ok()) continue;
    ++completed;
    if (i < ref.size() && ref[i].status.ok()) {
      identical += got[i].tokens == ref[i].tokens;
      added.push_back(got[i].seconds - ref[i].seconds);
    }
  }
  std::printf("FAULT-ROW | %s | %zu | %d | %d | %.3f s | %.3f s |\n", fault.c_str(), got.size(),
              completed, identical, Quantile(added, 0.5), Quantile(added, 0.99));
}

}  // namespace swaserve::e2e
