// lib/launch's ClusterLauncher and the `swaserve up | generate | chat`
// commands against real processes on loopback (label tools;integration): a
// redis-server, two prefill workers (buckets 2048, 8192), a decode worker and
// a router on free ports, with the tiny random model.
#include <algorithm>
#include "lib/launch/cluster_launcher.h"

#include <dirent.h>
#include <httplib.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"

namespace swaserve::launch {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kCli[] = SWASERVE_CLI_BIN;
constexpr char kWorker[] = SWASERVE_WORKER_BIN;
constexpr char kRouter[] = SWASERVE_ROUTER_BIN;
constexpr char kEncoder[] = SWASERVE_ENCODER_BIN;

bool Alive(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

// Pids whose parent is `parent` (from /proc/<pid>/stat).
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat;
    std::getline(in, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(pid);
  }
  closedir(d);
  return out;
}

// Polls 127.0.0.1:`port`/metrics every 50 ms until `done` holds for its
// body or `limit` passed; the last body ("" when none was read). Worker
// counters move when a request ends, which may come after its answer.
std::string AwaitMetrics(int port, const std::function<bool(const std::string&)>& done,
                         absl::Duration limit = absl::Seconds(30)) {
  httplib::Client c("127.0.0.1", port);
  std::string body;
  for (const absl::Time until = absl::Now() + limit; absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(50))) {
    httplib::Result r = c.Get("/metrics");
    if (r) body = r->body;
    if (r && done(body)) break;
  }
  return body;
}

constexpr char kPrefillOk[] = "swaserve_prefill_requests_total{result=\"ok\"} 1";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// cached_tokens=N of every usage line of `out`.
std::vector<int> CachedTokens(const std::string& out) {
  std::vector<int> v;
  static const std::regex re("cached_tokens=([0-9]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    v.push_back(std::stoi((*it)[1].str()));
  }
  return v;
}

// A prompt of token ids that grows (an agent's conversation), pseudo-random
// from `seed`.
struct GrowingPrompt {
  explicit GrowingPrompt(uint64_t seed) : x(seed) {}
  void Grow(int n) {
    for (int k = 0; k < n; ++k) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      ids.push_back(10 + static_cast<int>((x >> 33) % 200));
    }
  }
  json ids = json::array();
  uint64_t x;
};

// POSTs /v1/completions of `ids` (max_tokens 2); the usage's cached_tokens,
// or -1 (and a test failure) when the answer is not a 200.
int CompleteCached(httplib::Client& h, const json& ids) {
  const json body = {{"model", "tiny"}, {"prompt", ids}, {"max_tokens", 2}, {"ignore_eos", true}};
  httplib::Result r = h.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(r && r->status == 200) << (r ? r->body : httplib::to_string(r.error()));
  if (!r || r->status != 200) return -1;
  return json::parse(r->body)["usage"]["prompt_tokens_details"].value("cached_tokens", 0);
}

// Whether a line of metric `name` with `label` has a value > 0.
bool MetricPositive(const std::string& m, absl::string_view name, absl::string_view label) {
  for (absl::string_view line : absl::StrSplit(m, '\n')) {
    double v = 0;
    if (absl::StartsWith(line, name) && absl::StrContains(line, label) &&
        absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v) && v > 0) {
      return true;
    }
  }
  return false;
}

// prefill-0's /metrics show the prompt near its bucket's bound put into L3,
// every put stored (its write-behind queue empty: a first put alone let the
// next bucket's worker look before the rest landed, which failed a clean-
// clone CI run once).
bool WrittenAtBound(const std::string& m) {
  return MetricPositive(m, "swaserve_kv_l3_store_ops_total{", "op=\"put\"}") &&
         MetricPositive(m, "swaserve_prefix_cache_l3_pages_total{", "op=\"written_at_bound\"}") &&
         absl::StrContains(m, "\nswaserve_kv_l3_write_queue_bytes 0\n");
}

class ClusterLauncherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::string> dir = base::MakeTempDir("swaserve-launch-test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = new std::string(*dir);
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {kCli, "make-model", "--shape=tiny", "--out=" + *dir_ + "/model"}, &out,
        absl::Seconds(120));
    ASSERT_TRUE(rc.ok()) << rc.status();
    ASSERT_EQ(*rc, 0) << out;
    ASSERT_TRUE(fs::exists(*dir_ + "/model/tokenizer.json")) << out;
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) {
      std::error_code ec;
      if (!::testing::UnitTest::GetInstance()->Failed())
        fs::remove_all(*dir_, ec);
      delete dir_;
      dir_ = nullptr;
    }
  }

  ClusterSpec Spec(const std::string& run) const {
    ClusterSpec s;
    s.model = *dir_ + "/model";
    s.model_name = "tiny";
    s.http_port = 0;
    s.grpc_port = 0;
    s.bucket_bounds = {2048, 8192};
    s.decode_workers = 1;
    s.worker_threads = 1;
    s.kv_mib = 32;
    s.worker_bin = kWorker;
    s.router_bin = kRouter;
    s.run_dir = *dir_ + "/" + run;
    s.start_timeout = absl::Seconds(60);
    s.decode_flags = {"--decode.staging_arena_mib=64"};
    return s;
  }

  static std::string* dir_;
};
std::string* ClusterLauncherTest::dir_ = nullptr;

TEST_F(ClusterLauncherTest, ServesHttpGenerateAndChatAndStopsEverything) {
  std::vector<std::string> progress;
  ClusterSpec spec = Spec("run-launcher");
  spec.on_progress = [&](const std::string& line) { progress.push_back(line); };
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c =
      ClusterLauncher::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  ClusterLauncher& cluster = **c;
  const Endpoints& e = cluster.endpoints();
  ASSERT_GT(e.http_port, 0);
  ASSERT_GT(e.grpc_port, 0);
  EXPECT_EQ(e.http_url, absl::StrCat("http://127.0.0.1:", e.http_port));
  EXPECT_EQ(e.model_name, "tiny");
  std::vector<ProcessInfo> procs = cluster.processes();
  ASSERT_EQ(procs.size(), 5u);
  EXPECT_EQ(procs[0].name, "redis");
  EXPECT_EQ(procs[1].name, "prefill-0");
  EXPECT_EQ(procs[2].name, "prefill-1");
  EXPECT_EQ(procs[3].name, "decode-0");
  EXPECT_EQ(procs[4].name, "router");
  EXPECT_EQ(e.metrics_urls.size(), 4u);  // every process but redis
  for (const ProcessInfo& p : procs) {
    EXPECT_TRUE(fs::exists(p.log_path)) << p.name;
    EXPECT_TRUE(Alive(p.pid)) << p.name;
  }
  EXPECT_FALSE(progress.empty());
  EXPECT_NE(progress.front().find("starting redis"), std::string::npos)
      << progress.front();

  // The prefill workers registered their buckets.
  {
    httplib::Client m("127.0.0.1", procs[2].metrics_port);
    httplib::Result r = m.Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_NE(r->body.find("swaserve_cluster_registered 1"), std::string::npos);
  }

  // OpenAI HTTP chat completion.
  {
    httplib::Client h("127.0.0.1", e.http_port);
    h.set_read_timeout(60, 0);
    const json body = {{"model", "tiny"},
                       {"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                       {"max_tokens", 8},
                       {"ignore_eos", true}};
    httplib::Result r =
        h.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string()) << j;
    EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0) << j;
    // Streaming too.
    json sbody = body;
    sbody["stream"] = true;
    r = h.Post("/v1/chat/completions", sbody.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos) << r->body;
  }

  // swaserve generate over gRPC.
  {
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {kCli, "generate", "--router=" + e.grpc_address, "--prompt",
         "Once upon a time", "--max_tokens=8", "--ignore_eos"},
        &out, absl::Seconds(60));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << out;
    EXPECT_NE(out.find("completion_tokens=8"), std::string::npos) << out;
    // Some text before the usage line.
    EXPECT_GT(out.find("[usage:"), 1u) << out;
  }

  // swaserve generate --prompt_file ('-': stdin), with progress lines on
  // stderr while the first token is awaited (--progress_interval).
  {
    // ~6,000 tokens (bucket 1: ~0.3 s of prefill), not cached: different
    // from its first word on.
    auto words = [](const char* first) {
      std::string w = first;
      for (int i = 0; i < 6000; ++i) absl::StrAppend(&w, i % 7 == 0 ? " dragon" : " and");
      return w;
    };
    const std::string path = *dir_ + "/long_prompt.txt";
    {
      std::ofstream f(path);
      f << words("Once");
    }
    for (const bool from_stdin : {false, true}) {
      SCOPED_TRACE(from_stdin ? "stdin" : "file");
      std::string out;
      absl::StatusOr<int> rc = base::RunCommand(
          {kCli, "generate", "--router=" + e.grpc_address, "--prompt_file",
           from_stdin ? "-" : path, "--max_tokens=4", "--ignore_eos", "--progress_interval=10ms"},
          &out, absl::Seconds(120), from_stdin ? words("Twice") : "");
      ASSERT_TRUE(rc.ok()) << rc.status();
      EXPECT_EQ(*rc, 0) << out;
      EXPECT_NE(out.find("completion_tokens=4"), std::string::npos) << out;
      const size_t waiting = out.find("[waiting for the first token, ");
      ASSERT_NE(waiting, std::string::npos) << out;
      const size_t last = out.rfind("[waiting for the first token, ");
      std::printf("progress (%s), last line: %s\n", from_stdin ? "stdin" : "file",
                  out.substr(last, out.find('\n', last) - last).c_str());
      const size_t prompt_at = out.find("prompt_tokens=");
      ASSERT_NE(prompt_at, std::string::npos) << out;
      EXPECT_GT(std::atoi(out.c_str() + prompt_at + 14), 4000) << out;
    }
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {kCli, "generate", "--router=" + e.grpc_address, "--prompt", "x", "--prompt_file", path},
        &out, absl::Seconds(30));
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 2) << out;
    EXPECT_NE(out.find("exclude each other"), std::string::npos) << out;
    out.clear();
    rc = base::RunCommand({kCli, "generate", "--router=" + e.grpc_address, "--prompt", "x",
                           "--progress_interval=5ms"},
                          &out, absl::Seconds(30));
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 2) << out;
    EXPECT_NE(out.find("progress_interval"), std::string::npos) << out;
  }

  // swaserve chat: two turns; the second's prompt extends the first's, so
  // whole pages of it come from the prefix cache.
  {
    std::string first = "Please tell me a long story about";
    for (int i = 0; i < 12; ++i)
      absl::StrAppend(&first, " a dragon number ", i, " and");
    first += " its friends.";
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {kCli, "chat", "--router=" + e.grpc_address, "--system",
         "You are terse.", "--max_tokens=8", "--ignore_eos", "--temperature=0"},
        &out, absl::Seconds(60), first + "\nAnd then?\n");
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << out;
    const std::vector<int> cached = CachedTokens(out);
    ASSERT_EQ(cached.size(), 2u) << out;
    EXPECT_GT(cached[1], 0) << out;
  }

  // Errors: an unreachable router, a bad request.
  {
    absl::StatusOr<int> port = base::PickFreePort();
    ASSERT_TRUE(port.ok());
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {kCli, "generate", absl::StrCat("--router=127.0.0.1:", *port),
         "--prompt", "x", "--connect_timeout=500ms"},
        &out, absl::Seconds(30));
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 1) << out;
    EXPECT_NE(out.find("cannot reach the router"), std::string::npos) << out;
    out.clear();
    rc = base::RunCommand({kCli, "generate", "--router=" + e.grpc_address,
                           "--prompt", "x", "--model=no-such-model"},
                          &out, absl::Seconds(30));
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 1) << out;
    EXPECT_NE(out.find("router error"), std::string::npos) << out;
  }

  EXPECT_TRUE(cluster.Poll().empty());
  EXPECT_TRUE(cluster.Dead().empty());
  cluster.Stop();
  for (const ProcessInfo& p : procs)
    EXPECT_FALSE(Alive(p.pid)) << p.name << " " << p.pid;
  EXPECT_TRUE(cluster.Poll().empty());  // a stop is not a death
}

