// The router against real processes on loopback (label router;integration):
// a redis-server, two prefill workers and a decode worker registered in it,
// and swaserve-router replicas in front of them.
//
// Checks: the OpenAI HTTP API (completions and chat, streaming and not; the
// error statuses for bad input, unknown model, oversized body and prompt,
// missing workers, API keys and their concurrency limit), gRPC Generate
// agreeing with HTTP, prefix affinity shared by two routers through Redis
// only, and a prefill leg retried on another worker when one is killed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/router/router.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/status_conversion.h"
#include "services/router/http_service.h"
#include "tests/integration/router/local_cluster.h"

namespace swaserve {
namespace {

using json = nlohmann::json;
using testing::LocalCluster;

class RouterIntegrationTest : public ::testing::Test {
 protected:
  // A short Generate on `router` with the given authorization (and
  // x-api-key) metadata; the call's status.
  grpc::Status GrpcGenerate(const std::string& router, const std::string& authorization,
                            const std::string& x_api_key = "") {
    grpc::ClientContext ctx;
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    if (!x_api_key.empty()) ctx.AddMetadata("x-api-key", x_api_key);
    v1::GenerateRequest g;
    g.set_model("tiny");
    g.set_text("hi");
    g.mutable_sampling()->set_max_tokens(2);
    auto stub = cluster_->RouterStub(router);
    auto stream = stub->Generate(&ctx, g);
    v1::GenerateResponse r;
    while (stream->Read(&r)) {
    }
    return stream->Finish();
  }

  static void SetUpTestSuite() {
    testing::LocalClusterOptions o;
    o.cli_bin = SWASERVE_CLI_BIN;
    o.worker_bin = SWASERVE_WORKER_BIN;
    o.router_bin = SWASERVE_ROUTER_BIN;
    o.worker_flags = {"--model_name=tiny", "--kv.page_size=16", "--prefill.chunk_tokens=256"};
    o.router_flags = {"--policy.bucket_bounds=2048,4096", "--http.max_body_bytes=65536",
                      "--max_max_tokens=4096"};
    auto c = LocalCluster::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
    for (const char* id : {"p1", "p2"}) {
      auto w = cluster_->StartWorker("prefill", id);
      ASSERT_TRUE(w.ok()) << w.status();
    }
    auto d = cluster_->StartWorker("decode", "d1");
    ASSERT_TRUE(d.ok()) << d.status();
    for (const char* id : {"r1", "r2"}) {
      // r2 decides from its index mirror (the KV event streams: the
      // default), r1 through the match script alone:
      // TwoRoutersShareAffinityThroughRedis checks both.
      std::vector<std::string> extra;
      if (std::string(id) == "r1") extra.push_back("--index_mirror=false");
      auto r = cluster_->StartRouter(id, extra);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(cluster_->WaitHealthy(id, absl::Seconds(20)).ok());
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  static std::vector<uint32_t> RandomPrompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint32_t> ids(n);
    for (uint32_t& t : ids) t = 100 + rng() % 50000;
    return ids;
  }

  static json Post(const std::string& router, const std::string& path, const json& body,
                   int expect_status = 200) {
    auto r = cluster_->Http(router, "POST", path, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return json();
    EXPECT_EQ(r->status, expect_status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r->body;
    return j;
  }

  // POSTs `body` to /v1/completions on a plain socket (so that a test can
  // close it mid-reply); the socket, or -1.
  static int PostOnRawSocket(int port, const std::string& body) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const std::string req = absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "Content-Length: ", body.size(), "\r\n\r\n", body);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
      close(fd);
      return -1;
    }
    return fd;
  }

