// Real swaserve-worker processes on loopback: a prefill worker and a decode
// worker (KV over real UCX), and a monolithic --role=both worker. A test
// client plays the router: Decode() first (gets the KV destination), then
// Prefill() with it, then reads the token stream.
//
// Checks: greedy outputs identical to a straight-line in-process reference
// and between monolithic and disaggregated runs, with and without prefix
// hits, for 50 random prompts of mixed lengths sent concurrently; a client
// cancelling mid-stream frees everything; a decode worker killed mid-request
// gives a clear error to prefill's caller within bounded time, with no leak
// in prefill. KV staging on the decode side: the default UCX-allocated arena
// (puts over shared memory), an arena too small for some prompts (those fall
// back to heap staging, same outputs), no arena, and the quarantine of a
// failed transfer's arena block.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/launch/service_process.h"
#include "lib/rpc/status_conversion.h"
#include "lib/kv/sequence.h"
#include "lib/model/checkpoint.h"
#include "lib/model/forward.h"
#include "lib/model/sampling.h"
#include "lib/rpc/channel.h"
#include "lib/rpc/deadline.h"
#include "swaserve/v1/worker.grpc.pb.h"

namespace swaserve {
namespace {

struct Worker {
  std::unique_ptr<base::Subprocess> process;
  std::string address;
  int metrics_port = 0;
  std::string id;
  std::unique_ptr<v1::Decode::Stub> decode;
  std::unique_ptr<v1::Prefill::Stub> prefill;
};

class DisaggregatedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(*base::MakeTempDir("worker-it"));
    auto config = model::BuiltinConfig("tiny", 256);
    ASSERT_TRUE(config.ok());
    ASSERT_TRUE(model::WriteRandomCheckpoint(*config, 5, *dir_ + "/model").ok());
    auto engine = model::Engine::Create({*dir_ + "/model", 1});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  // Starts a worker and waits until it serves.
  static std::unique_ptr<Worker> StartWorker(const std::string& role, const std::string& id,
                                             std::vector<std::string> extra = {}) {
    auto w = std::make_unique<Worker>();
    w->id = id;
    // Spawned and awaited like every service (lib/launch/service_process.h).
    std::vector<std::string> argv = {SWASERVE_WORKER_BIN, "--model=" + *dir_ + "/model", "--role=" + role,
              "--worker_id=" + id,  "--threads=1",
              "--kv.page_size=4", "--prefill.chunk_tokens=32", "--prefill.step_token_budget=96",
              "--kv.prefill_mib=16", "--kv.decode_mib=16", "--drain=2s",
              "--transfer.timeout=5s", "--decode.commit_timeout=20s"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<launch::ServiceProcess> svc =
        launch::SpawnService({.name = id, .argv = std::move(argv), .dir = *dir_});
    EXPECT_TRUE(svc.ok()) << svc.status();
    if (!svc.ok()) return w;
    absl::Status serving =
        launch::WaitServing(*svc, absl::Now() + absl::Seconds(60), absl::Seconds(60));
    w->process = std::move(svc->process);
    if (!serving.ok()) {
      ADD_FAILURE() << serving;
      return w;
    }
    w->address = absl::StrCat("127.0.0.1:", svc->grpc_port);
    w->metrics_port = svc->metrics_port;
    auto channel = rpc::CreateChannel(w->address);
    EXPECT_TRUE(channel.ok());
    w->decode = v1::Decode::NewStub(*channel);
    w->prefill = v1::Prefill::NewStub(*channel);
    return w;
  }

  // Greedy generation, straight-line, in this process.
  static std::vector<uint32_t> Reference(const std::vector<uint32_t>& prompt, int n) {
    const int pages = std::max(512, static_cast<int>(prompt.size()) / 4 + n / 4 + 8);
    auto pools = *kv::KvPools::Create({engine_->config().KvShape(4), pages, pages, true});
    kv::Sequence seq(kv::SequenceOptions{pools.get(), nullptr, 0, false});
    model::ForwardOutput out;
    EXPECT_TRUE(seq.Append(static_cast<int>(prompt.size())).ok());
    model::ForwardItem item{&seq, prompt, 0, false};
    EXPECT_TRUE(engine_->Forward({&item, 1}, &out).ok());
    std::vector<uint32_t> gen{model::Argmax(out.logits)};
    while (static_cast<int>(gen.size()) < n) {
      EXPECT_TRUE(seq.Append(1).ok());
      model::ForwardItem step{&seq, absl::MakeConstSpan(&gen.back(), 1), seq.length() - 1, false};
      EXPECT_TRUE(engine_->Forward({&step, 1}, &out).ok());
      gen.push_back(model::Argmax(out.logits));
    }
    return gen;
  }

  struct Result {
    grpc::Status decode_status;
    grpc::Status prefill_status;
    v1::PrefillResponse prefill;
    std::vector<uint32_t> tokens;
    v1::Usage usage;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  };

  // Plays the router for one request: Decode on `d`, Prefill on `p`.
  // `cancel_after` > 0: the client cancels the stream after that many tokens.
  static Result Generate(Worker& p, Worker& d, const std::string& id,
                         const std::vector<uint32_t>& prompt, int max_tokens,
                         int cancel_after = 0) {
    Result r;
    grpc::ClientContext dctx;
    dctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::DecodeRequest dreq;
    dreq.set_request_id("t-" + id);
    for (uint32_t t : prompt) dreq.add_prompt_token_ids(t);
    dreq.mutable_sampling()->set_max_tokens(max_tokens);
    auto stream = d.decode->Decode(&dctx, dreq);
    v1::DecodeResponse first;
    if (!stream->Read(&first) || !first.has_accepted()) {
      r.decode_status = stream->Finish();
      return r;
    }
    std::thread prefill([&] {
      grpc::ClientContext pctx;
      pctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      v1::PrefillRequest preq;
      preq.set_request_id(id);
      for (uint32_t t : prompt) preq.add_token_ids(t);
      preq.mutable_sampling()->set_max_tokens(max_tokens);
      v1::DecodeTarget* target = preq.mutable_decode();
      target->set_worker_id(d.id);
      target->set_grpc_address(d.address);
      target->set_transfer_id("t-" + id);
      r.prefill_status = p.prefill->Prefill(&pctx, preq, &r.prefill);
    });
    v1::DecodeResponse msg;
    while (stream->Read(&msg)) {
      for (uint32_t t : msg.tokens().token_ids()) r.tokens.push_back(t);
      if (msg.tokens().finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        r.finish = msg.tokens().finish_reason();
        r.usage = msg.tokens().usage();
      }
      if (cancel_after > 0 && static_cast<int>(r.tokens.size()) >= cancel_after) {
        dctx.TryCancel();
      }
    }
    r.decode_status = stream->Finish();
    prefill.join();
    return r;
  }

  static std::string Scrape(const Worker& w) {
    std::string out;
    auto rc = base::RunCommand({"curl", "-s", absl::StrCat("http://127.0.0.1:", w.metrics_port,
                                                            "/metrics")},
                               &out, absl::Seconds(10));
    EXPECT_TRUE(rc.ok() && *rc == 0);
    return out;
  }

  // The value of the sample `line_prefix` (name{labels}); `missing` when
  // absent and not `required`.
  static double Metric(const Worker& w, const std::string& line_prefix, bool required = true,
                       double missing = -1) {
    std::istringstream in(Scrape(w));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(line_prefix + " ", 0) == 0) return std::stod(line.substr(line_prefix.size() + 1));
    }
    if (required) ADD_FAILURE() << "no metric " << line_prefix;
    return missing;
  }