// spec.prometheus (swaserve up --prometheus): a real Prometheus scrapes every
// process under the jobs the dashboards use, with the recording rules of
// deploy/prometheus; it stops with the cluster.
TEST_F(ClusterLauncherTest, PrometheusScrapesEveryProcessWithTheRules) {
  ClusterSpec spec = Spec("run-prometheus");
  spec.prometheus = true;
  spec.prometheus_port = 0;
  spec.prometheus_rules = std::string(SWASERVE_SOURCE_DIR) + "/deploy/prometheus/rules/swaserve.rules.yml";
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  ClusterLauncher& cluster = **c;
  const Endpoints& e = cluster.endpoints();
  ASSERT_FALSE(e.prometheus_url.empty());
  std::vector<ProcessInfo> procs = cluster.processes();
  ASSERT_EQ(procs.back().name, "prometheus");
  const int port = procs.back().grpc_port;
  httplib::Client prom("127.0.0.1", port);
  prom.set_read_timeout(10, 0);
  auto query = [&](const std::string& q) {
    httplib::Result r = prom.Get("/api/v1/query", httplib::Params{{"query", q}}, httplib::Headers{});
    if (!r || r->status != 200) return json();
    return json::parse(r->body)["data"]["result"];
  };
  // Every process but Redis up, with the roles' job names.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  json up;
  while (true) {
    up = query("up == 1");
    if (up.is_array() && up.size() == 4) break;
    ASSERT_LT(absl::Now(), deadline) << up.dump() << "\n" << ReadFile(procs.back().log_path);
    absl::SleepFor(absl::Milliseconds(500));
  }
  std::set<std::string> jobs;
  for (const json& s : up) jobs.insert(s["metric"]["job"].get<std::string>() + "/" +
                                       s["metric"]["instance"].get<std::string>());
  EXPECT_EQ(jobs, (std::set<std::string>{"swaserve-prefill/prefill-0", "swaserve-prefill/prefill-1",
                                         "swaserve-decode/decode-0", "swaserve-router/router"}));
  // The rules are loaded (a recording rule's series appears once evaluated).
  json rule;
  while (true) {
    rule = query("swaserve:kv_pages_used:ratio");
    if (rule.is_array() && !rule.empty()) break;
    ASSERT_LT(absl::Now(), deadline) << "recording rules not evaluated";
    absl::SleepFor(absl::Milliseconds(500));
  }
  const pid_t pid = procs.back().pid;
  cluster.Stop();
  EXPECT_FALSE(Alive(pid)) << "prometheus still running after Stop";
}