  // Waits up to 10 s for `router`'s count of requests ended `code`
  // (swaserve_router_requests_total) to reach `n`; the count.
  static double AwaitRequests(const std::string& router, const std::string& code, double n) {
    const std::string name = absl::StrCat("swaserve_router_requests_total{code=\"", code, "\"}");
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (cluster_->Metric(router, name) < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    return cluster_->Metric(router, name);
  }

  // The data: frames of an SSE body, [DONE] excluded; asserts it ends with [DONE].
  static std::vector<json> SseFrames(const std::string& body) {
    std::vector<json> frames;
    bool done = false;
    for (absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
      EXPECT_TRUE(absl::StartsWith(line, "data: ")) << line;
      absl::string_view data = line.substr(6);
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      EXPECT_FALSE(done) << "frame after [DONE]";
      frames.push_back(json::parse(std::string(data), nullptr, false));
      EXPECT_FALSE(frames.back().is_discarded()) << data;
    }
    EXPECT_TRUE(done) << "no [DONE] in " << body;
    return frames;
  }

  static LocalCluster* cluster_;
};

LocalCluster* RouterIntegrationTest::cluster_ = nullptr;

TEST_F(RouterIntegrationTest, CompletionsStreamingEqualsNonStreaming) {
  json req = {{"model", "tiny"},   {"prompt", "The quick brown fox"}, {"max_tokens", 12},
              {"temperature", 0},  {"ignore_eos", true}};
  json full = Post("r1", "/v1/completions", req);
  ASSERT_TRUE(full.contains("choices")) << full;
  EXPECT_EQ(full["object"], "text_completion");
  EXPECT_EQ(full["model"], "tiny");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(full["usage"]["completion_tokens"], 12);
  EXPECT_GT(full["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_TRUE(full["usage"]["prompt_tokens_details"].contains("cached_tokens"));

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  auto r = cluster_->Http("r2", "POST", "/v1/completions", req.dump());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  std::string finish;
  json usage;
  for (const json& f : SseFrames(r->body)) {
    if (f.contains("usage") && !f["usage"].is_null()) usage = f["usage"];
    if (f["choices"].empty()) continue;
    text += f["choices"][0]["text"].get<std::string>();
    if (!f["choices"][0]["finish_reason"].is_null()) finish = f["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, full["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 12);
}

TEST_F(RouterIntegrationTest, ChatCompletionsAndGrpcAgree) {
  json req = {{"model", "tiny"},
              {"messages", {{{"role", "system"}, {"content", "Be brief."}},
                            {{"role", "user"}, {"content", "Name a color."}}}},
              {"max_tokens", 10},
              {"temperature", 0},
              {"ignore_eos", true}};
  json full = Post("r1", "/v1/chat/completions", req);
  ASSERT_TRUE(full.contains("choices")) << full;
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["role"], "assistant");
  const std::string http_text = full["choices"][0]["message"]["content"];

  req["stream"] = true;
  auto r = cluster_->Http("r1", "POST", "/v1/chat/completions", req.dump());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  std::vector<json> frames = SseFrames(r->body);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames[0]["choices"][0]["delta"]["role"], "assistant");
  for (const json& f : frames) {
    if (!f["choices"].empty() && f["choices"][0]["delta"].contains("content")) {
      text += f["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(text, http_text);

  // The same conversation over gRPC.
  auto stub = cluster_->RouterStub("r2");
  ASSERT_NE(stub, nullptr);
  v1::GenerateRequest g;
  g.set_model("tiny");
  v1::ChatMessage* m = g.mutable_chat()->add_messages();
  m->set_role("system");
  m->set_content("Be brief.");
  m = g.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Name a color.");
  g.mutable_chat()->set_add_generation_prompt(true);
  g.mutable_sampling()->set_max_tokens(10);
  g.mutable_sampling()->set_ignore_eos(true);
  // A client-chosen request id, reused: ids need not be unique.
  g.set_request_id("client-chosen-id");
  for (int round = 0; round < 2; ++round) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    const auto sent = std::chrono::steady_clock::now();
    auto stream = stub->Generate(&ctx, g);
    v1::GenerateResponse resp;
    std::string grpc_text;
    int tokens = 0;
    v1::Usage usage;
    while (stream->Read(&resp)) {
      EXPECT_EQ(resp.request_id(), "client-chosen-id");
      grpc_text += resp.text();
      tokens += resp.token_ids_size();
      if (resp.has_usage()) usage = resp.usage();
    }
    grpc::Status s = stream->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(grpc_text, http_text);
    EXPECT_EQ(tokens, 10);
    EXPECT_EQ(usage.completion_tokens(), 10u);
    EXPECT_EQ(usage.prompt_tokens(), full["usage"]["prompt_tokens"].get<uint32_t>());
    // The prefill worker's scheduling wait, forwarded by the router: within
    // the request's lifetime.
    ASSERT_TRUE(usage.has_prefill_queue_seconds());
    EXPECT_GE(usage.prefill_queue_seconds(), 0);
    EXPECT_LT(usage.prefill_queue_seconds(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
  }

  // The same client id on concurrent requests: workers never see a clash.
  {
    std::vector<std::thread> same;
    std::atomic<int> ok{0};
    for (int k = 0; k < 4; ++k) {
      same.emplace_back([&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto stream = stub->Generate(&ctx, g);
        v1::GenerateResponse resp;
        while (stream->Read(&resp)) {
        }
        if (stream->Finish().ok()) ok.fetch_add(1);
      });
    }
    for (std::thread& t : same) t.join();
    EXPECT_EQ(ok.load(), 4);
  }

  v1::ListModelsResponse models;
  grpc::ClientContext lctx;
  ASSERT_TRUE(stub->ListModels(&lctx, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "tiny");
  EXPECT_EQ(models.models(0).modalities_size(), 0) << "the tiny model has no tower";
  auto http_models = cluster_->Http("r1", "GET", "/v1/models");
  ASSERT_TRUE(http_models.ok());
  EXPECT_EQ(json::parse(http_models->body)["data"][0]["id"], "tiny");
}

TEST_F(RouterIntegrationTest, BadRequestsGetTheRightStatusNeverACrash) {
  struct Case {
    std::string name, path, body;
    int status;
  };
  const std::string big_prompt = json(RandomPrompt(4200, 9)).dump();  // > 4096: no bucket
  std::string bad_utf8 = R"({"model":"tiny","prompt":"ab)";
  bad_utf8 += "\xff\xfe";
  bad_utf8 += R"("})";
  const std::vector<Case> cases = {
      {"malformed json", "/v1/completions", R"({"model":"tiny","prompt":)", 400},
      {"not an object", "/v1/completions", R"([1,2,3])", 400},
      {"prompt wrong type", "/v1/completions", R"({"model":"tiny","prompt":{"a":1}})", 400},
      {"max_tokens string", "/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":"5"})",
       400},
      {"negative max_tokens", "/v1/completions", R"({"model":"tiny","prompt":"x","max_tokens":-3})",
       400},
      {"huge max_tokens", "/v1/completions",
       R"({"model":"tiny","prompt":"x","max_tokens":100000000000})", 400},
      {"unknown field", "/v1/completions", R"({"model":"tiny","prompt":"x","bogus":1})", 400},
      {"invalid utf-8", "/v1/completions", bad_utf8, 400},
      {"empty messages", "/v1/chat/completions", R"({"model":"tiny","messages":[]})", 400},
      {"bad role", "/v1/chat/completions",
       R"({"model":"tiny","messages":[{"role":"wizard","content":"hi"}]})", 400},
      {"unknown model", "/v1/completions", R"({"model":"gpt-9","prompt":"x"})", 404},
      {"body over limit", "/v1/completions",
       absl::StrCat(R"({"model":"tiny","prompt":")", std::string(70000, 'a'), R"("})"), 413},
      {"prompt beyond largest bucket", "/v1/completions",
       absl::StrCat(R"({"model":"tiny","max_tokens":1,"prompt":)", big_prompt, "}"), 413},
      {"token id outside vocabulary", "/v1/completions",
       R"({"model":"tiny","prompt":[1,2,999999999],"max_tokens":1})", 400},
      {"unknown path", "/v1/embeddings", R"({})", 404},
      // The tiny model has no vision tower (before: 503, no encoder registered).
      {"image for a text-only model", "/v1/chat/completions",
       R"({"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":[)"
       R"({"type":"text","text":"what is it?"},)"
       R"({"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]})",
       400},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = cluster_->Http("r1", "POST", c.path, c.body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, c.status) << r->body;
    // A body over the limit is refused on its Content-Length by the HTTP
    // server itself, before the body is read: no JSON error there.
    if (std::string(c.name) == "body over limit") continue;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r->body;
  }
  {
    const json image_chat = json::parse(cases[cases.size() - 1].body);
    auto r = cluster_->Http("r1", "POST", "/v1/chat/completions", image_chat.dump());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(r->body.find("accepts no image input (its checkpoint has no vision tower)"),
              std::string::npos)
        << r->body;
  }
  // Still serving.
  json ok = Post("r1", "/v1/completions", {{"model", "tiny"}, {"prompt", "still"}, {"max_tokens", 2}});
  EXPECT_EQ(ok["usage"]["completion_tokens"].get<int>() >= 1, true);
}

TEST_F(RouterIntegrationTest, TwoRoutersShareAffinityThroughRedis) {
  // Warm each prompt's prefix on a chosen worker directly (prefill only, no
  // decode leg): its cache events reach the Redis index. Both routers must
  // then send the prompt to that worker, whatever their own history.
  std::vector<std::string> holders;
  for (int i = 0; i < 6; ++i) {
    const std::string holder = i % 2 == 0 ? "p2" : "p1";  // p2 first: not the tie-break pick
    holders.push_back(holder);
    auto ch = rpc::CreateChannel(cluster_->Get(holder)->grpc_address());
    ASSERT_TRUE(ch.ok());
    auto stub = v1::Prefill::NewStub(*ch);
    v1::PrefillRequest pr;
    pr.set_request_id(absl::StrCat("warm-", i));
    for (uint32_t t : RandomPrompt(320, 1000 + i)) pr.add_token_ids(t);
    pr.mutable_sampling()->set_max_tokens(1);
    v1::PrefillResponse presp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Status s = stub->Prefill(&ctx, pr, &presp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  absl::SleepFor(absl::Milliseconds(500));  // cache events -> Redis
  for (int i = 0; i < 6; ++i) {
    for (const char* router : {"r1", "r2"}) {
      SCOPED_TRACE(absl::StrCat("prompt ", i, " via ", router, ", held by ", holders[i]));
      json out = Post(router, "/v1/completions",
                      {{"model", "tiny"},
                       {"prompt", RandomPrompt(320, 1000 + i)},
                       {"max_tokens", 2},
                       {"ignore_eos", true}});
      // Whole pages of the prompt's 320 tokens were cached on the holder
      // (the last token is always recomputed).
      EXPECT_GE(out["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 288) << out;
    }
  }
  // And a prompt first routed by r1 is a hit when repeated through r2.
  const std::vector<uint32_t> fresh = RandomPrompt(400, 77);
  json first = Post("r1", "/v1/completions",
                    {{"model", "tiny"}, {"prompt", fresh}, {"max_tokens", 2}});
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  absl::SleepFor(absl::Milliseconds(300));
  json second = Post("r2", "/v1/completions",
                     {{"model", "tiny"}, {"prompt", fresh}, {"max_tokens", 2}});
  EXPECT_GE(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 368) << second;
  EXPECT_GE(cluster_->Metric("r2", R"(swaserve_router_decisions_total{leg="prefill",reason="cache_affinity"})"),
            7);
  // r2's decisions came from its mirror of the three workers' streams.
  EXPECT_EQ(cluster_->Metric("r2", "swaserve_index_mirror_workers"), 3);
  EXPECT_GE(cluster_->Metric("r2", "swaserve_index_mirror_events_total"), 7);
  // Its size: at least the 400-token prompt's whole pages on its holder.
  EXPECT_GE(cluster_->Metric("r2", "swaserve_index_mirror_entries"), 10);
  // r1 has no mirror (--index_mirror=false): no such metric on its
  // /metrics (which answers: the breaker gauge is there).
  EXPECT_GE(cluster_->Metric("r1", "swaserve_router_open_breakers"), 0);
  EXPECT_EQ(cluster_->Metric("r1", "swaserve_index_mirror_workers"), -1);
}

TEST_F(RouterIntegrationTest, NoWorkersIs503AndApiKeysAreEnforced) {
  // A router of an empty cluster (another key prefix in the same Redis).
  auto r3 = cluster_->StartRouter("r3", {"--cluster=empty", "--worker_wait=500ms"});
  ASSERT_TRUE(r3.ok()) << r3.status();
  auto h = cluster_->Http("r3", "GET", "/health");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->status, 503);
  json e = Post("r3", "/v1/completions", {{"model", "tiny"}, {"prompt", "x"}}, 503);
  EXPECT_TRUE(e["error"]["message"].is_string());

  const std::string keys = cluster_->dir() + "/keys.txt";
  {
    std::ofstream f(keys);
    f << "# test keys\nteam-a:sk-aaaaaaaaaaaa\nteam-b:sk-bbbbbbbbbbbb\n";
  }
  auto r4 = cluster_->StartRouter("r4", {"--api_keys=" + keys, "--api_key_concurrency=1"});
  ASSERT_TRUE(r4.ok()) << r4.status();
  ASSERT_TRUE(cluster_->WaitHealthy("r4", absl::Seconds(20)).ok());
  const std::string body = json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}}.dump();
  auto no_key = cluster_->Http("r4", "POST", "/v1/completions", body);
  ASSERT_TRUE(no_key.ok());
  EXPECT_EQ(no_key->status, 401) << no_key->body;
  auto wrong = cluster_->Http("r4", "POST", "/v1/completions", body,
                              {{"Authorization", "Bearer sk-nope"}});
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(wrong->body.find("sk-nope"), std::string::npos);  // no key material echoed
  auto good = cluster_->Http("r4", "POST", "/v1/completions", body,
                             {{"Authorization", "Bearer sk-aaaaaaaaaaaa"}});
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->status, 200) << good->body;
  // gRPC takes the same keys from the call's metadata.
  EXPECT_EQ(GrpcGenerate("r4", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status wrong_grpc = GrpcGenerate("r4", "Bearer sk-nope");
  EXPECT_EQ(wrong_grpc.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong_grpc.error_message().find("sk-nope"), std::string::npos);
  EXPECT_TRUE(GrpcGenerate("r4", "Bearer sk-aaaaaaaaaaaa").ok());
  EXPECT_TRUE(GrpcGenerate("r4", "", "sk-bbbbbbbbbbbb").ok());  // x-api-key
  {
    grpc::ClientContext ctx;
    v1::ListModelsResponse models;
    EXPECT_EQ(cluster_->RouterStub("r4")->ListModels(&ctx, v1::ListModelsRequest(), &models)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  // Concurrency limit 1 per key: a long request holds team-a's slot.
  std::thread slow([&] {
    auto r = cluster_->Http(
        "r4", "POST", "/v1/completions",
        json{{"model", "tiny"}, {"prompt", "long"}, {"max_tokens", 1500}, {"ignore_eos", true}}
            .dump(),
        {{"Authorization", "Bearer sk-aaaaaaaaaaaa"}});
    EXPECT_TRUE(r.ok() && r->status == 200);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (cluster_->Metric("r4", "swaserve_router_inflight_requests") < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto limited = cluster_->Http("r4", "POST", "/v1/completions", body,
                                {{"Authorization", "Bearer sk-aaaaaaaaaaaa"}});
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->status, 429) << limited->body;
  // The same limit over gRPC: team-a's slot is taken.
  EXPECT_EQ(GrpcGenerate("r4", "Bearer sk-aaaaaaaaaaaa").error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto other = cluster_->Http("r4", "POST", "/v1/completions", body,
                              {{"Authorization", "Bearer sk-bbbbbbbbbbbb"}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 200) << other->body;
  slow.join();

  // Keys reload when the file changes: team-b revoked, team-c added.
  {
    std::ofstream f(keys + ".new");
    f << "team-a:sk-aaaaaaaaaaaa\nteam-c:sk-cccccccccccc\n";
  }
  std::filesystem::rename(keys + ".new", keys);
  absl::SleepFor(absl::Seconds(3));
  auto revoked = cluster_->Http("r4", "POST", "/v1/completions", body,
                                {{"Authorization", "Bearer sk-bbbbbbbbbbbb"}});
  auto added = cluster_->Http("r4", "POST", "/v1/completions", body,
                              {{"Authorization", "Bearer sk-cccccccccccc"}});
  ASSERT_TRUE(revoked.ok() && added.ok());
  EXPECT_EQ(revoked->status, 401);
  EXPECT_EQ(added->status, 200) << added->body;
}

// A self-signed certificate for 127.0.0.1 and localhost, CN `cn`, written
// as <prefix>.crt / <prefix>.key (openssl's CLI).
void MakeCertificate(const std::string& prefix, const std::string& cn) {
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=", cn,
      " -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ", prefix, ".key -out ", prefix,
      ".crt 2>/dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A Generate over TLS trusting only `root_pem`.
grpc::Status TlsGenerate(int port, const std::string& root_pem) {
  grpc::SslCredentialsOptions so;
  so.pem_root_certs = root_pem;
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           grpc::SslCredentials(so), args);
  auto stub = v1::Router::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::GenerateRequest g;
  g.set_model("tiny");
  g.set_text("hi");
  g.mutable_sampling()->set_max_tokens(2);
  auto stream = stub->Generate(&ctx, g);
  v1::GenerateResponse r;
  while (stream->Read(&r)) {
  }
  return stream->Finish();
}

// TLS on both listeners from files: HTTPS and gRPC over TLS work, plaintext
// to them does not; replacing the files serves the new certificate to new
// connections without a restart.
TEST_F(RouterIntegrationTest, TlsOnBothListenersReloadsItsCertificate) {
  const std::string one = cluster_->dir() + "/tls-one", two = cluster_->dir() + "/tls-two";
  const std::string live = cluster_->dir() + "/tls-live";
  MakeCertificate(one, "swaserve-test-one");
  MakeCertificate(two, "swaserve-test-two");
  std::filesystem::copy_file(one + ".crt", live + ".crt",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(one + ".key", live + ".key",
                             std::filesystem::copy_options::overwrite_existing);
  auto r5 = cluster_->StartRouter("r5", {"--tls.cert=" + live + ".crt",
                                         "--tls.key=" + live + ".key", "--tls.refresh=1s"});
  ASSERT_TRUE(r5.ok()) << r5.status();
  const int http_port = (*r5)->http_port, grpc_port = (*r5)->grpc_port;

  httplib::SSLClient https("127.0.0.1", http_port);
  https.set_ca_cert_path((one + ".crt").c_str());
  https.enable_server_certificate_verification(true);
  const std::string body = json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}}.dump();
  auto res = https.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200) << res->body;
  // Plaintext HTTP to the TLS port gets no answer.
  httplib::Client plain("127.0.0.1", http_port);
  plain.set_read_timeout(3);
  auto p = plain.Post("/v1/completions", body, "application/json");
  EXPECT_TRUE(!p || p->status != 200);
  EXPECT_TRUE(TlsGenerate(grpc_port, ReadAll(one + ".crt")).ok());
  EXPECT_FALSE(TlsGenerate(grpc_port, ReadAll(two + ".crt")).ok());  // not yet served

  // The certificate is replaced as a Secret update does: whole files.
  std::filesystem::copy_file(two + ".key", live + ".key.new");
  std::filesystem::copy_file(two + ".crt", live + ".crt.new");
  std::filesystem::rename(live + ".key.new", live + ".key");
  std::filesystem::rename(live + ".crt.new", live + ".crt");
  bool grpc_two = false, http_two = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while ((!grpc_two || !http_two) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(500));
    if (!grpc_two) grpc_two = TlsGenerate(grpc_port, ReadAll(two + ".crt")).ok();
    if (!http_two) {
      httplib::SSLClient c("127.0.0.1", http_port);
      c.set_ca_cert_path((two + ".crt").c_str());
      c.enable_server_certificate_verification(true);
      auto r = c.Post("/v1/completions", body, "application/json");
      http_two = r && r->status == 200;
    }
  }
  EXPECT_TRUE(grpc_two) << "gRPC still serves the old certificate";
  EXPECT_TRUE(http_two) << "HTTP still serves the old certificate";
  httplib::SSLClient old("127.0.0.1", http_port);
  old.set_ca_cert_path((one + ".crt").c_str());
  old.enable_server_certificate_verification(true);
  EXPECT_FALSE(old.Post("/v1/completions", body, "application/json"));
  ASSERT_TRUE(cluster_->Kill("r5").ok());
}

// Last: kills a worker.
TEST_F(RouterIntegrationTest, ZKilledPrefillWorkerIsRetriedElsewhere) {
  // Warm prompts on p2 so the router's first choice for them is p2.
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(RandomPrompt(256, 5000 + i));
  {
    auto ch = rpc::CreateChannel(cluster_->Get("p2")->grpc_address());
    ASSERT_TRUE(ch.ok());
    auto stub = v1::Prefill::NewStub(*ch);
    for (size_t i = 0; i < prompts.size(); ++i) {
      v1::PrefillRequest pr;
      pr.set_request_id(absl::StrCat("warm-k", i));
      for (uint32_t t : prompts[i]) pr.add_token_ids(t);
      pr.mutable_sampling()->set_max_tokens(1);
      v1::PrefillResponse presp;
      grpc::ClientContext ctx;
      ASSERT_TRUE(stub->Prefill(&ctx, pr, &presp).ok());
    }
  }
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(cluster_->Kill("p2").ok());
  // p2's record outlives it (TTL): the router picks it, fails, retries p1.
  for (const auto& p : prompts) {
    json out = Post("r1", "/v1/completions",
                    {{"model", "tiny"}, {"prompt", p}, {"max_tokens", 3}, {"ignore_eos", true}});
    EXPECT_EQ(out["usage"]["completion_tokens"], 3) << out;
  }
  EXPECT_GE(cluster_->Metric("r1", R"(swaserve_router_retries_total{leg="prefill"})"), 1);
}

// Admission under overload: a router at its in-flight bound
// answers 429 with Retry-After (HTTP) and RESOURCE_EXHAUSTED with
// ErrorDetail.retry_after_ms (gRPC), and counts the shed request.
TEST_F(RouterIntegrationTest, OverloadIsAnsweredWithRetryAfter) {
  auto r = cluster_->StartRouter("r6", {"--max_inflight=1"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(cluster_->WaitHealthy("r6", absl::Seconds(20)).ok());
  std::thread slow([&] {
    auto res = cluster_->Http(
        "r6", "POST", "/v1/completions",
        json{{"model", "tiny"}, {"prompt", "long"}, {"max_tokens", 1500}, {"ignore_eos", true}}
            .dump());
    EXPECT_TRUE(res.ok() && res->status == 200);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (cluster_->Metric("r6", "swaserve_router_inflight_requests") < 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto shed = cluster_->Http("r6", "POST", "/v1/completions",
                             json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}}.dump());
  ASSERT_TRUE(shed.ok());
  EXPECT_EQ(shed->status, 429) << shed->body;
  EXPECT_EQ(shed->headers["retry-after"], "1");
  EXPECT_EQ(shed->headers["retry-after-ms"], "1000");
  auto stub = cluster_->RouterStub("r6");
  ASSERT_NE(stub, nullptr);
  v1::GenerateRequest g;
  g.set_model("tiny");
  g.set_text("hi");
  g.mutable_sampling()->set_max_tokens(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Generate(&ctx, g);
  v1::GenerateResponse resp;
  while (stream->Read(&resp)) {
  }
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(s);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->code(), v1::ERROR_CODE_OVERLOADED);
  EXPECT_EQ(d->retry_after_ms(), 1000u);
  slow.join();
  EXPECT_EQ(cluster_->Metric("r6", R"(swaserve_router_shed_total{reason="inflight"})"), 2);
}

// The HTTP API is event-driven (no thread per stream), and a
// client that closes its connection mid-stream cancels its request at once:
// the router ends it CANCELLED and cancels its worker legs, long before its
// max_tokens.
TEST_F(RouterIntegrationTest, ClosingAnHttpStreamCancelsItsRequest) {
  auto r = cluster_->StartRouter("r7");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(cluster_->WaitHealthy("r7", absl::Seconds(20)).ok());
  const std::string body =
      json{{"model", "tiny"}, {"prompt", "tell me everything"}, {"max_tokens", 4000},
           {"ignore_eos", true}, {"stream", true}}
          .dump();
  const int fd = PostOnRawSocket((*r)->http_port, body);
  ASSERT_GE(fd, 0);
  // Read until three SSE frames arrived.
  std::string got;
  char buf[4096];
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  size_t frames = 0;
  while (frames < 3 && absl::Now() < deadline) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0) << "the stream ended early: " << got;
    got.append(buf, static_cast<size_t>(n));
    frames = 0;
    for (size_t at = got.find("data: "); at != std::string::npos; at = got.find("data: ", at + 1)) {
      ++frames;
    }
  }
  ASSERT_GE(frames, 3u) << got;
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  EXPECT_EQ(cluster_->Metric("r7", "swaserve_router_inflight_requests"), 1);
  const absl::Time closed_at = absl::Now();
  close(fd);
  EXPECT_EQ(AwaitRequests("r7", "cancelled", 1), 1);
  EXPECT_LE(cluster_->Metric("r7", R"(swaserve_router_requests_total{code="ok"})"), 0);  // -1: none yet
  EXPECT_EQ(cluster_->Metric("r7", "swaserve_router_inflight_requests"), 0);
  EXPECT_LT(absl::Now() - closed_at, absl::Seconds(5));
  // The router still serves on the same event loops.
  json j = Post("r7", "/v1/completions", json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 3}});
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

// A streamed request waiting for its first token gets its stream started
// and SSE comment lines meanwhile (--http.stream_keepalive), so clients'
// header and idle timeouts (Node's fetch: 300 s; the openai package: 10 min
// until the headers) never cut a long prefill; the stream is otherwise the
// same, and the official openai client reads it.
TEST_F(RouterIntegrationTest, ALongFirstTokenWaitKeepsTheStreamAliveWithComments) {
  auto r = cluster_->StartRouter("r8", {"--http.stream_keepalive=20ms"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(cluster_->WaitHealthy("r8", absl::Seconds(20)).ok());
  std::mt19937 rng(2026);
  auto prompt = [&rng] {
    json ids = json::array();
    for (int i = 0; i < 4000; ++i) ids.push_back(10 + static_cast<int>(rng() % 400));
    return ids;
  };
  httplib::Client h("127.0.0.1", (*r)->http_port);
  h.set_read_timeout(120, 0);
  const json body = {{"model", "tiny"}, {"prompt", prompt()}, {"max_tokens", 4},
                     {"ignore_eos", true}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Result res = h.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string& sse = res->body;
  const size_t first_comment = sse.find(": waiting for the first token, ");
  const size_t first_data = sse.find("data: ");
  ASSERT_NE(first_comment, std::string::npos) << sse.substr(0, 400);
  ASSERT_NE(first_data, std::string::npos) << sse.substr(0, 400);
  EXPECT_LT(first_comment, first_data) << sse.substr(0, 400);
  EXPECT_EQ(first_comment, 0u) << "the comments open the stream";
  // No comment once tokens flow; every data line but [DONE] is a chunk.
  EXPECT_EQ(sse.find(": waiting", first_data), std::string::npos) << sse;
  // The comments say where the prefill stands (the worker's GetProgress,
  // asked a quarter interval before each comment, the first one included):
  // tokens done of the prompt, never going back, or its KV on the way to the
  // decode worker.
  int progress_comments = 0, last_done = -1;
  for (absl::string_view line : absl::StrSplit(sse.substr(0, first_data), '\n')) {
    if (line.empty()) continue;
    ASSERT_TRUE(absl::StartsWith(line, ": waiting for the first token, ")) << line;
    if (const size_t at = line.find("; prefill "); at != absl::string_view::npos) {
      ++progress_comments;
      if (absl::StrContains(line, "prefill done")) continue;
      const absl::string_view rest = line.substr(at + 10);
      ASSERT_TRUE(absl::StrContains(rest, " of 4,000 prompt tokens (")) << line;
      int done = 0;
      ASSERT_TRUE(absl::SimpleAtoi(absl::StrReplaceAll(rest.substr(0, rest.find(' ')), {{",", ""}}),
                                   &done))
          << line;
      EXPECT_GE(done, last_done) << sse.substr(0, first_data);
      EXPECT_LE(done, 4000);
      last_done = done;
    }
  }
  EXPECT_GT(progress_comments, 0) << sse.substr(0, first_data);
  // The progress is asked for a quarter interval (5 ms) before each comment,
  // so the first comment has it too when the worker answers within those
  // 5 ms (before, the first never did): on a busy machine not every time, so
  // three requests, at least one.
  int first_with_progress = absl::StrContains(sse.substr(0, sse.find('\n')), "; ");
  for (int i = 0; i < 2; ++i) {
    json fresh = body;
    fresh["prompt"] = prompt();  // no prefix hit: a prefill as long as the first
    httplib::Result again = h.Post("/v1/completions", fresh.dump(), "application/json");
    ASSERT_TRUE(again) << httplib::to_string(again.error());
    ASSERT_EQ(again->status, 200) << again->body;
    const std::string first_line = again->body.substr(0, again->body.find('\n'));
    if (absl::StartsWith(first_line, ": waiting")) {
      first_with_progress += absl::StrContains(first_line, "; ");
    }
  }
  EXPECT_GT(first_with_progress, 0) << "no first comment carried the prefill's progress";
  // Every data line parses; the last chunk before [DONE] carries the usage.
  int chunks = 0;
  json usage;
  for (absl::string_view line : absl::StrSplit(sse, '\n')) {
    if (!absl::StartsWith(line, "data: {")) continue;
    ++chunks;
    const json c = json::parse(line.substr(6));
    if (c.contains("usage") && c["usage"].is_object()) usage = c["usage"];
  }
  EXPECT_GE(chunks, 2) << sse;  // tokens (MTP may send several per chunk), then usage
  EXPECT_EQ(usage["completion_tokens"], 4) << sse;
  EXPECT_NE(sse.find("data: [DONE]"), std::string::npos);

  // The official client reads such a stream (comments are SSE's, ignored).
  std::string out;
  absl::StatusOr<int> rc = base::RunCommand(
      {"node", std::string(SWASERVE_SOURCE_DIR) + "/tests/integration/router/openai_stream.mjs",
       absl::StrCat("http://127.0.0.1:", (*r)->http_port), "tiny", prompt().dump()},
      &out, absl::Seconds(120));
  ASSERT_TRUE(rc.ok()) << rc.status();
  ASSERT_EQ(*rc, 0) << out;
  const json j = json::parse(out.substr(out.find('{')));
  ASSERT_FALSE(j.contains("error")) << j;
  EXPECT_EQ(j["finish_reason"], "length") << j;
  EXPECT_EQ(j["usage"]["completion_tokens"], 4) << j;
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4000) << j;
  EXPECT_GE(j["chunks"].get<int>(), 4) << j;
}

// The gRPC API's counterpart of the SSE keep-alive comments: with
// GenerateRequest.progress_interval_ms, a request waiting for its first token
// gets messages carrying only `progress` (where the prefill stands, as the
// worker answered a probe), none once tokens flow; the tokens are those of
// the same request without it. Below 10 ms is INVALID_ARGUMENT.
TEST_F(RouterIntegrationTest, GrpcProgressMessagesComeUntilTheFirstToken) {
  auto stub = cluster_->RouterStub("r1");
  ASSERT_NE(stub, nullptr);
  std::vector<uint32_t> ids = RandomPrompt(4000, 99);
  v1::GenerateRequest g;
  g.set_model("tiny");
  for (uint32_t id : ids) g.mutable_token_ids()->add_ids(id);
  g.mutable_sampling()->set_max_tokens(6);
  g.mutable_sampling()->set_ignore_eos(true);
  g.set_request_id("progress-test");
  struct Run {
    std::vector<v1::GenerateResponse> messages;
    grpc::Status status;
  };
  auto run = [&stub](const v1::GenerateRequest& request) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto stream = stub->Generate(&ctx, request);
    Run r;
    v1::GenerateResponse resp;
    while (stream->Read(&resp)) r.messages.push_back(resp);
    r.status = stream->Finish();
    return r;
  };
  g.set_progress_interval_ms(20);
  const Run with = run(g);
  ASSERT_TRUE(with.status.ok()) << with.status.error_message();
  std::vector<uint32_t> tokens;
  size_t progress_messages = 0, with_answer = 0;
  bool tokens_began = false;
  uint32_t last_done = 0;
  for (const v1::GenerateResponse& m : with.messages) {
    EXPECT_EQ(m.request_id(), "progress-test");
    if (m.has_progress()) {
      EXPECT_FALSE(tokens_began) << "a progress message after the first token";
      EXPECT_EQ(m.token_ids_size(), 0);
      EXPECT_TRUE(m.text().empty());
      ++progress_messages;
      if (!m.progress().found()) continue;
      ++with_answer;
      EXPECT_EQ(m.progress().prompt_tokens(), 4000u) << m.ShortDebugString();
      EXPECT_GE(m.progress().done_tokens(), last_done) << m.ShortDebugString();
      EXPECT_LE(m.progress().done_tokens(), 4000u);
      last_done = m.progress().done_tokens();
      continue;
    }
    tokens_began = tokens_began || m.token_ids_size() > 0;
    tokens.insert(tokens.end(), m.token_ids().begin(), m.token_ids().end());
  }
  EXPECT_GE(progress_messages, 1u);
  EXPECT_GE(with_answer, 1u) << progress_messages << " progress messages, none with an answer";
  EXPECT_EQ(tokens.size(), 6u);
  RecordProperty("progress_messages", absl::StrCat(progress_messages));

  g.set_progress_interval_ms(0);
  const Run without = run(g);
  ASSERT_TRUE(without.status.ok()) << without.status.error_message();
  std::vector<uint32_t> plain;
  for (const v1::GenerateResponse& m : without.messages) {
    EXPECT_FALSE(m.has_progress());
    plain.insert(plain.end(), m.token_ids().begin(), m.token_ids().end());
  }
  EXPECT_EQ(plain, tokens);

  g.set_progress_interval_ms(5);
  const Run bad = run(g);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(bad.status.error_message(), "progress_interval_ms"))
      << bad.status.error_message();
  EXPECT_TRUE(bad.messages.empty());
}

// A non-streamed request whose answer takes longer than
// --http.nonstream_keepalive gets its 200 and whitespace first, then its JSON
// body (valid JSON: whitespace may precede a value), so a client's header
// timeout (the openai package: 10 min, then a retry) or a proxy's idle
// timeout no longer cuts a long prefill. The same request through a router
// with it off fails the official client's timeout; an error after the 200
// travels in the body.
TEST_F(RouterIntegrationTest, ALongNonStreamedRequestGetsItsHeadersAndWhitespaceFirst) {
  EXPECT_GT(router_service::HttpServiceOptions{}.nonstream_keepalive, absl::ZeroDuration());
  auto on = cluster_->StartRouter("r10", {"--http.nonstream_keepalive=20ms"});
  ASSERT_TRUE(on.ok()) << on.status();
  auto off = cluster_->StartRouter("r11", {"--http.nonstream_keepalive=0"});
  ASSERT_TRUE(off.ok()) << off.status();
  auto late = cluster_->StartRouter(
      "r12", {"--http.nonstream_keepalive=20ms", "--request_timeout=400ms"});
  ASSERT_TRUE(late.ok()) << late.status();
  for (const char* id : {"r10", "r11", "r12"}) {
    ASSERT_TRUE(cluster_->WaitHealthy(id, absl::Seconds(20)).ok());
  }
  // A long answer (~2 s here): 300 tokens, decoded whole before the body is
  // known.
  static constexpr int kMaxTokens = 300;
  uint32_t seed = 70;
  auto body = [&seed] {
    return json{{"model", "tiny"}, {"prompt", RandomPrompt(600, seed++)},
                {"max_tokens", kMaxTokens}, {"ignore_eos", true}, {"temperature", 0}};
  };
  auto post = [](int port, const json& b) {
    httplib::Client h("127.0.0.1", port);
    h.set_read_timeout(120, 0);
    const absl::Time t0 = absl::Now();
    httplib::Result res = h.Post("/v1/completions", b.dump(), "application/json");
    return std::make_pair(std::move(res), absl::Now() - t0);
  };
  const json b1 = body();
  auto [with, with_s] = post((*on)->http_port, b1);
  ASSERT_TRUE(with) << httplib::to_string(with.error());
  ASSERT_EQ(with->status, 200) << with->body;
  EXPECT_EQ(with->get_header_value("Content-Type"), "application/json");
  const size_t json_at = with->body.find('{');
  ASSERT_NE(json_at, std::string::npos) << with->body.substr(0, 200);
  EXPECT_GE(json_at, 1u) << "no whitespace before the body (answered in " << with_s << ")";
  EXPECT_EQ(with->body.find_first_not_of('\n'), json_at) << "only newlines before the body";
  const json j = json::parse(with->body);  // leading whitespace is valid JSON
  EXPECT_EQ(j["usage"]["completion_tokens"], kMaxTokens) << j;
  // The same request without it: the same answer, nothing before the body.
  auto [plain, plain_s] = post((*off)->http_port, b1);
  ASSERT_TRUE(plain) << httplib::to_string(plain.error());
  ASSERT_EQ(plain->status, 200) << plain->body;
  EXPECT_EQ(plain->body.front(), '{');
  EXPECT_EQ(json::parse(plain->body)["choices"][0]["text"], j["choices"][0]["text"]);

  // The official client with a timeout well below the answer's time: the
  // headers come first through r10, not through r11 (every answer here
  // takes longer than the timeout: checked on the plain request above).
  const int timeout_ms = 250;
  ASSERT_GT(plain_s, absl::Milliseconds(2 * timeout_ms))
      << "the answer came too fast to show a client timeout";
  auto client = [&](int port) {
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {"node", std::string(SWASERVE_SOURCE_DIR) + "/tests/integration/router/openai_complete.mjs",
         absl::StrCat("http://127.0.0.1:", port), "tiny", body()["prompt"].dump(),
         absl::StrCat(kMaxTokens), absl::StrCat(timeout_ms)},
        &out, absl::Seconds(120));
    EXPECT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(rc.value_or(-1), 0) << out;
    return json::parse(out.substr(out.find('{')));
  };
  const json kept = client((*on)->http_port);
  ASSERT_FALSE(kept.contains("error")) << kept;
  EXPECT_EQ(kept["finish_reason"], "length") << kept;
  EXPECT_EQ(kept["usage"]["completion_tokens"], kMaxTokens) << kept;
  const json lost = client((*off)->http_port);
  ASSERT_TRUE(lost.contains("error")) << lost;
  EXPECT_TRUE(absl::StrContains(lost["error"].get<std::string>(), "timed out")) << lost;

  // An error after the 200 (here the 400 ms request deadline, mid-decode)
  // ends the body as an OpenAI error object, and the router counts it.
  auto [failed, failed_s] = post((*late)->http_port, body());
  ASSERT_TRUE(failed) << httplib::to_string(failed.error());
  EXPECT_EQ(failed->status, 200);
  ASSERT_GE(failed->body.find('{'), 1u) << failed->body;
  const json e = json::parse(failed->body);
  ASSERT_TRUE(e.contains("error")) << e;
  EXPECT_FALSE(e["error"]["message"].get<std::string>().empty()) << e;
  EXPECT_FALSE(e.contains("choices")) << e;
  EXPECT_GE(AwaitRequests("r12", "deadline_exceeded", 1), 1);

  // A client that leaves while its non-streamed request runs cancels it
  // (after the 200 too; AClientThatLeavesBeforeAnyReply... covers before).
  const int fd = PostOnRawSocket((*on)->http_port, body().dump());
  ASSERT_GE(fd, 0);
  char buf[256];
  ASSERT_GT(read(fd, buf, sizeof(buf)), 0) << "no headers";
  close(fd);
  EXPECT_EQ(AwaitRequests("r10", "cancelled", 1), 1);
  EXPECT_EQ(AwaitRequests("r10", "ok", 2), 2);  // the two above
  RecordProperty("answer_seconds", absl::StrCat(absl::ToDoubleSeconds(plain_s)));
}

// A client that leaves while nothing has been written to it yet (a
// non-streamed request, or a stream before its first event, with the
// keep-alives off or not yet due) cancels its request at once: the router
// watches the connection for the client's FIN (EV_CLOSED) instead of
// noticing only when the finished answer's write fails, after computing it
// for nobody. Half-closing (shutdown(SHUT_WR)) counts as leaving too.
TEST_F(RouterIntegrationTest, AClientThatLeavesBeforeAnyReplyCancelsItsRequestAtOnce) {
  auto r = cluster_->StartRouter(
      "r13", {"--http.nonstream_keepalive=0", "--http.stream_keepalive=0"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(cluster_->WaitHealthy("r13", absl::Seconds(20)).ok());
  uint32_t seed = 90;
  // ~2 s for 300 tokens (ALongNonStreamedRequest...): 3,000 take ~20 s.
  auto body = [&seed] {
    return json{{"model", "tiny"}, {"prompt", RandomPrompt(600, seed++)},
                {"max_tokens", 3000}, {"ignore_eos", true}}.dump();
  };
  for (const bool half_close : {false, true}) {
    SCOPED_TRACE(half_close ? "shutdown(SHUT_WR)" : "close");
    const double before = cluster_->Metric("r13", R"(swaserve_router_requests_total{code="cancelled"})");
    const int fd = PostOnRawSocket((*r)->http_port, body());
    ASSERT_GE(fd, 0);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (cluster_->Metric("r13", "swaserve_router_inflight_requests") < 1 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(cluster_->Metric("r13", "swaserve_router_inflight_requests"), 1);
    absl::SleepFor(absl::Milliseconds(300));  // the request is computing
    const absl::Time left_at = absl::Now();
    if (half_close) {
      shutdown(fd, SHUT_WR);
    } else {
      close(fd);
    }
    EXPECT_EQ(AwaitRequests("r13", "cancelled", std::max(before, 0.0) + 1),
              std::max(before, 0.0) + 1);
    EXPECT_LT(absl::Now() - left_at, absl::Seconds(3));
    EXPECT_EQ(cluster_->Metric("r13", "swaserve_router_inflight_requests"), 0);
    if (half_close) close(fd);
  }
  // A client that stays gets its answer (the watch cancels nothing else).
  httplib::Client h("127.0.0.1", (*r)->http_port);
  h.set_read_timeout(120, 0);
  httplib::Result ok = h.Post("/v1/completions",
                              json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 3}}.dump(),
                              "application/json");
  ASSERT_TRUE(ok) << httplib::to_string(ok.error());
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(cluster_->Metric("r13", R"(swaserve_router_requests_total{code="cancelled"})"), 2);
}

// The router's default request deadline is none: a request lasts while its
// client waits and its workers live (a fixed 10 min once cut off prompts
// whose prefill takes longer). An operator's --request_timeout still caps.
TEST_F(RouterIntegrationTest, ARequestTimeoutCapsOnlyWhenSet) {
  EXPECT_EQ(router::RouterOptions{}.request_timeout, absl::ZeroDuration());
  auto r = cluster_->StartRouter("r9", {"--request_timeout=1ms"});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(cluster_->WaitHealthy("r9", absl::Seconds(20)).ok());
  httplib::Client h("127.0.0.1", (*r)->http_port);
  h.set_read_timeout(60, 0);
  const json body = {{"model", "tiny"}, {"prompt", "tell me everything"}, {"max_tokens", 4}};
  httplib::Result res = h.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_GE(res->status, 500) << res->body;  // the 1 ms deadline passed before any answer
  // The same request through a router with the default deadline completes.
  const json j = Post("r1", "/v1/completions", body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4) << j;
}

// Tools, reasoning, /tokenize and logit_bias through real processes: a
// router serving the tiny model with MiMo's chat template (the workers run
// the same weights and tokenizer; only the router reads the template).
TEST_F(RouterIntegrationTest, ToolsReasoningTokenizeAndLogitBias) {
  namespace fs = std::filesystem;
  // A router `id` over the tiny model's weights and tokenizer with the
  // chat template `source`.
  auto router_with_template = [](const std::string& id, const std::string& source) {
    const std::string dir = cluster_->dir() + "/template_" + id;
    fs::create_directories(dir);
    for (const char* f : {"config.json", "tokenizer.json"}) {
      fs::copy_file(cluster_->model_dir() + "/" + f, dir + "/" + f,
                    fs::copy_options::overwrite_existing);
    }
    std::ofstream(dir + "/chat_template.jinja") << source;
    auto r = cluster_->StartRouter(id, {"--model=" + dir});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(cluster_->WaitHealthy(id, absl::Seconds(20)).ok());
  };
  std::ifstream mimo(std::string(SWASERVE_SOURCE_DIR) +
                     "/tests/fixtures/chat_templates/mimo_v2_5.jinja");
  router_with_template("r12", std::string(std::istreambuf_iterator<char>(mimo), {}));
  router_with_template("r13", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");

  const json tools = json::parse(R"([{"type": "function", "function": {"name": "add",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}])");
  json req = {{"model", "tiny"},
              {"messages", {{{"role", "user"}, {"content", "add 2 and 3"}}}},
              {"tools", tools},
              {"max_tokens", 8},
              {"temperature", 0},
              {"ignore_eos", true}};
  // Thinking on (the template's default): the generation prompt opens the
  // block, so the output starts as reasoning.
  const json on = Post("r12", "/v1/chat/completions", req);
  ASSERT_TRUE(on.contains("choices")) << on;
  const json& msg = on["choices"][0]["message"];
  ASSERT_TRUE(msg.contains("reasoning_content")) << on;
  const int reasoning = on["usage"]["completion_tokens_details"]["reasoning_tokens"];
  EXPECT_GT(reasoning, 0) << on;
  EXPECT_LE(reasoning, on["usage"]["completion_tokens"].get<int>());
  // Streamed, the same split.
  req["stream"] = true;
  auto streamed = cluster_->Http("r12", "POST", "/v1/chat/completions", req.dump());
  ASSERT_TRUE(streamed.ok());
  std::string reasoning_text, content_text;
  for (const json& f : SseFrames(streamed->body)) {
    if (f["choices"].empty()) continue;
    const json& d = f["choices"][0]["delta"];
    reasoning_text += d.value("reasoning_content", "");
    if (d.contains("content") && d["content"].is_string()) content_text += d["content"];
  }
  EXPECT_EQ(reasoning_text, msg["reasoning_content"].get<std::string>());
  EXPECT_EQ(content_text, msg["content"].is_string() ? msg["content"].get<std::string>() : "");
  req.erase("stream");

  // Thinking off: no reasoning.
  req["chat_template_kwargs"] = {{"enable_thinking", false}};
  const json off = Post("r12", "/v1/chat/completions", req);
  EXPECT_FALSE(off["choices"][0]["message"].contains("reasoning_content")) << off;
  EXPECT_EQ(off["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);

  // /tokenize counts what the request's usage reports.
  const json tok = Post("r12", "/tokenize", {{"messages", req["messages"]}, {"tools", tools}});
  EXPECT_EQ(tok["count"], on["usage"]["prompt_tokens"]) << tok;
  EXPECT_EQ(tok["tokens"].size(), tok["count"].get<size_t>());
  const json text = Post("r12", "/detokenize", {{"tokens", tok["tokens"]}});
  EXPECT_NE(text["prompt"].get<std::string>().find("<tool_call>"), std::string::npos) << text;

  // A template that does not render tools: a 400 that says so.
  const json refused = Post("r13", "/v1/chat/completions", req, 400);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("does not render tool"),
            std::string::npos)
      << refused;

  // logit_bias reaches prefill (the first token) and decode (the rest).
  const json forced = Post("r12", "/v1/completions",
                           {{"model", "tiny"},
                            {"prompt", RandomPrompt(40, 7)},
                            {"max_tokens", 6},
                            {"temperature", 0},
                            {"ignore_eos", true},
                            {"logit_bias", {{"1234", 100}}}});
  const json one = Post("r12", "/detokenize", {{"tokens", {1234}}});
  std::string six;
  for (int i = 0; i < 6; ++i) six += one["prompt"].get<std::string>();
  EXPECT_EQ(forced["choices"][0]["text"], six) << forced;
}

}  // namespace
}  // namespace swaserve
