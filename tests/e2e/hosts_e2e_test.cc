// Faults a network makes (labels e2e, fault, hosts): every process of a
// small cluster on a host of its own (tests/integration/router/
// host_network.h: a network namespace per process, links shaped with tc,
// partitions that drop packets silently), KV over TCP between hosts. Each
// case runs streams, injects one fault while they are in flight, and
// compares every answer with the same greedy requests run before the fault:
// no request lost, no token duplicated or missing. Each prints a FAULT-ROW
// (bench/RESULTS.md: fault | requests | completed | identical | added
// latency p50 | p99) and how long the fault took to notice.
//
// Skipped where network namespaces cannot be created (not root, no `ip`,
// `tc` or `nft`).
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/loadgen/mooncake_trace.h"
#include "lib/loadgen/replay.h"
#include "lib/model/config.h"
#include "lib/transfer/kv_destination.h"
#include "tests/e2e/e2e_util.h"
#include "tests/integration/router/host_network.h"
#include "tests/integration/router/local_cluster.h"

namespace swaserve {
namespace {

using e2e::GenerateIds;
using e2e::GrpcResult;
using e2e::RandomPrompt;
using testing::HostNetwork;
using testing::LinkShape;
using testing::LocalCluster;

// A stream's messages: seconds since the run started, and tokens so far.
struct Timeline {
  std::vector<std::pair<double, int>> points;
  // The longest gap between two messages after `t`.
  double LongestGapAfter(double t) const {
    double worst = 0;
    for (size_t i = 1; i < points.size(); ++i) {
      if (points[i].first >= t) worst = std::max(worst, points[i].first - points[i - 1].first);
    }
    return worst;
  }
};

struct StreamRun {
  std::vector<GrpcResult> results;
  std::vector<Timeline> timelines;
  double fault_at = -1;  // seconds since the start; -1: no fault
};

// `prompts` streamed concurrently (greedy, `max_tokens` each); once every
// stream has `tokens_before_fault` tokens (or ended), `fault()` runs on this
// thread while they continue.
StreamRun RunStreams(v1::Router::Stub& stub, const std::vector<std::vector<uint32_t>>& prompts,
                     int max_tokens, int tokens_before_fault = 0,
                     const std::function<void()>& fault = nullptr) {
  StreamRun run;
  run.results.resize(prompts.size());
  run.timelines.resize(prompts.size());
  std::vector<std::atomic<int>> progress(prompts.size());
  std::vector<std::atomic<bool>> ended(prompts.size());
  const absl::Time t0 = absl::Now();
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    progress[i] = 0;
    ended[i] = false;
    threads.emplace_back([&, i] {
      run.results[i] = GenerateIds(
          stub, prompts[i], max_tokens,
          [&, i](int n) {
            run.timelines[i].points.emplace_back(absl::ToDoubleSeconds(absl::Now() - t0), n);
            progress[i] = n;
          },
          300);
      ended[i] = true;
    });
  }
  if (fault) {
    for (const absl::Time until = absl::Now() + absl::Seconds(120); absl::Now() < until;
         absl::SleepFor(absl::Milliseconds(2))) {
      bool ready = true;
      for (size_t i = 0; i < prompts.size(); ++i) {
        ready = ready && (ended[i] || progress[i] >= tokens_before_fault);
      }
      if (ready) break;
    }
    run.fault_at = absl::ToDoubleSeconds(absl::Now() - t0);
    fault();
  }
  for (std::thread& t : threads) t.join();
  return run;
}

// Every request of `got` completed with `ref`'s tokens.
void ExpectIdentical(const StreamRun& ref, const StreamRun& got) {
  ASSERT_EQ(ref.results.size(), got.results.size());
  for (size_t i = 0; i < got.results.size(); ++i) {
    ASSERT_TRUE(ref.results[i].status.ok()) << i << ": " << ref.results[i].status.error_message();
    EXPECT_TRUE(got.results[i].status.ok()) << i << ": " << got.results[i].status.error_message();
    EXPECT_EQ(got.results[i].tokens, ref.results[i].tokens) << "request " << i;
  }
}

// The longest stall of any stream across the fault: from its last message
// before the fault to its first after.
double LongestStall(const StreamRun& run) {
  double worst = 0;
  for (const Timeline& t : run.timelines) worst = std::max(worst, t.LongestGapAfter(run.fault_at));
  return worst;
}

// Polls `read` every 20 ms until `done(value)` or `limit` passed; the
// seconds it took (limit when never).
double SecondsUntil(const std::function<double()>& read, const std::function<bool(double)>& done,
                    absl::Duration limit) {
  const absl::Time t0 = absl::Now();
  while (absl::Now() - t0 < limit) {
    if (done(read())) return absl::ToDoubleSeconds(absl::Now() - t0);
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::ToDoubleSeconds(limit);
}

// One row of bench/RESULTS.md's fault table: fault | requests | completed |
// identical | detection | added latency p50 | p99 (against `ref`, the same
// requests without the fault).
void PrintRow(const std::string& fault, const StreamRun& ref, const StreamRun& got,
              double detection_seconds, const std::string& note = "") {
  int completed = 0, identical = 0;
  std::vector<double> added;
  for (size_t i = 0; i < got.results.size(); ++i) {
    if (!got.results[i].status.ok()) continue;
    ++completed;
    if (i < ref.results.size() && ref.results[i].status.ok()) {
      identical += got.results[i].tokens == ref.results[i].tokens;
      added.push_back(got.results[i].seconds - ref.results[i].seconds);
    }
  }
  std::printf("FAULT-ROW | %s | %zu | %d | %d | %.2f s | %.2f s | %.2f s | %s\n", fault.c_str(),
              got.results.size(), completed, identical, detection_seconds,
              e2e::Quantile(added, 0.5), e2e::Quantile(added, 0.99), note.c_str());
  std::fflush(stdout);
}

std::vector<std::vector<uint32_t>> Prompts(int n, int len, uint32_t seed) {
  std::vector<std::vector<uint32_t>> out;
  for (int i = 0; i < n; ++i) out.push_back(RandomPrompt(len, seed + i));
  return out;
}

class HostsE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<HostNetwork>> net =
        HostNetwork::Create({.link_delay_bin = SWASERVE_LINK_DELAY_BIN});
    if (absl::IsFailedPrecondition(net.status())) {
      GTEST_SKIP() << "multi-host tests skipped: " << net.status().message();
    }
    ASSERT_TRUE(net.ok()) << net.status();
    net_ = std::move(*net);
  }