// A model with vision and audio towers gets an encoder: started
// with the workers, serving /metrics, stopped with the cluster; a text-only
// model gets none.
TEST_F(ClusterLauncherTest, AMultimodalModelGetsAnEncoder) {
  std::string out;
  const std::string model = *dir_ + "/mm-model";
  absl::StatusOr<int> rc = base::RunCommand(
      {kCli, "make-model", "--shape=tiny", "--vision", "--audio", "--out=" + model}, &out,
      absl::Seconds(120));
  ASSERT_TRUE(rc.ok() && *rc == 0) << out;
  ClusterSpec spec = Spec("run-encoder");
  spec.model = model;
  spec.bucket_bounds = {8192};
  spec.encoder_bin = kEncoder;
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<ProcessInfo> procs = (*c)->processes();
  auto enc = std::find_if(procs.begin(), procs.end(),
                          [](const ProcessInfo& p) { return p.name == "encoder-0"; });
  ASSERT_NE(enc, procs.end());
  EXPECT_EQ(enc->role, "encoder");
  httplib::Client m("127.0.0.1", enc->metrics_port);
  auto r = m.Get("/metrics");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_NE(r->body.find("swaserve_encoder_cache_bytes"), std::string::npos);
  EXPECT_NE(ReadFile(enc->log_path).find("vision true, audio true"), std::string::npos);
  const pid_t pid = enc->pid;
  (*c)->Stop();
  EXPECT_FALSE(Alive(pid)) << "the encoder still runs after Stop";
  // The text-only model: no encoder.
  ClusterSpec text = Spec("run-no-encoder");
  text.bucket_bounds = {8192};
  text.encoder_bin = kEncoder;
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> t = ClusterLauncher::Start(text);
  ASSERT_TRUE(t.ok()) << t.status();
  for (const ProcessInfo& p : (*t)->processes()) EXPECT_NE(p.role, "encoder") << p.name;
}

TEST_F(ClusterLauncherTest, ReportsAChildThatDies) {
  ClusterSpec spec = Spec("run-dies");
  spec.bucket_bounds = {2048};
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c =
      ClusterLauncher::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<ProcessInfo> procs = (*c)->processes();
  ASSERT_EQ(procs.size(), 4u);
  ASSERT_EQ(procs[2].name, "decode-0");
  ASSERT_EQ(kill(procs[2].pid, SIGKILL), 0);
  std::vector<ProcessExit> dead;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (dead.empty() && absl::Now() < deadline) {
    dead = (*c)->Poll();
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].name, "decode-0");
  EXPECT_EQ(dead[0].exit_code, 128 + SIGKILL);
  EXPECT_EQ((*c)->Dead().size(), 1u);
  c->reset();  // the destructor stops the rest
  for (const ProcessInfo& p : procs) EXPECT_FALSE(Alive(p.pid)) << p.name;
}