  // Every sample line of the family `name`, e.g. for the test log.
  static std::string Samples(const Worker& w, const std::string& name) {
    std::istringstream in(Scrape(w));
    std::string out;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(name, 0) == 0) absl::StrAppend(&out, line, "\n");
    }
    return out;
  }

  static std::string* dir_;
  static model::Engine* engine_;
};

std::string* DisaggregatedTest::dir_ = nullptr;
model::Engine* DisaggregatedTest::engine_ = nullptr;

TEST_F(DisaggregatedTest, GreedyOutputsIdenticalMonolithicAndDisaggregated) {
  auto prefill = StartWorker("prefill", "p1");
  auto decode = StartWorker("decode", "d1");
  auto both = StartWorker("both", "m1");
  ASSERT_FALSE(prefill->address.empty());
  ASSERT_FALSE(decode->address.empty());
  ASSERT_FALSE(both->address.empty());
  std::mt19937 rng(99);
  const std::vector<uint32_t> base_prompt = [&] {
    std::vector<uint32_t> b(48);
    for (auto& t : b) t = rng() % 256;
    return b;
  }();
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<int> max_tokens;
  for (int i = 0; i < 50; ++i) {
    std::vector<uint32_t> p;
    if (i % 2 == 0) p = base_prompt;  // shared prefix: prefix hits later on
    const int n = 1 + rng() % (i % 5 == 0 ? 300 : 60);
    for (int k = 0; k < n; ++k) p.push_back(rng() % 256);
    prompts.push_back(p);
    max_tokens.push_back(1 + rng() % 10);
  }
  std::vector<Result> disagg(50), mono(50);
  // Concurrent batches of 10 (batch compositions vary with timing).
  for (int wave = 0; wave < 5; ++wave) {
    std::vector<std::thread> threads;
    for (int i = wave * 10; i < wave * 10 + 10; ++i) {
      threads.emplace_back([&, i] {
        disagg[i] = Generate(*prefill, *decode, absl::StrCat("d", i), prompts[i], max_tokens[i]);
      });
      threads.emplace_back([&, i] {
        mono[i] = Generate(*both, *both, absl::StrCat("m", i), prompts[i], max_tokens[i]);
      });
    }
    for (auto& t : threads) t.join();
  }
  int hits = 0;
  for (int i = 0; i < 50; ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " (", prompts[i].size(), " tokens)"));
    ASSERT_TRUE(disagg[i].prefill_status.ok()) << disagg[i].prefill_status.error_message();
    ASSERT_TRUE(disagg[i].decode_status.ok()) << disagg[i].decode_status.error_message();
    ASSERT_TRUE(mono[i].decode_status.ok()) << mono[i].decode_status.error_message();
    const std::vector<uint32_t> ref = Reference(prompts[i], max_tokens[i]);
    EXPECT_EQ(disagg[i].tokens, ref);
    EXPECT_EQ(mono[i].tokens, ref);
    EXPECT_EQ(disagg[i].finish, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(disagg[i].usage.completion_tokens(), static_cast<uint32_t>(max_tokens[i]));
    EXPECT_EQ(disagg[i].usage.prompt_tokens(), prompts[i].size());
    EXPECT_EQ(disagg[i].prefill.first_token(), ref[0]);
    EXPECT_GT(disagg[i].prefill.kv_bytes_sent(), 0u);
    hits += disagg[i].usage.cached_tokens() > 0;
  }
  EXPECT_GT(hits, 5) << "prefix hits were not exercised";
  // Nothing in use on either side afterwards (cached pages may remain).
  EXPECT_EQ(Metric(*prefill, "swaserve_kv_pages{pool=\"full\",state=\"in_use\"}"), 0);
  v1::WorkerLoad load;
  grpc::ClientContext ctx;
  ASSERT_TRUE(decode->decode->GetLoad(&ctx, v1::GetLoadRequest(), &load).ok());
  EXPECT_EQ(load.free_full_pages(), load.total_full_pages());
  EXPECT_EQ(load.running_requests(), 0u);
  // Staged in the default arena (no fallback), every block returned.
  for (auto* w : {decode.get(), both.get()}) {
    // MTP speculation ran (decode workers draft by default) and changed
    // nothing in the greedy outputs above.
    EXPECT_GT(Metric(*w, "swaserve_decode_mtp_drafted_tokens_total"), 0) << w->id;
    EXPECT_GE(Metric(*w, "swaserve_decode_mtp_accepted_tokens_total"), 0) << w->id;
    EXPECT_EQ(Metric(*w, "swaserve_decode_staging_fallback_total"), 0) << w->id;
    EXPECT_EQ(Metric(*w, "swaserve_decode_staging_arena_bytes{state=\"in_use\"}"), 0) << w->id;
  }
  std::cout << "KV sends, disaggregated:\n"
            << Samples(*prefill, "swaserve_prefill_kv_sends_total")
            << "KV sends, monolithic:\n" << Samples(*both, "swaserve_prefill_kv_sends_total");
  for (auto* w : {prefill.get(), decode.get(), both.get()}) {
    auto rc = w->process->Stop();
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 0) << w->id << " did not stop cleanly:\n" << w->process->ReadLog();
  }
}