  // Redis, a router r1 and the given workers, each on its own host.
  void StartCluster(const std::vector<std::pair<std::string, std::string>>& workers,
                    std::vector<std::string> worker_flags = {},
                    std::vector<std::string> router_flags = {}) {
    testing::LocalClusterOptions o;
    o.cli_bin = SWASERVE_CLI_BIN;
    o.worker_bin = SWASERVE_WORKER_BIN;
    o.router_bin = SWASERVE_ROUTER_BIN;
    o.worker_flags = {"--model_name=tiny", "--kv.page_size=16", "--prefill.chunk_tokens=256"};
    o.worker_flags.insert(o.worker_flags.end(), worker_flags.begin(), worker_flags.end());
    o.router_flags = std::move(router_flags);
    o.network = net_.get();
    o.model_dir = model_dir_;
    absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
    for (const auto& [role, id] : workers) {
      absl::StatusOr<testing::LocalProcess*> p = cluster_->StartWorker(role, id);
      ASSERT_TRUE(p.ok()) << p.status();
    }
    absl::StatusOr<testing::LocalProcess*> r = cluster_->StartRouter("r1");
    ASSERT_TRUE(r.ok()) << r.status();
    const absl::Status healthy = cluster_->WaitHealthy("r1", absl::Seconds(30));
    ASSERT_TRUE(healthy.ok()) << healthy;
    stub_ = cluster_->RouterStub("r1");
  }

  double RouterMetric(const std::string& line) { return cluster_->Metric("r1", line); }

  // Of two decode workers, the one running more requests now.
  std::string BusierDecode(const std::string& a, const std::string& b) {
    const std::string running = "swaserve_decode_running_requests";
    return cluster_->Metric(a, running) >= cluster_->Metric(b, running) ? a : b;
  }

  // Seconds until the router's `line` exceeds `above` (limit when never).
  double UntilRouterMetricAbove(const std::string& line, double above, absl::Duration limit) {
    return SecondsUntil([&] { return RouterMetric(line); }, [&](double v) { return v > above; },
                        limit);
  }

  // Declared in this order: the cluster's processes stop before the
  // network goes.
  std::unique_ptr<HostNetwork> net_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::Router::Stub> stub_;
  // StartCluster's model (empty: the tiny random one).
  std::string model_dir_;
};

// Run only by the test below, in a child process: a network with two
// hosts, a process on one of them, the names written to $SWASERVE_HOSTS_MARKER;
// then it waits to be killed.
TEST(HostNetworkChild, DISABLED_HoldANetworkUntilKilled) {
  const char* marker = std::getenv("SWASERVE_HOSTS_MARKER");
  ASSERT_NE(marker, nullptr);
  absl::StatusOr<std::unique_ptr<HostNetwork>> net = HostNetwork::Create();
  ASSERT_TRUE(net.ok()) << net.status();
  for (const char* h : {"a", "b"}) ASSERT_TRUE((*net)->AddHost(h).ok());
  absl::StatusOr<std::unique_ptr<base::Subprocess>> sleeper =
      base::Subprocess::Start({.argv = (*net)->Wrap("a", {"sleep", "600"})});
  ASSERT_TRUE(sleeper.ok()) << sleeper.status();
  {
    std::ofstream out(std::string(marker) + ".tmp");
    out << (*net)->Get("a")->netns << " " << (*net)->Get("b")->netns << " "
        << (*net)->Get("a")->veth << " " << (*sleeper)->pid() << "\n";
  }
  std::rename((std::string(marker) + ".tmp").c_str(), marker);
  absl::SleepFor(absl::Seconds(600));
}

