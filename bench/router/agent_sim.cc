// Coding-agent sessions on a production-sized cluster: a deterministic
// discrete-event SIMULATION (not a cluster measurement) of the prefill side
// replaying the data input ../shared/traces/agents/coding_agent_sessions.jsonl.gz
// (outside the repository; format: docs/benchmarks.md#traces; loaded with loadgen::LoadAgentTrace, prompts by
// loadgen::AgentPromptSynthesizer with continuations reconstructed).
//
// Cluster (flags; defaults in Flags below):
//   - length buckets 64K / 256K / 1M (router::PolicyOptions defaults), one
//     group of prefill instances per bucket, --instances per bucket
//     (default 1,8,3: 12 instances split by the trace's prompt tokens per
//     bucket, 8% / 67% / 25%);
//   - an instance is --gpus H200s (default 16: two 8-GPU nodes) holding one
//     copy of MiMo-V2.5-Pro (1.02T parameters in FP8: --weights-gb 1020);
//     its KV budget (L1) is gpus x (--hbm-gb 141 - weights/gpus -
//     --reserve-gb 10 of activations and runtime);
//   - each instance is a REAL kv::PrefixCache over metadata-only pools of
//     the MiMo-V2.5-Pro shape (kv::KvShape::MiMoV25Pro: 10 full + 60 SWA
//     layers, 8 KV heads, K 192 / V 128, BF16, W 128, page 16), dual pools
//     split by SizePools at SWA/full ratio 0.02, window restore on (as a
//     pyramid, from the window-safe hit when inside the stretch) and SWA
//     checkpoints every 2048 tokens, as the prefill worker runs by default; L2
//     (--l2-gb of host memory per instance, ratio 0.02) with a load-back before
//     every lookup; L3
//     (--l3-gb of NVMe per instance, a MemoryPageStore of metadata blobs)
//     fetched and attached before the load-back; by default ONE L3 shared
//     by every instance (deploy/k8s's shared-l3 component, `swaserve up`'s
//     l3_redis_mib) of all their bytes, each instance but the last bucket's
//     writing a prompt through to it at 0.75 of its bucket's bound
//     (--l3-near-bound, as `swaserve up` does); --l3-shared=false: one each;
//   - one request at a time per instance, FIFO queue; its hit is the
//     window-safe hit (a restored hit: M minus the pyramid's work) when it
//     starts; its pages go into the cache when its prefill ends.
// Prefill cost model (TTFT = queue wait + load-back copies + compute):
//   FLOPs(tokens h..len) = 2 * 42e9 * n                  (active parameters,
//                                                         model card: 42B)
//     + 10 * 128 * 2 * (192 + 128) * (len^2 - h^2) / 2   (full-attention
//                                                         layers, 128 q heads)
//     + 60 * 128 * 2 * (192 + 128) * 128 * n             (SWA layers, W 128)
//   with n = len - h, at gpus x --peak-tflops 1979 (H200 SXM FP8 dense,
//   NVIDIA's datasheet) x --mfu 0.4 (an assumption, not a measurement);
//   L2 load-back at --pcie-gbs 50 per GPU, L3 at --nvme-gbs 25 per instance.
//   Decode and the KV transfer are not simulated.
// Variants: defaults (dual + restore + L2 + L3, router::ChoosePrefill with
// PolicyOptions defaults and the SWA-aware credit as policy_sim --swa-study
// computes it, L2 tokens at lower_tier_credit); single (one pool of the same
// L1 bytes: the same classes with W past the longest prompt, SizePools
// ratio 1.0; the same L2 bytes; L3 of the same bytes); single-l1 and l1
// (no tiers); round-robin, least-load, sglang (policy_sim's model of SGLang's
// cache-aware policy) and dynamo (Dynamo's KV router cost with its default
// overlap weight 1 and temperature 0: new prefill blocks + the worker's
// active blocks, the prompt blocks of its running and queued requests) over
// the default cache; carry and l1-carry, a what-if the router and workers do
// not implement (a worker refuses a prompt above its bucket): defaults and
// l1 where a prompt may also go to an instance of the next lower bucket
// holding at least half of it.
// Sessions: the top-level sessions start evenly over a span such that
// --concurrency run at once on average (loadgen::ScheduleAgentSessions,
// order shuffled with --seed); sub-agents run on their parent's clock.
// Halves: a top-level session is in the held-out half when Mix64(its index
// + 1) is odd (fixed before any tuning); --half tune|heldout|all picks the
// sessions run, and every run also reports each half's figures apart.
// Miss attribution: loadgen::AttributeMisses per request (miss_attribution.h)
// with the ideal from an infinite per-scope cache of earlier prompts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "bench/common/bench_util.h"
#include "bench/common/prompt_synth.h"
#include "bench/common/swa_pattern.h"
#include "bench/common/window_restore_plan.h"
#include "lib/base/hash.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/l3_prefetch.h"
#include "lib/kv/memory_page_store.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/prefix_cache.h"
#include "lib/kv/sequence.h"
#include "lib/loadgen/agent_trace.h"
#include "lib/loadgen/miss_attribution.h"
#include "lib/router/policy.h"
#include "nlohmann/json.hpp"