// Window restore with real workers: a prefill worker whose SWA pool holds
// only ~800 tokens (--kv.swa_full_ratio=0.02) keeps the full KV of long
// shared prefixes while their SWA KV is evicted; prompts diverging inside
// those prefixes then restore the window. The same workload on a prefill
// worker with restore off, and on a monolithic worker with it on: greedy
// outputs all equal the straight-line reference; the restoring workers
// restored windows and report more cached tokens than the one without.
TEST_F(DisaggregatedTest, WindowRestoreKeepsGreedyOutputsIdentical) {
  const std::vector<std::string> small_swa = {"--kv.swa_full_ratio=0.02",
                                              "--prefill.window_restore_min_saved_work=0"};
  auto restoring = StartWorker("prefill", "pr", small_swa);
  auto plain = StartWorker("prefill", "pn",
                           {"--kv.swa_full_ratio=0.02", "--prefill.window_restore_min_saved_work=-1"});
  auto decode = StartWorker("decode", "dr");
  auto both = StartWorker("both", "mr", small_swa);
  for (auto* w : {restoring.get(), plain.get(), decode.get(), both.get()}) {
    ASSERT_FALSE(w->address.empty()) << w->id;
  }
  std::mt19937 rng(7);
  std::vector<std::vector<uint32_t>> bases(3);
  for (size_t b = 0; b < bases.size(); ++b) {
    bases[b].resize(240 + 40 * b);
    for (auto& t : bases[b]) t = rng() % 256;
  }
  const int kRequests = 32;
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) {
    const auto& base = bases[rng() % bases.size()];
    const int cut = i < 3 ? static_cast<int>(base.size())
                          : 100 + static_cast<int>(rng() % (base.size() - 100));
    std::vector<uint32_t> p(base.begin(), base.begin() + cut);
    const int tail = 3 + rng() % 20;
    for (int k = 0; k < tail; ++k) p.push_back(rng() % 256);
    prompts.push_back(std::move(p));
  }
  std::vector<Result> on(kRequests), off(kRequests), mono(kRequests);
  for (int wave = 0; wave < kRequests / 4; ++wave) {
    std::vector<std::thread> threads;
    for (int i = wave * 4; i < wave * 4 + 4; ++i) {
      threads.emplace_back([&, i] { on[i] = Generate(*restoring, *decode, absl::StrCat("r", i), prompts[i], 4); });
      threads.emplace_back([&, i] { off[i] = Generate(*plain, *decode, absl::StrCat("n", i), prompts[i], 4); });
      threads.emplace_back([&, i] { mono[i] = Generate(*both, *both, absl::StrCat("m", i), prompts[i], 4); });
    }
    for (auto& t : threads) t.join();
  }
  int64_t cached_on = 0, cached_off = 0;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " (", prompts[i].size(), " tokens)"));
    const std::vector<uint32_t> ref = Reference(prompts[i], 4);
    for (const Result* r : {&on[i], &off[i], &mono[i]}) {
      ASSERT_TRUE(r->prefill_status.ok() || r == &mono[i]) << r->prefill_status.error_message();
      ASSERT_TRUE(r->decode_status.ok()) << r->decode_status.error_message();
      EXPECT_EQ(r->tokens, ref);
    }
    cached_on += on[i].usage.cached_tokens();
    cached_off += off[i].usage.cached_tokens();
  }
  const double restores = Metric(*restoring, "swaserve_prefill_window_restore_requests_total");
  std::cout << "window restores: disaggregated " << restores << " ("
            << Metric(*restoring, "swaserve_prefill_window_restore_tokens_total") << " tokens recomputed, "
            << Metric(*restoring, "swaserve_prefill_window_restore_saved_tokens_total")
            << " saved, "
            << Metric(*restoring, "swaserve_prefill_window_restore_from_window_safe_total")
            << " from the window-safe hit), monolithic "
            << Metric(*both, "swaserve_prefill_window_restore_requests_total")
            << "; cached tokens with restore " << cached_on << ", without " << cached_off << "\n";
  EXPECT_GE(restores, 3) << "the workload did not exercise window restore";
  EXPECT_GE(Metric(*restoring, "swaserve_prefill_window_restore_from_window_safe_total"), 1)
      << "no restore started at the window-safe hit";
  EXPECT_GE(Metric(*both, "swaserve_prefill_window_restore_requests_total"), 3);
  EXPECT_EQ(Metric(*plain, "swaserve_prefill_window_restore_requests_total"), 0);
  EXPECT_GT(cached_on, cached_off);
  for (auto* w : {restoring.get(), plain.get(), decode.get(), both.get()}) {
    EXPECT_EQ(Metric(*w, "swaserve_kv_pages{pool=\"full\",state=\"in_use\"}"), 0) << w->id;
    auto rc = w->process->Stop();
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 0) << w->id << " did not stop cleanly:\n" << w->process->ReadLog();
  }
}