// A test process killed with SIGKILL leaves no namespace, link or process
// behind: its reaper deletes them.
TEST(HostNetworkTest, AKilledTestLeavesNothingBehind) {
  {
    absl::StatusOr<std::unique_ptr<HostNetwork>> probe = HostNetwork::Create();
    if (absl::IsFailedPrecondition(probe.status())) {
      GTEST_SKIP() << "multi-host tests skipped: " << probe.status().message();
    }
    ASSERT_TRUE(probe.ok()) << probe.status();
  }
  absl::StatusOr<std::string> dir = base::MakeTempDir("hosts-reaper");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string marker = *dir + "/names";
  std::string self(4096, '\0');
  self.resize(std::max<ssize_t>(0, readlink("/proc/self/exe", self.data(), self.size())));
  absl::StatusOr<std::unique_ptr<base::Subprocess>> child = base::Subprocess::Start(
      {.argv = {self, "--gtest_filter=HostNetworkChild.DISABLED_HoldANetworkUntilKilled",
                "--gtest_also_run_disabled_tests"},
       .env = {"SWASERVE_HOSTS_MARKER=" + marker},
       .log_path = *dir + "/child.log"});
  ASSERT_TRUE(child.ok()) << child.status();
  std::string ns_a, ns_b, veth;
  int sleeper = 0;
  for (const absl::Time until = absl::Now() + absl::Seconds(30); absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(50))) {
    std::ifstream in(marker);
    if (in >> ns_a >> ns_b >> veth >> sleeper) break;
  }
  ASSERT_GT(sleeper, 0) << "the child did not set up its network: " << (*child)->ReadLog();
  auto listed = [](const std::vector<std::string>& cmd, const std::string& name) {
    std::string out;
    (void)base::RunCommand(cmd, &out);
    return absl::StrContains(out, name);
  };
  ASSERT_TRUE(listed({"ip", "netns", "list"}, ns_a));
  ASSERT_EQ(kill(sleeper, 0), 0);
  ASSERT_TRUE((*child)->Signal(SIGKILL).ok());
  ASSERT_TRUE((*child)->Wait(absl::Seconds(10)).ok());
  const absl::Time killed = absl::Now();
  bool gone = false;
  while (!gone && absl::Now() - killed < absl::Seconds(20)) {
    gone = !listed({"ip", "netns", "list"}, ns_a) && !listed({"ip", "netns", "list"}, ns_b) &&
           !listed({"ip", "-o", "link", "show"}, veth) && kill(sleeper, 0) != 0;
    if (!gone) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(gone) << "left behind after SIGKILL: " << ns_a << " " << ns_b << " " << veth
                    << " pid " << sleeper;
  std::printf("SIGKILLed test cleaned up after %.2f s\n",
              absl::ToDoubleSeconds(absl::Now() - killed));
  std::error_code ec;
  std::filesystem::remove_all(*dir, ec);
}

TEST_F(HostsE2ETest, HostsReachEachOtherAndPartitionsDropSilentlyUntilHealed) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}});
  const auto prompts = Prompts(2, 300, 7000);
  const StreamRun ref = RunStreams(*stub_, prompts, 16);
  for (const GrpcResult& r : ref.results) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 16u);
  }
  // KV crossed the hosts (UCX_TLS=tcp there: over TCP on eth0).
  EXPECT_EQ(cluster_->Metric("p1", "swaserve_kv_transfers_total{direction=\"send\",result=\"ok\"}"),
            2);
  // The router's host cut off: the client's HTTP call to it fails after
  // its own timeout, silently (no refusal), and works again once healed.
  ASSERT_TRUE(net_->Partition("r1").ok());
  const absl::Time t0 = absl::Now();
  httplib::Client cli(cluster_->Get("r1")->host, cluster_->Get("r1")->http_port);
  cli.set_connection_timeout(1, 0);
  httplib::Result res = cli.Get("/health");
  EXPECT_FALSE(res) << "a partitioned host answered";
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(900)) << "the partition was not silent";
  ASSERT_TRUE(net_->Heal("r1").ok());
  ASSERT_TRUE(cluster_->WaitHealthy("r1", absl::Seconds(10)).ok());
  // Added delay (netem, where the kernel has it): a request to the router
  // and its answer cross its link once each way.
  const absl::Status delayed = net_->Shape("r1", {.delay = absl::Milliseconds(50)});
  if (absl::IsFailedPrecondition(delayed)) {
    std::printf("link delay not checked: %s\n", std::string(delayed.message()).c_str());
    return;
  }
  ASSERT_TRUE(delayed.ok()) << delayed;
  const absl::Time t1 = absl::Now();
  ASSERT_TRUE(cluster_->WaitHealthy("r1", absl::Seconds(10)).ok());
  EXPECT_GE(absl::Now() - t1, absl::Milliseconds(100)) << "the delay was not applied";
  ASSERT_TRUE(net_->Shape("r1", {}).ok());
}

// A decode host vanishes (its packets dropped both ways, no RST) while it
// streams: the router notices when its HTTP/2 keepalive goes unanswered
// (lib/rpc/channel.h) and migrates each stream — prompt plus the tokens
// already sent — to the other decode host; the client's streams continue
// with exactly the tokens an unfaulted run gives. Healed, the host
// registers again.
TEST_F(HostsE2ETest, ADecodeHostPartitionedMidStreamMigratesItsStreams) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}, {"decode", "d2"}});
  const auto prompts = Prompts(4, 200, 7100);
  constexpr int kTokens = 400;
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);
  const std::string lost = "swaserve_router_migrations_total{reason=\"worker_lost\"}";
  const double before = RouterMetric(lost);
  std::string victim;
  double detection = -1;
  const StreamRun got = RunStreams(*stub_, prompts, kTokens, 20, [&] {
    victim = BusierDecode("d1", "d2");
    ASSERT_TRUE(net_->Partition(victim).ok());
    detection = UntilRouterMetricAbove(lost, before, absl::Seconds(90));
  });
  ExpectIdentical(ref, got);
  EXPECT_GE(RouterMetric(lost), before + 1) << "no stream migrated off " << victim;
  EXPECT_LT(detection, 60) << "the partition was not noticed within a minute";
  PrintRow("decode host partitioned mid-stream", ref, got, detection,
           absl::StrCat("longest stream stall ", LongestStall(got), " s"));
  // Healed: the worker is registered again and serves.
  ASSERT_TRUE(net_->Heal(victim).ok());
  const double back =
      SecondsUntil([&] { return cluster_->Metric(victim, "swaserve_cluster_registered"); },
                   [](double v) { return v == 1; }, absl::Seconds(30));
  // Its breaker (opened by the failed streams) closes again: the router
  // uses the host once more.
  const double breakers =
      SecondsUntil([&] { return RouterMetric("swaserve_router_open_breakers"); },
                   [](double v) { return v == 0; }, absl::Seconds(30));
  std::printf("%s registered again %.2f s after the heal, no breaker open after %.2f s\n",
              victim.c_str(), back, breakers);
  EXPECT_LT(back, 10);
  EXPECT_LT(breakers, 30);
  const std::string ok_streams = "swaserve_decode_streams_total{result=\"ok\"}";
  const std::string free_pages = "swaserve_kv_pages{pool=\"full\",state=\"free\"}";
  const std::string running = "swaserve_decode_running_requests";
  const std::string other = victim == "d1" ? "d2" : "d1";
  std::printf("after the heal: %s running %.0f, free full pages %.0f; %s running %.0f, free %.0f\n",
              victim.c_str(), cluster_->Metric(victim, running),
              cluster_->Metric(victim, free_pages), other.c_str(), cluster_->Metric(other, running),
              cluster_->Metric(other, free_pages));
  // One request at a time, apart by more than a load report's period: the
  // healed host gets its share again.
  const double victim_streams = cluster_->Metric(victim, ok_streams);
  for (const std::vector<uint32_t>& p : Prompts(12, 200, 7150)) {
    const GrpcResult r = GenerateIds(*stub_, p, 20);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    absl::SleepFor(absl::Milliseconds(300));
  }
  std::printf("of 12 requests after the heal, %s served %.0f\n", victim.c_str(),
              cluster_->Metric(victim, ok_streams) - victim_streams);
  EXPECT_GT(cluster_->Metric(victim, ok_streams), victim_streams)
      << "the healed host got no stream";
}

