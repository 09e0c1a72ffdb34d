// Agents against a real local cluster serving the demo model (MiMo's chat
// template, trained on tool-use conversations): the official openai npm
// client (tests/e2e/openai_tools.mjs) and the OpenAI Agents SDK
// (tests/e2e/agents_sdk.mjs) through router -> prefill -> decode. Checks:
//   - the chat API's reasoning / content / tool calls are exactly the parse
//     of the raw output (the same prompt through /v1/completions), streamed
//     and not;
//   - tool calls come back well formed, with ids, names of declared tools,
//     JSON-object arguments and finish_reason "tool_calls"; the stream helper
//     of the client assembles the same calls;
//   - reasoning arrives in reasoning_content (thinking on, the template's
//     default) and not with enable_thinking false; usage counts it;
//   - tool_choice "none" parses no call; n = 3 gives three choices (seeds
//     seed + i, the prompt computed once);
//   - a multi-turn conversation with tool results reaches an answer, and the
//     prefix cache follows the agent loop: cached_tokens grows turn by turn;
//   - /tokenize counts what usage reports;
//   - bad tool requests are 400s the client raises;
//   - the Agents SDK runs an agent with three tools to its final answer,
//     streamed and not, cached tokens growing across its model calls;
//   - held-out prompts the demo model gets right: a well-formed call of the
//     right tool with tool_choice "auto", no call where none is needed.
// How often the model calls the right tool is the demo model's quality, not
// the server's: tools/train/eval_tools.mjs measures it (bench/RESULTS.md).
#include <cstdio>
#include <string>

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
constexpr char kTools[] = SWASERVE_SOURCE_DIR "/tools/train/agent_tools.json";

// Runs a node script of tests/e2e; the JSON object it prints.
json RunNode(const std::string& args) {
  return e2e::RunJsonCommand(absl::StrCat("node ", SWASERVE_SOURCE_DIR, "/tests/e2e/", args));
}

// A well-formed call of a declared tool.
void ExpectWellFormed(const json& call, const json& names) {
  ASSERT_TRUE(call.is_object()) << call.dump();
  EXPECT_EQ(call.value("type", ""), "function") << call.dump();
  EXPECT_FALSE(call.value("id", "").empty()) << call.dump();
  const std::string name = call["function"].value("name", "");
  EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << call.dump();
  const json args = json::parse(call["function"].value("arguments", ""), nullptr, false);
  EXPECT_TRUE(args.is_object()) << call.dump();
}

class AgentE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto c = e2e::StartDemoCluster(kModelDir);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static std::string Url() {
    return absl::StrCat("http://127.0.0.1:", cluster_->Get("r1")->http_port);
  }
  // The openai client script's output (run once for the tests that read it).
  static const json& ClientRun() {
    static const json r = RunNode(absl::StrCat("openai_tools.mjs ", Url(), " demo ", kTools, " 20"));
    return r;
  }
  static LocalCluster* cluster_;
};
LocalCluster* AgentE2E::cluster_ = nullptr;

// `raw` without its reasoning tags: the first "</think>" (and, when the
// prompt did not open the block, a leading "<think>").
std::string WithoutThinkTags(std::string raw, bool prompt_opens) {
  if (!prompt_opens) {
    const size_t open = raw.find("<think>");
    if (open == std::string::npos || raw.find_first_not_of(" \n") != open) return raw;
    raw.erase(open, 7);
  }
  if (const size_t close = raw.find("</think>"); close != std::string::npos) raw.erase(close, 8);
  return raw;
}

TEST_F(AgentE2E, TheChatSplitIsTheParseOfTheRawOutput) {
  ASSERT_NE(cluster_, nullptr);
  const json& r = ClientRun();
  ASSERT_FALSE(r.contains("error")) << r.dump();
  ASSERT_EQ(r["split"].size(), 5u);
  int with_reasoning = 0;
  for (const json& c : r["split"]) {
    ASSERT_FALSE(c.contains("error")) << c.dump();
    const json& whole = c["whole"];
    // Streamed deltas, joined, say what the whole response says.
    EXPECT_EQ(c["streamed"]["reasoning"], whole["reasoning"]) << c.dump();
    EXPECT_EQ(c["streamed"]["content"], whole["content"]) << c.dump();
    ASSERT_EQ(c["streamed"]["calls"].size(), whole["calls"].size()) << c.dump();
    for (size_t i = 0; i < whole["calls"].size(); ++i) {
      EXPECT_EQ(c["streamed"]["calls"][i]["name"], whole["calls"][i]["function"]["name"]);
      EXPECT_EQ(c["streamed"]["calls"][i]["arguments"], whole["calls"][i]["function"]["arguments"]);
      ExpectWellFormed(whole["calls"][i], r["tool_names"]);
      EXPECT_NE(c["raw"].get<std::string>().find(
                    absl::StrCat("<function=", whole["calls"][i]["function"]["name"].get<std::string>())),
                std::string::npos);
    }
    const std::string reasoning = whole["reasoning"], content = whole["content"];
    if (!reasoning.empty()) ++with_reasoning;
    if (whole["calls"].empty()) {
      // Nothing was taken out as a call: reasoning and content are the
      // model's text exactly, markup of malformed calls included.
      EXPECT_EQ(WithoutThinkTags(c["raw"], c["opens_reasoning"]), reasoning + content) << c.dump();
    }
  }
  EXPECT_GT(with_reasoning, 0) << r["split"].dump();
}

