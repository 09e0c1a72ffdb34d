// The attack suite against a local cluster with API keys and tenants (label
// "security"): the demo model behind a router started with --api_keys and
// --tenants, probed as a hostile client would:
//   - gRPC and HTTP without a key or with a wrong one are refused;
//   - a second tenant sending the first tenant's prompt finds nothing cached
//     (usage) and waits as long as a cold prefill (TTFT), while another key
//     of the first tenant, and a tenant the operator put in one share group
//     with it, reuse the prompt;
//   - a request's cache_salt keeps even its own tenant's cache apart.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/demo_cluster.h"
#include "tests/e2e/e2e_util.h"
#include "tests/integration/router/local_cluster.h"

namespace swaserve {
namespace {

using nlohmann::json;
using testing::LocalCluster;

constexpr char kModelDir[] = SWASERVE_SOURCE_DIR "/models/demo";

struct Result {
  grpc::Status status;
  uint32_t cached_tokens = 0;
  uint32_t prompt_tokens = 0;
  double ttft_seconds = 0;
};

class SecurityE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/security_e2e");
    std::filesystem::create_directories(*dir_);
    std::ofstream(*dir_ + "/keys") << "acme-prod:sk-acme-prod-0123456789\n"
                                      "acme-ci:sk-acme-ci-0123456789\n"
                                      "globex:sk-globex-0123456789\n"
                                      "initech:sk-initech-0123456789\n"
                                      "small:sk-small-0123456789\n";
    std::ofstream(*dir_ + "/tenants") << "tenant acme: acme-prod acme-ci\n"
                                         "tenant initech: initech\n"
                                         "share demo-prompts: acme initech\n"
                                         "tenant small: small\n"
                                         "limit small: requests_per_minute=3 "
                                         "tokens_per_minute=100000\n";
    auto c = e2e::StartDemoCluster(
        kModelDir, {absl::StrCat("--api_keys=", *dir_, "/keys"),
                    absl::StrCat("--tenants=", *dir_, "/tenants")});
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
    auto channel = grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", cluster_->Get("r1")->grpc_port), grpc::InsecureChannelCredentials());
    stub_ = v1::Router::NewStub(channel).release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete cluster_;
    delete dir_;
    stub_ = nullptr;
    cluster_ = nullptr;
  }

  // Token ids of the demo model's vocabulary (4,352 ids), fixed per seed.
  static std::vector<uint32_t> Prompt(int n, uint32_t seed) {
    std::vector<uint32_t> p = e2e::RandomPrompt(n, seed);
    for (uint32_t& t : p) t = 100 + t % 4000;
    return p;
  }

