// Fault tests of a whole local cluster (labels e2e, fault; no request
// lost): real redis-server, workers and routers on loopback, faults
// injected by signals (kill -9, SIGTERM, SIGSTOP) — the cases a long-prompt
// workload meets in production:
//
//   * a queue longer than every timeout: prompts whose queue wait plus
//     compute exceed the decode, transfer and destination timeouts several
//     times over all complete (deadlines follow progress, not
//     announcements); a decode worker that hangs while prefill computes
//     makes the ship fail, and the retry on another decode worker is a
//     prefix hit of the whole prompt (the computed KV was kept);
//   * prompts too large for any pool: a clear error at once, no breaker
//     opens, concurrent normal requests unaffected;
//   * SIGTERM of a prefill and of a decode worker under load: no request
//     fails;
//   * kill -9 of the router carrying a long prompt, or of its decode worker,
//     in the middle of the prefill: the retry resumes from the chunks the
//     prefill worker had computed (kept in its prefix cache);
//   * SIGTERM of a prefill worker whose drain ends before its prefill: it
//     hands the computed chunks to the shared L3 before the deadline, and
//     the retry on another worker resumes from there;
//   * chaos: a 1,000-request trace replay while a random process (prefill,
//     decode, Redis) is killed with -9 and restarted every few seconds:
//     every request completes.
// Timeouts are shrunk with flags (1 s) instead of using huge prompts.
#include <signal.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/loadgen/mooncake_trace.h"
#include "lib/loadgen/replay.h"
#include "tests/e2e/e2e_util.h"
#include "tests/integration/router/local_cluster.h"

namespace swaserve {
namespace {

using e2e::GenerateIds;
using e2e::GrpcResult;
using e2e::RandomPrompt;
using testing::LocalCluster;

std::unique_ptr<LocalCluster> MakeCluster(
    std::vector<std::string> worker_flags,
    std::vector<std::string> router_flags) {
  testing::LocalClusterOptions o;
  o.cli_bin = SWASERVE_CLI_BIN;
  o.worker_bin = SWASERVE_WORKER_BIN;
  o.router_bin = SWASERVE_ROUTER_BIN;
  o.worker_flags = {"--model_name=tiny", "--kv.page_size=16",
                    "--prefill.chunk_tokens=256"};
  o.worker_flags.insert(o.worker_flags.end(), worker_flags.begin(),
                        worker_flags.end());
  o.router_flags = std::move(router_flags);
  auto c = LocalCluster::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// `read()` (a metric) polled every 5 ms until it reaches `at_least` or a
// minute passed; its last value.
double WaitUntilAtLeast(const std::function<double()>& read, double at_least) {
  double v = read();
  for (const absl::Time until = absl::Now() + absl::Seconds(60);
       v < at_least && absl::Now() < until; absl::SleepFor(absl::Milliseconds(5))) {
    v = read();
  }
  return v;
}

// Two length buckets (bounds 20,000 and 32,768 tokens) with one prefill
// worker each, p0 and p1 (p0 with p0_flags too), decode worker d1 and
// router r1, healthy; null (after a test failure) when a start failed.
std::unique_ptr<LocalCluster> MakeTwoBucketCluster(std::vector<std::string> worker_flags,
                                                   std::vector<std::string> p0_flags) {
  auto c = MakeCluster(std::move(worker_flags), {"--policy.bucket_bounds=20000,32768"});
  if (c == nullptr) return nullptr;
  p0_flags.insert(p0_flags.begin(), {"--bucket=0", "--prefill.max_prompt_tokens=20000"});
  for (const absl::Status& st :
       {c->StartWorker("prefill", "p0", p0_flags).status(),
        c->StartWorker("prefill", "p1",
                       {"--bucket=1", "--bucket_min_tokens=20000",
                        "--prefill.max_prompt_tokens=32768"})
            .status(),
        c->StartWorker("decode", "d1").status(), c->StartRouter("r1").status(),
        c->WaitHealthy("r1", absl::Seconds(30))}) {
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return nullptr;
  }
  return c;
}

// Runs `n` prompts concurrently; returns their results in order.
std::vector<GrpcResult> RunConcurrently(
    v1::Router::Stub& stub, const std::vector<std::vector<uint32_t>>& prompts,
    int max_tokens) {
  std::vector<GrpcResult> out(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      out[i] = GenerateIds(stub, prompts[i], max_tokens, nullptr, 300);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(FaultE2ETest,
     QueueLongerThanEveryTimeoutCompletesAndAFailedShipIsRetriedAsAHit) {
  // Every timer of the request path is 1 s; each prompt takes longer than
  // that to compute on the one prefill worker, so the last in the queue
  // waits several times every timeout.
  auto cluster =
      MakeCluster({"--transfer.timeout=1s", "--decode.commit_timeout=1s",
                   "--kv.prefill_mib=256", "--kv.decode_mib=256",
                   "--decode.staging_arena_mib=64", "--prefill.policy=fcfs"},
                  {"--destination_timeout=1s", "--breaker.open_for=30s"});
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->StartWorker("prefill", "p1").ok());
  ASSERT_TRUE(cluster->StartWorker("decode", "d2").ok());
  ASSERT_TRUE(cluster->StartRouter("r1").ok());
  ASSERT_TRUE(cluster->WaitHealthy("r1", absl::Seconds(30)).ok());
  auto stub = cluster->RouterStub("r1");
  constexpr int kLong = 16384;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(RandomPrompt(kLong, 9000 + i));
  const absl::Time t0 = absl::Now();
  std::vector<GrpcResult> a = RunConcurrently(*stub, prompts, 4);
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  double max_wait = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].status.ok()) << i << ": " << a[i].status.error_message();
    EXPECT_EQ(a[i].tokens.size(), 4u);
    max_wait = std::max<double>(max_wait, a[i].usage.prefill_queue_seconds());
    std::printf("long prompt %zu: %d tokens, prefill queue wait %.2f s\n", i,
                kLong, a[i].usage.prefill_queue_seconds());
  }
  std::printf(
      "4 x %d-token prompts in %.1f s; longest queue wait %.2f s vs 1 s "
      "timeouts\n",
      kLong, wall, max_wait);
  EXPECT_GT(max_wait, 2.0)
      << "the queue did not outlast the timeouts: the test proves nothing";

