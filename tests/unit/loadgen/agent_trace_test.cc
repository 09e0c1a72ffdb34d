#include "lib/loadgen/agent_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

namespace swaserve::loadgen {
namespace {

using ::testing::HasSubstr;

// A session of three turns (each the previous prompt plus more) and a
// sub-agent started at t = 5 whose prompts share the parent's first block
// (id 1) and then go their own way.
constexpr char kSession[] =
    R"({"id": "s0", "block_size": 4, "requests": [)"
    R"({"t": 0, "type": "n", "in": 6, "out": 2, "hash_ids": [1, 2], "api_time": 1.0},)"
    R"({"t": 3, "type": "s", "in": 10, "out": 1, "hash_ids": [1, 3, 4], "think_time": 2.0, "api_time": 1.5},)"
    R"({"t": 5, "type": "subagent", "agent_id": "a1", "requests": [)"
    R"(  {"t": 0, "type": "n", "in": 7, "out": 1, "hash_ids": [1, 9], "api_time": 0.5},)"
    R"(  {"t": 2, "type": "n", "in": 9, "out": 1, "hash_ids": [1, 10, 11]}]},)"
    R"({"t": 8, "type": "n", "in": 13, "out": 3, "hash_ids": [1, 3, 5, 6], "api_time": 2.0}]})"
    "\n";
constexpr char kOther[] =
    R"({"id": "s1", "block_size": 4, "requests": [)"
    R"({"t": 0, "in": 5, "out": 1, "hash_ids": [1, 2], "api_time": 4.0}]})"
    "\n";

TEST(ParseAgentSessions, FlattensSubAgentsIntoSessionsSharingTheScope) {
  auto s = ParseAgentSessions(std::string(kSession) + "\n" + kOther);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 3u);
  const AgentSession& top = (*s)[0];
  const AgentSession& sub = (*s)[1];
  const AgentSession& other = (*s)[2];
  EXPECT_EQ(top.id, "s0");
  EXPECT_TRUE(top.top_level());
  EXPECT_EQ(top.block_tokens, 4);
  ASSERT_EQ(top.requests.size(), 3u);
  EXPECT_EQ(top.requests[1].input_tokens, 10);
  EXPECT_DOUBLE_EQ(top.requests[1].think_time_s, 2.0);
  EXPECT_DOUBLE_EQ(top.requests[2].t_s, 8);
  EXPECT_EQ(sub.id, "s0/a1");
  EXPECT_EQ(sub.parent, 0);
  EXPECT_EQ(sub.scope, 0);
  EXPECT_DOUBLE_EQ(sub.offset_s, 5);
  ASSERT_EQ(sub.requests.size(), 2u);
  EXPECT_DOUBLE_EQ(sub.requests[1].api_time_s, 0);  // absent: 0
  EXPECT_EQ(other.scope, 2);
  EXPECT_DOUBLE_EQ(top.DurationS(), 10.0);
  EXPECT_DOUBLE_EQ(sub.DurationS(), 2.0);

  auto one = ParseAgentSessions(std::string(kSession) + kOther, {.limit = 1});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 2u);  // the first session and its sub-agent
}