// Growing prompts (an agent's or a conversation's next turns) on real
// prefill workers with a small SWA pool: each turn extends the previous
// turn's prompt, so the previous end's window is superseded and goes cold
// (--kv.cold_superseded_windows, the default where restore is). Greedy
// outputs equal the straight-line reference with it on and off; the
// worker counts the pages it made cold, the one with it off none.
TEST_F(DisaggregatedTest, GrowingPromptsMakeSupersededWindowsColdAndKeepOutputs) {
  const std::vector<std::string> small_swa = {"--kv.swa_full_ratio=0.02"};
  std::vector<std::string> no_cold = small_swa;
  no_cold.push_back("--kv.cold_superseded_windows=false");
  auto cold = StartWorker("prefill", "pc", small_swa);
  auto hot = StartWorker("prefill", "ph", no_cold);
  auto decode = StartWorker("decode", "dc");
  for (auto* w : {cold.get(), hot.get(), decode.get()}) ASSERT_FALSE(w->address.empty()) << w->id;
  std::mt19937 rng(11);
  constexpr int kConversations = 6, kTurns = 9;
  std::vector<std::vector<uint32_t>> conv(kConversations);
  std::vector<std::vector<uint32_t>> prompts;
  for (int t = 0; t < kTurns; ++t) {
    for (auto& c : conv) {
      const int grow = (t == 0 ? 150 : 20) + static_cast<int>(rng() % 40);
      for (int k = 0; k < grow; ++k) c.push_back(rng() % 256);
      prompts.push_back(c);
    }
  }
  const int n = static_cast<int>(prompts.size());
  std::vector<Result> on(n), off(n);
  for (int i = 0; i < n; ++i) {
    std::thread a([&] { on[i] = Generate(*cold, *decode, absl::StrCat("c", i), prompts[i], 4); });
    off[i] = Generate(*hot, *decode, absl::StrCat("h", i), prompts[i], 4);
    a.join();
  }
  int64_t cached_on = 0, cached_off = 0;
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " (", prompts[i].size(), " tokens)"));
    const std::vector<uint32_t> ref = Reference(prompts[i], 4);
    for (const Result* r : {&on[i], &off[i]}) {
      ASSERT_TRUE(r->prefill_status.ok()) << r->prefill_status.error_message();
      ASSERT_TRUE(r->decode_status.ok()) << r->decode_status.error_message();
      EXPECT_EQ(r->tokens, ref);
    }
    cached_on += on[i].usage.cached_tokens();
    cached_off += off[i].usage.cached_tokens();
  }
  const double cooled = Metric(*cold, "swaserve_prefix_cache_cooled_swa_pages_total");
  std::cout << "superseded-window pages made cold " << cooled << ", SWA pages evicted "
            << Metric(*cold, "swaserve_prefix_cache_evicted_pages_total{pool=\"swa\"}")
            << "; cached tokens " << cached_on
            << " (cold) vs " << cached_off << " (hot); restores "
            << Metric(*cold, "swaserve_prefill_window_restore_requests_total") << " vs "
            << Metric(*hot, "swaserve_prefill_window_restore_requests_total") << "\n";
  EXPECT_GT(cooled, 0);
  // The SWA pool was under pressure: cold windows were evicted.
  EXPECT_GT(Metric(*cold, "swaserve_prefix_cache_evicted_pages_total{pool=\"swa\"}"), 0);
  EXPECT_EQ(Metric(*hot, "swaserve_prefix_cache_cooled_swa_pages_total"), 0);
  EXPECT_GT(cached_on, 0);
  for (auto* w : {cold.get(), hot.get(), decode.get()}) {
    EXPECT_EQ(Metric(*w, "swaserve_kv_pages{pool=\"full\",state=\"in_use\"}"), 0) << w->id;
    auto rc = w->process->Stop();
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 0) << w->id << " did not stop cleanly:\n" << w->process->ReadLog();
  }
}