// `swaserve up` restarts nothing (Kubernetes does, deploy/): with the only
// prefill worker of bucket 0 killed, the router sends bucket 0's prompts to
// bucket 1's worker (RouterOptions::bucket_fallback) at once, instead of
// answering 503 after --worker_wait until a restart that never comes.
TEST_F(ClusterLauncherTest, AKilledBucketsPromptsGoToTheNextBucketUp) {
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(Spec("run-fallback"));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<ProcessInfo> procs = (*c)->processes();
  auto find = [&](const std::string& name) {
    for (const ProcessInfo& p : procs) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no process " << name;
    return ProcessInfo{};
  };
  const ProcessInfo p0 = find("prefill-0"), p1 = find("prefill-1"), router = find("router");
  ASSERT_EQ(kill(p0.pid, SIGKILL), 0);
  std::vector<ProcessExit> dead;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); dead.empty() && absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(20))) {
    dead = (*c)->Poll();
  }
  ASSERT_EQ(dead.size(), 1u);
  httplib::Client h("127.0.0.1", (*c)->endpoints().http_port);
  h.set_read_timeout(60, 0);
  const json body = {{"model", "tiny"}, {"prompt", "a short prompt for bucket zero"},
                     {"max_tokens", 4}, {"ignore_eos", true}};
  const absl::Time t0 = absl::Now();
  httplib::Result r = h.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 4) << r->body;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5)) << "waited for bucket 0 to come back";
  httplib::Client rm("127.0.0.1", router.metrics_port);
  httplib::Result m = rm.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_TRUE(absl::StrContains(m->body, "swaserve_router_bucket_fallbacks_total{bucket=\"0\"} 1"))
      << m->body.substr(0, 2000);
  // Served by prefill-1 (its counter moves once its request ended).
  auto ok = [](const std::string& m) { return absl::StrContains(m, kPrefillOk); };
  EXPECT_TRUE(ok(AwaitMetrics(p1.metrics_port, ok)));
}

// spec.l3_redis_mib (swaserve up's default 1024): a second redis-server that
// every prefill worker shares as its L3. A prompt in the top quarter of
// bucket 0 (spec.l3_write_through_near_bound, 0.75) is written through at
// once, the first time bucket 0's worker serves it; the same prompt grown
// past the bucket bound (an agent's next turn) goes to bucket 1's worker,
// which finds the prefix there instead of recomputing it.
TEST_F(ClusterLauncherTest, ASharedL3CarriesAPromptIntoTheNextBucket) {
  ClusterSpec spec = Spec("run-shared-l3");
  spec.l3_redis_mib = 64;
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<ProcessInfo> procs = (*c)->processes();
  ProcessInfo p0;
  int l3_servers = 0;
  for (const ProcessInfo& p : procs) {
    if (p.name == "prefill-0") p0 = p;
    l3_servers += p.name == "redis-l3";
  }
  ASSERT_EQ(l3_servers, 1);
  ASSERT_FALSE((*c)->endpoints().l3_redis_address.empty());
  EXPECT_NE((*c)->endpoints().l3_redis_address, (*c)->endpoints().redis_address);
  EXPECT_TRUE(absl::StrContains(ReadFile(p0.log_path), "prefill L3: Redis store at " +
                                                           (*c)->endpoints().l3_redis_address));
  httplib::Client h("127.0.0.1", (*c)->endpoints().http_port);
  h.set_read_timeout(120, 0);
  GrowingPrompt prompt(777);
  prompt.Grow(1900);  // bucket 0 (< 2048), past 0.75 x 2048
  EXPECT_EQ(CompleteCached(h, prompt.ids), 0);  // served once: no hit to count
  EXPECT_TRUE(WrittenAtBound(AwaitMetrics(p0.metrics_port, WrittenAtBound, absl::Seconds(10))))
      << "prefill-0 did not write the prompt near its bound into the shared L3";
  prompt.Grow(400);  // 2,300 tokens: bucket 1, whose worker never saw the prompt
  EXPECT_GT(CompleteCached(h, prompt.ids), 1500) << "bucket 1's worker recomputed the prefix";
}