  // A decode worker that hangs (SIGSTOP) while its requests are queued at
  // prefill: the prefill computes, cannot get staging within its transfer
  // timeout, keeps the KV in its prefix cache and names d2; the router
  // retries the decode leg on d1 and that retry hits the whole prompt.
  prompts.clear();
  for (int i = 0; i < 4; ++i) prompts.push_back(RandomPrompt(kLong, 9100 + i));
  std::vector<GrpcResult> b(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back(
        [&, i] { b[i] = GenerateIds(*stub, prompts[i], 4, nullptr, 300); });
  }
  absl::SleepFor(absl::Milliseconds(300));  // accepted by d2, queued at p1
  ASSERT_TRUE(cluster->StartWorker("decode", "d1").ok());
  ASSERT_TRUE(cluster->Get("d2")->process->Signal(SIGSTOP).ok());
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(cluster->Get("d2")->process->Signal(SIGCONT).ok());
  int hits = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_TRUE(b[i].status.ok()) << i << ": " << b[i].status.error_message();
    std::printf("after the hung decode worker: prompt %zu cached %u of %d\n", i,
                b[i].usage.cached_tokens(), kLong);
    hits += b[i].usage.cached_tokens() >= static_cast<uint32_t>(kLong - 16);
  }
  EXPECT_GE(hits, 2)
      << "retries after the failed ships did not hit the kept KV";
  EXPECT_GE(
      cluster->Metric("r1", "swaserve_router_retries_total{leg=\"decode\"}"),
      2);
}