// A prefill host vanishes in the middle of a long prompt while short
// streams run: the router's keepalive toward workers notices (the prefill
// call waits for its answer, so nothing else would), the prefill leg is
// retried on the other prefill host, and every answer is the unfaulted one.
TEST_F(HostsE2ETest, APrefillHostPartitionedMidPromptIsRetriedOnAnother) {
  // Pings toward workers every 10 s (the least workers accept), unanswered
  // for 5 s: a silent worker is dropped within 15 s (default 30 s + 10 s).
  StartCluster({{"prefill", "p1"}, {"prefill", "p2"}, {"decode", "d1"}}, {"--kv.prefill_mib=256"},
               {"--worker_keepalive=10s", "--worker_keepalive_timeout=5s"});
  std::vector<std::vector<uint32_t>> prompts = Prompts(3, 200, 7200);
  prompts.push_back(RandomPrompt(8192, 7299));  // 32 steps of 256
  constexpr int kTokens = 60;
  const std::string retries = "swaserve_router_retries_total{leg=\"prefill\"}";
  const double before = RouterMetric(retries);
  std::string victim;
  double detection = -1;
  StreamRun faulted;
  {
    std::thread fault([&] {
      // The prefill host computing the long prompt, once it started it.
      const std::string steps = "swaserve_prefill_step_tokens_sum";
      SecondsUntil(
          [&] { return std::max(cluster_->Metric("p1", steps), cluster_->Metric("p2", steps)); },
          [](double v) { return v >= 2048; }, absl::Seconds(60));
      victim = cluster_->Metric("p1", steps) >= cluster_->Metric("p2", steps) ? "p1" : "p2";
      ASSERT_TRUE(net_->Partition(victim).ok());
      detection = UntilRouterMetricAbove(retries, before, absl::Seconds(90));
    });
    faulted = RunStreams(*stub_, prompts, kTokens);
    fault.join();
  }
  ASSERT_TRUE(net_->Heal(victim).ok());
  // The unfaulted answers (the prompts now cached somewhere: greedy output
  // does not depend on it).
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);
  ExpectIdentical(ref, faulted);
  EXPECT_GE(RouterMetric(retries), before + 1) << "the prefill leg was not retried";
  EXPECT_LT(detection, 25) << "not noticed within --worker_keepalive + timeout (+ slack)";
  PrintRow(
      "prefill host partitioned mid-prompt (8,192 tokens, --worker_keepalive=10s, _timeout=5s)",
      ref, faulted, detection,
      absl::StrCat("long prompt ", faulted.results.back().seconds, " s vs ",
                   ref.results.back().seconds, " s cached"));
}

// Redis hangs (SIGSTOP: connections stay open, nothing answers) for 8 s
// while streams run and new requests arrive; then it resumes. Routers keep
// deciding on their index mirror (loads unknown), streams in flight are
// untouched, and the workers' records, expired while Redis slept, come back
// with their next heartbeat.
TEST_F(HostsE2ETest, AHungRedisCostsNoRequest) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}});
  const auto prompts = Prompts(6, 200, 7300);
  constexpr int kTokens = 200;
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);
  const std::string fallbacks = "swaserve_router_redis_fallbacks_total";
  const double before = RouterMetric(fallbacks);
  double detection = -1;
  StreamRun late;
  const std::vector<std::vector<uint32_t>> more = Prompts(4, 200, 7350);
  const StreamRun late_ref = RunStreams(*stub_, more, 40);
  const StreamRun got = RunStreams(*stub_, prompts, kTokens, 20, [&] {
    ASSERT_TRUE(cluster_->redis().pid() > 0);
    ASSERT_EQ(kill(cluster_->redis().pid(), SIGSTOP), 0);
    const absl::Time stopped = absl::Now();
    std::thread newcomers([&] { late = RunStreams(*stub_, more, 40); });
    detection = UntilRouterMetricAbove(fallbacks, before, absl::Seconds(8));
    absl::SleepFor(stopped + absl::Seconds(8) - absl::Now());
    ASSERT_EQ(kill(cluster_->redis().pid(), SIGCONT), 0);
    newcomers.join();
  });
  ExpectIdentical(ref, got);
  ExpectIdentical(late_ref, late);
  PrintRow("Redis hung (SIGSTOP 8 s)", ref, got, detection,
           absl::StrCat("4 requests sent during the hang: ", late.results.size(), " ok-checked"));
  PrintRow("Redis hung (SIGSTOP 8 s): requests sent during the hang", late_ref, late, detection);
}

