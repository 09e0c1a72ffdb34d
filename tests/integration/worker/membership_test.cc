// swaserve-worker with --redis: its record, load reports and prefix-cache
// events reach Redis (read back through cluster::ClusterView, as a router
// does); Redis unavailable → the worker keeps serving and re-registers when
// it returns.
#include <signal.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/base/hash.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/cluster_view.h"
#include "lib/cluster/redis_client.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/rpc/channel.h"
#include "swaserve/v1/worker.grpc.pb.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve {
namespace {

TEST(WorkerMembership, RegistersPublishesAndSurvivesARedisRestart) {
  auto redis = cluster::testing::RedisServer::Start();
  if (!redis.ok() && absl::IsFailedPrecondition(redis.status())) GTEST_SKIP() << redis.status();
  ASSERT_TRUE(redis.ok()) << redis.status();
  const std::string dir = *base::MakeTempDir("worker-membership");
  auto config = model::BuiltinConfig("tiny", 256);
  ASSERT_TRUE(model::WriteRandomCheckpoint(*config, 5, dir + "/model").ok());
  base::SubprocessOptions o;
  o.argv = {SWASERVE_WORKER_BIN, "--model=" + dir + "/model", "--role=prefill",
            "--worker_id=p-mem", "--port_file=" + dir + "/ports.json", "--threads=1",
            "--kv.prefill_mib=16", absl::StrCat("--redis=127.0.0.1:", (*redis)->port()),
            "--prefill.max_prompt_tokens=4096", "--bucket=0"};
  o.log_path = dir + "/worker.log";
  auto worker = base::Subprocess::Start(o);
  ASSERT_TRUE(worker.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!std::filesystem::exists(dir + "/ports.json") && absl::Now() < deadline &&
         (*worker)->Running()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(dir + "/ports.json")) << (*worker)->ReadLog();
  std::ifstream in(dir + "/ports.json");
  const int grpc_port = nlohmann::json::parse(in)["grpc_port"].get<int>();

  auto client = cluster::RedisClient::Create((*redis)->ClientOptions());
  ASSERT_TRUE(client.ok());
  auto view = cluster::ClusterView::Create({client->get()});
  ASSERT_TRUE(view.ok()) << view.status();
  auto find = [&]() -> std::optional<cluster::WorkerInfo> {
    auto workers = (*view)->ListWorkers();
    if (!workers.ok()) return std::nullopt;
    for (const auto& w : *workers) {
      if (w.id == "p-mem") return w;
    }
    return std::nullopt;
  };
  auto wait_for = [&](auto pred, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (pred()) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_for([&] { return find().has_value(); }, absl::Seconds(10)))
      << (*worker)->ReadLog();
  const cluster::WorkerInfo info = *find();
  EXPECT_EQ(info.role, v1::ROLE_PREFILL);
  EXPECT_EQ(info.grpc_address, absl::StrCat("127.0.0.1:", grpc_port));
  EXPECT_EQ(info.bucket_max_tokens, 4096);
  EXPECT_FALSE(info.ucx_address.empty());
  EXPECT_GT(info.full_pages, 0);
  // The window fields of the router's credit: a prefill worker restores
  // windows by default, as a pyramid, and publishes what a restore computes.
  EXPECT_EQ(info.sliding_window, config->sliding_window);
  EXPECT_EQ(info.swa_chain_layers, config->num_swa_layers() + config->num_mtp_layers);
  EXPECT_TRUE(info.window_restore);
  EXPECT_EQ(info.window_restore_work,
            kv::WindowRestoreWorkPerRestore(config->sliding_window, 16, config->swa_layer_mask(),
                                            config->num_mtp_layers));
  EXPECT_GT(info.window_restore_work, 0);
  ASSERT_TRUE(wait_for(
      [&] {
        auto loads = (*view)->GetLoads({std::string("p-mem")});
        return loads.ok() && (*loads)[0].has_value() && (*loads)[0]->total_full_pages() > 0;
      },
      absl::Seconds(5)));

  // A prefill-only request warms the cache; its pages reach the index.
  std::vector<uint32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (i * 11 + 3) % 256;
  auto channel = rpc::CreateChannel(info.grpc_address);
  ASSERT_TRUE(channel.ok());
  auto stub = v1::Prefill::NewStub(*channel);
  {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_request_id("warm");
    for (uint32_t t : prompt) req.add_token_ids(t);
    v1::PrefillResponse resp;
    ASSERT_TRUE(stub->Prefill(&ctx, req, &resp).ok());
  }
  const std::vector<uint64_t> hashes = base::ChainedPageHashes(prompt, 16);
  ASSERT_TRUE(wait_for(
      [&] {
        auto depth = (*view)->MatchPrefixes(hashes, {std::string("p-mem")});
        return depth.ok() && (*depth)[0] == static_cast<int64_t>(hashes.size());
      },
      absl::Seconds(5)))
      << "the worker's cache events did not reach the prefix index";

  // Redis dies: the worker keeps serving.
  ASSERT_TRUE((*redis)->Kill().ok());
  {
    grpc::ClientContext ctx;
    v1::PrefillRequest req;
    req.set_request_id("while-down");
    for (uint32_t t : prompt) req.add_token_ids(t);
    req.add_token_ids(7);
    v1::PrefillResponse resp;
    grpc::Status s = stub->Prefill(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // Redis returns empty: the worker registers again within seconds.
  ASSERT_TRUE((*redis)->Restart().ok());
  const absl::Time back = absl::Now();
  ASSERT_TRUE(wait_for([&] { return find().has_value(); }, absl::Seconds(10)))
      << (*worker)->ReadLog();
  std::printf("re-registered %.2f s after Redis returned\n",
              absl::ToDoubleSeconds(absl::Now() - back));
  auto rc = (*worker)->Stop();
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0) << (*worker)->ReadLog();
  // A clean stop deregisters.
  EXPECT_FALSE(find().has_value());
  std::filesystem::remove_all(dir);
}

// Worker identity: a second worker registering a live worker's
// id is refused with a clear error (not silently merged into one record);
// once the first one is dead, the id may be taken again; default ids differ.
TEST(WorkerMembership, ALiveIdIsRefusedAndADeadOnesIsTakenOver) {
  auto redis = cluster::testing::RedisServer::Start();
  if (!redis.ok() && absl::IsFailedPrecondition(redis.status())) GTEST_SKIP() << redis.status();
  ASSERT_TRUE(redis.ok()) << redis.status();
  const std::string dir = *base::MakeTempDir("worker-identity");
  auto config = model::BuiltinConfig("tiny", 256);
  ASSERT_TRUE(model::WriteRandomCheckpoint(*config, 5, dir + "/model").ok());
  auto start = [&](const std::string& name, const std::string& id) {
    base::SubprocessOptions o;
    o.argv = {SWASERVE_WORKER_BIN, "--model=" + dir + "/model", "--role=decode",
              "--port_file=" + dir + "/" + name + ".json", "--threads=1", "--kv.decode_mib=8",
              "--decode.staging_arena_mib=0", absl::StrCat("--redis=127.0.0.1:", (*redis)->port())};
    if (!id.empty()) o.argv.push_back("--worker_id=" + id);
    o.log_path = dir + "/" + name + ".log";
    return base::Subprocess::Start(o);
  };
  auto client = cluster::RedisClient::Create((*redis)->ClientOptions());
  ASSERT_TRUE(client.ok());
  auto view = cluster::ClusterView::Create({client->get()});
  ASSERT_TRUE(view.ok());
  auto address_of = [&](const std::string& id) -> std::string {
    auto workers = (*view)->ListWorkers();
    if (!workers.ok()) return "";
    for (const auto& w : *workers) {
      if (w.id == id) return w.grpc_address;
    }
    return "";
  };
  auto wait_registered = [&](const std::string& id, const std::string& not_address) {
    const absl::Time end = absl::Now() + absl::Seconds(20);
    while (absl::Now() < end) {
      const std::string a = address_of(id);
      if (!a.empty() && a != not_address) return a;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return std::string();
  };
  auto first = start("first", "dup");
  ASSERT_TRUE(first.ok());
  const std::string first_address = wait_registered("dup", "");
  ASSERT_FALSE(first_address.empty()) << (*first)->ReadLog();
  // The same id while the first is alive: refused, exits 1, says why.
  auto second = start("second", "dup");
  ASSERT_TRUE(second.ok());
  absl::StatusOr<int> rc = (*second)->Wait(absl::Seconds(30));
  ASSERT_TRUE(rc.ok()) << "the duplicate worker did not exit";
  EXPECT_EQ(*rc, 1);
  EXPECT_NE((*second)->ReadLog().find("already registered by a live worker at " + first_address),
            std::string::npos)
      << (*second)->ReadLog();
  EXPECT_EQ(address_of("dup"), first_address) << "the refused worker touched the live record";
  // The first dies (kill -9: its record outlives it for the TTL); a new
  // worker under the same id takes over at once.
  ASSERT_TRUE((*first)->Signal(SIGKILL).ok());
  ASSERT_TRUE((*first)->Wait(absl::Seconds(10)).ok());
  auto third = start("third", "dup");
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(wait_registered("dup", first_address).empty()) << (*third)->ReadLog();
  // Default ids: host + pid + random suffix, never equal.
  auto a = start("a", ""), b = start("b", "");
  ASSERT_TRUE(a.ok() && b.ok());
  const absl::Time end = absl::Now() + absl::Seconds(20);
  std::vector<std::string> defaults;
  while (absl::Now() < end && defaults.size() < 2) {
    defaults.clear();
    auto workers = (*view)->ListWorkers();
    if (workers.ok()) {
      for (const auto& w : *workers) {
        if (w.id.rfind("decode-", 0) == 0) defaults.push_back(w.id);
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(defaults.size(), 2u) << (*a)->ReadLog();
  EXPECT_NE(defaults[0], defaults[1]);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace swaserve