// The shared L3 hung (SIGSTOP of redis-l3: a Redis that accepts nothing and
// answers nothing): prompts that would read from it or write to it are
// served all the same, the reads given up after the prefetch wait and the
// Redis client's command timeout (2 s) at most; once it is back (SIGCONT)
// it serves again.
TEST_F(ClusterLauncherTest, AHungL3RedisDelaysButLosesNoRequest) {
  ClusterSpec spec = Spec("run-hung-l3");
  spec.l3_redis_mib = 64;
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  ProcessInfo p0, l3;
  for (const ProcessInfo& p : (*c)->processes()) {
    if (p.name == "prefill-0") p0 = p;
    if (p.name == "redis-l3") l3 = p;
  }
  ASSERT_GT(l3.pid, 0);
  httplib::Client h("127.0.0.1", (*c)->endpoints().http_port);
  h.set_read_timeout(120, 0);
  GrowingPrompt before(31);
  before.Grow(1900);
  EXPECT_EQ(CompleteCached(h, before.ids), 0);
  ASSERT_TRUE(WrittenAtBound(AwaitMetrics(p0.metrics_port, WrittenAtBound, absl::Seconds(10))));
  ASSERT_EQ(kill(l3.pid, SIGSTOP), 0);
  // Bucket 1's worker tries to fetch the prefix from the hung L3.
  before.Grow(400);
  absl::Time t0 = absl::Now();
  const int crossing = CompleteCached(h, before.ids);
  const absl::Duration crossing_took = absl::Now() - t0;
  // Bucket 0's worker writes a new prompt near its bound to it.
  GrowingPrompt other(32);
  other.Grow(1900);
  t0 = absl::Now();
  EXPECT_EQ(CompleteCached(h, other.ids), 0);
  const absl::Duration other_took = absl::Now() - t0;
  ASSERT_EQ(kill(l3.pid, SIGCONT), 0);
  EXPECT_GE(crossing, 0);
  EXPECT_LT(crossing_took, absl::Seconds(15)) << "waited too long for the hung L3";
  EXPECT_LT(other_took, absl::Seconds(15));
  std::printf("hung L3: the crossing prompt answered after %.2f s (%d cached), a new one after %.2f s\n",
              absl::ToDoubleSeconds(crossing_took), crossing, absl::ToDoubleSeconds(other_took));
  // Back: a new prompt near the bound is written, and found from bucket 1
  // (new prompts until then: the Redis client may still be in its
  // reconnect backoff, and a retry of the same one would hit bucket 1's L1).
  int found = 0;
  for (uint64_t seed = 33; found <= 1500 && seed < 53; ++seed) {
    GrowingPrompt after(seed);
    after.Grow(1900);
    EXPECT_EQ(CompleteCached(h, after.ids), 0);
    absl::SleepFor(absl::Milliseconds(300));  // the write-behind thread puts it
    after.Grow(400);
    found = CompleteCached(h, after.ids);
  }
  EXPECT_GT(found, 1500) << "the L3 did not serve again after SIGCONT";
}

// A bad spec fails before any process starts, naming the key.
TEST_F(ClusterLauncherTest, BadSpecsAreRefusedNamingTheKey) {
  const struct {
    void (*edit)(ClusterSpec&);
    const char* key;
  } cases[] = {
      {[](ClusterSpec& s) { s.prefill_nice_step = 20; }, "prefill_nice_step: 20 is not in [0, 19]"},
      {[](ClusterSpec& s) { s.prefill_nice_step = -1; }, "prefill_nice_step: -1"},
      {[](ClusterSpec& s) { s.decode_workers = 0; }, "decode_workers"},
      {[](ClusterSpec& s) { s.http_port = 70000; }, "ports must be in [0, 65535]"},
      {[](ClusterSpec& s) { s.l3_write_through_near_bound = 1.5; },
       "l3_write_through_near_bound: 1.5 is not in [0, 1]"},
  };
  for (const auto& c : cases) {
    ClusterSpec spec = Spec("run-bad-spec");
    c.edit(spec);
    absl::StatusOr<std::unique_ptr<ClusterLauncher>> l = ClusterLauncher::Start(spec);
    ASSERT_FALSE(l.ok()) << c.key;
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << l.status();
    EXPECT_NE(l.status().message().find(c.key), std::string::npos) << l.status();
    EXPECT_TRUE(ChildrenOf(getpid()).empty()) << c.key;
  }
}

TEST_F(ClusterLauncherTest, StartFailureNamesTheProcessAndStopsTheRest) {
  ClusterSpec spec = Spec("run-fail");
  spec.bucket_bounds = {2048};
  spec.decode_flags = {"--no_such_flag=1"};
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c =
      ClusterLauncher::Start(spec);
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("decode-0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no_such_flag"), std::string::npos)
      << msg;  // the log's tail
  for (const pid_t pid : ChildrenOf(getpid())) {
    ADD_FAILURE() << "child " << pid << " still running";
  }
}