// The router's host loses Redis (packets dropped both ways) while every
// worker still reaches it: the router decides on its index mirror, requests
// complete; healed, it reads Redis again.
TEST_F(HostsE2ETest, ARouterCutFromRedisKeepsRouting) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}});
  const auto prompts = Prompts(4, 200, 7400);
  const auto more = Prompts(4, 200, 7450);
  constexpr int kTokens = 100;
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);
  const StreamRun more_ref = RunStreams(*stub_, more, kTokens);
  const std::string fallbacks = "swaserve_router_redis_fallbacks_total";
  const double before = RouterMetric(fallbacks);
  double detection = -1;
  StreamRun during, later;
  const StreamRun got = RunStreams(*stub_, prompts, kTokens, 10, [&] {
    ASSERT_TRUE(net_->PartitionFrom("r1", "redis").ok());
    std::thread detect(
        [&] { detection = UntilRouterMetricAbove(fallbacks, before, absl::Seconds(30)); });
    during = RunStreams(*stub_, more, kTokens);
    detect.join();
    // Later in the outage: the client's connection is gone, reconnects
    // fail after connect_timeout, with backoff.
    absl::SleepFor(absl::Seconds(3));
    later = RunStreams(*stub_, more, kTokens);
  });
  ASSERT_TRUE(net_->Heal("r1").ok());
  ExpectIdentical(ref, got);
  ExpectIdentical(more_ref, during);
  ExpectIdentical(more_ref, later);
  PrintRow("router cut from Redis", more_ref, during, detection, "requests sent at the cut");
  PrintRow("router cut from Redis", more_ref, later, detection, "requests sent 3 s into the cut");
  const StreamRun after = RunStreams(*stub_, more, kTokens);
  ExpectIdentical(more_ref, after);
}

// Asymmetric: a decode worker loses Redis while the router still reaches
// it. Its streams in flight finish; its record expires (the router stops
// choosing it: believed gone while it could serve, never the reverse); new
// requests go to the other decode worker; healed, it registers again.
TEST_F(HostsE2ETest, ADecodeWorkerCutFromRedisOnlyFinishesItsStreamsAndRejoins) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}, {"decode", "d2"}});
  const auto prompts = Prompts(4, 200, 7500);
  const auto more = Prompts(4, 200, 7550);
  constexpr int kTokens = 200;
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);
  const StreamRun more_ref = RunStreams(*stub_, more, 40);
  const std::string migrations = "swaserve_router_migrations_total{reason=\"worker_lost\"}";
  const std::string streams = "swaserve_decode_streams_total{result=\"ok\"}";
  const double migrations_before = RouterMetric(migrations);
  std::string victim;
  double unregistered = -1, victim_before = -1, victim_after = -1;
  StreamRun during;
  const StreamRun got = RunStreams(*stub_, prompts, kTokens, 20, [&] {
    victim = BusierDecode("d1", "d2");
    ASSERT_TRUE(net_->PartitionFrom(victim, "redis").ok());
    unregistered =
        SecondsUntil([&] { return cluster_->Metric(victim, "swaserve_cluster_registered"); },
                     [](double v) { return v == 0; }, absl::Seconds(30));
    absl::SleepFor(absl::Seconds(1));  // the router's registry refresh
    victim_before = cluster_->Metric(victim, streams);
    during = RunStreams(*stub_, more, 40);
    victim_after = cluster_->Metric(victim, streams);
  });
  ASSERT_TRUE(net_->Heal(victim).ok());
  const double back =
      SecondsUntil([&] { return cluster_->Metric(victim, "swaserve_cluster_registered"); },
                   [](double v) { return v == 1; }, absl::Seconds(30));
  ExpectIdentical(ref, got);
  ExpectIdentical(more_ref, during);
  EXPECT_EQ(RouterMetric(migrations), migrations_before)
      << "streams on the worker the router still reached were moved";
  EXPECT_EQ(victim_after, victim_before) << "new requests went to a worker without a record";
  EXPECT_LT(unregistered, 10) << victim << " believed itself registered";
  EXPECT_LT(back, 10);
  PrintRow("decode worker cut from Redis only (router reaches it)", ref, got, unregistered,
           absl::StrCat("knew its record expired after ", unregistered, " s; registered again ",
                        back, " s after the heal"));
}