TEST_F(DisaggregatedTest, ClientCancelMidStreamFreesBothSides) {
  auto prefill = StartWorker("prefill", "p2");
  auto decode = StartWorker("decode", "d2");
  std::vector<uint32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (i * 7) % 256;
  Result r = Generate(*prefill, *decode, "c1", prompt, 100000, /*cancel_after=*/5);
  EXPECT_EQ(r.decode_status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(r.prefill_status.ok()) << r.prefill_status.error_message();
  // The decode side lets go of everything.
  v1::WorkerLoad load;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(decode->decode->GetLoad(&ctx, v1::GetLoadRequest(), &load).ok());
    if (load.running_requests() == 0 && load.free_full_pages() == load.total_full_pages()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(load.running_requests(), 0u);
  EXPECT_EQ(load.free_full_pages(), load.total_full_pages());
  EXPECT_EQ(load.free_swa_pages(), load.total_swa_pages());
  EXPECT_EQ(Metric(*prefill, "swaserve_kv_pages{pool=\"full\",state=\"in_use\"}"), 0);
}

TEST_F(DisaggregatedTest, DecodeKilledMidRequestFailsClearlyWithoutLeaks) {
  auto prefill = StartWorker("prefill", "p3");
  auto decode = StartWorker("decode", "d3");
  std::vector<uint32_t> prompt(3000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (i * 13 + 1) % 256;
  // Announce the request, kill the decode worker, then ask prefill to ship
  // to it: the prefill computes, cannot get staging, fails naming d3 — and
  // keeps the computed KV in its prefix cache.
  grpc::ClientContext dctx;
  v1::DecodeRequest dreq;
  dreq.set_request_id("t-k1");
  for (uint32_t t : prompt) dreq.add_prompt_token_ids(t);
  dreq.mutable_sampling()->set_max_tokens(4);
  auto stream = decode->decode->Decode(&dctx, dreq);
  v1::DecodeResponse first;
  ASSERT_TRUE(stream->Read(&first));
  ASSERT_TRUE(first.has_accepted());
  ASSERT_TRUE(decode->process->Signal(SIGKILL).ok());
  ASSERT_TRUE(decode->process->Wait(absl::Seconds(10)).ok());
  grpc::ClientContext pctx;
  v1::PrefillRequest preq;
  preq.set_request_id("k1");
  for (uint32_t t : prompt) preq.add_token_ids(t);
  v1::DecodeTarget* target = preq.mutable_decode();
  target->set_worker_id(decode->id);
  target->set_transfer_id("t-k1");
  target->set_grpc_address(decode->address);
  v1::PrefillResponse presp;
  const absl::Time t0 = absl::Now();
  grpc::Status s = prefill->prefill->Prefill(&pctx, preq, &presp);
  const absl::Duration took = absl::Now() - t0;
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("decode worker d3"), std::string::npos) << s.error_message();
  std::optional<v1::ErrorDetail> detail = rpc::GetErrorDetail(s);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->worker_id(), "d3");  // the router retries the decode leg
  EXPECT_TRUE(detail->retryable());
  EXPECT_LT(took, absl::Seconds(30)) << "failure not bounded in time";
  EXPECT_EQ(Metric(*prefill, "swaserve_kv_pages{pool=\"full\",state=\"in_use\"}"), 0);
  EXPECT_EQ(Metric(*prefill, "swaserve_kv_pages{pool=\"swa\",state=\"in_use\"}"), 0);
  // Prefill still serves.
  grpc::ClientContext lctx;
  v1::WorkerLoad load;
  ASSERT_TRUE(prefill->prefill->GetLoad(&lctx, v1::GetLoadRequest(), &load).ok());
  EXPECT_EQ(load.running_requests(), 0u);
  // The retry of the same prompt hits the KV computed for the failed ship.
  grpc::ClientContext rctx;
  v1::PrefillRequest retry;
  retry.set_request_id("k1-retry");
  for (uint32_t t : prompt) retry.add_token_ids(t);
  v1::PrefillResponse rresp;
  ASSERT_TRUE(prefill->prefill->Prefill(&rctx, retry, &rresp).ok());
  EXPECT_GE(rresp.cached_tokens(), prompt.size() - 4) << "the shipped-failed KV was thrown away";
}

// Bounded decode staging: all staged KV stays within
// --decode.staging_budget_mib. With one request admitted at a time
// (--decode.max_batch_size=1), each generating 600 tokens, the staged ones
// hold the budget, so prefill
// workers ready to ship wait in line (swaserve_decode_staging_waits_total)
// instead of the worker allocating without bound; outputs stay identical.
// A prompt whose staging exceeds the whole budget fails at once, as a
// request error naming the budget.
TEST_F(DisaggregatedTest, StagingStaysWithinItsBudgetAndWaitersAreServedInTurn) {
  auto prefill = StartWorker("prefill", "p7");
  auto decode = StartWorker("decode", "d7",
                            {"--decode.staging_budget_mib=1", "--decode.staging_arena_mib=0",
                             "--decode.max_batch_size=1"});
  ASSERT_FALSE(prefill->address.empty());
  ASSERT_FALSE(decode->address.empty());
  const kv::KvShape shape = engine_->config().KvShape(4);
  // Staging holds full KV of every token and SWA KV of one window only.
  const size_t token_bytes = shape.Full().TokenBytes();
  // About 0.4 MiB of staging each: two fit in the budget, a third waits.
  const int n = static_cast<int>((size_t{4} << 20) / 10 / token_bytes);
  ASSERT_GT(n, 16);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<uint32_t> p(static_cast<size_t>(n - i));
    for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<uint32_t>((j * 7 + i * 13 + 1) % 256);
    prompts.push_back(std::move(p));
  }
  std::vector<Result> results(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = Generate(*prefill, *decode, absl::StrCat("b", i), prompts[i], 600); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_TRUE(results[i].prefill_status.ok()) << results[i].prefill_status.error_message();
    ASSERT_TRUE(results[i].decode_status.ok()) << results[i].decode_status.error_message();
    EXPECT_EQ(results[i].tokens, Reference(prompts[i], 600));
  }
  EXPECT_EQ(Metric(*decode, "swaserve_decode_staging_budget_bytes{state=\"capacity\"}"), 1 << 20);
  EXPECT_EQ(Metric(*decode, "swaserve_decode_staging_budget_bytes{state=\"in_use\"}"), 0);
  const double waits = Metric(*decode, "swaserve_decode_staging_waits_total");
  std::cout << "stagings that waited for the 1 MiB budget: " << waits << " of 6\n";
  EXPECT_GT(waits, 0) << "the budget never filled: the test proves nothing";
  // Larger than the whole budget: refused at Decode, before any prefill.
  std::vector<uint32_t> huge(static_cast<size_t>((size_t{3} << 20) / token_bytes));
  for (size_t j = 0; j < huge.size(); ++j) huge[j] = static_cast<uint32_t>(j % 256);
  Result r = Generate(*prefill, *decode, "too-big", huge, 4);
  EXPECT_EQ(r.decode_status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.decode_status.error_message();
  EXPECT_NE(r.decode_status.error_message().find("staging budget"), std::string::npos)
      << r.decode_status.error_message();
  std::optional<v1::ErrorDetail> d = rpc::GetErrorDetail(r.decode_status);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->code(), v1::ERROR_CODE_TOO_LARGE_FOR_WORKER);
  EXPECT_FALSE(d->retryable());
}

