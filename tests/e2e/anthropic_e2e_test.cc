// The Anthropic Messages API against a real local cluster serving the demo
// model, driven by the official @anthropic-ai/sdk
// (tests/e2e/anthropic_messages.mjs) through router -> prefill -> decode:
//   - a plain message, thinking on and off (a thinking block only when on),
//     a stop sequence named in stop_sequence;
//   - streaming: the SDK's stream helper assembles the same message as the
//     non-streamed request, events in the documented order, pings while a
//     long prefill runs;
//   - a 20-turn tool loop with tool_result turns: every tool_use is a
//     declared tool with an object input, and cache_read_input_tokens
//     follows the conversation; a loop forced to call (tool_choice any)
//     whose tool_result leads to a text answer;
//   - count_tokens counts the prompt usage reports;
//   - the same conversation through the OpenAI API and this one shares the
//     prefix cache both ways;
//   - cache_control: the prefix up to the breakpoint is written, then read,
//     and the prefill worker holds it pinned;
//   - every error type the server can give, with Anthropic's status codes:
//     400, 401 (x-api-key), 404, 413, 429 (one request per key), 529 (no
//     workers).
#include <fstream>
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
constexpr char kKey[] = "sk-anthropic-test-0123";

class AnthropicE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto c = e2e::StartDemoCluster(kModelDir);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
    const std::string keys = cluster_->dir() + "/anthropic_keys.txt";
    std::ofstream(keys) << "team-a:" << kKey << "\n";
    ASSERT_TRUE(cluster_
                    ->StartRouter("r2", {"--api_keys=" + keys, "--api_key_concurrency=1",
                                         "--http.max_body_bytes=200000",
                                         "--http.stream_keepalive=20ms"})
                    .ok());
    ASSERT_TRUE(cluster_->StartRouter("r3", {"--cluster=empty", "--worker_wait=500ms"}).ok());
    ASSERT_TRUE(cluster_->WaitHealthy("r2", absl::Seconds(60)).ok());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static std::string Url(const char* router) {
    return absl::StrCat("http://127.0.0.1:", cluster_->Get(router)->http_port);
  }
  static const json& Run() {
    static const json r = e2e::RunJsonCommand(
        absl::StrCat("node ", SWASERVE_SOURCE_DIR, "/tests/e2e/anthropic_messages.mjs ", Url("r1"),
                     " demo ", kTools, " 20 ", Url("r2"), " ", kKey, " ", Url("r3")));
    return r;
  }
  static LocalCluster* cluster_;
};
LocalCluster* AnthropicE2E::cluster_ = nullptr;

// The prompt's tokens as Anthropic splits them.
int Prompt(const json& usage) {
  return usage["input_tokens"].get<int>() + usage["cache_read_input_tokens"].get<int>() +
         usage["cache_creation_input_tokens"].get<int>();
}

TEST_F(AnthropicE2E, MessagesThinkingAndStopSequences) {
  ASSERT_NE(cluster_, nullptr);
  const json& r = Run();
  const json& p = r["plain"];
  ASSERT_FALSE(p.contains("error")) << p.dump();
  EXPECT_EQ(p["type"], "message");
  EXPECT_EQ(p["role"], "assistant");
  EXPECT_EQ(p["id"].get<std::string>().rfind("msg_", 0), 0u) << p.dump();
  EXPECT_EQ(p["kinds"], json::array({"text"})) << p.dump();
  EXPECT_FALSE(p["text"].get<std::string>().empty());
  EXPECT_EQ(p["stop_reason"], "max_tokens");
  EXPECT_EQ(p["usage"]["output_tokens"], 32);
  EXPECT_GT(Prompt(p["usage"]), 0);

  ASSERT_FALSE(r["thinking_on"].contains("error")) << r["thinking_on"].dump();
  EXPECT_EQ(r["thinking_on"]["kinds"][0], "thinking") << r["thinking_on"].dump();
  EXPECT_FALSE(r["thinking_on"]["thinking"].get<std::string>().empty());
  ASSERT_FALSE(r["thinking_off"].contains("error")) << r["thinking_off"].dump();
  for (const json& k : r["thinking_off"]["kinds"]) EXPECT_NE(k, "thinking");

  const json& s = r["stop_sequence"];
  ASSERT_FALSE(s.contains("error")) << s.dump();
  EXPECT_EQ(s["stop_reason"], "stop_sequence") << s.dump();
  EXPECT_EQ(s["stop_sequence"], s["stop"]);
  // The output is the free output cut before the stop sequence.
  const std::string free = s["free"], text = s["text"], stop = s["stop"];
  EXPECT_EQ(free.substr(0, free.find(stop)), text) << s.dump();
}