// The reverse asymmetry: a decode host the router cannot reach while it
// still reaches Redis (so it stays registered) and the prefill host. A call
// sent to it on the connection opened before the cut gets no answer: the
// router gives up on it after its 10 s wait for the decode worker's first
// message and retries the request on the other decode host; the failures
// open the host's breaker, so later requests skip it; healed, the breaker
// closes again.
TEST_F(HostsE2ETest, ADecodeHostTheRouterCannotReachIsSkippedByItsBreaker) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}, {"decode", "d2"}}, {},
               {"--breaker.open_for=10s"});
  constexpr int kWaves = 6, kPerWave = 4, kTokens = 40;
  std::vector<std::vector<std::vector<uint32_t>>> waves;
  std::vector<StreamRun> refs;
  for (int w = 0; w < kWaves; ++w) {
    waves.push_back(Prompts(kPerWave, 200, 7900 + 10 * w));
    refs.push_back(RunStreams(*stub_, waves.back(), kTokens));
  }
  const std::string breakers = "swaserve_router_open_breakers";
  ASSERT_TRUE(net_->PartitionFrom("d1", "r1").ok());
  const absl::Time cut = absl::Now();
  // Waves of requests (a burst goes to one decode worker: loads are read,
  // not predicted) until one went to d1 and its breaker opened.
  double detection = -1;
  StreamRun hit_ref, hit;  // every request of the waves sent until then
  int w = 0;
  for (; w < kWaves && detection < 0; ++w) {
    const StreamRun got = RunStreams(*stub_, waves[w], kTokens);
    ExpectIdentical(refs[w], got);
    hit_ref.results.insert(hit_ref.results.end(), refs[w].results.begin(), refs[w].results.end());
    hit.results.insert(hit.results.end(), got.results.begin(), got.results.end());
    if (RouterMetric(breakers) >= 1) detection = absl::ToDoubleSeconds(absl::Now() - cut);
  }
  ASSERT_GE(detection, 0) << "no request of " << kWaves << " waves went to d1";
  // The breaker is open: the next wave skips d1.
  const StreamRun later = RunStreams(*stub_, waves[w % kWaves], kTokens);
  ExpectIdentical(refs[w % kWaves], later);
  EXPECT_EQ(cluster_->Metric("d1", "swaserve_cluster_registered"), 1)
      << "d1 reaches Redis: it stays registered";
  ASSERT_TRUE(net_->Heal("d1").ok());
  const double closed = SecondsUntil([&] { return RouterMetric(breakers); },
                                     [](double v) { return v == 0; }, absl::Seconds(30));
  PrintRow("decode host the router cannot reach (it reaches Redis and prefill)", hit_ref, hit,
           detection, absl::StrCat(w, " waves of 4 until its breaker opened"));
  PrintRow("decode host the router cannot reach: requests once its breaker is open",
           refs[w % kWaves], later, 0,
           absl::StrCat("the breaker closed ", closed, " s after the heal"));
  EXPECT_LT(closed, 30);
}

// A decode host vanishes while a prompt's KV crosses to it (the prefill
// host's link slowed to 10 Mbit/s so the transfer lasts seconds): the
// sender's transfer deadline (--transfer.timeout, 10 s here) ends the ship,
// the prefill worker keeps the KV, and the router retries the pair with the
// other decode host — a prefix hit, so only the transfer is redone. The
// answer is the unfaulted one.
TEST_F(HostsE2ETest, ADecodeHostPartitionedDuringAKvTransferGetsTheRequestRetried) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}, {"decode", "d2"}});
  std::vector<std::vector<uint32_t>> prompts = {RandomPrompt(8192, 7800)};
  const auto shorts = Prompts(3, 200, 7810);
  prompts.insert(prompts.end(), shorts.begin(), shorts.end());
  constexpr int kTokens = 40;
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);  // p1 caches them
  ASSERT_TRUE(net_->Shape("p1", {.rate_bits_per_second = 10'000'000}).ok());
  const std::string in_flight = "swaserve_kv_transfers_in_flight{direction=\"receive\"}";
  const std::string retries = "swaserve_router_retries_total{leg=\"decode\"}";
  const double retries_before = RouterMetric(retries);
  std::string victim;
  double detection = -1;
  StreamRun got;
  std::thread fault([&] {
    const double waited = SecondsUntil(
        [&] { return cluster_->Metric("d1", in_flight) + cluster_->Metric("d2", in_flight); },
        [](double v) { return v >= 1; }, absl::Seconds(60));
    victim = cluster_->Metric("d1", in_flight) >= 1 ? "d1" : "d2";
    ASSERT_LT(waited, 60) << "no KV transfer in flight";
    ASSERT_TRUE(net_->Partition(victim).ok());
    detection = UntilRouterMetricAbove(retries, retries_before, absl::Seconds(60));
  });
  got = RunStreams(*stub_, prompts, kTokens);
  fault.join();
  ASSERT_TRUE(net_->Shape("p1", {}).ok());
  ASSERT_TRUE(net_->Heal(victim).ok());
  ExpectIdentical(ref, got);
  EXPECT_GE(RouterMetric(retries), retries_before + 1) << "the decode leg was not retried";
  EXPECT_GE(
      cluster_->Metric(
          "p1", "swaserve_kv_transfer_failures_total{direction=\"send\",reason=\"timeout\"}") +
          cluster_->Metric(
              "p1",
              "swaserve_kv_transfer_failures_total{direction=\"send\",reason=\"peer_failure\"}"),
      1);
  PrintRow("decode host partitioned during a KV transfer (10 Mbit/s link)", ref, got, detection,
           absl::StrCat("the 8,192-token prompt took ", got.results[0].seconds, " s"));
}

// A decode host's link flaps: down 1 s, up 1 s, five times, while it
// streams. TCP rides it out (retransmits; keepalive's 10 s timeout never
// fires): no stream migrates, none fails, tokens identical.
TEST_F(HostsE2ETest, AFlappingDecodeLinkCostsNoRequest) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}, {"decode", "d2"}});
  const auto prompts = Prompts(4, 200, 7600);
  constexpr int kTokens = 300;
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);
  std::string victim;
  const StreamRun got = RunStreams(*stub_, prompts, kTokens, 10, [&] {
    victim = BusierDecode("d1", "d2");
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(net_->Partition(victim).ok());
      absl::SleepFor(absl::Seconds(1));
      ASSERT_TRUE(net_->Heal(victim).ok());
      absl::SleepFor(absl::Seconds(1));
    }
  });
  ExpectIdentical(ref, got);
  PrintRow("decode link flapping (1 s down / 1 s up x5)", ref, got, 0,
           absl::StrCat("migrations ",
                        RouterMetric("swaserve_router_migrations_total{reason=\"worker_lost\"}"),
                        ", longest stall ", LongestStall(got), " s"));
}