// Every bucket the cluster advertises serves a prompt at its top: each
// prefill worker's KV pool is sized for its bucket's upper bound and the
// decode worker's for the largest bucket (kv_plan.h). Before, one kv_mib for
// every worker refused each prompt above what that held (HTTP 413): with
// `swaserve up`'s defaults, every prompt of the demo model over 65,792
// tokens, i.e. the whole 64K-256K and 256K-1M buckets.
TEST_F(ClusterLauncherTest, EveryBucketServesAPromptAtItsTop) {
  ClusterSpec spec = Spec("run-buckets");
  spec.bucket_bounds = {1024, 4096, 24576};
  spec.kv_mib = 1;
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  const KvPlan& plan = (*c)->kv_plan();
  ASSERT_EQ(plan.prefill_mib.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_GE(plan.prefill_tokens[i], spec.bucket_bounds[i]);
  EXPECT_GE(plan.decode_tokens, spec.bucket_bounds.back() + kDecodeHeadroomTokens);
  // kv_mib alone was too small for the top bucket: the plan grew it.
  EXPECT_GT(plan.prefill_mib[2], spec.kv_mib) << plan.Describe(1);
  EXPECT_GT(plan.decode_mib, spec.kv_mib) << plan.Describe(1);
  std::printf("%s\n", plan.Describe(1).c_str());

  const std::vector<ProcessInfo> procs = (*c)->processes();
  // CPU priority by bucket (ClusterSpec::prefill_nice_step, 10): every
  // thread of prefill-i runs at this process's nice + min(19, 10·i), the
  // decode worker and the router at this process's.
  const int own_nice = getpriority(PRIO_PROCESS, 0);
  for (const ProcessInfo& p : procs) {
    int want = own_nice;
    if (absl::StartsWith(p.name, "prefill-")) {
      want = std::min(19, own_nice + 10 * std::stoi(p.name.substr(8)));
    }
    int threads = 0;
    for (const auto& t : fs::directory_iterator(absl::StrCat("/proc/", p.pid, "/task"))) {
      std::ifstream in(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // Fields after "(comm) ": state is the 3rd, nice the 19th.
      std::vector<std::string> f = absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
      ASSERT_GT(f.size(), 16u) << stat;
      EXPECT_EQ(std::stoi(f[16]), want) << p.name << " thread " << t.path();
      ++threads;
    }
    if (p.role == "prefill" || p.role == "decode") EXPECT_GT(threads, 1) << p.name;
  }
  httplib::Client h("127.0.0.1", (*c)->endpoints().http_port);
  h.set_read_timeout(240, 0);
  uint64_t x = 12345;
  for (size_t i = 0; i < 3; ++i) {
    const int64_t n = spec.bucket_bounds[i] - 1;  // the bucket's largest prompt
    json ids = json::array();
    for (int64_t k = 0; k < n; ++k) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      ids.push_back(10 + static_cast<int>((x >> 33) % 200));
    }
    const json body = {{"model", "tiny"}, {"prompt", ids}, {"max_tokens", 2},
                       {"ignore_eos", true}};
    const absl::Time t0 = absl::Now();
    httplib::Result r = h.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    ASSERT_EQ(r->status, 200) << "bucket " << i << ": " << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["usage"]["prompt_tokens"].get<int64_t>(), n) << j;
    EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 2) << j;
    std::printf("bucket %zu: a %lld-token prompt served in %.1f s\n", i,
                static_cast<long long>(n), absl::ToDoubleSeconds(absl::Now() - t0));
    // Served by that bucket's prefill worker: it ended one request ok,
    // counted when the worker's request ends, after its KV shipped, which
    // may come after the answer reached the client (more so at the worker's
    // nice +10 or +19): poll. The router cancels the prefill leg it still
    // holds once it has the answer; a delivered prefill still ends ok
    // (not cancelled), so this count is exact.
    auto served = [](const std::string& m) { return absl::StrContains(m, kPrefillOk); };
    const std::string metrics = AwaitMetrics(procs[1 + i].metrics_port, served);
    const size_t at = metrics.find("swaserve_prefill_requests_total{");
    EXPECT_TRUE(served(metrics)) << procs[1 + i].name << "\n"
                                 << (at == std::string::npos ? metrics : metrics.substr(at, 400));
  }
}

