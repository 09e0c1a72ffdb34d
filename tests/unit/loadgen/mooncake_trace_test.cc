#include "lib/loadgen/mooncake_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace swaserve::loadgen {
namespace {

using ::testing::HasSubstr;

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / name).string();
  std::ofstream(path) << text;
  return path;
}

TraceRequest Req(int64_t input, std::vector<int64_t> ids, int64_t output = 10,
                 int64_t ts = 0) {
  TraceRequest r;
  r.timestamp_ms = ts;
  r.input_length = input;
  r.output_length = output;
  r.hash_ids = std::move(ids);
  return r;
}

TEST(LoadMooncakeTrace, ParsesLinesAndLimit) {
  const std::string path = WriteTemp(
      "ok.jsonl",
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, "
      "\"hash_ids\": [0, 1]}\n"
      "\n"
      "{\"timestamp\": 250, \"input_length\": 100, \"output_length\": 7, "
      "\"hash_ids\": [0]}\n"
      "{\"timestamp\": 300, \"input_length\": 10, \"output_length\": 1, "
      "\"hash_ids\": [9]}\n");
  auto all = LoadMooncakeTrace(path);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].input_length, 600);
  EXPECT_EQ((*all)[0].output_length, 5);
  EXPECT_EQ((*all)[0].hash_ids, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ((*all)[1].timestamp_ms, 250);
  auto two = LoadMooncakeTrace(path, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->size(), 2u);
}

TEST(LoadMooncakeTrace, ErrorsNameTheLine) {
  const std::string good =
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, "
      "\"hash_ids\": [0]}\n";
  struct Case {
    std::string bad_line;
    std::string what;
  };
  for (const Case& c : std::vector<Case>{
           {"{not json", "not valid JSON"},
           {"[1, 2]", "not a JSON object"},
           {"{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [0]}",
            "missing field 'input_length'"},
           {"{\"timestamp\": \"x\", \"input_length\": 1, \"output_length\": 1, "
            "\"hash_ids\": [0]}",
            "field 'timestamp' is not an integer"},
           {"{\"timestamp\": 0, \"input_length\": -1, \"output_length\": 1, "
            "\"hash_ids\": [0]}",
            "negative input_length"},
           {"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, "
            "\"hash_ids\": [\"a\"]}",
            "non-integer"},
           {"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, "
            "\"hash_ids\": []}",
            "no hash_ids"},
       }) {
    const std::string path = WriteTemp("bad.jsonl", good + good + c.bad_line);
    auto r = LoadMooncakeTrace(path);
    ASSERT_FALSE(r.ok()) << c.bad_line;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(path + ":3: "));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.what));
  }
  // The limit stops before a bad line.
  EXPECT_TRUE(
      LoadMooncakeTrace(WriteTemp("bad2.jsonl", good + good + "{"), 2).ok());
}

TEST(LoadMooncakeTrace, MissingFile) {
  auto r = LoadMooncakeTrace("/nonexistent/trace.jsonl");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("/nonexistent/trace.jsonl"));
}

TEST(SynthesizePrompt, SharedLeadingIdsShareExactlyThoseTokens) {
  const ScaleOptions s;
  const auto a = SynthesizePrompt(Req(1500, {0, 1, 2}), s, 1000);
  const auto b = SynthesizePrompt(Req(1400, {0, 1, 7}), s, 1000);
  const auto c = SynthesizePrompt(Req(2000, {0, 5, 6, 8}), s, 1000);
  ASSERT_EQ(a.size(), 1500u);
  ASSERT_EQ(b.size(), 1400u);
  ASSERT_EQ(c.size(), 2000u);
  // a and b agree on blocks 0 and 1, differ in block 2.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 1024, b.begin()));
  EXPECT_FALSE(
      std::equal(a.begin() + 1024, a.begin() + 1400, b.begin() + 1024));
  // a and c agree on block 0 only.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 512, c.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 512, a.begin() + 1024, c.begin() + 512));
  // Deterministic.
  EXPECT_EQ(a, SynthesizePrompt(Req(1500, {0, 1, 2}), s, 1000));
  // A block's tokens depend on its id, not its position.
  const auto d = SynthesizePrompt(Req(1024, {3, 0}), s, 1000);
  EXPECT_TRUE(std::equal(d.begin() + 512, d.end(), a.begin()));
}