TEST(ParseAgentSessions, ErrorsNameTheLineAndTheField) {
  const auto err = [](const std::string& text) {
    auto s = ParseAgentSessions(text, {.source = "x.jsonl"});
    EXPECT_FALSE(s.ok());
    return std::string(s.status().message());
  };
  EXPECT_THAT(err("\n{"), HasSubstr("x.jsonl:2: not valid JSON"));
  EXPECT_THAT(err("[1]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(err(R"({"id": "a"})"), HasSubstr("'requests'"));
  EXPECT_THAT(err(R"({"requests": [{"in": 1, "out": 1, "hash_ids": [1]}]})"),
              HasSubstr("missing field 't'"));
  EXPECT_THAT(
      err(R"({"requests": [{"t": -1, "in": 1, "out": 1, "hash_ids": [1]}]})"),
      HasSubstr("'t' is negative"));
  EXPECT_THAT(
      err(R"({"requests": [{"t": 0, "in": -1, "out": 1, "hash_ids": [1]}]})"),
      HasSubstr("'in' is not a non-negative integer"));
  EXPECT_THAT(
      err(R"({"block_size": 4, "requests": [{"t": 0, "in": 13, "out": 1,)"
          R"( "hash_ids": [1, 2]}]})"),
      HasSubstr("has 2 hash ids, needs 3"));
  EXPECT_THAT(err(R"({"block_size": 0, "requests": []})"),
              HasSubstr("block_size"));
  std::string deep = R"({"requests": [)";
  for (int i = 0; i < 10; ++i)
    deep += R"({"t": 0, "type": "subagent", "requests": [)";
  for (int i = 0; i < 10; ++i) deep += "]}";
  deep += "]}";
  EXPECT_THAT(err(deep), HasSubstr("nested too deep"));
}

TEST(LoadAgentTrace, ReadsGzipAndPlainText) {
  const std::string dir = ::testing::TempDir();
  const std::string gz = (std::filesystem::path(dir) / "t.jsonl.gz").string();
  gzFile f = gzopen(gz.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  const std::string text = std::string(kSession) + kOther;
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  gzclose(f);
  auto s = LoadAgentTrace(gz);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->size(), 3u);
  EXPECT_FALSE(LoadAgentTrace(dir + "/missing.jsonl.gz").ok());
}

TEST(ScheduleAgentSessions,
     SpanFromConcurrencyAndSubAgentsOnTheirParentsClock) {
  auto s = ParseAgentSessions(std::string(kSession) + kOther);
  ASSERT_TRUE(s.ok());
  // Durations 10 s and 4 s: two sessions at once on average need a span of 7.
  auto sched = ScheduleAgentSessions(*s, {.concurrency = 2});
  ASSERT_TRUE(sched.ok()) << sched.status();
  EXPECT_DOUBLE_EQ(sched->span_s, 7.0);
  EXPECT_DOUBLE_EQ(sched->start_s[0], 0);
  EXPECT_DOUBLE_EQ(sched->start_s[1], 5);    // sub-agent: parent's t
  EXPECT_DOUBLE_EQ(sched->start_s[2], 3.5);  // second of two over 7 s
  std::vector<double> arrivals;
  std::vector<std::pair<int64_t, int64_t>> order;
  for (const AgentArrival& a : sched->arrivals) {
    arrivals.push_back(a.arrival_s);
    order.push_back({a.session, a.request});
  }
  EXPECT_EQ(arrivals, (std::vector<double>{0, 3, 3.5, 5, 7, 8}));
  EXPECT_EQ(order, (std::vector<std::pair<int64_t, int64_t>>{
                       {0, 0}, {0, 1}, {2, 0}, {1, 0}, {1, 1}, {0, 2}}));

  auto scaled = ScheduleAgentSessions(*s, {.span_s = 100, .time_scale = 0.5});
  ASSERT_TRUE(scaled.ok());
  EXPECT_DOUBLE_EQ(scaled->start_s[2], 50);
  EXPECT_DOUBLE_EQ(scaled->start_s[1], 2.5);
  EXPECT_DOUBLE_EQ(scaled->arrivals.back().arrival_s, 50);  // s1 at 50 + 0
  EXPECT_FALSE(ScheduleAgentSessions(*s, {.concurrency = -1}).ok());

  // A seed shuffles the start order, deterministically.
  std::string many;
  for (int i = 0; i < 8; ++i) many += kOther;
  auto m = ParseAgentSessions(many);
  ASSERT_TRUE(m.ok());
  auto a = ScheduleAgentSessions(*m, {.span_s = 8, .seed = 7});
  auto b = ScheduleAgentSessions(*m, {.span_s = 8, .seed = 7});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->start_s, b->start_s);
  EXPECT_NE(a->start_s, (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(AgentPromptSynthesizer, ContinuationsAndSubAgentsShareTokensExactly) {
  auto s = ParseAgentSessions(std::string(kSession) + kOther);
  ASSERT_TRUE(s.ok());
  AgentPromptSynthesizer synth({.vocab_size = 1000});
  const std::vector<uint32_t> t0 = synth.Next((*s)[0], 0);  // 6 tokens
  const std::vector<uint32_t> t1 = synth.Next((*s)[0], 1);  // 10
  const std::vector<uint32_t> u0 = synth.Next((*s)[1], 0);  // 7, sub-agent
  const std::vector<uint32_t> u1 = synth.Next((*s)[1], 1);  // 9
  const std::vector<uint32_t> t2 = synth.Next((*s)[0], 2);  // 13
  const std::vector<uint32_t> o0 = synth.Next((*s)[2], 0);  // 5, other scope
  ASSERT_EQ(t0.size(), 6u);
  ASSERT_EQ(t1.size(), 10u);
  ASSERT_EQ(u0.size(), 7u);
  ASSERT_EQ(t2.size(), 13u);
  ASSERT_EQ(o0.size(), 5u);
  // Turn 2 continues turn 1: its first 6 tokens are turn 1's whole prompt,
  // the partial last block (2 tokens of block 2) included.
  EXPECT_TRUE(std::equal(t0.begin(), t0.end(), t1.begin()));
  // Turn 3 continues turn 2 (ids 1, 3 = turn 2's full blocks).
  EXPECT_TRUE(std::equal(t1.begin(), t1.end(), t2.begin()));
  // The sub-agent's first prompt ([1, 9], 7 tokens) has the parent's first
  // prompt's full blocks as leading ids and is longer: by the continuation
  // rule it continues it (6 tokens), then block 9 from its offset 2 on.
  EXPECT_TRUE(std::equal(t0.begin(), t0.end(), u0.begin()));
  EXPECT_NE(u0[6], t1[6]);
  // u1 = [1, 10, 11] continues u0 (the latest request ending after block 1).
  EXPECT_TRUE(std::equal(u0.begin(), u0.end(), u1.begin()));
  // Another session's id 1 is another block: scopes never share.
  EXPECT_NE(std::vector<uint32_t>(o0.begin(), o0.begin() + 4),
            std::vector<uint32_t>(t0.begin(), t0.begin() + 4));
  // Deterministic: a fresh synthesizer gives the same tokens.
  AgentPromptSynthesizer again({.vocab_size = 1000});
  EXPECT_EQ(again.Next((*s)[0], 0), t0);
  // Without reconstruction turn 2 diverges inside turn 1's partial block.
  AgentPromptSynthesizer plain(
      {.vocab_size = 1000, .reconstruct_continuations = false});
  const std::vector<uint32_t> p0 = plain.Next((*s)[0], 0);
  const std::vector<uint32_t> p1 = plain.Next((*s)[0], 1);
  EXPECT_TRUE(std::equal(p0.begin(), p0.begin() + 4, p1.begin()));
  EXPECT_FALSE(std::equal(p0.begin(), p0.end(), p1.begin()));
  for (uint32_t t : t2) EXPECT_LT(t, 1000u);
}

TEST(AgentPromptSynthesizer, UnnamedPartialBlocksAsTheTraceHasThem) {
  // The trace names full blocks only: 6 tokens of block 4 have one id.
  auto s =
      ParseAgentSessions(R"({"block_size": 4, "requests": [)"
                         R"({"t": 0, "in": 6, "out": 1, "hash_ids": [1]},)"
                         R"({"t": 1, "in": 11, "out": 1, "hash_ids": [1, 2]},)"
                         R"({"t": 2, "in": 7, "out": 1, "hash_ids": [1]}]})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(AsTraceRequest((*s)[0], 0).hash_ids.size(), 2u);  // + the tail's
  EXPECT_EQ(AsTraceRequest((*s)[0], 1).hash_ids.size(), 3u);
  AgentPromptSynthesizer synth({.vocab_size = 1000});
  const std::vector<uint32_t> a = synth.Next((*s)[0], 0);
  const std::vector<uint32_t> b = synth.Next((*s)[0], 1);
  const std::vector<uint32_t> c = synth.Next((*s)[0], 2);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 11u);
  ASSERT_EQ(c.size(), 7u);
  // b continues a: a's unnamed tail is b's, as the real next turn's is.
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
  // c also has a's full blocks as its leading ids and is longer than a:
  // by the continuation rule it continues a too.
  EXPECT_TRUE(std::equal(a.begin(), a.end(), c.begin()));
}

TEST(ScopedBlockId, UniquePerScopeAndNonNegative) {
  EXPECT_EQ(ScopedBlockId(3, 7), ScopedBlockId(3, 7));
  EXPECT_NE(ScopedBlockId(3, 7), ScopedBlockId(4, 7));
  EXPECT_NE(ScopedBlockId(3, 7), ScopedBlockId(3, 8));
  EXPECT_GE(ScopedBlockId(-1, -1), 0);
}

}  // namespace
}  // namespace swaserve::loadgen