TEST_F(AnthropicE2E, StreamingAssemblesTheSameMessage) {
  ASSERT_NE(cluster_, nullptr);
  const json& s = Run()["stream"];
  ASSERT_FALSE(s.contains("error")) << s.dump();
  // The same blocks; a tool_use block's id is minted per response, so it is
  // checked for presence and left out of the comparison.
  auto without_ids = [](json blocks) {
    for (json& b : blocks) {
      if (b.value("type", "") != "tool_use") continue;
      EXPECT_FALSE(b.value("id", "").empty()) << b.dump();
      b.erase("id");
    }
    return blocks;
  };
  ASSERT_TRUE(s["streamed"].is_array()) << s.dump();
  ASSERT_TRUE(s["whole"].is_array()) << s.dump();
  EXPECT_EQ(without_ids(s["streamed"]), without_ids(s["whole"]));
  EXPECT_EQ(s["streamed_stop"], s["whole_stop"]);
  const json& ev = s["events"];
  ASSERT_GE(ev.size(), 5u) << ev.dump();
  EXPECT_EQ(ev.front(), "message_start");
  EXPECT_EQ(ev.back(), "message_stop");
  EXPECT_EQ(ev[ev.size() - 2], "message_delta");
  // Blocks open and close in turn.
  int open = 0, blocks = 0;
  for (const json& e : ev) {
    if (e == "content_block_start") {
      EXPECT_EQ(open, 0) << ev.dump();
      ++open;
      ++blocks;
    } else if (e == "content_block_stop") {
      EXPECT_EQ(open, 1) << ev.dump();
      --open;
    } else if (e == "content_block_delta") {
      EXPECT_EQ(open, 1) << ev.dump();
    }
  }
  EXPECT_EQ(open, 0);
  EXPECT_EQ(blocks, static_cast<int>(s["whole"].size()));
  EXPECT_GT(Prompt(s["usage"]), 0);

  const json& pings = Run()["pings"];
  ASSERT_FALSE(pings.contains("error")) << pings.dump();
  EXPECT_EQ(pings["events"][0], "message_start") << pings.dump();
  const bool pinged =
      std::find(pings["events"].begin(), pings["events"].end(), "ping") != pings["events"].end();
  EXPECT_TRUE(pinged) << pings.dump();
  EXPECT_EQ(pings["events"].back(), "message_stop") << pings.dump();
  EXPECT_TRUE(pings["sdk_stop_reason"].is_string()) << pings.dump();
}

TEST_F(AnthropicE2E, ToolLoopFollowsTheCache) {
  ASSERT_NE(cluster_, nullptr);
  const json& r = Run();
  const json& turns = r["loop"]["turns"];
  ASSERT_EQ(turns.size(), 20u) << r["loop"].dump();
  int64_t prompt = 0, read = 0;
  for (size_t t = 0; t < turns.size(); ++t) {
    const json& u = turns[t];
    for (const json& use : u["uses"]) {
      EXPECT_FALSE(use["id"].get<std::string>().empty());
      EXPECT_TRUE(use["input"].is_object()) << use.dump();
    }
    EXPECT_EQ(u["tool_uses"].get<int>() > 0, u["stop_reason"] == "tool_use") << u.dump();
    if (t == 0) continue;
    const int p = u["input_tokens"].get<int>() + u["cache_read"].get<int>();
    EXPECT_GE(u["cache_read"].get<int>(), turns[t - 1]["cache_read"].get<int>()) << t;
    prompt += p;
    read += u["cache_read"].get<int>();
  }
  EXPECT_GT(read, prompt / 2) << turns.dump();

  // tool_choice any: a call for sure; its result back; then an answer.
  const json& a = r["answer_loop"];
  ASSERT_FALSE(a.contains("error")) << a.dump();
  EXPECT_EQ(a["first_stop"], "tool_use") << a.dump();
  ASSERT_GE(a["uses"].size(), 1u) << a.dump();
  for (const json& u : a["uses"]) EXPECT_TRUE(u["input"].is_object()) << a.dump();
  EXPECT_NE(a["final_stop"], "tool_use") << a.dump();
  EXPECT_FALSE(a["final_text"].get<std::string>().empty()) << a.dump();
  EXPECT_GT(a["final_cache_read"].get<int>(), 0) << a.dump();
  ASSERT_FALSE(r["tool_result_forms"].contains("error")) << r["tool_result_forms"].dump();
  ASSERT_FALSE(r["count_tokens"].contains("error")) << r["count_tokens"].dump();
  EXPECT_EQ(r["count_tokens"]["count"], r["count_tokens"]["prompt"]);
}