namespace swaserve::router {
namespace {

using bench::Die;
using bench::Mix64;
using bench::Percentile;
constexpr int kChunk = 4096;
constexpr double kGB = 1e9;

struct Flags {
  std::string trace = "../shared/traces/agents/coding_agent_sessions.jsonl.gz";
  std::string json;
  int64_t sessions = 0;  // top-level sessions (0 = all)
  double concurrency = 200;
  uint64_t seed = 1;
  std::string half = "all";
  std::vector<int> instances = {1, 8, 3};
  int gpus = 16;
  double hbm_gb = 141, weights_gb = 1020, reserve_gb = 10;
  double l2_gb = 2000, l3_gb = 30000;
  double peak_tflops = 1979, mfu = 0.4, pcie_gbs = 50, nvme_gbs = 25;
  double ratio = 0.02;
  // One L3 store shared by every prefill instance (deploy/k8s's shared-l3
  // component; its bytes: l3_gb x instances) instead of one per instance.
  bool l3_shared = true;
  // kv.l3_write_through_near_bound of every instance but the last bucket's
  // (fraction of its bucket's upper bound; 0: off). Default 0.75, what
  // `swaserve up` gives its workers with the shared L3
  // (launch::ClusterSpec::l3_write_through_near_bound).
  double l3_near_bound = 0.75;
  // KV bytes (L1) per GPU; 0: hbm - weights / gpus - reserve.
  double kv_gb = 0;
  // Tenants (the router's cache domains): top-level session s and its
  // sub-agents belong to tenant s mod N, whose page hashes are seeded
  // apart (base::PageHashSeedFor), as the router does per tenant. 0: one
  // shared domain.
  int64_t tenants = 0;
  std::vector<std::string> variants = {"defaults",  "single",      "l1",
                                       "single-l1", "round-robin", "least-load",
                                       "sglang",    "dynamo"};
};

enum class Policy { kOurs, kRoundRobin, kLeastLoad, kSglang, kDynamo };

struct Variant {
  std::string name;
  bool single = false;
  bool tiers = true;
  Policy policy = Policy::kOurs;
  // A what-if the router and workers do not implement: a prompt may also go
  // to an instance of the next lower bucket that holds at least half of it.
  bool carry = false;
};

Variant MakeVariant(const std::string& name) {
  Variant v{.name = name};
  if (name == "defaults") return v;
  if (name == "single") return v.single = true, v;
  if (name == "l1") return v.tiers = false, v;
  if (name == "single-l1") return v.single = true, v.tiers = false, v;
  if (name == "l1-carry") return v.tiers = false, v.carry = true, v;
  if (name == "carry") return v.carry = true, v;
  if (name == "round-robin") return v.policy = Policy::kRoundRobin, v;
  if (name == "least-load") return v.policy = Policy::kLeastLoad, v;
  if (name == "sglang") return v.policy = Policy::kSglang, v;
  if (name == "dynamo") return v.policy = Policy::kDynamo, v;
  Die("unknown variant " + name);
  return v;
}

double KvGbPerGpu(const Flags& f) {
  return f.kv_gb > 0 ? f.kv_gb
                     : f.hbm_gb - f.weights_gb / f.gpus - f.reserve_gb;
}

bool HeldOut(int64_t scope) {
  return (Mix64(static_cast<uint64_t>(scope) + 1) & 1) != 0;
}

// Seconds of prefill compute for tokens [h, len) on one instance.
double PrefillSeconds(const Flags& f, int64_t h, int64_t len) {
  const double n = static_cast<double>(len - h);
  if (n <= 0) return 0;
  const double attn =
      2.0 * (192 + 128) * 128;  // per (query, key) pair and layer
  const double flops = 2 * 42e9 * n +
                       10 * attn * (double(len) * len - double(h) * h) / 2 +
                       60 * attn * 128 * n;
  return flops / (f.gpus * f.peak_tflops * 1e12 * f.mfu);
}

struct Req {
  int64_t session = 0, request = 0, scope = 0;
  double arrival = 0;
  int len = 0;
  int bucket = 0;
  std::vector<uint64_t> hashes;
  loadgen::MissChain chain;
  double extra_s = 0;  // load-back copies
  double ttft = -1;
  int64_t hit = 0;
  loadgen::MissCauses causes;
  int64_t restore_work = 0;  // of the window cause: a window restore's work
};

struct Instance {
  std::unique_ptr<kv::KvPools> pools, l2;
  std::unique_ptr<kv::MemoryPageStore> l3;  // its own L3 (not shared)
  kv::PageStore* store = nullptr;           // the L3 it uses
  std::unique_ptr<kv::PrefixCache> cache;
  std::deque<size_t> queue;
  int64_t queued_uncached = 0;  // router estimates
  int64_t active_tokens = 0;    // prompt tokens of queued + running
  bool busy = false;
  size_t running = 0;
  double end = 0;
  std::unique_ptr<kv::Sequence> seq;
};

struct Summary {
  int64_t requests = 0, prompt = 0, hit = 0;
  loadgen::MissCauses causes;
  std::vector<double> ttft;
  int64_t ideal_prompt = 0,
          ideal_hit = 0;  // top-level requests: the infinite cache
  int64_t restores = 0, restore_work = 0;
  void Add(const Req& r) {
    restores += r.restore_work > 0;
    restore_work += r.restore_work;
    ++requests;
    prompt += r.len;
    hit += r.hit;
    causes += r.causes;
    ttft.push_back(r.ttft);
  }
  nlohmann::json Json() const {
    const double p = prompt > 0 ? double(prompt) : 1;
    return {{"requests", requests},
            {"prompt_tokens", prompt},
            {"cached_tokens", hit},
            {"hit_rate", hit / p},
            {"prefill_tokens_computed", prompt - hit},
            {"ttft_p50_s", Percentile(ttft, 0.5)},
            {"ttft_p90_s", Percentile(ttft, 0.9)},
            {"ttft_p99_s", Percentile(ttft, 0.99)},
            {"miss_cold", causes.cold},
            {"miss_evicted", causes.evicted},
            {"miss_bucket", causes.bucket},
            {"miss_routing", causes.routing},
            {"miss_window", causes.window},
            {"window_restores", restores},
            {"window_restore_work_tokens", restore_work}};
  }
};

class Sim {
 public:
  Sim(const Flags& f, const Variant& v,
      const std::vector<loadgen::AgentSession>& sessions,
      const loadgen::AgentSchedule& sched)
      : f_(f), v_(v), sessions_(sessions), sched_(sched) {
    shape_ = kv::KvShape::MiMoV25Pro();
    const double kv_bytes = f.gpus * KvGbPerGpu(f) * kGB;
    if (kv_bytes <= 0) Die("no HBM left for KV");
    if (v.single)
      shape_.sliding_window =
          1 << 21;  // past any prompt: every token keeps all layers
    swa_pattern_ = bench::SwaPattern(shape_);
    const double ratio = v.single ? 1.0 : f.ratio;
    auto l1 = kv::SizePools(shape_, static_cast<int64_t>(kv_bytes), ratio);
    if (!l1.ok()) Die(std::string(l1.status().message()));
    auto l2 = kv::SizePools(shape_, static_cast<int64_t>(f.l2_gb * kGB), ratio);
    if (!l2.ok()) Die(std::string(l2.status().message()));
    l1_tokens_ = l1->full_pages * shape_.page_size;
    // L3 blobs: a full page each (the dual shape's SWA windows are a few
    // pages per prompt); the single shape stores both halves of every page.
    const double blob =
        v.single
            ? double(shape_.Full().PageBytes() + shape_.Swa().PageBytes()) / 2
            : double(shape_.Full().PageBytes());
    int total_instances = 0;
    for (int n : f.instances) total_instances += n;
    const int64_t l3_blobs = static_cast<int64_t>(
        f.l3_gb * kGB * (f.l3_shared ? total_instances : 1) / blob);
    if (v.tiers && f.l3_shared) {
      shared_l3_ = std::make_unique<kv::MemoryPageStore>(
          l3_blobs * kv::MemoryPageStore::kEntryOverhead);
    }
    page_bytes_ = double(shape_.Full().PageBytes()) +
                  (v.single ? shape_.Swa().PageBytes() : 0);
    for (int b = 0; b < static_cast<int>(f.instances.size()); ++b) {
      for (int k = 0; k < f.instances[b]; ++k) {
        Instance in;
        kv::KvPoolsOptions po{.shape = shape_,
                              .full_pages = l1->full_pages,
                              .swa_pages = l1->swa_pages,
                              .allocate_memory = false};
        in.pools = Value(kv::KvPools::Create(po));
        kv::PrefixCacheOptions co;
        co.pools = in.pools.get();
        if (v.tiers) {
          po.full_pages = l2->full_pages;
          po.swa_pages = l2->swa_pages;
          in.l2 = Value(kv::KvPools::Create(po));
          if (shared_l3_ == nullptr) {
            in.l3 = std::make_unique<kv::MemoryPageStore>(
                l3_blobs * kv::MemoryPageStore::kEntryOverhead);
          }
          in.store = shared_l3_ != nullptr ? shared_l3_.get() : in.l3.get();
          co.l2 = in.l2.get();
          co.l3 = in.store;
          if (f.l3_near_bound > 0 &&
              b + 1 < static_cast<int>(f.instances.size())) {
            co.l3_write_through_from_tokens = static_cast<int>(std::ceil(
                f.l3_near_bound * double(PolicyOptions{}.bucket_bounds[b])));
          }
        }
        co.keep_restorable_tombstones = true;
        co.cold_superseded_windows = true;
        in.cache = Value(kv::PrefixCache::Create(co));
        bucket_of_.push_back(b);
        instances_.push_back(std::move(in));
      }
    }
    restore_work_ = kv::WindowRestoreWorkPerRestore(
        shape_.sliding_window, shape_.page_size, swa_pattern_, 0);
  }