TEST_F(AgentE2E, OpenAiClient) {
  ASSERT_NE(cluster_, nullptr);
  const json& r = ClientRun();
  ASSERT_FALSE(r.contains("error")) << r.dump();
  const json& names = r["tool_names"];

  // Thinking is on by default: the answer comes with its reasoning.
  ASSERT_FALSE(r["plain"].contains("error")) << r["plain"].dump();
  EXPECT_TRUE(r["plain"]["reasoning_content"].is_string()) << r["plain"].dump();
  EXPECT_GT(r["plain"]["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  ASSERT_FALSE(r["thinking_off"].contains("error")) << r["thinking_off"].dump();
  EXPECT_TRUE(r["thinking_off"]["reasoning_content"].is_null()) << r["thinking_off"].dump();

  // Whatever calls the model made are well formed and end the turn; the
  // client's stream helper assembles the same ones.
  for (const char* k : {"tool_nonstream", "tool_stream", "parallel"}) {
    const json& t = r[k];
    ASSERT_FALSE(t.contains("error")) << k << ": " << t.dump();
    for (const json& c : t["tool_calls"]) ExpectWellFormed(c, names);
    EXPECT_EQ(t["finish_reason"] == "tool_calls", !t["tool_calls"].empty()) << k << t.dump();
  }
  ASSERT_EQ(r["tool_stream"]["tool_calls"].size(), r["tool_nonstream"]["tool_calls"].size());
  for (size_t i = 0; i < r["tool_stream"]["tool_calls"].size(); ++i) {
    EXPECT_EQ(r["tool_stream"]["tool_calls"][i]["function"],
              r["tool_nonstream"]["tool_calls"][i]["function"]);
  }
  EXPECT_GT(r["tool_stream"]["chunks"].get<int>(), 2);


  ASSERT_FALSE(r["tool_choice_none"].contains("error"));
  EXPECT_TRUE(r["tool_choice_none"]["tool_calls"].empty()) << r["tool_choice_none"].dump();
  EXPECT_NE(r["tool_choice_none"]["finish_reason"], "tool_calls");

  // The conversation goes on after each call's result until an answer.
  const json& mt = r["multi_turn"];
  ASSERT_FALSE(mt.contains("error")) << mt.dump();
  ASSERT_GE(mt["steps"].size(), 1u) << mt.dump();
  for (size_t i = 0; i + 1 < mt["steps"].size(); ++i) {
    EXPECT_GT(mt["steps"][i]["tool_calls"].get<int>(), 0) << mt.dump();
  }

  // The agent loop: every turn's prompt extends the last one, so the cache
  // holds all but the newest part.
  const json& turns = r["loop"]["turns"];
  ASSERT_EQ(turns.size(), 20u) << r["loop"].dump();
  int64_t prompt = 0, cached = 0;
  for (size_t t = 1; t < turns.size(); ++t) {
    EXPECT_GT(turns[t]["prompt_tokens"].get<int>(), turns[t - 1]["prompt_tokens"].get<int>()) << t;
    EXPECT_GE(turns[t]["cached_tokens"].get<int>(), turns[t - 1]["cached_tokens"].get<int>()) << t;
    prompt += turns[t]["prompt_tokens"].get<int>();
    cached += turns[t]["cached_tokens"].get<int>();
  }
  EXPECT_GT(cached, prompt / 2) << turns.dump();

  ASSERT_FALSE(r["tokenize"].contains("error")) << r["tokenize"].dump();
  EXPECT_EQ(r["tokenize"]["count"], r["tokenize"]["prompt_tokens"]);
  EXPECT_GT(r["tokenize"]["detokenized_chars"].get<int>(), 0);

  // n = 3: three choices by index; choice i of a seeded request samples as a
  // one-choice request with seed + i does (MTP off: see the script); the same request again gives the
  // same choices; the stream helper assembles the same three; usage counts
  // the prompt once and every choice's tokens. Greedy choices are equal, and
  // the followers' prefill reused the fresh prompt (router counters: three
  // prompts counted, at least two of them nearly all cached).
  const json& n3 = r["n3"];
  ASSERT_FALSE(n3.contains("error")) << n3.dump();
  ASSERT_EQ(n3["choices"].size(), 3u) << n3.dump();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(n3["choices"][i]["index"], i) << n3.dump();
    EXPECT_EQ(n3["greedy"][i]["index"], i) << n3.dump();
  }
  EXPECT_EQ(n3["choices"][1]["content"], n3["choice1_alone"]) << n3.dump();
  EXPECT_NE(n3["choices"][0]["content"], n3["choices"][1]["content"]) << n3.dump();
  EXPECT_EQ(n3["choices"], n3["again"]) << n3.dump();
  EXPECT_EQ(n3["streamed"], n3["choices"]) << n3.dump();
  EXPECT_EQ(n3["streamed_indexes"], json::array({0, 1, 2})) << n3.dump();
  EXPECT_EQ(n3["greedy"][0]["content"], n3["greedy"][1]["content"]) << n3.dump();
  EXPECT_EQ(n3["greedy"][0]["content"], n3["greedy"][2]["content"]) << n3.dump();
  const int greedy_prompt = n3["greedy_usage"]["prompt_tokens"];
  EXPECT_GT(greedy_prompt, 300) << n3.dump();
  // Equal greedy choices have equal lengths: three times one choice's.
  EXPECT_EQ(n3["greedy_usage"]["completion_tokens"].get<int>() % 3, 0) << n3.dump();
  if (n3["greedy"][0]["finish_reason"] == "length") {
    EXPECT_EQ(n3["greedy_usage"]["completion_tokens"], 30) << n3.dump();
  }
  EXPECT_EQ(n3["counters"]["prompt"], 3 * greedy_prompt) << n3.dump();
  // A page of the demo cluster is at most 64 tokens: each follower computes
  // at most the last partial page (and its first token's position).
  EXPECT_GE(n3["counters"]["cached"].get<int>(), 2 * (greedy_prompt - 64)) << n3.dump();
  int all_length = 0;
  for (const json& c : n3["choices"]) all_length += c["finish_reason"] == "length";
  if (all_length == 3) EXPECT_EQ(n3["usage"]["completion_tokens"], 36) << n3.dump();
  EXPECT_LE(n3["usage"]["completion_tokens"].get<int>(), 36) << n3.dump();
  EXPECT_GE(n3["usage"]["completion_tokens"].get<int>(), 3) << n3.dump();

  ASSERT_FALSE(r["logit_bias"].contains("error")) << r["logit_bias"].dump();

  for (const auto& [name, e] : r["errors"].items()) {
    EXPECT_EQ(e.value("status", 0), 400) << name << ": " << e.dump();
  }
}

// Held-out prompts of tools/train/agent_eval.jsonl (values never seen in
// training), scored by tools/train/eval_tools.mjs (tool_choice "auto",
// greedy, the prompt's tools and thinking mode). The ids were chosen from
// that script's run on all 240 prompts against `swaserve up` with this
// checkpoint, among those it scored right: four of the three tools the model
// names right most often (add 18/20, days_between 19/20, count_word 26/32;
// held-out and seen phrasings, thinking on and off) and two of the 48 of 60
// that need no tool and got no call. The model does not copy argument values
// yet (right arguments 0 %), so only the call's form and tool are checked.
TEST_F(AgentE2E, HeldOutPromptsGetAWellFormedCallOfTheRightTool) {
  ASSERT_NE(cluster_, nullptr);
  const json r = e2e::RunJsonCommand(absl::StrCat(
      "node ", SWASERVE_SOURCE_DIR, "/tools/train/eval_tools.mjs --base-url ", Url(),
      "/v1 --model demo --ids 5,1,27,8,15,36"));
  ASSERT_FALSE(r.contains("error")) << r.dump();
  const json& o = r["overall"];
  EXPECT_EQ(o["prompts"], 6) << r.dump();
  EXPECT_EQ(o["errors"], 0) << r.dump();
  EXPECT_EQ(o["well_formed"]["n"], 4) << o.dump();
  EXPECT_EQ(o["well_formed"]["of"], 4) << o.dump();
  EXPECT_EQ(o["right_tool"]["n"], 4) << o.dump();
  EXPECT_EQ(o["no_call_when_not_needed"]["n"], 2) << o.dump();
  EXPECT_EQ(o["no_call_when_not_needed"]["of"], 2) << o.dump();
}

TEST_F(AgentE2E, AgentsSdk) {
  ASSERT_NE(cluster_, nullptr);
  const json r = RunNode(absl::StrCat("agents_sdk.mjs ", Url(), " demo"));
  ASSERT_FALSE(r.contains("error")) << r.dump();
  for (const json* run : {&r, &r["streamed"]}) {
    EXPECT_TRUE((*run)["final_output"].is_string()) << run->dump();
    const json& usage = (*run)["usage"];
    ASSERT_GE(usage.size(), 1u) << run->dump();
    // Each model call reuses the last one's prompt.
    for (size_t i = 1; i < usage.size(); ++i) {
      EXPECT_GT(usage[i]["cached_tokens"].get<int>(), usage[i - 1]["cached_tokens"].get<int>())
          << usage.dump();
    }
  }
  // The second run sends the first one's prompt again: found in the cache.
  EXPECT_GE(r["streamed"]["usage"][0]["cached_tokens"].get<int>(),
            r["usage"][0]["input_tokens"].get<int>() / 2)
      << r.dump();
}

}  // namespace
}  // namespace swaserve