// One decode host behind a slow, lossy link (20 Mbit/s, 2% loss each way):
// KV and tokens crawl to it, nothing is lost or changed.
TEST_F(HostsE2ETest, ASlowLossyLinkToOneDecodeHostCostsNoRequest) {
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}, {"decode", "d2"}});
  const auto prompts = Prompts(8, 400, 7700);
  constexpr int kTokens = 100;
  const StreamRun ref = RunStreams(*stub_, prompts, kTokens);
  ASSERT_TRUE(net_->Shape("d1", {.rate_bits_per_second = 20'000'000, .loss = 0.02}).ok());
  const StreamRun got = RunStreams(*stub_, prompts, kTokens);
  ASSERT_TRUE(net_->Shape("d1", {}).ok());
  ExpectIdentical(ref, got);
  PrintRow("slow lossy link to one decode host (20 Mbit/s, 2% loss)", ref, got, 0,
           absl::StrCat("streams served by d1: ",
                        cluster_->Metric("d1", "swaserve_decode_streams_total{result=\"ok\"}")));
}

// Chaos across hosts: the 1,000-request trace replay while, every 0.5-1.5 s, a
// fault hits a random worker's host, the kinds in turn — a partition of 1-4 s (a blip TCP rides
// out or the keepalive notices), kill -9 and restart of a worker, a slow
// lossy link for a few seconds, Redis's host partitioned or Redis hung by
// SIGSTOP for 2 s. Every request completes.
TEST_F(HostsE2ETest, ChaosAcrossHostsDuringAThousandRequestReplayLosesNone) {
  StartCluster({{"prefill", "p1"}, {"prefill", "p2"}, {"decode", "d1"}, {"decode", "d2"}});
  auto trace = loadgen::LoadMooncakeTrace(SWASERVE_TRACE, 1000);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const loadgen::ReplayOptions ro = e2e::TraceReplayOptions(cluster_->Get("r1")->grpc_address());
  auto calm = loadgen::Replay(*trace, ro);
  ASSERT_TRUE(calm.ok()) << calm.status();
  EXPECT_EQ(calm->failed, 0);
  std::printf("no faults:\n%s\n", calm->ToText().c_str());
  std::atomic<bool> stop{false};
  std::vector<std::string> log;  // the chaos thread's until joined
  std::thread chaos([&] {
    std::mt19937 rng(20261207);
    const std::vector<std::string> workers = {"p1", "p2", "d1", "d2"};
    auto sleep_ms = [&](int ms) {
      for (const absl::Time until = absl::Now() + absl::Milliseconds(ms);
           !stop.load() && absl::Now() < until;) {
        absl::SleepFor(absl::Milliseconds(20));
      }
    };
    while (!stop.load()) {
      sleep_ms(500 + static_cast<int>(rng() % 1000));
      if (stop.load()) break;
      const std::string v = workers[rng() % workers.size()];
      const int kind = static_cast<int>(log.size() % 5);  // every kind, in turn
      absl::Status s;
      std::string what;
      if (kind == 0) {
        const int ms = 1000 + static_cast<int>(rng() % 3000);
        what = absl::StrCat("partition ", v, " ", ms, " ms");
        s = net_->Partition(v);
        sleep_ms(ms);
        if (s.ok()) s = net_->Heal(v);
      } else if (kind == 1) {
        what = absl::StrCat("kill -9 ", v);
        s = cluster_->Kill(v);
        if (s.ok()) s = cluster_->StartWorker(v[0] == 'p' ? "prefill" : "decode", v).status();
      } else if (kind == 2) {
        what = absl::StrCat("slow lossy ", v);
        s = net_->Shape(v, {.rate_bits_per_second = 10'000'000, .loss = 0.03});
        sleep_ms(3000);
        if (s.ok()) s = net_->Shape(v, {});
      } else if (kind == 3) {
        what = "Redis host partitioned 2 s";
        s = net_->Partition("redis");
        sleep_ms(2000);
        if (s.ok()) s = net_->Heal("redis");
      } else {
        what = "Redis SIGSTOP 2 s";
        s = kill(cluster_->redis().pid(), SIGSTOP) == 0 ? absl::OkStatus()
                                                        : absl::InternalError("SIGSTOP");
        sleep_ms(2000);
        kill(cluster_->redis().pid(), SIGCONT);
      }
      log.push_back(s.ok() ? what : absl::StrCat(what, " (", s.ToString(), ")"));
    }
  });
  auto report = loadgen::Replay(*trace, ro);
  stop = true;
  chaos.join();
  ASSERT_TRUE(report.ok()) << report.status();
  std::printf("chaos across hosts:\n%s\n", report->ToText().c_str());
  std::string faults;
  for (const std::string& f : log) faults += f + "; ";
  std::printf(
      "FAULT-ROW | chaos across hosts (%zu faults) | %zu | %lld | - | - | p50 %.2f s / p99 %.2f s "
      "e2e "
      "vs %.2f / %.2f calm | %s\n",
      log.size(), trace->size(), static_cast<long long>(report->succeeded), report->e2e_s.p50,
      report->e2e_s.p99, calm->e2e_s.p50, calm->e2e_s.p99, faults.c_str());
  EXPECT_GE(log.size(), 3u) << "too few faults to mean anything";
  EXPECT_EQ(report->failed, 0) << (report->error_samples.empty() ? "" : report->error_samples[0]);
  EXPECT_EQ(report->succeeded, static_cast<int>(trace->size()));
}