// The router sets no request deadline by default (a fixed one cut off long
// prompts whose prefill takes longer), so what ends a call to a prefill
// worker that hangs (SIGSTOP) mid-prefill is HTTP/2 keepalive: the router's
// channel pings every 30 s and drops the connection when a ping goes
// unanswered for 10 s (lib/rpc/channel.h); the prefill leg fails and is
// retried on another worker. Nothing else bounds it: without keepalive this
// request would wait as long as its client.
TEST(FaultE2ETest, AHungPrefillWorkerIsDroppedByKeepaliveAndTheRequestRetried) {
  auto cluster = MakeCluster({}, {});
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->StartWorker("prefill", "p1").ok());
  ASSERT_TRUE(cluster->StartWorker("decode", "d1").ok());
  ASSERT_TRUE(cluster->StartRouter("r1").ok());
  ASSERT_TRUE(cluster->WaitHealthy("r1", absl::Seconds(30)).ok());
  auto stub = cluster->RouterStub("r1");
  const std::vector<uint32_t> prompt = RandomPrompt(16384, 9200);
  GrpcResult result;
  const absl::Time t0 = absl::Now();
  std::thread client([&] { result = GenerateIds(*stub, prompt, 4, nullptr, 300); });
  // Until p1 is computing it (a fixed 500 ms was sometimes too early on a
  // busy machine: the request then went to p2, started below, and no
  // retry happened).
  const double steps = WaitUntilAtLeast(
      [&] { return cluster->Metric("p1", "swaserve_prefill_step_tokens_count"); }, 1);
  ASSERT_GE(steps, 1) << "p1 never started the prompt";
  ASSERT_TRUE(cluster->Get("p1")->process->Signal(SIGSTOP).ok());
  ASSERT_TRUE(cluster->StartWorker("prefill", "p2").ok());
  client.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  ASSERT_TRUE(cluster->Get("p1")->process->Signal(SIGCONT).ok());
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens.size(), 4u);
  std::printf("FAULT-ROW hung prefill worker (SIGSTOP mid-prefill): served by the retry after %.1f s\n",
              seconds);
  EXPECT_LT(seconds, 120.0) << "keepalive (30 s + 10 s) should have dropped the hung worker";
  EXPECT_GE(cluster->Metric("r1", "swaserve_router_retries_total{leg=\"prefill\"}"), 1);
}

// Bucket fallback (RouterOptions::bucket_fallback) when the only prefill
// worker of a prompt's bucket dies with kill -9 in the middle of computing
// it: the router's prefill leg fails, no worker of bucket 0 is left, and the
// retry goes to bucket 1's worker at once, which computes the whole prompt;
// the answer is the one a second run (a prefix hit there) gives.
TEST(FaultE2ETest, APrefillWorkerKilledMidPrefillHandsItsPromptToTheNextBucket) {
  auto cluster = MakeTwoBucketCluster({}, {});
  ASSERT_NE(cluster, nullptr);
  auto stub = cluster->RouterStub("r1");
  constexpr int kLen = 16384;  // bucket 0; 64 steps of 256 tokens
  const std::vector<uint32_t> prompt = RandomPrompt(kLen, 9300);
  GrpcResult result;
  std::thread client([&] { result = GenerateIds(*stub, prompt, 6, nullptr, 300); });
  // Mid-prefill: p0 has computed a step of it and not finished.
  const double steps = WaitUntilAtLeast(
      [&] { return cluster->Metric("p0", "swaserve_prefill_step_tokens_count"); }, 1);
  const double p0_done = cluster->Metric("p0", "swaserve_prefill_requests_total{result=\"ok\"}");
  ASSERT_TRUE(cluster->Kill("p0").ok());
  client.join();
  ASSERT_GE(steps, 1) << "p0 never started the prompt";
  ASSERT_LT(p0_done, 1) << "p0 finished the prompt before the kill: nothing was tested";
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.tokens.size(), 6u);
  EXPECT_EQ(cluster->Metric("r1", "swaserve_router_bucket_fallbacks_total{bucket=\"0\"}"), 1);
  EXPECT_GE(cluster->Metric("r1", "swaserve_router_retries_total{leg=\"prefill\"}"), 1);
  EXPECT_EQ(cluster->Metric("p1", "swaserve_prefill_tokens_total{source=\"computed\"}"), kLen);
  // Again: bucket 1's worker holds the prompt now; the same greedy answer.
  GrpcResult again = GenerateIds(*stub, prompt, 6, nullptr, 300);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, result.tokens);
  EXPECT_GE(again.usage.cached_tokens(), static_cast<uint32_t>(kLen - 256));
  std::printf("FAULT-ROW bucket 0's only prefill worker killed mid-prefill (%.0f steps done): "
              "served by bucket 1, retry cached %u of %d\n",
              steps, again.usage.cached_tokens(), kLen);
}