// A staging arena too small for some prompts: those are staged in heap
// memory registered per request (counted as fallbacks), the rest in the
// arena; outputs stay identical to the reference either way.
TEST_F(DisaggregatedTest, ArenaFallbackToHeapStagingGivesIdenticalOutputs) {
  auto prefill = StartWorker("prefill", "p5");
  auto decode = StartWorker("decode", "d5", {"--decode.staging_arena_mib=1"});
  ASSERT_FALSE(prefill->address.empty());
  ASSERT_FALSE(decode->address.empty());
  // Full KV alone of `big` tokens exceeds the 1 MiB arena; `small` prompts
  // take at most 1/16 of it.
  const kv::KvShape shape = engine_->config().KvShape(4);
  const size_t token_bytes = shape.Full().TokenBytes() + shape.Swa().TokenBytes();
  const int big = static_cast<int>((size_t{1} << 20) / shape.Full().TokenBytes()) + 8;
  const int small = static_cast<int>((size_t{1} << 16) / token_bytes) - 8;
  ASSERT_LE(big, 3000) << "tiny model KV larger than expected";
  ASSERT_GT(small, 4);
  std::mt19937 rng(7);
  std::vector<std::vector<uint32_t>> prompts;
  int bigs = 0;
  for (int i = 0; i < 12; ++i) {
    const bool is_big = i % 4 == 0;
    bigs += is_big;
    std::vector<uint32_t> p(is_big ? big + static_cast<int>(rng() % 16) : 1 + rng() % small);
    for (auto& t : p) t = rng() % 256;
    prompts.push_back(std::move(p));
  }
  std::vector<Result> results(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(*prefill, *decode, absl::StrCat("f", i), prompts[i], 4);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i, " (", prompts[i].size(), " tokens)"));
    ASSERT_TRUE(results[i].prefill_status.ok()) << results[i].prefill_status.error_message();
    ASSERT_TRUE(results[i].decode_status.ok()) << results[i].decode_status.error_message();
    EXPECT_EQ(results[i].tokens, Reference(prompts[i], 4));
  }
  EXPECT_NE(decode->process->ReadLog().find("KV staging in a 1 MiB UCX-allocated arena"),
            std::string::npos);
  const double fallbacks = Metric(*decode, "swaserve_decode_staging_fallback_total");
  EXPECT_GE(fallbacks, bigs);
  EXPECT_LT(fallbacks, static_cast<double>(prompts.size())) << "the arena was never used";
  EXPECT_EQ(Metric(*decode, "swaserve_decode_staging_arena_bytes{state=\"in_use\"}"), 0);
  EXPECT_EQ(Metric(*decode, "swaserve_decode_staging_arena_bytes{state=\"free\"}"), 1 << 20);
  // Over shared memory the arena's transfers are puts, the heap ones AMs.
  const std::string sends = Samples(*prefill, "swaserve_prefill_kv_sends_total");
  std::cout << "KV sends with a 1 MiB arena (" << fallbacks << " fallbacks):\n" << sends;
  if (sends.find("transport=\"shm\"") != std::string::npos) {
    EXPECT_GT(Metric(*prefill, "swaserve_prefill_kv_sends_total{primitive=\"put\",transport=\"shm\"}",
                     false, 0),
              0);
    EXPECT_GE(Metric(*prefill, "swaserve_prefill_kv_sends_total{primitive=\"am\",transport=\"shm\"}",
                     false, 0),
              fallbacks);
  }
  for (auto* w : {prefill.get(), decode.get()}) {
    auto rc = w->process->Stop();
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 0) << w->id << " did not stop cleanly:\n" << w->process->ReadLog();
  }
}