// "100 Mbit/s, +5ms each way", "unlimited".
std::string LinkName(const LinkShape& link) {
  std::string name = link.rate_bits_per_second > 0
                         ? absl::StrCat(link.rate_bits_per_second / 1'000'000, " Mbit/s")
                         : "unlimited";
  if (link.delay > absl::ZeroDuration()) {
    absl::StrAppend(&name, ", +", absl::FormatDuration(link.delay), " each way");
  }
  return name;
}

// KV over a real network stack: the demo model's prompt KV shipped from the
// prefill host to the decode host while the prefill host's link is limited
// (tbf) to 250, 100 and 10 Mbit/s — 25, 10 and 1 Gbit/s scaled by 1/100 to
// what two cores push through UCX over TCP — and unlimited. Per bandwidth: the
// bytes shipped (full KV for every token, SWA KV for the last window), the
// sender's transfer time, TTFT (max_tokens 1), what the bandwidth alone
// predicts, and the bytes and predicted time of shipping SWA KV for every
// token instead. Prints TRANSFER-ROW lines (bench/RESULTS.md).
TEST_F(HostsE2ETest, KvTransferTimeAndTtftAgainstLinkBandwidth) {
  model_dir_ = SWASERVE_SOURCE_DIR "/models/demo";
  StartCluster({{"prefill", "p1"}, {"decode", "d1"}},
               {"--kv.prefill_mib=256", "--kv.decode_mib=256"});
  absl::StatusOr<model::ModelConfig> config = model::ModelConfig::Load(model_dir_ + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const kv::KvShape shape = config->KvShape(16);
  constexpr int kTokens = 4096;
  const std::string bytes = "swaserve_kv_transfer_bytes_total{direction=\"send\"}";
  const std::string seconds = "swaserve_kv_transfer_seconds_sum{direction=\"send\"}";
  const std::string count = "swaserve_kv_transfer_seconds_count{direction=\"send\"}";
  absl::StatusOr<transfer::KvStagingPlan> plan = transfer::PlanStaging(shape, kTokens);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double all_swa = static_cast<double>(transfer::NaiveTransferBytes(shape, kTokens));
  std::mt19937 rng(8800);
  int seed = 0;
  // Then added latency, on each direction of the prefill host's link (its
  // round trip to the decode host grows by twice that), alone and at the
  // 10 Gbit/s point.
  const std::vector<LinkShape> links = {
      {},
      {.rate_bits_per_second = 250'000'000},
      {.rate_bits_per_second = 100'000'000},
      {.rate_bits_per_second = 10'000'000},
      {.delay = absl::Milliseconds(5)},
      {.delay = absl::Milliseconds(20)},
      {.rate_bits_per_second = 100'000'000, .delay = absl::Milliseconds(20)}};
  for (const LinkShape& link : links) {
    const int64_t rate = link.rate_bits_per_second;
    const absl::Status shaped = net_->Shape("p1", link);
    if (absl::IsFailedPrecondition(shaped)) {
      std::printf("link delay not measured: %s\n", std::string(shaped.message()).c_str());
      continue;
    }
    ASSERT_TRUE(shaped.ok()) << shaped;
    constexpr int kRuns = 2;
    double ttft = 0, sent = 0, took = 0;
    for (int run = 0; run < kRuns; ++run) {
      std::vector<uint32_t> prompt(kTokens);
      for (uint32_t& t : prompt) t = 100 + rng() % 4000;  // the demo vocabulary
      ++seed;
      const double b0 = cluster_->Metric("p1", bytes), s0 = cluster_->Metric("p1", seconds),
                   c0 = cluster_->Metric("p1", count);
      const GrpcResult r = GenerateIds(*stub_, prompt, 1, nullptr, 300);
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      // The prefill worker counts its transfer when the ship completes,
      // which may be just after the client has its token.
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (cluster_->Metric("p1", count) < c0 + 1 && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      ASSERT_EQ(cluster_->Metric("p1", count), c0 + 1);
      ttft += r.seconds / kRuns;
      sent += (cluster_->Metric("p1", bytes) - b0) / kRuns;
      took += (cluster_->Metric("p1", seconds) - s0) / kRuns;
    }
    // Shipping SWA KV for every token: the same bytes per full-KV token,
    // scaled by the plan's ratio (dtype-independent).
    const double all_swa_bytes = sent * all_swa / static_cast<double>(plan->total_bytes());
    const double predicted = rate > 0 ? sent * 8 / static_cast<double>(rate) : 0;
    // Unlimited: at the throughput this run measured.
    const double all_swa_predicted =
        rate > 0 ? all_swa_bytes * 8 / static_cast<double>(rate) : all_swa_bytes * took / sent;
    std::printf(
        "TRANSFER-ROW | %s | %d tokens | %.2f MB | %.3f s | %.3f s (bandwidth alone) | "
        "%.3f s TTFT | all-SWA %.2f MB, %.3f s predicted\n",
        LinkName(link).c_str(), kTokens,
        sent / 1e6, took, predicted, ttft, all_swa_bytes / 1e6, all_swa_predicted);
    std::fflush(stdout);
    if (rate > 0) {
      EXPECT_GE(took, predicted * 0.8) << "faster than the link allows: the shaping failed";
    }
  }
  ASSERT_TRUE(net_->Shape("p1", {}).ok());
}

}  // namespace
}  // namespace swaserve
