// Attribution of a request's missed prompt tokens to exactly one cause each,
// for replays and simulations of session traffic (agent_trace.h).
//
// A request of `prompt` tokens hit `hit` of them (tokens not computed). The
// caller measures, at the request's routing and start:
//   ideal        the longest prefix an infinite cache holding every earlier
//                prompt of the request's scope would have matched (full KV,
//                capped like a real match at prompt - 1, whole pages);
//   anywhere     the deepest full-KV match over every worker of the cluster
//                (all buckets, L1 + L2);
//   in_bucket    the same over the workers of the request's length bucket;
//   chosen       the full-KV match on the worker the request ran on, when it
//                started (after any L3 fetch);
// and the causes telescope down that chain (each value clamped into the
// range the one above leaves, so every cause is >= 0 and they sum to
// prompt - hit exactly):
//   cold          prompt - ideal: never seen in the scope;
//   evicted       ideal - anywhere: gone from every tier of every worker
//                 (capacity eviction);
//   bucket        anywhere - in_bucket: held only by another bucket's worker
//                 (the session crossed a bucket bound);
//   routing       in_bucket - chosen: the router picked a worker with less;
//   window        chosen - hit: full KV matched but not usable as is (the
//                 window-safe rule, a lost SWA window, or a window restore's
//                 recomputed stretch).
// Pure functions: thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>

namespace swaserve::loadgen {

struct MissChain {
  int64_t prompt = 0;
  int64_t ideal = 0;
  int64_t anywhere = 0;
  int64_t in_bucket = 0;
  int64_t chosen = 0;
  int64_t hit = 0;
};

struct MissCauses {
  int64_t cold = 0;
  int64_t evicted = 0;
  int64_t bucket = 0;
  int64_t routing = 0;
  int64_t window = 0;

  int64_t Total() const { return cold + evicted + bucket + routing + window; }
  MissCauses& operator+=(const MissCauses& o) {
    cold += o.cold;
    evicted += o.evicted;
    bucket += o.bucket;
    routing += o.routing;
    window += o.window;
    return *this;
  }
};

// The causes of chain.prompt - chain.hit missed tokens (see above). `hit` is
// clamped into [0, prompt]; a level above `ideal` (a cache can hold no more
// than the scope's earlier prompts, so that means a caller's bug) is clamped
// to it. The hit and the chosen worker's match bound the levels from below:
// a level is at least the chosen match, which is at least the hit.
inline MissCauses AttributeMisses(const MissChain& c) {
  const int64_t prompt = std::max<int64_t>(0, c.prompt);
  const int64_t hit = std::clamp<int64_t>(c.hit, 0, prompt);
  const int64_t ideal = std::clamp<int64_t>(c.ideal, hit, prompt);
  const int64_t chosen = std::clamp<int64_t>(c.chosen, hit, ideal);
  const int64_t anywhere = std::clamp<int64_t>(c.anywhere, chosen, ideal);
  const int64_t in_bucket = std::clamp<int64_t>(c.in_bucket, chosen, anywhere);
  return MissCauses{.cold = prompt - ideal,
                    .evicted = ideal - anywhere,
                    .bucket = anywhere - in_bucket,
                    .routing = in_bucket - chosen,
                    .window = chosen - hit};
}

}  // namespace swaserve::loadgen
