// The whole cluster (`swaserve up --redis=redis-cluster://...`: prefill
// workers, decode worker, router as real processes) on a real 3-master Redis
// Cluster with replicas: requests are served, the workers'
// KV events and index land in the cluster (read back with `swaserve
// kv-events`), and when the master of the prompts' index shard is killed
// every request is still served (the router routes by load: the fallback),
// until the replica is promoted and the index answers again.
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/key_schema.h"
#include "lib/cluster/redis_cluster_protocol.h"
#include "lib/launch/cluster_launcher.h"
#include "tests/integration/cluster/redis_cluster_server.h"

namespace swaserve::launch {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kCli[] = SWASERVE_CLI_BIN;
constexpr char kWorker[] = SWASERVE_WORKER_BIN;
constexpr char kRouter[] = SWASERVE_ROUTER_BIN;

// A prompt of a few pages (a page is 16 tokens), under the anchor page (32):
// matched in the index's home shard.
std::string ShortPrompt(const std::string& tag) {
  std::string p = absl::StrCat("Question ", tag, ":");
  for (int i = 0; i < 12; ++i) absl::StrAppend(&p, " stone ", i);
  return p;
}

// The value of an unlabelled counter in a /metrics page (-1: absent).
double Counter(const std::string& page, const std::string& name) {
  const std::regex re("\n" + name + " ([0-9.e+]+)");
  std::smatch m;
  if (!std::regex_search(page, m, re)) return -1;
  double v = 0;
  return absl::SimpleAtod(m[1].str(), &v) ? v : -1;
}

class RedisClusterLaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto redis = cluster::testing::RedisClusterServer::Start(3, 1);
    if (absl::IsFailedPrecondition(redis.status())) GTEST_SKIP() << redis.status();
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = *std::move(redis);
    ASSERT_TRUE(redis_->WaitHealthy(absl::Seconds(30), /*replicas_online=*/true).ok());
    absl::StatusOr<std::string> dir = base::MakeTempDir("swaserve-redis-cluster-launch");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {kCli, "make-model", "--shape=tiny", "--out=" + dir_ + "/model"}, &out,
        absl::Seconds(120));
    ASSERT_TRUE(rc.ok()) << rc.status();
    ASSERT_EQ(*rc, 0) << out;
  }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_, ec);
  }

  // A completion of `prompt` through the router's HTTP API: its status.
  int Complete(int port, const std::string& prompt) {
    httplib::Client h("127.0.0.1", port);
    h.set_read_timeout(60, 0);
    const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4},
                       {"ignore_eos", true}};
    httplib::Result r = h.Post("/v1/completions", body.dump(), "application/json");
    if (!r) return -1;
    EXPECT_EQ(r->status, 200) << r->body;
    return r->status;
  }

  double Fallbacks(int port) { return RouterMetric(port, "swaserve_router_redis_fallbacks_total"); }
  double RouterMetric(int port, const std::string& name) {
    httplib::Client h("127.0.0.1", port);
    httplib::Result r = h.Get("/metrics");
    if (!r || r->status != 200) return -1;
    return Counter(r->body, name);
  }

  std::unique_ptr<cluster::testing::RedisClusterServer> redis_;
  std::string dir_;
};

