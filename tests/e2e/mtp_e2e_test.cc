// MTP speculative decoding through a whole local cluster (labels e2e,
// fault): the trained demo model (models/demo, 3 MTP layers,
// drafts that are accepted on English text), a real redis-server, a prefill
// worker, two decode workers drafting 3 tokens every step
// (--decode.mtp_draft_tokens=3, not adaptive) and a router, all real
// processes on loopback.
//
// A decode worker killed with -9 in the middle of 8 drafting streams (half
// of them with a ~1,000-token prompt, 8 windows long): every
// stream migrates to the other decode worker, which goes on drafting for it
// (re-prefilled, its MTP state rebuilt from the prompt and the tokens so
// far), the output is token for token the uninterrupted run's, and each
// request's usage counts the drafts of both its legs (TokenChunk carries a
// leg's drafts so far on every chunk).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/e2e_util.h"
#include "tests/integration/router/local_cluster.h"

namespace swaserve {
namespace {

using e2e::Generate;
using e2e::GrpcResult;
using testing::LocalCluster;

// KJV (public domain) openings, as bench/worker/mtp_bench.cc uses: text the
// demo model was trained on the like of, so its drafts are accepted.
const char* const kPassages[] = {
    "In the beginning God created the heaven and the earth. And the earth was without form,",
    "And it came to pass, when men began to multiply on the face of the earth, and daughters",
    "Now the LORD had said unto Abram, Get thee out of thy country, and from thy kindred,",
    "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures:",
    "Blessed is the man that walketh not in the counsel of the ungodly, nor standeth in the",
    "And when the day of Pentecost was fully come, they were all with one accord in one",
    "Hear, O Israel: The LORD our God is one LORD: And thou shalt love the LORD thy God",
    "And I saw a new heaven and a new earth: for the first heaven and the first earth were",
};
constexpr int kStreams = sizeof(kPassages) / sizeof(kPassages[0]);
constexpr int kTokens = 256;
constexpr int kKillAfter = 64;  // every stream this far when the worker dies

// Stream i's prompt: its opening; odd streams read it after a shared
// context of every opening 6 times over (~1,000 tokens: many windows of
// W = 128, and the migration's re-prefill then hits the prefix cache).
std::string Prompt(int i) {
  std::string p;
  if (i % 2 == 1) {
    for (int r = 0; r < 6; ++r) {
      for (const char* o : kPassages) absl::StrAppend(&p, o, " ");
    }
  }
  return absl::StrCat(p, kPassages[i]);
}

v1::GenerateRequest Request(const std::string& text) {
  v1::GenerateRequest g;
  g.set_model("tiny");  // the local cluster's served name, whatever the model
  g.set_text(text);
  g.mutable_sampling()->set_max_tokens(kTokens);
  g.mutable_sampling()->set_ignore_eos(true);
  return g;
}

TEST(MtpE2E, ADecodeWorkerKilledMidDraftingHandsItsStreamsOnAndTheyKeepDrafting) {
  testing::LocalClusterOptions o;
  o.cli_bin = SWASERVE_CLI_BIN;
  o.worker_bin = SWASERVE_WORKER_BIN;
  o.router_bin = SWASERVE_ROUTER_BIN;
  o.model_dir = SWASERVE_SOURCE_DIR "/models/demo";
  o.worker_flags = {"--model_name=tiny", "--kv.page_size=16", "--prefill.chunk_tokens=256",
                    "--decode.mtp_draft_tokens=3", "--decode.mtp_adaptive=false"};
  o.router_flags = {"--breaker.open_for=30s"};
  auto created = LocalCluster::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  LocalCluster& c = **created;
  ASSERT_TRUE(c.StartWorker("prefill", "p1").ok());
  for (const char* id : {"d1", "d2"}) ASSERT_TRUE(c.StartWorker("decode", id).ok());
  ASSERT_TRUE(c.StartRouter("r1").ok());
  ASSERT_TRUE(c.WaitHealthy("r1", absl::Seconds(30)).ok());
  auto stub = c.RouterStub("r1");

  // The uninterrupted run, all streams at once (batch-invariant kernels and
  // exact verification: neither the batch mix nor the drafts change the
  // greedy tokens).
  std::vector<GrpcResult> want(kStreams);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kStreams; ++i) {
      threads.emplace_back([&, i] { want[i] = Generate(*stub, Request(Prompt(i))); });
    }
    for (std::thread& t : threads) t.join();
  }
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(want[i].status.ok()) << want[i].status.error_message();
    ASSERT_EQ(want[i].tokens.size(), static_cast<size_t>(kTokens));
    // The premise: the demo model's drafts are accepted on this text.
    EXPECT_GT(want[i].usage.accepted_draft_tokens(), kTokens / 4) << "stream " << i;
  }
  {
    // The OpenAI HTTP API reports the same counts (usage's extension keys).
    const nlohmann::json body = {{"model", "tiny"}, {"prompt", Prompt(0)},
                                 {"max_tokens", kTokens}, {"ignore_eos", true}};
    auto r = c.Http("r1", "POST", "/v1/completions", body.dump());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->status, 200) << r->body;
    const nlohmann::json usage = nlohmann::json::parse(r->body)["usage"];
    EXPECT_EQ(usage["completion_tokens"], kTokens);
    EXPECT_GT(usage.value("accepted_draft_tokens", 0u), static_cast<unsigned>(kTokens / 4))
        << r->body;
    EXPECT_LE(usage.value("accepted_draft_tokens", 0u), usage.value("draft_tokens", 0u));
  }

  // Again, and the decode worker holding more of the streams dies once every
  // stream is kKillAfter tokens in.
  std::vector<GrpcResult> got(kStreams);
  std::vector<std::atomic<int>> progress(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      got[i] = Generate(*stub, Request(Prompt(i)), [&, i](int n) { progress[i].store(n); });
    });
  }
  auto slowest = [&] {
    int m = kTokens;
    for (const auto& p : progress) m = std::min(m, p.load());
    return m;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (slowest() < kKillAfter && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  const double on_d1 = c.Metric("d1", "swaserve_decode_running_requests");
  const double on_d2 = c.Metric("d2", "swaserve_decode_running_requests");
  const std::string victim = on_d2 >= on_d1 ? "d2" : "d1";
  const std::string survivor = victim == "d1" ? "d2" : "d1";
  const int at_kill = slowest();
  const double accepted_before =
      c.Metric(survivor, "swaserve_decode_mtp_accepted_tokens_total");
  std::vector<int> progress_at_kill;
  for (const auto& p : progress) progress_at_kill.push_back(p.load());
  ASSERT_TRUE(c.Kill(victim).ok());
  for (std::thread& t : threads) t.join();
  std::printf("streams running: d1 %.0f, d2 %.0f; killed %s with every stream %d+ tokens in\n",
              on_d1, on_d2, victim.c_str(), at_kill);
  ASSERT_GE(at_kill, kKillAfter);
  ASSERT_GT(std::max(on_d1, on_d2), 0);

  int64_t want_accepted = 0, got_accepted = 0;
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(absl::StrCat("stream ", i));
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].text, want[i].text);
    EXPECT_EQ(got[i].usage.completion_tokens(), static_cast<uint32_t>(kTokens));
    EXPECT_LE(got[i].usage.accepted_draft_tokens(), got[i].usage.draft_tokens());
    // Usage counts the drafts of both legs: the dead one's up to its last
    // chunk, then the survivor's. The migration costs at most the step in
    // flight at the kill (3 drafts, not delivered, verified again) and the
    // new leg's first token (prefill's, not a draft); the steps after it may
    // align differently, so drafts proposed get twice that slack. Were the
    // dead leg's drafts dropped, or did the survivor not draft for a
    // migrated stream, 25-65% of them would be missing.
    EXPECT_NEAR(got[i].usage.accepted_draft_tokens(), want[i].usage.accepted_draft_tokens(), 4);
    EXPECT_NEAR(got[i].usage.draft_tokens(), want[i].usage.draft_tokens(), 8);
    if (i % 2 == 1) EXPECT_GT(got[i].usage.prompt_tokens(), 6u * 128) << "the long context";
    std::printf("stream %d: %u prompt tokens (%u cached), %d tokens at the kill; drafts accepted "
                "%u of %u (uninterrupted: %u of %u)\n",
                i, got[i].usage.prompt_tokens(), got[i].usage.cached_tokens(), progress_at_kill[i],
                got[i].usage.accepted_draft_tokens(),
                got[i].usage.draft_tokens(), want[i].usage.accepted_draft_tokens(),
                want[i].usage.draft_tokens());
    want_accepted += want[i].usage.accepted_draft_tokens();
    got_accepted += got[i].usage.accepted_draft_tokens();
  }
  const double migrated =
      c.Metric("r1", "swaserve_router_migrations_total{reason=\"worker_lost\"}");
  EXPECT_GE(migrated, std::max(on_d1, on_d2)) << "every stream on " << victim << " migrates";
  // The survivor drafted and had drafts accepted after the kill: its own
  // streams and the migrated ones.
  EXPECT_GT(c.Metric(survivor, "swaserve_decode_mtp_accepted_tokens_total"), accepted_before);
  std::printf("migrated %.0f; drafts accepted in all: %lld (uninterrupted %lld)\n", migrated,
              static_cast<long long>(got_accepted), static_cast<long long>(want_accepted));
}

}  // namespace
}  // namespace swaserve