  // A gRPC Generate with `key` ("" sends none), greedy, 2 tokens.
  static Result Send(const std::string& key, const std::vector<uint32_t>& prompt,
                     const std::string& cache_salt = "") {
    v1::GenerateRequest g;
    g.set_model("demo");
    g.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
    g.mutable_sampling()->set_max_tokens(2);
    g.mutable_sampling()->set_ignore_eos(true);
    g.set_cache_salt(cache_salt);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    const auto t0 = std::chrono::steady_clock::now();
    auto stream = stub_->Generate(&ctx, g);
    Result r;
    v1::GenerateResponse resp;
    while (stream->Read(&resp)) {
      if (resp.token_ids_size() > 0 && r.ttft_seconds == 0) {
        r.ttft_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      if (resp.has_usage()) {
        r.cached_tokens = resp.usage().cached_tokens();
        r.prompt_tokens = resp.usage().prompt_tokens();
      }
    }
    r.status = stream->Finish();
    return r;
  }

  // POST /v1/completions with `key`; status and body (and Retry-After).
  static std::pair<int, json> Http(const std::string& key, const json& body,
                                   std::string* retry_after = nullptr) {
    httplib::Client cli("127.0.0.1", cluster_->Get("r1")->http_port);
    cli.set_read_timeout(120);
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    auto res = cli.Post("/v1/completions", h, body.dump(), "application/json");
    if (!res) return {0, json()};
    if (retry_after != nullptr) *retry_after = res->get_header_value("Retry-After");
    return {res->status, json::parse(res->body, nullptr, false)};
  }

  static std::string* dir_;
  static LocalCluster* cluster_;
  static v1::Router::Stub* stub_;
};
std::string* SecurityE2E::dir_ = nullptr;
LocalCluster* SecurityE2E::cluster_ = nullptr;
v1::Router::Stub* SecurityE2E::stub_ = nullptr;

TEST_F(SecurityE2E, CallsWithoutOrWithAWrongKeyAreRefused) {
  ASSERT_NE(cluster_, nullptr);
  const std::vector<uint32_t> p = Prompt(32, 1);
  EXPECT_EQ(Send("", p).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Send("sk-acme-prod-0123456788", p).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Send("sk-acme-prod-0123456789", p).status.ok());
  const json body = {{"model", "demo"}, {"prompt", "In the beginning"}, {"max_tokens", 2}};
  EXPECT_EQ(Http("", body).first, 401);
  EXPECT_EQ(Http("sk-wrong", body).first, 401);
  EXPECT_EQ(Http("sk-globex-0123456789", body).first, 200);
}

TEST_F(SecurityE2E, ATenantLearnsNothingOfAnothersPrompt) {
  ASSERT_NE(cluster_, nullptr);
  const std::vector<uint32_t> p = Prompt(3000, 2);
  const Result cold = Send("sk-acme-prod-0123456789", p);
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.cached_tokens, 0u);
  const Result warm = Send("sk-acme-prod-0123456789", p);
  ASSERT_TRUE(warm.status.ok());
  EXPECT_GE(warm.cached_tokens, 2900u);
  // Another key of the same tenant shares its cache.
  const Result sibling = Send("sk-acme-ci-0123456789", p);
  EXPECT_GE(sibling.cached_tokens, 2900u);
  // Another tenant: nothing cached, and a cold prefill's wait.
  const Result probe = Send("sk-globex-0123456789", p);
  ASSERT_TRUE(probe.status.ok());
  EXPECT_EQ(probe.cached_tokens, 0u);
  EXPECT_GT(probe.ttft_seconds, 2 * warm.ttft_seconds)
      << "cold " << cold.ttft_seconds << " s, warm " << warm.ttft_seconds << " s, other tenant "
      << probe.ttft_seconds << " s";
  // A tenant the operator shares acme's cache with reuses it.
  const Result shared = Send("sk-initech-0123456789", p);
  EXPECT_GE(shared.cached_tokens, 2900u);
  std::printf("TTFT of a 3,000-token prompt: cold %.3f s, the tenant again %.3f s, another "
              "tenant %.3f s\n",
              cold.ttft_seconds, warm.ttft_seconds, probe.ttft_seconds);
}