// A long prompt's computed chunks outlive its caller: the router carrying it
// is killed -9 in the middle of its prefill, and the client's retry through
// another router replica resumes where the prefill stood; then the only
// decode worker is killed in the middle of a second prompt's prefill, and
// the router's own retry resumes the same way. Before, the prefill worker
// threw the computed chunks away with the cancelled call, and both retries
// computed their prompt from its first token. Both answers equal those of a
// fresh prefill worker computing the prompts from scratch.
TEST(FaultE2ETest, AKilledRouterOrDecodeWorkerCostsALongPromptNoRecompute) {
  auto cluster = MakeCluster({}, {});
  ASSERT_NE(cluster, nullptr);
  // Two prefill workers: a retry resumes only if the router sends it to the
  // one holding the kept chunks (the prefix index learns them from its
  // cache events).
  ASSERT_TRUE(cluster->StartWorker("prefill", "p1").ok());
  ASSERT_TRUE(cluster->StartWorker("prefill", "p2").ok());
  ASSERT_TRUE(cluster->StartWorker("decode", "d1").ok());
  for (const char* r : {"r1", "r2"}) {
    ASSERT_TRUE(cluster->StartRouter(r).ok());
    ASSERT_TRUE(cluster->WaitHealthy(r, absl::Seconds(30)).ok());
  }
  constexpr int kLen = 16384;  // 64 steps of 256 tokens
  const std::vector<uint32_t> a = RandomPrompt(kLen, 9400), b = RandomPrompt(kLen, 9401);
  // A counter summed over both prefill workers.
  auto prefill_sum = [&](const std::string& line) {
    return cluster->Metric("p1", line) + cluster->Metric("p2", line);
  };
  const std::string steps = "swaserve_prefill_step_tokens_sum";  // tokens computed
  auto computed = [&] { return prefill_sum(steps); };
  auto wait_metric = [&](const std::string& line, double at_least) {
    return WaitUntilAtLeast([&] { return prefill_sum(line); }, at_least);
  };
  const std::string kept_requests = "swaserve_prefill_partial_kept_requests_total";
  const std::string kept_tokens = "swaserve_prefill_partial_kept_tokens_total";

  // 1. The router dies mid-prefill; the client retries through r2.
  GrpcResult lost;
  std::thread client([&] { lost = GenerateIds(*cluster->RouterStub("r1"), a, 6, nullptr, 300); });
  const double at_kill_a = wait_metric(steps, 4096);
  ASSERT_TRUE(cluster->Kill("r1").ok());
  client.join();
  ASSERT_GE(at_kill_a, 4096) << "no prefill worker got a third of the way into the prompt";
  ASSERT_FALSE(lost.status.ok()) << "r1 answered before it was killed: nothing was tested";
  ASSERT_GE(wait_metric(kept_requests, 1), 1) << "nothing of the cancelled prefill was kept";
  const double kept_a = prefill_sum(kept_tokens);
  // Whole pages that every MTP layer reached, at least what was computed at
  // the kill.
  EXPECT_GE(kept_a, at_kill_a - 32);
  EXPECT_LT(kept_a, kLen);
  auto r2 = cluster->RouterStub("r2");
  const GrpcResult retry_a = GenerateIds(*r2, a, 6, nullptr, 300);
  ASSERT_TRUE(retry_a.status.ok()) << retry_a.status.error_message();
  EXPECT_EQ(retry_a.usage.cached_tokens(), static_cast<uint32_t>(kept_a))
      << "the retry did not resume where the prefill stood";

  // 2. The only decode worker dies mid-prefill; a new one comes up and the
  // router retries by itself.
  const double base = computed();
  GrpcResult result_b;
  std::thread client_b([&] { result_b = GenerateIds(*r2, b, 6, nullptr, 300); });
  const double at_kill_b = wait_metric(steps, base + 4096) - base;
  ASSERT_TRUE(cluster->Kill("d1").ok());
  ASSERT_TRUE(cluster->StartWorker("decode", "d2").ok());
  client_b.join();
  ASSERT_GE(at_kill_b, 4096);
  ASSERT_TRUE(result_b.status.ok()) << result_b.status.error_message();
  ASSERT_EQ(result_b.tokens.size(), 6u);
  ASSERT_GE(wait_metric(kept_requests, 2), 2);
  const double kept_b = prefill_sum(kept_tokens) - kept_a;
  EXPECT_GE(kept_b, at_kill_b - 32);
  EXPECT_EQ(result_b.usage.cached_tokens(), static_cast<uint32_t>(kept_b));
  // Each prompt was computed once, plus at most the steps that ran between
  // the kill and the cancel reaching the worker.
  const double total = computed();
  EXPECT_LE(total, 2 * kLen + 2 * 4 * 256) << "recomputed what was done";
  const double kept_p1 = cluster->Metric("p1", kept_tokens), kept_p2 = cluster->Metric("p2", kept_tokens);

  // 3. The same prompts on a fresh prefill worker (no cache, no L3): the
  // same greedy answers.
  ASSERT_TRUE(cluster->Kill("p1").ok());
  ASSERT_TRUE(cluster->Kill("p2").ok());
  ASSERT_TRUE(cluster->StartWorker("prefill", "p3").ok());
  const GrpcResult ref_a = GenerateIds(*r2, a, 6, nullptr, 300);
  const GrpcResult ref_b = GenerateIds(*r2, b, 6, nullptr, 300);
  ASSERT_TRUE(ref_a.status.ok()) << ref_a.status.error_message();
  ASSERT_TRUE(ref_b.status.ok()) << ref_b.status.error_message();
  EXPECT_EQ(ref_a.usage.cached_tokens(), 0u);
  EXPECT_EQ(ref_b.usage.cached_tokens(), 0u);
  EXPECT_EQ(retry_a.tokens, ref_a.tokens);
  EXPECT_EQ(result_b.tokens, ref_b.tokens);
  std::printf("FAULT-ROW router killed after %.0f of %d prompt tokens: retry via r2 cached %u; "
              "decode worker killed after %.0f: router's retry cached %u; the 2 prefill workers computed %.0f "
              "tokens for 2 prompts of %d (kept on p1 %.0f, on p2 %.0f)\n",
              at_kill_a, kLen, retry_a.usage.cached_tokens(), at_kill_b,
              result_b.usage.cached_tokens(), total, kLen, kept_p1, kept_p2);
}