// Arena off (--decode.staging_arena_mib=0): every request is heap staging,
// with no arena metrics.
TEST_F(DisaggregatedTest, HeapStagingOnlyWhenArenaDisabled) {
  auto prefill = StartWorker("prefill", "p6");
  auto decode = StartWorker("decode", "d6", {"--decode.staging_arena_mib=0"});
  ASSERT_FALSE(prefill->address.empty());
  ASSERT_FALSE(decode->address.empty());
  std::vector<uint32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (i * 11 + 3) % 256;
  Result r = Generate(*prefill, *decode, "h1", prompt, 5);
  ASSERT_TRUE(r.decode_status.ok()) << r.decode_status.error_message();
  EXPECT_EQ(r.tokens, Reference(prompt, 5));
  EXPECT_EQ(Metric(*decode, "swaserve_decode_staging_fallback_total", false, -7), -7);
  EXPECT_NE(decode->process->ReadLog().find("KV staging in heap memory"), std::string::npos);
}

// A transfer that fails after its destination went out (here: the client
// cancels before prefill ships) keeps its arena block out of use for the
// transfer timeout (a sender's late puts could still land there), then the
// next request returns it.
TEST_F(DisaggregatedTest, FailedTransferQuarantinesItsArenaBlock) {
  auto prefill = StartWorker("prefill", "p7");
  auto decode = StartWorker("decode", "d7", {"--decode.staging_arena_mib=4"});
  ASSERT_FALSE(prefill->address.empty());
  ASSERT_FALSE(decode->address.empty());
  const std::string quarantined = "swaserve_decode_staging_arena_bytes{state=\"quarantined\"}";
  const std::string in_use = "swaserve_decode_staging_arena_bytes{state=\"in_use\"}";
  std::vector<uint32_t> prompt(90);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (i * 5 + 2) % 256;
  {
    grpc::ClientContext dctx;
    v1::DecodeRequest dreq;
    dreq.set_request_id("t-q1");
    for (uint32_t t : prompt) dreq.add_prompt_token_ids(t);
    auto stream = decode->decode->Decode(&dctx, dreq);
    v1::DecodeResponse first;
    ASSERT_TRUE(stream->Read(&first));
    ASSERT_TRUE(first.has_accepted());
    EXPECT_EQ(Metric(*decode, in_use), 0) << "staging allocated before the prefill is ready";
    // What a prefill worker about to ship does: now the staging exists.
    grpc::ClientContext gctx;
    v1::GetKvDestinationRequest greq;
    greq.set_transfer_id("t-q1");
    v1::KvDestination dest;
    ASSERT_TRUE(decode->decode->GetKvDestination(&gctx, greq, &dest).ok());
    EXPECT_GT(Metric(*decode, in_use), 0);
    dctx.TryCancel();
    v1::DecodeResponse more;
    while (stream->Read(&more)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  double q = 0;
  for (int i = 0; i < 100 && q == 0; ++i) {
    q = Metric(*decode, quarantined);
    if (q == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GT(q, 0) << "the failed transfer's block was not quarantined";
  EXPECT_EQ(Metric(*decode, in_use), 0);
  // Past the quarantine (--transfer.timeout=5s) the next request frees it.
  absl::SleepFor(absl::Seconds(5.5));
  Result r = Generate(*prefill, *decode, "q2", prompt, 3);
  ASSERT_TRUE(r.decode_status.ok()) << r.decode_status.error_message();
  EXPECT_EQ(r.tokens, Reference(prompt, 3));
  EXPECT_EQ(Metric(*decode, quarantined), 0);
  EXPECT_EQ(Metric(*decode, in_use), 0);
  EXPECT_EQ(Metric(*decode, "swaserve_decode_staging_fallback_total"), 0);
}

}  // namespace
}  // namespace swaserve
