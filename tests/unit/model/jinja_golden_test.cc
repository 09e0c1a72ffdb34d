// Byte-identical renders against @huggingface/jinja: the goldens of
// tools/chat_template_golden/make_golden.js (tests/fixtures/chat_templates/
// goldens.json) — the real Qwen3, DeepSeek-V3 and MiMo-V2.5 chat templates
// over many conversations, and hand-written templates feature by feature.
// Where @huggingface/jinja throws, the C++ render must fail too (and a
// raise_exception must carry the template's own message).
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/model/jinja/template.h"
#include "nlohmann/json.hpp"

namespace swaserve::model::jinja {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kDir[] = SWASERVE_SOURCE_DIR "/tests/fixtures/chat_templates/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Json LoadGoldens(const std::string& file) {
  return Json::parse(ReadFile(std::string(kDir) + file), nullptr,
                     /*allow_exceptions=*/false);
}

class JinjaGoldenTest : public ::testing::Test {
 protected:
  void SetUp() override { Load("goldens.json"); }
  void Load(const std::string& file) {
    goldens_ = LoadGoldens(file);
    ASSERT_FALSE(goldens_.is_discarded()) << "cannot parse " << file;
    for (const auto& [name, file] : goldens_["header"]["templates"].items()) {
      sources_[name] = ReadFile(std::string(kDir) + file.get<std::string>());
      ASSERT_FALSE(sources_[name].empty()) << file;
    }
  }

  // Renders every golden case of `template_name` ("inline": the case's own
  // source); returns the number of cases checked.
  int Check(const std::string& template_name) {
    int checked = 0;
    for (const Json& c : goldens_["cases"]) {
      if (c["template"] != template_name) continue;
      ++checked;
      const std::string name = c["name"].get<std::string>();
      const std::string source = template_name == "inline"
                                     ? c["source"].get<std::string>()
                                     : sources_[template_name];
      absl::StatusOr<Rendered> out = absl::InternalError("not parsed");
      absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(source);
      if (t.ok()) {
        out =
            (*t)->Render(c.contains("context") ? c["context"]
                                               : goldens_["header"]["context"]);
      }
      if (c.contains("error")) {
        const std::string expected = c["error"].get<std::string>();
        EXPECT_FALSE(out.ok())
            << name << ": @huggingface/jinja fails with \"" << expected
            << "\" but this renders \"" << (out.ok() ? out->text : "") << "\"";
        if (!out.ok() && out.status().GetPayload(kRaisedPayload).has_value()) {
          EXPECT_EQ(out.status().message(), expected) << name;
        }
        continue;
      }
      if (!t.ok()) {
        ADD_FAILURE() << name << ": parse: " << t.status();
        continue;
      }
      if (!out.ok()) {
        ADD_FAILURE() << name << ": render: " << out.status();
        continue;
      }
      EXPECT_EQ(out->text, c["text"].get<std::string>()) << name;
    }
    return checked;
  }

  Json goldens_;
  std::map<std::string, std::string> sources_;
};

TEST_F(JinjaGoldenTest, Qwen3) { EXPECT_GE(Check("qwen3"), 20); }
TEST_F(JinjaGoldenTest, DeepSeekV3) { EXPECT_GE(Check("deepseek_v3"), 20); }
TEST_F(JinjaGoldenTest, MiMoV25) { EXPECT_GE(Check("mimo_v2_5"), 20); }
TEST_F(JinjaGoldenTest, Features) { EXPECT_GE(Check("inline"), 80); }

// Seeded random templates over the whole grammar (make_golden.js --random):
// successes and failures alike must agree with @huggingface/jinja.
TEST_F(JinjaGoldenTest, RandomTemplates) {
  Load("random_goldens.json");
  int failures = 0;
  for (const Json& c : goldens_["cases"]) failures += c.contains("error");
  EXPECT_GE(Check("inline"), 1000);
  EXPECT_GE(failures, 100);  // both outcomes are exercised
  EXPECT_LE(failures, static_cast<int>(goldens_["cases"].size()) - 500);
}

// A long conversation (about 4 MB, 2000 turns) renders within the default
// limits, with the real templates.
TEST_F(JinjaGoldenTest, LongConversationsFitTheDefaultLimits) {
  Json messages = Json::array();
  const std::string turn(2000, 'x');
  for (int i = 0; i < 2000; ++i) {
    messages.push_back({{"role", i % 2 == 0 ? "user" : "assistant"},
                        {"content", turn + std::to_string(i)}});
  }
  for (const char* name : {"qwen3", "deepseek_v3", "mimo_v2_5"}) {
    auto t = Template::Parse(sources_[name]);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    Json context = {{"messages", messages},
                    {"tools", nullptr},
                    {"add_generation_prompt", true}};
    auto r = (*t)->Render(context);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_GT(r->text.size(), 2000u * 2000u) << name;
    // Every message's content came from the data.
    size_t untrusted = 0;
    for (const ByteRange& b : r->untrusted) untrusted += b.end - b.begin;
    EXPECT_GE(untrusted, 2000u * 2000u) << name;
  }
}

TEST_F(JinjaGoldenTest, EveryCaseBelongsToAKnownTemplate) {
  int total = 0;
  for (const char* name : {"qwen3", "deepseek_v3", "mimo_v2_5", "inline"}) {
    for (const Json& c : goldens_["cases"]) total += c["template"] == name;
  }
  EXPECT_EQ(total, static_cast<int>(goldens_["cases"].size()));
  EXPECT_EQ(goldens_["header"]["count"].get<int>(), total);
}

}  // namespace
}  // namespace swaserve::model::jinja