// SIGTERM of a prefill worker in the middle of a long prompt (a rolling
// restart) whose drain is shorter than the prompt's prefill: a little before
// its drain deadline (--drain_handback) the worker hands the prefill back —
// what it computed goes to the shared L3, and it answers DRAINING once that
// is stored — and the router's retry on the next bucket's worker (bucket 0
// has no other) resumes from L3. Before, the deadline cancelled the call and
// the retry computed the prompt from its first token.
// After bucket 0's worker went away mid-prompt: the retry on bucket 1's
// worker (p1) found the prompt's prefix in L3 (one prefetch hit), computed
// only the rest (its last chunk's MTP tail aside), and a second run gives
// the same greedy answer from p1's cache. Returns what p1 computed.
double ExpectP1ResumedFromL3(LocalCluster& cluster, v1::Router::Stub& stub,
                             const std::vector<uint32_t>& prompt, const GrpcResult& result) {
  const uint32_t cached = result.usage.cached_tokens();
  EXPECT_EQ(cluster.Metric("p1", "swaserve_prefill_l3_prefetch_total{result=\"hit\"}"), 1);
  const double p1_computed = cluster.Metric("p1", "swaserve_prefill_step_tokens_sum");
  EXPECT_LE(p1_computed, static_cast<double>(prompt.size()) - cached + 64);
  const GrpcResult again = GenerateIds(stub, prompt, 6, nullptr, 300);
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, result.tokens);
  return p1_computed;
}

TEST(FaultE2ETest, ASigtermedPrefillWorkerHandsItsChunksToTheRetryThroughL3) {
  auto l3 = cluster::testing::RedisServer::Start(
      {"--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"});
  ASSERT_TRUE(l3.ok()) << l3.status();
  const std::string l3_flag = absl::StrCat("--kv.l3=redis:127.0.0.1:", (*l3)->port());
  auto cluster = MakeTwoBucketCluster({l3_flag}, {"--drain=1s", "--drain_handback=1s"});
  ASSERT_NE(cluster, nullptr);
  auto stub = cluster->RouterStub("r1");
  constexpr int kLen = 19968;  // bucket 0's largest
  const std::vector<uint32_t> prompt = RandomPrompt(kLen, 9500);
  GrpcResult result;
  std::thread client([&] { result = GenerateIds(*stub, prompt, 6, nullptr, 300); });
  const double at_term = WaitUntilAtLeast(
      [&] { return cluster->Metric("p0", "swaserve_prefill_step_tokens_sum"); }, 2048);
  ASSERT_GE(at_term, 2048) << "p0 never got into the prompt";
  ASSERT_TRUE(cluster->Terminate("p0", absl::Seconds(60)).ok());
  client.join();
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.tokens.size(), 6u);
  const uint32_t cached = result.usage.cached_tokens();
  EXPECT_GE(cached, at_term - 32) << "the retry did not resume from what p0 computed";
  EXPECT_LT(cached, static_cast<uint32_t>(kLen)) << "p0 finished the prompt: nothing was tested";
  EXPECT_GE(cluster->Metric("r1", "swaserve_router_retries_total{leg=\"prefill\"}"), 1);
  const double p1_computed = ExpectP1ResumedFromL3(*cluster, *stub, prompt, result);
  std::printf("FAULT-ROW SIGTERM of bucket 0's prefill worker (drain 1 s, hand-back 0.5 s before) "
              "after %.0f of %d prompt tokens: the retry on bucket 1 cached %u from L3, "
              "computed %.0f\n",
              at_term, kLen, cached, p1_computed);
}

