// SimWorker: a TIMING SIMULATOR of the worker protocol, for benchmarks only
//. It serves swaserve.v1.Decode and
// swaserve.v1.Prefill as a real worker of role `both` does on the wire —
// Decode answers `accepted`, waits for its transfer id's commit, then
// streams tokens and a last chunk with usage; Prefill "computes" for
// prompt_tokens / prefill_tokens_per_second, commits the transfer id and
// answers — but it has no model and no KV: the tokens are timestamps
// (SimTokenId), one every `tpot`. It registers in Redis like a worker, so a
// real swaserve-router routes to it.
//
// Thread-safety: thread-safe; gRPC callbacks and one timer thread drive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/cluster/redis_client.h"

namespace swaserve::bench {

struct SimWorkerOptions {
  std::string id = "sim-0";
  std::string model = "tiny";
  // Redis of the cluster to register in (host:port).
  std::string redis;
  // Time per output token; a stream sends max_tokens tokens. Default 1 s.
  absl::Duration tpot = absl::Seconds(1);
  // Simulated prefill speed. Default 100,000 tokens/s.
  double prefill_tokens_per_second = 100000;
};

// The token the simulator emits at steady-clock microsecond `now_us`: its
// emission time modulo 2^17 µs (131 ms), offset into the ordinary part of
// the Qwen3 vocabulary (ids 4096..135167), so that a client can compute
// each token's delivery latency (SimTokenLatencyUs) without a side channel.
uint32_t SimTokenId(int64_t now_us);
// The delivery latency of `token` received at `now_us` (valid below 131 ms).
int64_t SimTokenLatencyUs(uint32_t token, int64_t now_us);
int64_t SteadyMicros();

class SimWorker {
 public:
  static absl::StatusOr<std::unique_ptr<SimWorker>> Start(const SimWorkerOptions& options);
  ~SimWorker();
  std::string grpc_address() const;
  // Streams open now, and tokens sent so far.
  int64_t open_streams() const;
  int64_t tokens_sent() const;

 private:
  struct Impl;
  explicit SimWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace swaserve::bench
