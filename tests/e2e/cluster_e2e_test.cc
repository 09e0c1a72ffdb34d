// End-to-end and fault tests of a whole local cluster (label e2e): a real
// redis-server, two prefill workers, two decode workers (KV over UCX) and a
// router, all real processes on loopback (tests/integration/router/
// local_cluster.h). Each case bounds its time with deadlines on every call.
//
//   * chat over HTTP and gRPC; greedy outputs identical to a monolithic
//     worker behind its own router; a multi-turn conversation reports cached
//     tokens from its second turn;
//   * kill -9 a prefill worker under load: every request completes;
//   * kill -9 a decode worker mid-stream: its streams migrate and complete,
//     token for token identical to an uninterrupted run;
//   * kill the router: a new one routes repeated prompts to their caches;
//   * restart Redis: workers re-register and routing recovers;
//   * load: 1,000 requests of the scaled conversation trace at fixed
//     concurrency, zero errors, RSS steady, every pool page returned.
#include <signal.h>

#include <random>
#include <thread>

#include <nlohmann/json.hpp>

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

using json = nlohmann::json;
using testing::LocalCluster;

using e2e::GenerateIds;
using e2e::GrpcResult;
using e2e::RandomPrompt;

class ClusterE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::LocalClusterOptions o;
    o.cli_bin = SWASERVE_CLI_BIN;
    o.worker_bin = SWASERVE_WORKER_BIN;
    o.router_bin = SWASERVE_ROUTER_BIN;
    o.worker_flags = {"--model_name=tiny", "--kv.page_size=16", "--prefill.chunk_tokens=256"};
    o.router_flags = {"--breaker.open_for=30s"};
    auto c = LocalCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    for (const char* id : {"p1", "p2"}) ASSERT_TRUE(cluster_->StartWorker("prefill", id).ok());
    for (const char* id : {"d1", "d2"}) ASSERT_TRUE(cluster_->StartWorker("decode", id).ok());
    ASSERT_TRUE(cluster_->StartRouter("r1").ok());
    ASSERT_TRUE(cluster_->WaitHealthy("r1", absl::Seconds(30)).ok());
    stub_ = cluster_->RouterStub("r1");
  }

  json PostChat(const std::string& router, const json& messages, int max_tokens) {
    json body = {{"model", "tiny"},
                 {"messages", messages},
                 {"max_tokens", max_tokens},
                 {"temperature", 0},
                 {"ignore_eos", true}};
    auto r = cluster_->Http(router, "POST", "/v1/chat/completions", body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body, nullptr, false);
  }

  // Pages of `pool` in `state` on a worker.
  double Pages(const std::string& id, const std::string& pool, const std::string& state) {
    return cluster_->Metric(id, absl::StrCat("swaserve_kv_pages{pool=\"", pool, "\",state=\"",
                                             state, "\"}"));
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::Router::Stub> stub_;
};

TEST_F(ClusterE2ETest, ChatOverHttpAndGrpcMatchesAMonolithicWorker) {
  // A monolithic worker with its own router (another cluster name).
  ASSERT_TRUE(cluster_->StartWorker("both", "m1", {"--cluster=mono"}).ok());
  ASSERT_TRUE(cluster_->StartRouter("rm", {"--cluster=mono"}).ok());
  ASSERT_TRUE(cluster_->WaitHealthy("rm", absl::Seconds(30)).ok());
  auto mono = cluster_->RouterStub("rm");
  // Greedy token outputs, disaggregated vs monolithic, mixed lengths, some
  // sharing prefixes (prefix hits on the second pass).
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(RandomPrompt(3 + i * 37, 300 + i));
  for (int i = 0; i < 4; ++i) {
    std::vector<uint32_t> p = prompts[7];
    p.resize(150 + i * 20);
    for (uint32_t t : RandomPrompt(10, 900 + i)) p.push_back(t);
    prompts.push_back(p);
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("pass ", pass, " prompt ", i));
      GrpcResult a = GenerateIds(*stub_, prompts[i], 12);
      GrpcResult b = GenerateIds(*mono, prompts[i], 12);
      ASSERT_TRUE(a.status.ok()) << a.status.error_message();
      ASSERT_TRUE(b.status.ok()) << b.status.error_message();
      EXPECT_EQ(a.tokens, b.tokens);
      EXPECT_EQ(a.text, b.text);
      if (pass == 1 && prompts[i].size() >= 32) {
        EXPECT_GT(a.usage.cached_tokens(), 0u);
      }
    }
  }
  // Chat: HTTP through the disaggregated cluster equals gRPC through it and
  // HTTP through the monolithic one.
  const json messages = {{{"role", "user"}, {"content", "Tell me about the sea."}}};
  json disagg = PostChat("r1", messages, 16);
  json mono_http = PostChat("rm", messages, 16);
  EXPECT_EQ(disagg["choices"][0]["message"]["content"],
            mono_http["choices"][0]["message"]["content"]);
}