// kill -9 of a prefill worker in the middle of a long prompt, with a shared
// L3: the worker gets no chance to keep anything (no cancellation, no drain),
// but its prefill wrote L3 checkpoints as it went
// (--prefill.l3_checkpoint_tokens), and the retry on bucket 1's worker
// fetches the prompt's prefix from there instead of computing it again
// (APrefillWorkerKilledMidPrefillHandsItsPromptToTheNextBucket: all of it).
TEST(FaultE2ETest, AKilledPrefillWorkersRetryResumesFromItsL3Checkpoints) {
  auto l3 = cluster::testing::RedisServer::Start(
      {"--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"});
  ASSERT_TRUE(l3.ok()) << l3.status();
  const std::string l3_flag = absl::StrCat("--kv.l3=redis:127.0.0.1:", (*l3)->port());
  constexpr int kInterval = 2048;
  auto cluster = MakeTwoBucketCluster(
      {l3_flag}, {absl::StrCat("--prefill.l3_checkpoint_tokens=", kInterval)});
  ASSERT_NE(cluster, nullptr);
  auto stub = cluster->RouterStub("r1");
  constexpr int kLen = 19968;  // bucket 0's largest
  const std::vector<uint32_t> prompt = RandomPrompt(kLen, 9600);
  GrpcResult result;
  std::thread client([&] { result = GenerateIds(*stub, prompt, 6, nullptr, 300); });
  const double checkpointed = WaitUntilAtLeast(
      [&] { return cluster->Metric("p0", "swaserve_prefill_l3_checkpoint_tokens_total"); },
      3 * kInterval);
  const double at_kill = cluster->Metric("p0", "swaserve_prefill_step_tokens_sum");
  ASSERT_TRUE(cluster->Kill("p0").ok());
  client.join();
  ASSERT_GE(checkpointed, 3 * kInterval) << "p0 wrote no checkpoints";
  ASSERT_LT(at_kill, kLen) << "p0 finished the prompt: nothing was tested";
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(result.tokens.size(), 6u);
  const uint32_t cached = result.usage.cached_tokens();
  // The last checkpoint's puts may have been queued still at the kill
  // (the L3 store writes behind), so the retry may resume one checkpoint
  // earlier (each covers a little more than the interval: whole chunks).
  EXPECT_GE(cached, kInterval) << "the retry did not resume from the checkpoints";
  EXPECT_GE(cached, checkpointed - 2 * kInterval) << "the retry resumed far behind them";
  const double p1_computed = ExpectP1ResumedFromL3(*cluster, *stub, prompt, result);
  std::printf("FAULT-ROW kill -9 of bucket 0's prefill worker after %.0f of %d prompt tokens "
              "(%.0f checkpointed to L3): the retry on bucket 1 cached %u, computed %.0f\n",
              at_kill, kLen, checkpointed, cached, p1_computed);
}