  nlohmann::json Setup() const {
    return {{"l1_full_tokens_per_instance", l1_tokens_},
            {"instances", f_.instances},
            {"gpus_per_instance", f_.gpus},
            {"l1_gb_per_instance", f_.gpus * KvGbPerGpu(f_)},
            {"l2_gb_per_instance", v_.tiers ? f_.l2_gb : 0},
            {"l3_gb_per_instance", v_.tiers ? f_.l3_gb : 0},
            {"l3_shared", f_.l3_shared},
            {"l3_write_through_near_bound", f_.l3_near_bound}};
  }

  // Runs every arrival of sessions kept by `keep`; fills reqs_.
  void Run(const std::vector<bool>& keep);
  const std::vector<Req>& requests() const { return reqs_; }

 private:
  template <typename T>
  static T Value(absl::StatusOr<T> v) {
    if (!v.ok()) Die(std::string(v.status().message()));
    return *std::move(v);
  }
  void Arrive(Req& r);
  int Pick(const Req& r, const std::vector<int>& cands,
           const std::vector<int64_t>& depth,
           const std::vector<kv::MatchLengths>& ml);
  void Start(Instance& in, double t);
  void Finish(Instance& in, double t);

  const Flags& f_;
  const Variant v_;
  const std::vector<loadgen::AgentSession>& sessions_;
  const loadgen::AgentSchedule& sched_;
  kv::KvShape shape_;
  std::vector<bool> swa_pattern_;
  int64_t l1_tokens_ = 0;
  double page_bytes_ = 0;
  int64_t restore_work_ = 0;
  std::unique_ptr<kv::MemoryPageStore>
      shared_l3_;  // before instances_: outlives their caches
  std::vector<Instance> instances_;
  std::vector<int> bucket_of_;
  std::vector<Req> reqs_;
  std::vector<int64_t> rr_;
  absl::flat_hash_map<int64_t, absl::flat_hash_set<uint64_t>>
      seen_;                                    // per scope
  absl::flat_hash_map<int64_t, int64_t> left_;  // requests left per scope
  std::unique_ptr<loadgen::AgentPromptSynthesizer> synth_;
  std::vector<int64_t> estimate_;
};

void Sim::Arrive(Req& r) {
  const loadgen::AgentSession& s = sessions_[r.session];
  std::vector<uint32_t> tokens = synth_->Next(s, r.request);
  if (--left_[r.scope] == 0) synth_->Release(r.scope);
  r.len = static_cast<int>(tokens.size());
  const uint64_t seed =
      f_.tenants > 0
          ? base::PageHashSeedFor(absl::StrCat("tenant:", s.scope % f_.tenants), "")
          : base::DefaultPageHashSeed();
  r.hashes = base::ChainedPageHashes(tokens, shape_.page_size, {}, seed);
  const int ps = shape_.page_size;
  const int64_t cap = std::max(0, (r.len - 1) / ps * ps);
  // The ideal: an infinite cache of the scope's earlier prompts.
  absl::flat_hash_set<uint64_t>& seen = seen_[r.scope];
  int64_t ideal = 0;
  while (ideal < static_cast<int64_t>(r.hashes.size()) &&
         seen.contains(r.hashes[ideal]))
    ++ideal;
  r.chain.prompt = r.len;
  r.chain.ideal = std::min(ideal * ps, cap);
  for (uint64_t h : r.hashes) seen.insert(h);
  const std::vector<int64_t>& bounds = PolicyOptions{}.bucket_bounds;
  r.bucket = static_cast<int>(bounds.size()) - 1;
  for (size_t b = 0; b < bounds.size(); ++b) {
    if (r.len < bounds[b]) {
      r.bucket = static_cast<int>(b);
      break;
    }
  }
  std::vector<int64_t> depth(instances_.size());
  std::vector<kv::MatchLengths> ml(instances_.size());
  std::vector<int> cands;
  for (size_t k = 0; k < instances_.size(); ++k) {
    ml[k] = instances_[k].cache->Match(r.hashes, r.len - 1);
    depth[k] =
        std::min<int64_t>(ml[k].matched_tokens + ml[k].lower_tier_tokens, cap);
    r.chain.anywhere = std::max(r.chain.anywhere, depth[k]);
    if (bucket_of_[k] == r.bucket) {
      cands.push_back(static_cast<int>(k));
      r.chain.in_bucket = std::max(r.chain.in_bucket, depth[k]);
    }
  }
  for (size_t k = 0; v_.carry && k < instances_.size(); ++k) {
    if (bucket_of_[k] + 1 == r.bucket && 2 * depth[k] >= r.len)
      cands.push_back(static_cast<int>(k));
  }
  if (cands.empty()) Die("a bucket without instances");
  const int pick = Pick(r, cands, depth, ml);
  const size_t i = &r - reqs_.data();
  Instance& in = instances_[pick];
  estimate_[i] = r.len - std::min<int64_t>(depth[pick], r.len);
  in.queue.push_back(i);
  in.queued_uncached += estimate_[i];
  in.active_tokens += r.len;
  Start(in, r.arrival);
}

int Sim::Pick(const Req& r, const std::vector<int>& cands,
              const std::vector<int64_t>& depth,
              const std::vector<kv::MatchLengths>& ml) {
  const int ps = shape_.page_size;
  // The running prefill's compute left, in tokens at the short-context rate.
  const double rate = f_.gpus * f_.peak_tflops * 1e12 * f_.mfu / (2 * 42e9);
  auto remaining = [&](const Instance& in, double t) {
    return in.busy ? static_cast<int64_t>((in.end - t) * rate) : 0;
  };
  switch (v_.policy) {
    case Policy::kRoundRobin: {
      rr_.resize(f_.instances.size());
      return cands[rr_[r.bucket]++ % cands.size()];
    }
    case Policy::kLeastLoad: {
      int best = cands[0];
      for (int k : cands) {
        if (instances_[k].queued_uncached +
                remaining(instances_[k], r.arrival) <
            instances_[best].queued_uncached +
                remaining(instances_[best], r.arrival)) {
          best = k;
        }
      }
      return best;
    }
    case Policy::kDynamo: {
      int best = cands[0];
      double best_cost = std::numeric_limits<double>::max();
      for (int k : cands) {
        const double cost = double(r.len - depth[k]) / ps +
                            double(instances_[k].active_tokens + r.len) / ps;
        if (cost < best_cost) best_cost = cost, best = k;
      }
      return best;
    }
    case Policy::kSglang: {
      auto load = [&](int k) {
        return int64_t{instances_[k].busy ? 1 : 0} +
               static_cast<int64_t>(instances_[k].queue.size());
      };
      int lo = cands[0], hi = cands[0], best = cands[0];
      for (int k : cands) {
        if (load(k) < load(lo)) lo = k;
        if (load(k) > load(hi)) hi = k;
        if (depth[k] > depth[best] ||
            (depth[k] == depth[best] && load(k) < load(best)))
          best = k;
      }
      if (load(hi) - load(lo) > 64 && load(hi) > 1.5 * load(lo)) return lo;
      if (double(depth[best]) / r.len > 0.3) return best;
      int small = cands[0];
      for (int k : cands) {
        if (instances_[k].cache->cached_full_pages() <
            instances_[small].cache->cached_full_pages()) {
          small = k;
        }
      }
      return small;
    }
    case Policy::kOurs:
      break;
  }
  std::vector<PrefillCandidate> pc;
  const PolicyOptions po;
  for (int k : cands) {
    const int64_t l1 = std::min<int64_t>(ml[k].matched_tokens, depth[k]);
    PrefixCreditInputs in{.full_tokens = depth[k],
                          .sliding_window = shape_.sliding_window,
                          .page_size = ps,
                          .swa_chain_layers = shape_.swa_layers,
                          .window_restore = true,
                          .restore_work = restore_work_};
    const int64_t safe = std::min<int64_t>(ml[k].safe_tokens, depth[k]);
    const int64_t scan = WindowScanPages(in, po.window_scan_pages);
    in.window_safe_tokens = safe >= depth[k]                   ? INT64_MAX
                            : safe / ps < depth[k] / ps - scan ? -1
                                                               : safe;
    const int64_t credit =
        TieredCredit(PrefixCredit(in), l1, po.lower_tier_credit);
    pc.push_back(PrefillCandidate{
        .id = "p" + std::to_string(k),
        .cached_tokens = credit,
        .queued_uncached_tokens =
            instances_[k].queued_uncached + remaining(instances_[k], r.arrival),
        .running_requests = instances_[k].busy ? 1 : 0,
        .queued_requests = static_cast<int32_t>(instances_[k].queue.size())});
  }
  auto d = ChoosePrefill(r.len, pc, po,
                         Mix64(static_cast<uint64_t>(&r - reqs_.data()) + 1));
  if (!d.ok()) Die(std::string(d.status().message()));
  return cands[d->index];
}

void Sim::Start(Instance& in, double t) {
  if (in.busy || in.queue.empty()) return;
  const size_t i = in.queue.front();
  in.queue.pop_front();
  in.queued_uncached -= estimate_[i];
  Req& r = reqs_[i];
  const int ps = shape_.page_size;
  kv::MatchOptions mo{.max_tokens = r.len - 1};
  if (in.store != nullptr) {
    const kv::MatchLengths ml = in.cache->Match(r.hashes, mo.max_tokens);
    const kv::L3Fetch fetch = kv::FetchFromL3(
        *in.store, in.cache->l3_fetch_options(),
        absl::MakeConstSpan(r.hashes).subspan(
            0, std::min<size_t>(r.hashes.size(), mo.max_tokens / ps)),
        (ml.matched_tokens + ml.lower_tier_tokens) / ps, ml.safe_tokens / ps);
    const int attached = in.cache->AttachFromL3(r.hashes, fetch);
    r.extra_s += attached * page_bytes_ / (f_.nvme_gbs * kGB);
  }
  if (in.l2 != nullptr) {
    const kv::LoadBackResult lb = in.cache->LoadBack(r.hashes, mo.max_tokens);
    r.extra_s += lb.pages * page_bytes_ / (f_.gpus * f_.pcie_gbs * kGB);
  }
  const bench::RestorePlan plan = bench::PlanWindowRestore(
      *in.cache, r.hashes, shape_, swa_pattern_, /*pyramid=*/true,
      /*from_window_safe=*/true, &mo);
  kv::CacheHit hit = in.cache->MatchAndLock(r.hashes, mo);
  r.chain.chosen = hit.matched_tokens();
  const bool restoring = hit.needs_window_restore();
  kv::SequenceOptions so;
  so.pools = in.pools.get();
  so.cache = in.cache.get();
  so.evict_on_demand = true;
  // The prefill worker's defaults (worker_options.h): SWA checkpoints every
  // 2048 tokens that yield to hot windows, divergence windows kept.
  so.swa_checkpoint_tokens = v_.single ? 0 : 2048;
  so.checkpoints_yield = true;
  so.keep_divergence_window = true;
  in.seq = std::make_unique<kv::Sequence>(so, std::move(hit));
  int next = in.seq->length();
  r.hit = next;
  if (restoring) {
    if (!in.seq->BeginWindowRestore(plan.choice.compute_from).ok())
      Die("window restore failed");
    r.hit = next - std::llround(plan.work);
    r.restore_work = std::llround(plan.work);
    next = plan.choice.compute_from;
  }
  while (next < r.len) {
    const int c = std::min(kChunk, r.len - next);
    if (!in.seq->Prepare(next, c).ok())
      Die("a prompt did not fit an instance's pools");
    next += c;
  }
  r.chain.hit = r.hit;
  r.causes = loadgen::AttributeMisses(r.chain);
  if (r.causes.Total() != r.len - r.hit)
    Die("miss attribution does not sum to the misses");
  in.busy = true;
  in.running = i;
  in.end = t + r.extra_s + PrefillSeconds(f_, r.hit, r.len);
}

void Sim::Finish(Instance& in, double t) {
  Req& r = reqs_[in.running];
  in.seq->Finish(r.hashes);
  in.seq.reset();
  in.active_tokens -= r.len;
  r.ttft = t - r.arrival;
  r.hashes = {};
  in.busy = false;
  Start(in, t);
}

void Sim::Run(const std::vector<bool>& keep) {
  synth_ = std::make_unique<loadgen::AgentPromptSynthesizer>(
      loadgen::AgentPromptSynthesizer::Options{});
  for (const loadgen::AgentArrival& a : sched_.arrivals) {
    const loadgen::AgentSession& s = sessions_[a.session];
    if (!keep[s.scope]) continue;
    ++left_[s.scope];
    reqs_.push_back(Req{.session = a.session,
                        .request = a.request,
                        .scope = s.scope,
                        .arrival = a.arrival_s});
  }
  estimate_.assign(reqs_.size(), 0);
  size_t next = 0;
  const size_t progress = std::max<size_t>(1, reqs_.size() / 10);
  while (true) {
    double t = next < reqs_.size() ? reqs_[next].arrival
                                   : std::numeric_limits<double>::infinity();
    Instance* done = nullptr;
    for (Instance& in : instances_) {
      if (in.busy && in.end <= t) t = in.end, done = &in;
    }
    if (done != nullptr) {
      Finish(*done, t);
      continue;
    }
    if (next >= reqs_.size()) break;
    Arrive(reqs_[next++]);
    if (next % progress == 0)
      std::fprintf(stderr, "  [%s] %zu/%zu\n", v_.name.c_str(), next,
                   reqs_.size());
  }
}

std::vector<int> ParseInts(absl::string_view s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 1)
      Die("bad count '" + std::string(p) + "'");
    out.push_back(v);
  }
  return out;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a == "--help" || eq == std::string::npos) {
      std::printf(
          "usage: agent_sim [--trace=F] [--json=F] [--sessions=N] "
          "[--concurrency=200] [--seed=1]\n"
          "  [--half=all|tune|heldout] [--instances=1,8,3] [--gpus=16] "
          "[--hbm-gb=141]\n"
          "  [--weights-gb=1020] [--reserve-gb=10] [--l2-gb=2000] "
          "[--l3-gb=30000]\n"
          "  [--peak-tflops=1979] [--mfu=0.4] [--pcie-gbs=50] [--nvme-gbs=25] "
          "[--ratio=0.02]\n"
          "  [--l3-shared=true|false] [--l3-near-bound=0.75] [--kv-gb=0 (per "
          "GPU; 0: derived)] [--tenants=0]\n"
          "  "
          "[--variants=defaults,single,l1,single-l1,round-robin,least-load,"
          "sglang,dynamo]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
    const std::string k = a.substr(0, eq), v = a.substr(eq + 1);
    const double d = std::atof(v.c_str());
    if (k == "--trace")
      f.trace = v;
    else if (k == "--json")
      f.json = v;
    else if (k == "--sessions")
      f.sessions = std::atoll(v.c_str());
    else if (k == "--concurrency")
      f.concurrency = d;
    else if (k == "--seed")
      f.seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--half")
      f.half = v;
    else if (k == "--instances")
      f.instances = ParseInts(v);
    else if (k == "--gpus")
      f.gpus = std::atoi(v.c_str());
    else if (k == "--hbm-gb")
      f.hbm_gb = d;
    else if (k == "--weights-gb")
      f.weights_gb = d;
    else if (k == "--reserve-gb")
      f.reserve_gb = d;
    else if (k == "--l2-gb")
      f.l2_gb = d;
    else if (k == "--l3-gb")
      f.l3_gb = d;
    else if (k == "--peak-tflops")
      f.peak_tflops = d;
    else if (k == "--mfu")
      f.mfu = d;
    else if (k == "--pcie-gbs")
      f.pcie_gbs = d;
    else if (k == "--nvme-gbs")
      f.nvme_gbs = d;
    else if (k == "--ratio")
      f.ratio = d;
    else if (k == "--l3-shared")
      f.l3_shared = v == "true" || v == "1";
    else if (k == "--l3-near-bound")
      f.l3_near_bound = d;
    else if (k == "--kv-gb")
      f.kv_gb = d;
    else if (k == "--tenants")
      f.tenants = std::atoll(v.c_str());
    else if (k == "--variants")
      f.variants = absl::StrSplit(v, ',');
    else
      Die("unknown flag " + k);
  }
  if (f.half != "all" && f.half != "tune" && f.half != "heldout")
    Die("--half: all, tune or heldout");
  if (f.instances.size() != PolicyOptions{}.bucket_bounds.size())
    Die("--instances: one per bucket");
  return f;
}