TEST(SynthesizePrompt, DifferentIdsGiveDifferentBlocks) {
  const ScaleOptions s;
  std::vector<std::vector<uint32_t>> blocks;
  for (int64_t id = 0; id < 50; ++id) {
    blocks.push_back(SynthesizePrompt(Req(512, {id}), s, 1000));
    ASSERT_EQ(blocks.back().size(), 512u);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      // Not just different: nearly independent (few positional matches).
      int same = 0;
      for (size_t k = 0; k < 512; ++k) same += blocks[i][k] == blocks[j][k];
      EXPECT_LT(same, 20) << i << " vs " << j;
    }
  }
}

TEST(SynthesizePrompt, TokensInRange) {
  const ScaleOptions s;
  const auto t =
      SynthesizePrompt(Req(5000, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), s, 300, 256);
  ASSERT_EQ(t.size(), 5000u);
  bool saw_low = false, saw_high = false;
  for (uint32_t x : t) {
    ASSERT_GE(x, 256u);
    ASSERT_LT(x, 300u);
    saw_low |= x == 256;
    saw_high |= x == 299;
  }
  EXPECT_TRUE(saw_low);
  EXPECT_TRUE(saw_high);
}

TEST(Scaling, LengthScale) {
  ScaleOptions s;
  s.length_scale = 0.25;  // 512-token blocks become 128 tokens
  EXPECT_EQ(ScaledBlockTokens(s), 128);
  const TraceRequest r = Req(1100, {0, 1, 2}, /*output=*/343);
  // 2 full blocks of 128 + round(76 * 0.25) = 19.
  EXPECT_EQ(ScaledInputLength(r, s), 2 * 128 + 19);
  EXPECT_EQ(ScaledOutputLength(r, s), 86);  // round(85.75)
  const auto t = SynthesizePrompt(r, s, 1000);
  EXPECT_EQ(static_cast<int64_t>(t.size()), ScaledInputLength(r, s));
  // Scaled blocks are prefixes of the unscaled ones.
  const auto full = SynthesizePrompt(r, ScaleOptions{}, 1000);
  EXPECT_TRUE(std::equal(t.begin(), t.begin() + 128, full.begin()));
  EXPECT_TRUE(std::equal(t.begin() + 128, t.begin() + 256, full.begin() + 512));
  // Shared prefixes survive scaling.
  const auto other = SynthesizePrompt(Req(1100, {0, 1, 9}), s, 1000);
  EXPECT_TRUE(std::equal(t.begin(), t.begin() + 256, other.begin()));
  EXPECT_NE(t[256], other[256]);

  // Tiny scales keep at least one token per block and one output token.
  s.length_scale = 0.0001;
  EXPECT_EQ(ScaledBlockTokens(s), 1);
  EXPECT_EQ(ScaledInputLength(r, s), 3);
  EXPECT_EQ(ScaledOutputLength(r, s), 1);
  // Larger scales grow blocks.
  s.length_scale = 2.0;
  EXPECT_EQ(ScaledInputLength(r, s), 2 * 1024 + 152);
  EXPECT_EQ(ScaledOutputLength(r, s), 686);
}

TEST(Scaling, Caps) {
  ScaleOptions s;
  const TraceRequest r = Req(2000, {0, 1, 2, 3}, /*output=*/500);
  s.max_input_tokens = 1300;  // whole blocks: 1024
  EXPECT_EQ(ScaledInputLength(r, s), 1024);
  EXPECT_EQ(SynthesizePrompt(r, s, 1000).size(), 1024u);
  s.max_input_tokens = 300;  // below one block: the cap itself
  EXPECT_EQ(ScaledInputLength(r, s), 300);
  s.max_input_tokens = 5000;  // not reached
  EXPECT_EQ(ScaledInputLength(r, s), 2000);
  s.max_output_tokens = 64;
  EXPECT_EQ(ScaledOutputLength(r, s), 64);
  s.max_output_tokens = 1000;
  EXPECT_EQ(ScaledOutputLength(r, s), 500);
  // With length scaling the cap counts scaled tokens and scaled blocks.
  s.length_scale = 0.5;
  s.max_input_tokens = 700;  // blocks of 256: 512
  EXPECT_EQ(ScaledInputLength(r, s), 512);
}