TEST(FaultE2ETest, PromptTooLargeForAnyPoolFailsFastWithoutOpeningABreaker) {
  auto cluster =
      MakeCluster({"--kv.prefill_mib=4", "--kv.decode_mib=4"},
                  {"--breaker.failures=1", "--breaker.open_for=60s"});
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->StartWorker("prefill", "p1").ok());
  ASSERT_TRUE(cluster->StartWorker("decode", "d1").ok());
  ASSERT_TRUE(cluster->StartRouter("r1").ok());
  ASSERT_TRUE(cluster->WaitHealthy("r1", absl::Seconds(30)).ok());
  auto stub = cluster->RouterStub("r1");
  // In the first length bucket, but beyond the 4 MiB pools.
  const std::vector<uint32_t> huge = RandomPrompt(60000, 1);
  std::vector<GrpcResult> big(6), normal(6);
  std::vector<std::thread> threads;
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] { big[i] = GenerateIds(*stub, huge, 4); });
    threads.emplace_back([&, i] {
      normal[i] = GenerateIds(*stub, RandomPrompt(200, 10 + i), 8);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(big[i].status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << big[i].status.error_message();
    EXPECT_NE(big[i].status.error_message().find("larger than the KV pool"),
              std::string::npos)
        << big[i].status.error_message();
    EXPECT_TRUE(normal[i].status.ok()) << normal[i].status.error_message();
  }
  EXPECT_LT(absl::Now() - t0, absl::Seconds(60));
  EXPECT_EQ(cluster->Metric("r1", "swaserve_router_open_breakers"), 0);
  std::printf("too large: 6 of 6 refused with RESOURCE_EXHAUSTED, %d of 6 normal requests ok, "
              "%.2f s for all 12\n",
              static_cast<int>(std::count_if(normal.begin(), normal.end(),
                                             [](const GrpcResult& g) { return g.status.ok(); })),
              absl::ToDoubleSeconds(absl::Now() - t0));
  // Over HTTP: 413 naming the limit.
  std::string text;
  for (int i = 0; i < 70000; ++i) text += " hello";
  nlohmann::json body = {
      {"model", "tiny"}, {"prompt", text}, {"max_tokens", 2}};
  auto r = cluster->Http("r1", "POST", "/v1/completions", body.dump());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413) << r->body;
  EXPECT_NE(r->body.find("KV pool"), std::string::npos) << r->body;
  // With breaker.failures=1 a single blamed failure would have opened one.
  GrpcResult after = GenerateIds(*stub, RandomPrompt(100, 99), 4);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(cluster->Metric("r1", "swaserve_router_open_breakers"), 0);
}

class LoadedClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = MakeCluster({}, {"--breaker.open_for=5s"});
    ASSERT_NE(cluster_, nullptr);
    for (const char* id : {"p1", "p2"})
      ASSERT_TRUE(cluster_->StartWorker("prefill", id).ok());
    for (const char* id : {"d1", "d2"})
      ASSERT_TRUE(cluster_->StartWorker("decode", id).ok());
    ASSERT_TRUE(cluster_->StartRouter("r1").ok());
    ASSERT_TRUE(cluster_->WaitHealthy("r1", absl::Seconds(30)).ok());
    stub_ = cluster_->RouterStub("r1");
  }
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::Router::Stub> stub_;
};

// kThreads clients, each sending kPerThread requests one after another;
// `during` runs once every client has its first token.
std::vector<GrpcResult> RunLoad(v1::Router::Stub& stub, const std::function<void()>& during) {
  constexpr int kThreads = 6, kPerThread = 8;
  std::vector<GrpcResult> out(kThreads * kPerThread);
  std::atomic<int> first_tokens{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        bool counted = false;
        out[t * kPerThread + i] =
            GenerateIds(stub, RandomPrompt(300 + 50 * i, 100 * t + i), 120, [&](int n) {
              if (!counted && n > 0 && i == 0) {
                counted = true;
                ++first_tokens;
              }
            });
      }
    });
  }
  while (first_tokens.load() < kThreads) absl::SleepFor(absl::Milliseconds(10));
  during();
  for (std::thread& t : threads) t.join();
  return out;
}

TEST_F(LoadedClusterTest, SigtermOfAPrefillAndADecodeWorkerUnderLoadFailsNoRequest) {
  const std::vector<GrpcResult> ref = RunLoad(*stub_, [] {});
  // Drains: each stops taking work, finishes (or, past --drain, hands back
  // to the router for migration) what it has, then exits.
  const std::vector<GrpcResult> got = RunLoad(*stub_, [&] {
    EXPECT_TRUE(cluster_->Terminate("p2", absl::Seconds(20)).ok());
    EXPECT_TRUE(cluster_->Terminate("d2", absl::Seconds(20)).ok());
  });
  int failed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(ref[i].status.ok()) << ref[i].status.error_message();
    if (!got[i].status.ok() || got[i].tokens.size() != 120u) {
      ++failed;
      ADD_FAILURE() << "request " << i << ": " << got[i].status.error_message() << " ("
                    << got[i].tokens.size() << " tokens)";
      continue;
    }
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
  }
  e2e::PrintFaultRow("SIGTERM prefill p2 then decode d2 under load", ref, got);
  std::printf("SIGTERM under load: %zu requests, %d failed, %.0f migrated (draining), %.0f "
              "(worker lost)\n",
              got.size(), failed,
              cluster_->Metric("r1", "swaserve_router_migrations_total{reason=\"draining\"}"),
              cluster_->Metric("r1", "swaserve_router_migrations_total{reason=\"worker_lost\"}"));
}