int Main(int argc, char** argv) {
  bench::SetProgramName("agent_sim");
  const Flags f = ParseFlags(argc, argv);
  const std::string path = bench::RepoPath(f.trace, SWASERVE_SOURCE_DIR);
  auto sessions = loadgen::LoadAgentTrace(path, {.limit = f.sessions});
  if (!sessions.ok()) Die(std::string(sessions.status().message()));
  auto sched = loadgen::ScheduleAgentSessions(
      *sessions, {.concurrency = f.concurrency, .seed = f.seed});
  if (!sched.ok()) Die(std::string(sched.status().message()));
  std::vector<bool> keep(sessions->size(), false);
  int64_t kept = 0;
  for (const loadgen::AgentSession& s : *sessions) {
    if (s.top_level()) {
      keep[s.index] =
          f.half == "all" || (f.half == "heldout") == HeldOut(s.index);
      kept += keep[s.index];
    }
  }
  std::printf(
      "trace %s: %zu sessions (sub-agents included), %lld top-level kept "
      "(--half=%s); "
      "span %.0f s for %.0f at once; instances per bucket %d,%d,%d of %d "
      "H200s\n",
      path.c_str(), sessions->size(), static_cast<long long>(kept),
      f.half.c_str(), sched->span_s, f.concurrency, f.instances[0],
      f.instances[1], f.instances[2], f.gpus);
  std::printf("%-12s %-8s %8s %9s %12s %9s %9s %6s %6s %6s %6s %6s\n",
              "variant", "sessions", "requests", "hit", "prefill tok",
              "TTFT p50", "p90 (ms)", "cold", "evict", "bucket", "route",
              "window");
  nlohmann::json out = {
      {"trace", path},           {"concurrency", f.concurrency},
      {"span_s", sched->span_s}, {"seed", f.seed},
      {"half", f.half},          {"variants", nlohmann::json::array()}};
  for (const std::string& name : f.variants) {
    Sim sim(f, MakeVariant(name), *sessions, *sched);
    sim.Run(keep);
    Summary all, tune, held, top;
    for (const Req& r : sim.requests()) {
      all.Add(r);
      (HeldOut(r.scope) ? held : tune).Add(r);
      if (r.session == r.scope) {
        top.ideal_prompt += r.len;
        top.ideal_hit += r.chain.ideal;
      }
    }
    nlohmann::json j = {
        {"variant", name},
        {"setup", sim.Setup()},
        {"all", all.Json()},
        {"tune_half", tune.Json()},
        {"heldout_half", held.Json()},
        {"top_level_ideal_hit_rate",
         top.ideal_prompt ? double(top.ideal_hit) / top.ideal_prompt : 0}};
    for (const auto& [label, s] :
         {std::pair<const char*, const Summary*>{"all", &all},
          {"tune", &tune},
          {"heldout", &held}}) {
      if (s->requests == 0) continue;
      const double p = double(s->prompt);
      std::printf(
          "%-12s %-8s %8lld %8.2f%% %12lld %9.1f %9.1f %5.2f%% %5.2f%% %5.2f%% "
          "%5.2f%% %5.2f%%\n",
          name.c_str(), label, static_cast<long long>(s->requests),
          100 * s->hit / p, static_cast<long long>(s->prompt - s->hit),
          1e3 * Percentile(s->ttft, 0.5), 1e3 * Percentile(s->ttft, 0.9),
          100 * s->causes.cold / p, 100 * s->causes.evicted / p,
          100 * s->causes.bucket / p, 100 * s->causes.routing / p,
          100 * s->causes.window / p);
    }
    std::printf(
        "%-12s ideal (infinite cache per session, top-level requests): %.2f%%; "
        "L1 %lld "
        "full-KV tokens per instance\n",
        name.c_str(), 100 * j["top_level_ideal_hit_rate"].get<double>(),
        static_cast<long long>(
            j["setup"]["l1_full_tokens_per_instance"].get<int64_t>()));
    std::fflush(stdout);
    out["variants"].push_back(std::move(j));
  }
  if (!f.json.empty()) bench::WriteJsonFile(f.json, out);
  return 0;
}

}  // namespace
}  // namespace swaserve::router

int main(int argc, char** argv) { return swaserve::router::Main(argc, argv); }