TEST_F(AnthropicE2E, BothApisShareThePrefixCache) {
  ASSERT_NE(cluster_, nullptr);
  const json& c = Run()["cross_api"];
  ASSERT_FALSE(c.contains("error")) << c.dump();
  // OpenAI first, then Anthropic: the same prompt, read from the cache
  // (all but the last partial page).
  const int prompt = c["openai_first"]["prompt"];
  EXPECT_EQ(Prompt(c["anthropic_second"]), prompt) << c.dump();
  EXPECT_GE(c["anthropic_second"]["cache_read_input_tokens"].get<int>(), prompt - 16) << c.dump();
  // Anthropic first, then OpenAI.
  EXPECT_EQ(Prompt(c["anthropic_first"]), c["openai_second"]["prompt"].get<int>()) << c.dump();
  EXPECT_GE(c["openai_second"]["cached"].get<int>(), c["openai_second"]["prompt"].get<int>() - 16)
      << c.dump();
}

TEST_F(AnthropicE2E, CacheControlWritesThenReadsAndPins) {
  ASSERT_NE(cluster_, nullptr);
  const json& c = Run()["cache_control"];
  ASSERT_FALSE(c.contains("error")) << c.dump();
  // The system prompt (about 330 tokens) is written by the first request...
  EXPECT_GT(c["first"]["cache_creation_input_tokens"].get<int>(), 300) << c.dump();
  // ...and read by the second, which only writes the page tail the cache
  // does not hold (less than a page).
  EXPECT_GE(c["second"]["cache_read_input_tokens"].get<int>(),
            c["first"]["cache_creation_input_tokens"].get<int>() - 16)
      << c.dump();
  EXPECT_LT(c["second"]["cache_creation_input_tokens"].get<int>(), 16) << c.dump();
  // The prefill worker pinned it (for an hour: still pinned now).
  EXPECT_GT(cluster_->Metric("p1", "swaserve_prefill_pinned_pages"), 0);
  EXPECT_GT(cluster_->Metric("p1", "swaserve_prefill_pinned_tokens_total"), 300);
}

TEST_F(AnthropicE2E, ErrorsHaveAnthropicsShape) {
  ASSERT_NE(cluster_, nullptr);
  const json& r = Run();
  const json& e = r["errors"];
  auto expect = [&](const char* name, int status, const char* type) {
    ASSERT_TRUE(e.contains(name)) << e.dump();
    EXPECT_EQ(e[name].value("status", 0), status) << name << ": " << e[name].dump();
    EXPECT_EQ(e[name].value("type", ""), type) << name << ": " << e[name].dump();
  };
  expect("missing_max_tokens", 400, "invalid_request_error");
  expect("unknown_field", 400, "invalid_request_error");
  expect("bad_role", 400, "invalid_request_error");
  expect("bad_tool_choice", 400, "invalid_request_error");
  expect("unknown_model", 404, "not_found_error");
  expect("wrong_key", 401, "authentication_error");
  // A body over the limit is refused on its Content-Length before it is
  // read: the HTTP server's own 413, which has no JSON body.
  ASSERT_TRUE(e.contains("too_large")) << e.dump();
  EXPECT_EQ(e["too_large"].value("status", 0), 413) << e["too_large"].dump();
  expect("rate_limited", 429, "rate_limit_error");
  expect("overloaded", 529, "overloaded_error");
  // The right key (x-api-key) works, and the model list has Anthropic's
  // shape.
  ASSERT_FALSE(r["keyed_ok"].contains("error")) << r["keyed_ok"].dump();
  EXPECT_EQ(r["keyed_ok"]["models"], json::parse(R"([{"id":"demo","type":"model"}])"));
}

}  // namespace
}  // namespace swaserve