// Without fitting, a prefill worker whose pool cannot hold one prompt of
// its bucket's largest size refuses to start, naming the --kv.prefill_mib
// that would (worker::CheckPrefillPoolHoldsBucket).
TEST_F(ClusterLauncherTest, APrefillWorkerRefusesABucketItsPoolCannotHold) {
  ClusterSpec spec = Spec("run-no-fit");
  spec.bucket_bounds = {1024, 1048576};
  spec.kv_mib = 4;  // holds bucket 0 of the tiny model, not a 1M-token prompt
  spec.kv_fit_buckets = false;
  absl::StatusOr<std::unique_ptr<ClusterLauncher>> c = ClusterLauncher::Start(spec);
  ASSERT_FALSE(c.ok());
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("prefill-1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not fit this worker's KV pool"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--kv.prefill_mib="), std::string::npos) << msg;
  for (const pid_t pid : ChildrenOf(getpid())) {
    ADD_FAILURE() << "child " << pid << " still running";
  }
}

// Worker options are typed at `swaserve up`: a bad key or value exits 2
// naming it, before anything starts.
TEST_F(ClusterLauncherTest, SwaserveUpChecksWorkerOptions) {
  for (const char* bad : {"--workers.prefill.no_such_key=1",
                          "--workers.decode.decode.max_batch_size=many"}) {
    std::string out;
    absl::StatusOr<int> rc = base::RunCommand(
        {kCli, "up", "--run_dir=" + *dir_ + "/run-bad", bad}, &out, absl::Seconds(30));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 2) << out;
    const std::string key = std::string(bad).substr(2, std::string(bad).find('=') - 2);
    EXPECT_NE(out.find(key), std::string::npos) << out;
  }
}

TEST_F(ClusterLauncherTest, SwaserveUpServesAndStopsOnSigterm) {
  const std::string run = *dir_ + "/run-up";
  const std::string log = *dir_ + "/up.log";
  absl::StatusOr<std::unique_ptr<base::Subprocess>> up =
      base::Subprocess::Start(
          {.argv = {kCli, "up", "--model=" + *dir_ + "/model",
                    "--model_name=tiny", "--http_port=0", "--grpc_port=0",
                    "--buckets=2048,8192", "--decode_workers=1",
                    "--worker_threads=1", "--kv_mib=32", "--run_dir=" + run,
                    std::string("--worker_bin=") + kWorker,
                    std::string("--router_bin=") + kRouter,
                    "--extra_flags.decode=--decode.staging_arena_mib=64",
                    "--workers.decode.decode.max_batch_size=3"},
           .log_path = log,
           .stop_grace = absl::Seconds(20)});
  ASSERT_TRUE(up.ok()) << up.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string out;
  while (out.find("Press Ctrl-C") == std::string::npos) {
    ASSERT_TRUE((*up)->Running()) << ReadFile(log);
    ASSERT_LT(absl::Now(), deadline) << ReadFile(log);
    absl::SleepFor(absl::Milliseconds(100));
    out = ReadFile(log);
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("OpenAI HTTP +http://127\\.0\\.0\\.1:([0-9]+)/v1")))
      << out;
  const int http_port = std::stoi(m[1].str());
  EXPECT_NE(out.find("starting redis"), std::string::npos) << out;
  EXPECT_NE(out.find("curl -N http://127.0.0.1:"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("model":"tiny")"), std::string::npos) << out;

  httplib::Client h("127.0.0.1", http_port);
  h.set_read_timeout(60, 0);
  const json body = {{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                     {"max_tokens", 4},
                     {"stream", true}};
  httplib::Result r =
      h.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos) << r->body;

  const std::vector<pid_t> children = ChildrenOf((*up)->pid());
  // redis, redis-l3 (the prefill workers' shared L3, on by default), 2
  // prefill, decode, router
  EXPECT_EQ(children.size(), 6u);
  // The typed worker option reached the decode worker, and only it.
  int decode_with_option = 0, others_with_option = 0;
  for (const pid_t pid : children) {
    std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    const bool has = cmdline.find("--decode.max_batch_size=3 ") != std::string::npos;
    const bool decode = cmdline.find("--worker_id=decode-0 ") != std::string::npos;
    (decode ? decode_with_option : others_with_option) += has ? 1 : 0;
  }
  EXPECT_EQ(decode_with_option, 1);
  EXPECT_EQ(others_with_option, 0);
  ASSERT_TRUE((*up)->Signal(SIGTERM).ok());
  absl::StatusOr<int> rc = (*up)->Wait(absl::Seconds(20));
  ASSERT_TRUE(rc.ok()) << rc.status() << "\n" << ReadFile(log);
  EXPECT_EQ(*rc, 0) << ReadFile(log);
  for (pid_t pid : children) EXPECT_FALSE(Alive(pid)) << pid;
  EXPECT_NE(ReadFile(log).find("stopped"), std::string::npos);
}

}  // namespace
}  // namespace swaserve::launch