TEST_F(RedisClusterLaunchTest, ServesThroughAKilledMasterAndTheIndexReturns) {
  ClusterSpec s;
  s.model = dir_ + "/model";
  s.model_name = "tiny";
  s.redis = redis_->Url();
  s.http_port = 0;
  s.grpc_port = 0;
  s.bucket_bounds = {2048, 8192};
  s.decode_workers = 1;
  s.worker_threads = 1;
  s.kv_mib = 32;
  s.worker_bin = kWorker;
  s.router_bin = kRouter;
  s.run_dir = dir_ + "/run";
  s.start_timeout = absl::Seconds(90);
  s.decode_flags = {"--decode.staging_arena_mib=64"};
  std::vector<std::string> progress;
  s.on_progress = [&](const std::string& line) { progress.push_back(line); };
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(s);
  ASSERT_TRUE(c.ok()) << c.status();
  const int port = (*c)->endpoints().http_port;
  bool said = false;
  for (const std::string& line : progress) said |= line.find("redis-cluster://") != std::string::npos;
  EXPECT_TRUE(said) << "no progress line names the Redis Cluster";

  // Short prompts (matched in the index's home shard) and a long one (past
  // the anchor page: its own shard), each twice.
  std::string long_prompt = "Tell me everything about";
  for (int i = 0; i < 120; ++i) absl::StrAppend(&long_prompt, " river ", i, " and");
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 4; ++i) ASSERT_EQ(Complete(port, ShortPrompt(absl::StrCat(i))), 200);
    ASSERT_EQ(Complete(port, long_prompt), 200);
  }
  EXPECT_EQ(Fallbacks(port), 0);
  // The router decides from its index mirror (the default), which polls the
  // workers' streams across the cluster's slots: every worker (2 prefill,
  // 1 decode) mirrored, and the prefill workers' events read.
  EXPECT_EQ(RouterMetric(port, "swaserve_index_mirror_workers"), 3);
  EXPECT_GT(RouterMetric(port, "swaserve_index_mirror_events_total"), 0);

  // The workers' index and KV events are in the cluster.
  std::string out;
  absl::StatusOr<int> rc = base::RunCommand(
      {kCli, "kv-events", "--redis=" + redis_->Url(), "--cluster=default"}, &out,
      absl::Seconds(30));
  ASSERT_TRUE(rc.ok()) << rc.status();
  ASSERT_EQ(*rc, 0) << out;
  const std::regex re("prefill[^ ]* seq=([0-9]+) pages=([0-9]+)");
  int64_t pages = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    pages += std::stoll((*it)[2].str());
  }
  EXPECT_GT(pages, 30) << out;
  // A worker with events has its stream's epoch (one without: "epoch=-").
  EXPECT_TRUE(std::regex_search(out, std::regex("seq=[1-9][0-9]* pages=[0-9]+ epoch=[0-9]")))
      << out;
  EXPECT_FALSE(std::regex_search(out, std::regex("seq=[1-9][0-9]* pages=[0-9]+ epoch=-"))) << out;

  // Kill the master of the home shard (short prompts' shard).
  absl::StatusOr<cluster::KeySchema> keys = cluster::KeySchema::Create("default", 64);
  ASSERT_TRUE(keys.ok());
  const int slot = cluster::RedisKeySlot(keys->PrefixKey("x", 0));
  absl::StatusOr<int> master = redis_->MasterOfSlot(slot);
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_TRUE(redis_->node(*master).Kill().ok());
  const absl::Time killed = absl::Now();
  // Every request is served meanwhile: routed by load when the index
  // cannot be read.
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(Complete(port, ShortPrompt(absl::StrCat("again ", i))), 200);
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GT(Fallbacks(port), 0) << "the index never failed: was the right master killed?";
  // The router mirrors the index (its default): those decisions kept the
  // prefix affinity from the mirror.
  EXPECT_GT(RouterMetric(port, "swaserve_router_mirror_fallbacks_total"), 0);
  ASSERT_TRUE(redis_->WaitHealthy(absl::Seconds(30)).ok());
  // After the promotion the index answers again: requests stop falling back.
  bool back = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!back && absl::Now() < deadline) {
    const double before = Fallbacks(port);
    ASSERT_EQ(Complete(port, ShortPrompt("1")), 200);
    back = Fallbacks(port) == before;
    if (!back) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(back) << "the router still falls back after the failover";
  std::fprintf(stderr, "index answering again %.1f s after the master was killed\n",
               absl::ToDoubleSeconds(absl::Now() - killed));
  EXPECT_TRUE((*c)->Dead().empty());
  (*c)->Stop();
}

}  // namespace
}  // namespace swaserve::launch