TEST_F(LoadedClusterTest,
       ChaosKillAndRestartDuringAThousandRequestReplayLosesNone) {
  auto trace = loadgen::LoadMooncakeTrace(SWASERVE_TRACE, 1000);
  ASSERT_TRUE(trace.ok()) << trace.status();
  loadgen::ReplayOptions ro = e2e::TraceReplayOptions(cluster_->Get("r1")->grpc_address());
  // The same trace without faults first (it also warms the caches the
  // chaos then keeps destroying): the latency baseline.
  auto calm = loadgen::Replay(*trace, ro);
  ASSERT_TRUE(calm.ok()) << calm.status();
  EXPECT_EQ(calm->failed, 0);
  std::printf("no faults:\n%s\n", calm->ToText().c_str());
  std::atomic<bool> stop{false};
  std::vector<std::string> log;  // written by the chaos thread only until joined
  std::atomic<int> faults{0};
  // A fault every 1.5-3.5 s, or faster when the calm replay was short (a
  // warm cache makes the chaos replay quicker still): about ten faults over
  // the calm replay's duration at least, so the run always sees >= 5.
  const int mean_ms = static_cast<int>(
      std::clamp(calm->duration_s * 1000 / 10, 300.0, 2500.0));
  std::thread chaos([&] {
    std::mt19937 rng(20261201);
    const std::vector<std::string> victims = {"p1", "p2", "d1", "d2", "redis"};
    // Faults are scheduled from the start, not from the end of the previous
    // restart: a worker restart takes seconds on a slow machine, and waiting
    // for it before counting the next interval ran only 4 faults in CI.
    absl::Time next = absl::Now();
    while (!stop.load()) {
      next += absl::Milliseconds(mean_ms * 3 / 5 + rng() % (mean_ms * 4 / 5 + 1));
      while (!stop.load() && absl::Now() < next) absl::SleepFor(absl::Milliseconds(20));
      if (stop.load()) break;
      const std::string v = victims[rng() % victims.size()];
      absl::Status s;
      if (v == "redis") {
        s = cluster_->redis().Kill();
        if (s.ok()) s = cluster_->redis().Restart();
      } else {
        s = cluster_->Kill(v);
        if (s.ok()) {
          absl::StatusOr<testing::LocalProcess*> p =
              cluster_->StartWorker(v[0] == 'p' ? "prefill" : "decode", v);
          s = p.status();
        }
      }
      log.push_back(
          absl::StrCat(v, s.ok() ? "" : absl::StrCat(" (", s.ToString(), ")")));
      faults.fetch_add(1);
    }
  });
  // The replay repeats (at most 3 times) until the chaos has done 5 faults,
  // so a fast machine cannot make the run meaningless; every request of every
  // pass must succeed.
  int passes = 0, succeeded = 0, failed = 0, sent = 0;
  std::string first_error;
  absl::Status replay_status;
  while (passes < 3) {
    auto report = loadgen::Replay(*trace, ro);
    ++passes;
    if (!report.ok()) {
      replay_status = report.status();
      break;
    }
    std::printf("chaos pass %d:\n%s\n", passes, report->ToText().c_str());
    sent += static_cast<int>(trace->size());
    succeeded += report->succeeded;
    failed += report->failed;
    if (first_error.empty() && !report->error_samples.empty()) {
      first_error = report->error_samples[0];
    }
    if (faults.load() >= 5) break;
  }
  stop = true;
  chaos.join();
  ASSERT_TRUE(replay_status.ok()) << replay_status;
  std::string kills;
  for (const std::string& k : log) kills += k + " ";
  std::printf("chaos: %zu kill -9 + restart (one every ~%d ms): %s\n", log.size(), mean_ms,
              kills.c_str());
  EXPECT_GE(log.size(), 5u) << "too few faults to mean anything";
  EXPECT_EQ(succeeded, sent);
  EXPECT_EQ(failed, 0) << first_error;
}

}  // namespace
}  // namespace swaserve