TEST_F(ClusterE2ETest, MultiTurnConversationReportsCachedTokensFromTheSecondTurn) {
  json messages = {{{"role", "system"}, {"content", "You are a helpful assistant. Answer in "
                                                     "full sentences and keep answers short."}},
                   {{"role", "user"}, {"content", "What is the capital of France?"}}};
  json t1 = PostChat("r1", messages, 24);
  EXPECT_EQ(t1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  for (int turn = 2; turn <= 4; ++turn) {
    messages.push_back(
        {{"role", "assistant"}, {"content", t1["choices"][0]["message"]["content"]}});
    messages.push_back({{"role", "user"}, {"content", absl::StrCat("And question ", turn, "?")}});
    json t = PostChat("r1", messages, 24);
    const int cached = t["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GE(cached, 16) << "turn " << turn << ": " << t["usage"];
    EXPECT_LT(cached, t["usage"]["prompt_tokens"].get<int>());
    t1 = t;
  }
}

TEST_F(ClusterE2ETest, KilledPrefillWorkerUnderLoadLosesNoRequest) {
  constexpr int kRequests = 40;
  std::vector<GrpcResult> results(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      absl::SleepFor(absl::Milliseconds(25 * i));  // spread over ~1 s
      results[i] = GenerateIds(*stub_, RandomPrompt(200 + i * 7, 4000 + i), 16);
    });
  }
  absl::SleepFor(absl::Milliseconds(400));
  ASSERT_TRUE(cluster_->Kill("p2").ok());
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), 16u) << i;
  }
}

// kill -9 of a decode worker mid-stream under load (request migration):
// the router re-dispatches each of its streams (prompt + the
// tokens already sent) to another prefill/decode pair and continues the same
// client stream: every stream completes, token for token identical to an
// uninterrupted run of the same prompts.
TEST_F(ClusterE2ETest, KilledDecodeWorkerMidStreamMigratesEveryStreamIdentically) {
  constexpr int kRequests = 16;
  constexpr int kTokens = 400;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(RandomPrompt(64, 7000 + i));
  // The uninterrupted run (batch-invariant kernels: the batch mix does not
  // change greedy outputs).
  std::vector<GrpcResult> want(kRequests);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kRequests; ++i) {
      threads.emplace_back([&, i] { want[i] = GenerateIds(*stub_, prompts[i], kTokens); });
    }
    for (std::thread& t : threads) t.join();
  }
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(want[i].status.ok()) << want[i].status.error_message();
  std::vector<GrpcResult> results(kRequests);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      bool counted = false;
      results[i] = GenerateIds(*stub_, prompts[i], kTokens, [&](int n) {
        if (!counted && n > 0) {
          counted = true;
          started.fetch_add(1);
        }
      });
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (started.load() < kRequests && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(started.load(), kRequests);
  // The decode worker with the most streams dies (the policy may have put
  // them all on one).
  const double on_d1 = cluster_->Metric("d1", "swaserve_decode_running_requests");
  const double on_d2 = cluster_->Metric("d2", "swaserve_decode_running_requests");
  const std::string victim = on_d2 >= on_d1 ? "d2" : "d1";
  std::printf("streams running: d1 %.0f, d2 %.0f; killing %s\n", on_d1, on_d2, victim.c_str());
  ASSERT_TRUE(cluster_->Kill(victim).ok());
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(results[i].usage.completion_tokens(), static_cast<uint32_t>(kTokens));
    EXPECT_EQ(results[i].usage.prompt_tokens(), 64u);
  }
  e2e::PrintFaultRow("kill -9 decode worker mid-stream (2 decode workers)", want, results);
  const double migrated =
      cluster_->Metric("r1", "swaserve_router_migrations_total{reason=\"worker_lost\"}");
  EXPECT_GT(migrated, 0) << "no stream was on " << victim;
  std::printf("streams migrated off the killed decode worker: %.0f of %d\n", migrated, kRequests);
  // New requests while d2's record is still in Redis: none fails (a decode
  // leg that fails before its first token is retried on another worker).
  for (int i = 0; i < 8; ++i) {
    GrpcResult r = GenerateIds(*stub_, RandomPrompt(40, 7100 + i), 4);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
}

