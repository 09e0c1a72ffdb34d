// Structured output through a real local cluster serving the demo model,
// driven by the official openai npm client (tests/e2e/structured_output.mjs):
//   - client.chat.completions.parse with a zod-derived schema parses;
//   - property: random JSON Schemas of the supported subset x sampling
//     seeds, every constrained output parses and validates with ajv (an
//     independent validator), while the same requests unconstrained fail
//     validation for some (the negative control: the test can fail);
//     greedy with MTP asked for equals greedy without;
//   - json_object outputs that end are objects;
//   - tool_choice "required" and a named function always give calls of
//     allowed tools whose arguments validate, thinking on and off;
//   - an unsupported keyword is a 400 naming it.
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

class StructuredE2E : public ::testing::Test {
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
  static const json& Run() {
    static const json r = e2e::RunJsonCommand(
        absl::StrCat("node ", SWASERVE_SOURCE_DIR, "/tests/e2e/structured_output.mjs http://127.0.0.1:",
                     cluster_->Get("r1")->http_port, " demo ", kTools, " 20 3"));
    return r;
  }
  static LocalCluster* cluster_;
};
LocalCluster* StructuredE2E::cluster_ = nullptr;

TEST_F(StructuredE2E, ZodParse) {
  ASSERT_NE(cluster_, nullptr);
  const json& p = Run()["parse"];
  ASSERT_FALSE(p.contains("error")) << p.dump();
  EXPECT_TRUE(p["valid"].get<bool>()) << p.dump();
  EXPECT_EQ(p["finish_reason"], "stop") << p.dump();
}

TEST_F(StructuredE2E, EveryConstrainedOutputValidates) {
  ASSERT_NE(cluster_, nullptr);
  const json& p = Run()["property"];
  ASSERT_FALSE(p.contains("error")) << p.dump();
  ASSERT_EQ(p["rows"].size(), 60u);
  int valid = 0, free_invalid = 0;
  for (const json& r : p["rows"]) {
    // Cut by max_tokens is the only way not to end in a valid value.
    if (r["finish_reason"] == "stop") {
      EXPECT_TRUE(r["constrained"]["valid"].get<bool>()) << r.dump();
      valid += r["constrained"]["valid"].get<bool>();
    }
    free_invalid += !r["free"]["valid"].get<bool>();
  }
  EXPECT_GE(valid, 55) << p.dump();  // nearly all end within max_tokens
  EXPECT_GT(free_invalid, 0);        // the constraint is what makes them valid
  EXPECT_TRUE(p["greedy_mtp_equal"].get<bool>());
  EXPECT_TRUE(p["greedy_valid"].get<bool>());
}

TEST_F(StructuredE2E, JsonObjectAndForcedToolCalls) {
  ASSERT_NE(cluster_, nullptr);
  const json& r = Run();
  ASSERT_FALSE(r["json_object"].contains("error")) << r["json_object"].dump();
  for (const json& o : r["json_object"]["rows"]) {
    EXPECT_TRUE(o["finish_reason"] == "length" || o["is_object"].get<bool>()) << o.dump();
  }
  ASSERT_FALSE(r["forced"].contains("error")) << r["forced"].dump();
  ASSERT_EQ(r["forced"]["rows"].size(), 9u);
  int with_calls = 0;
  for (const json& f : r["forced"]["rows"]) {
    // A reasoning block that ran to max_tokens is the only way to no call
    // (the reasoning cannot end the output; the call follows it).
    if (f["finish_reason"] == "length" && f["calls"].empty() && f["thinking"].get<bool>()) continue;
    ASSERT_GE(f["calls"].size(), 1u) << f.dump();
    ++with_calls;
    for (const json& c : f["calls"]) {
      EXPECT_TRUE(c["valid"].get<bool>()) << f.dump();
      if (f["choice"] == "add") EXPECT_EQ(c["name"], "add") << f.dump();
    }
    if (f["choice"] == "add") EXPECT_EQ(f["calls"].size(), 1u) << f.dump();
  }
  EXPECT_GE(with_calls, 7) << r["forced"].dump();
  EXPECT_EQ(r["unsupported"].value("status", 0), 400) << r["unsupported"].dump();
  EXPECT_NE(r["unsupported"].value("error", "").find("'not'"), std::string::npos);
}

}  // namespace
}  // namespace swaserve