TEST_F(SecurityE2E, ACacheSaltKeepsEvenItsOwnTenantApart) {
  ASSERT_NE(cluster_, nullptr);
  const std::vector<uint32_t> p = Prompt(1000, 3);
  json body = {{"model", "demo"}, {"prompt", p}, {"max_tokens", 2}, {"ignore_eos", true}};
  const auto cached = [](const json& r) {
    return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  auto [s1, r1] = Http("sk-globex-0123456789", body);
  ASSERT_EQ(s1, 200) << r1.dump();
  auto [s2, r2] = Http("sk-globex-0123456789", body);
  EXPECT_GE(cached(r2), 900) << r2.dump();
  body["cache_salt"] = "user-17";
  auto [s3, r3] = Http("sk-globex-0123456789", body);
  ASSERT_EQ(s3, 200) << r3.dump();
  EXPECT_EQ(cached(r3), 0) << r3.dump();
  auto [s4, r4] = Http("sk-globex-0123456789", body);
  EXPECT_GE(cached(r4), 900) << r4.dump();
  body["cache_salt"] = "user-18";
  auto [s5, r5] = Http("sk-globex-0123456789", body);
  EXPECT_EQ(cached(r5), 0) << r5.dump();
}

// A tenant over its request rate (3 a minute) gets 429 with Retry-After,
// over HTTP and gRPC alike; another tenant is not affected.
TEST_F(SecurityE2E, ATenantsRateLimitIsItsOwn) {
  ASSERT_NE(cluster_, nullptr);
  const json body = {{"model", "demo"}, {"prompt", "In the beginning"}, {"max_tokens", 2}};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Http("sk-small-0123456789", body).first, 200) << i;
  std::string retry_after;
  auto [status, error] = Http("sk-small-0123456789", body, &retry_after);
  EXPECT_EQ(status, 429) << error.dump();
  int seconds = 0;
  EXPECT_TRUE(absl::SimpleAtoi(retry_after, &seconds)) << retry_after;
  EXPECT_GE(seconds, 1);
  EXPECT_LE(seconds, 20);
  EXPECT_EQ(Send("sk-small-0123456789", Prompt(8, 4)).status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Http("sk-globex-0123456789", body).first, 200);
}

// The HTTP edge under a hostile client: a body over the limit is refused on
// its Content-Length before any of it is sent; 2,000 idle connections and
// 200 that stop halfway through their headers do not keep a normal request
// from being served at once; the memory they cost the router is printed.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int64_t RssKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int64_t kib = 0;
    if (absl::StartsWith(line, "VmRSS:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")), &kib)) {
      return kib;
    }
  }
  return -1;
}

TEST_F(SecurityE2E, TheEdgeHoldsAgainstLargeBodiesAndIdleConnections) {
  ASSERT_NE(cluster_, nullptr);
  const int port = cluster_->Get("r1")->http_port;
  {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    const std::string head =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Authorization: Bearer sk-globex-0123456789\r\nContent-Length: 200000000\r\n\r\n";
    ASSERT_EQ(write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const auto t0 = std::chrono::steady_clock::now();
    char buf[512] = {};
    const ssize_t n = read(fd, buf, sizeof(buf) - 1);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    close(fd);
    ASSERT_GT(n, 0) << "no answer before the body";
    EXPECT_TRUE(absl::StartsWith(buf, "HTTP/1.1 413")) << buf;
    EXPECT_LT(s, 2.0);
  }
  const pid_t pid = cluster_->Get("r1")->process->pid();
  const int64_t rss_before = RssKiB(pid);
  std::vector<int> fds;
  for (int i = 0; i < 2200; ++i) {
    const int fd = Connect(port);
    if (fd < 0) break;
    if (i % 11 == 0) {
      const std::string partial = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
      (void)!write(fd, partial.data(), partial.size());
    }
    fds.push_back(fd);
  }
  EXPECT_EQ(fds.size(), 2200u);
  absl::SleepFor(absl::Milliseconds(500));
  const int64_t rss_flooded = RssKiB(pid);
  const json body = {{"model", "demo"}, {"prompt", "In the beginning"}, {"max_tokens", 4}};
  const auto t0 = std::chrono::steady_clock::now();
  auto [status, r] = Http("sk-globex-0123456789", body);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(status, 200) << r.dump();
  EXPECT_LT(s, 5.0);
  for (int fd : fds) close(fd);
  std::printf("router RSS %lld KiB idle, %lld KiB with %zu idle or stalled connections "
              "(%.1f KiB each); a request among them: %.3f s\n",
              static_cast<long long>(rss_before), static_cast<long long>(rss_flooded), fds.size(),
              static_cast<double>(rss_flooded - rss_before) / std::max<size_t>(1, fds.size()), s);
}

}  // namespace
}  // namespace swaserve