TEST_F(ClusterE2ETest, NewRouterAfterAKilledOneKeepsTheCacheHitRate) {
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(RandomPrompt(256, 8000 + i));
  auto hit_rate = [&](v1::Router::Stub& stub) {
    double cached = 0, total = 0;
    for (const auto& p : prompts) {
      GrpcResult r = GenerateIds(stub, p, 2);
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      cached += r.usage.cached_tokens();
      total += r.usage.prompt_tokens();
    }
    return cached / total;
  };
  hit_rate(*stub_);  // warm
  absl::SleepFor(absl::Milliseconds(300));
  const double before = hit_rate(*stub_);
  EXPECT_GT(before, 0.9);
  ASSERT_TRUE(cluster_->Kill("r1").ok());
  ASSERT_TRUE(cluster_->StartRouter("r2").ok());
  ASSERT_TRUE(cluster_->WaitHealthy("r2", absl::Seconds(30)).ok());
  auto stub2 = cluster_->RouterStub("r2");
  const double after = hit_rate(*stub2);
  EXPECT_EQ(after, before);
}

TEST_F(ClusterE2ETest, RedisRestartRecoversWithinSeconds) {
  const std::vector<uint32_t> prompt = RandomPrompt(256, 99);
  ASSERT_TRUE(GenerateIds(*stub_, prompt, 2).status.ok());
  ASSERT_TRUE(cluster_->redis().Kill().ok());
  // Without Redis the router keeps its worker list and routes by what it
  // has: requests still succeed.
  GrpcResult during = GenerateIds(*stub_, RandomPrompt(50, 5), 4);
  EXPECT_TRUE(during.status.ok()) << during.status.error_message();
  ASSERT_TRUE(cluster_->redis().Restart().ok());
  const absl::Time t0 = absl::Now();
  // Every worker re-registers (its registrations counter moves to 2).
  for (const char* id : {"p1", "p2", "d1", "d2"}) {
    while (cluster_->Metric(id, "swaserve_cluster_registrations_total") < 2 &&
           absl::Now() - t0 < absl::Seconds(15)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_GE(cluster_->Metric(id, "swaserve_cluster_registrations_total"), 2) << id;
  }
  const absl::Duration reregistered = absl::Now() - t0;
  EXPECT_LT(reregistered, absl::Seconds(10));
  EXPECT_TRUE(cluster_->WaitHealthy("r1", absl::Seconds(10)).ok());
  // Routing works and affinity rebuilds from the workers' new events (the
  // restarted Redis is empty; the router's own client may still be in its
  // reconnect backoff for a moment, routing by load meanwhile): a repeated
  // prompt becomes a cache hit again within seconds.
  ASSERT_TRUE(GenerateIds(*stub_, prompt, 2).status.ok());
  bool hit = false;
  while (!hit && absl::Now() - t0 < absl::Seconds(20)) {
    absl::SleepFor(absl::Milliseconds(200));
    GrpcResult again = GenerateIds(*stub_, prompt, 2);
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    hit = again.usage.cached_tokens() >= 240u;
  }
  EXPECT_TRUE(hit) << "no prefix hit within 20 s of Redis coming back";
  std::printf("affinity back %.2f s after Redis came back\n", absl::ToDoubleSeconds(absl::Now() - t0));
  std::printf("workers re-registered %.2f s after Redis came back\n",
              absl::ToDoubleSeconds(reregistered));
}

TEST_F(ClusterE2ETest, ThousandTraceRequestsAtFixedConcurrency) {
  auto trace = loadgen::LoadMooncakeTrace(SWASERVE_TRACE, 1000);
  ASSERT_TRUE(trace.ok()) << trace.status();
  loadgen::ReplayOptions ro = e2e::TraceReplayOptions(cluster_->Get("r1")->grpc_address());
  const std::vector<std::string> ids = {"r1", "p1", "p2", "d1", "d2"};
  // Steady state: after two passes of the same requests, when the prefix
  // caches hold the working set (they grow until they do). A leak grows
  // what malloc has handed out with every pass; RSS does not tell it:
  // glibc keeps freed blocks in its arenas (the workers ask it to keep up to
  // 1 GiB: base::KeepFreedMemory), and a decode worker's RSS rose by ~20 MiB
  // at random later passes (a high-water buffer outgrowing its block leaves
  // the old one free in the arena) while its allocated
  // bytes grew by at most 8 MiB (swaserve_process_heap_free_bytes took the
  // rest). So the checks are on allocated bytes; RSS is printed. The
  // largest high-water buffers, the verify and draft logits (rows x
  // vocabulary floats), are allocated for the largest batch when the decode
  // core starts (DecodeCoreOptions::max_batch_size): before that they grew
  // at whichever pass first met a larger batch, by 7-8 MiB (4%) at two
  // measured passes in a row once, under load beside other tests. What is
  // left grows by 1.4-1.9 MiB (0.8%) at the first measured pass, then
  // 0.03-0.2 MiB; a leak grows every pass. Two measured passes: the smaller
  // of their two growths must be under 2% of the steady state (a leak of 2%
  // a pass fails), and the two together under 15%.
  for (int pass = 0; pass < 2; ++pass) {
    auto w = loadgen::Replay(*trace, ro);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->failed, 0);
  }
  struct Memory {
    double rss = 0, allocated = 0, free = 0;
  };
  auto memory = [&] {
    std::map<std::string, Memory> m;
    for (const std::string& id : ids) {
      m[id] = {.rss = cluster_->Metric(id, "process_resident_memory_bytes"),
               .allocated = cluster_->Metric(id, "swaserve_process_heap_allocated_bytes"),
               .free = cluster_->Metric(id, "swaserve_process_heap_free_bytes")};
    }
    return m;
  };
  std::vector<std::map<std::string, Memory>> after_pass = {memory()};
  for (int pass = 0; pass < 2; ++pass) {
    auto report = loadgen::Replay(*trace, ro);
    ASSERT_TRUE(report.ok()) << report.status();
    if (pass == 0) std::printf("%s\n", report->ToText().c_str());
    EXPECT_EQ(report->succeeded, 1000);
    EXPECT_EQ(report->failed, 0)
        << (report->error_samples.empty() ? "" : report->error_samples[0]);
    after_pass.push_back(memory());
  }
  for (const std::string& id : ids) {
    std::printf("%s: heap allocated / heap free / RSS KiB:", id.c_str());
    for (auto& m : after_pass) {
      std::printf("  %.0f / %.0f / %.0f", m[id].allocated / 1024, m[id].free / 1024,
                  m[id].rss / 1024);
    }
    std::printf("\n");
    const double s = after_pass[0][id].allocated;
    const double g1 = after_pass[1][id].allocated - s;
    const double g2 = after_pass[2][id].allocated - after_pass[1][id].allocated;
    EXPECT_GT(s, 0) << id << ": no heap figures on /metrics";
    EXPECT_LE(std::min(g1, g2), 0.02 * s) << id << ": allocated bytes grew every pass";
    EXPECT_LE(g1 + g2, 0.15 * s) << id;
  }
  // Every pool page free or cached once the load is gone.
  for (const char* id : {"p1", "p2", "d1", "d2"}) {
    for (const char* pool : {"full", "swa"}) {
      EXPECT_EQ(Pages(id, pool, "in_use"), 0) << id << " " << pool;
      EXPECT_EQ(Pages(id, pool, "reserved"), 0) << id << " " << pool;
    }
  }
}

}  // namespace
}  // namespace swaserve