TEST(Scaling, TimeScaleAndEdgeCases) {
  ScaleOptions s;
  s.time_scale = 0.5;
  EXPECT_EQ(ScaledTimestampMs(Req(1, {0}, 1, 1000), s), 500);
  s.time_scale = 0;
  EXPECT_EQ(ScaledTimestampMs(Req(1, {0}, 1, 1000), s), 0);
  // Output length 0 still asks for one token.
  EXPECT_EQ(ScaledOutputLength(Req(1, {0}, 0), ScaleOptions{}), 1);
  // Empty prompt.
  EXPECT_EQ(ScaledInputLength(Req(0, {}), ScaleOptions{}), 0);
  EXPECT_TRUE(SynthesizePrompt(Req(0, {}), ScaleOptions{}, 1000).empty());
  // Fewer ids than the length needs: the ids bound the prompt.
  EXPECT_EQ(ScaledInputLength(Req(2000, {0, 1}), ScaleOptions{}), 1024);
}

TEST(LoadMooncakeTrace, RealTraceIfPresent) {
  const std::string path =
      "/work/shared/traces/mooncake_conversation_trace.jsonl";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  auto r = LoadMooncakeTrace(path, 100);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 100u);
  for (const TraceRequest& t : *r) {
    EXPECT_EQ(ScaledInputLength(t, ScaleOptions{}), t.input_length);
  }
}

}  // namespace
}  // namespace swaserve::loadgen

namespace swaserve::loadgen {
namespace {

TEST(PromptSynthesizer, PlainMatchesSynthesizePrompt) {
  PromptSynthesizer p({});
  const TraceRequest a = Req(1100, {0, 1, 2});
  const TraceRequest b = Req(2000, {0, 1, 5, 6});
  EXPECT_EQ(p.Next(a), SynthesizePrompt(a, ScaleOptions{}, 1000));
  EXPECT_EQ(p.Next(b), SynthesizePrompt(b, ScaleOptions{}, 1000));
}

TEST(PromptSynthesizer, ReconstructsContinuations) {
  for (double scale : {1.0, 0.25}) {
    PromptSynthesizer::Options o;
    o.scale.length_scale = scale;
    o.reconstruct_continuations = true;
    PromptSynthesizer p(o);
    const TraceRequest a = Req(1100, {0, 1, 2});
    const TraceRequest b = Req(2000, {0, 1, 5, 6});        // continues a
    const TraceRequest c = Req(2600, {0, 1, 5, 7, 8, 9});  // continues b
    const TraceRequest d = Req(1500, {0, 3, 4});           // unrelated to a
    const auto pa = p.Next(a);
    const auto pb = p.Next(b);
    const auto pc = p.Next(c);
    const auto pd = p.Next(d);
    ASSERT_EQ(static_cast<int64_t>(pa.size()), ScaledInputLength(a, o.scale));
    ASSERT_EQ(static_cast<int64_t>(pb.size()), ScaledInputLength(b, o.scale));
    ASSERT_EQ(static_cast<int64_t>(pc.size()), ScaledInputLength(c, o.scale));
    EXPECT_EQ(pa, SynthesizePrompt(a, o.scale, 1000));
    // b starts with all of a (its partial last block included).
    EXPECT_TRUE(std::equal(pa.begin(), pa.end(), pb.begin())) << scale;
    // The rest of b's block 2 and its block 3 are b's own blocks at their
    // positions.
    const auto plain_b = SynthesizePrompt(b, o.scale, 1000);
    EXPECT_TRUE(std::equal(pb.begin() + pa.size(), pb.end(),
                           plain_b.begin() + pa.size()));
    EXPECT_NE(pb, plain_b);
    // c continues b, hence a.
    EXPECT_TRUE(std::equal(pb.begin(), pb.end(), pc.begin())) << scale;
    // d only shares block 0 with a, so it is plain.
    EXPECT_EQ(pd, SynthesizePrompt(d, o.scale, 1000));
  }
}

TEST(PromptSynthesizer, ShorterOrCappedRequests) {
  PromptSynthesizer::Options o;
  o.reconstruct_continuations = true;
  o.scale.max_input_tokens = 1024;
  PromptSynthesizer p(o);
  const auto pa = p.Next(Req(1100, {0, 1, 2}));
  // Not longer than a: not a continuation, plain.
  const TraceRequest b = Req(1050, {0, 1, 7});
  EXPECT_EQ(p.Next(b), SynthesizePrompt(b, o.scale, 1000));
  // Capped continuation: cut to the cap.
  const auto pc = p.Next(Req(3000, {0, 1, 7, 8, 9, 10}));
  EXPECT_EQ(pc.size(), 1024u);
  EXPECT_EQ(pa.size(), 1024u);
}

}  // namespace
}  // namespace swaserve::loadgen
