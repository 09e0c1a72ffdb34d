// The config error paths as a user meets them: through the real CLI binary.
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"

namespace swaserve::base {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct CliResult {
  int code;
  std::string output;
};

CliResult Cli(std::vector<std::string> args) {
  args.insert(args.begin(), SWASERVE_CLI_PATH);
  CliResult r;
  absl::StatusOr<int> code = RunCommand(args, &r.output, absl::Seconds(30));
  EXPECT_TRUE(code.ok()) << code.status();
  r.code = code.ok() ? *code : -1;
  return r;
}

class ConfigCliTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    if (dir_.empty()) dir_ = *MakeTempDir("config-cli");
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigCliTest, GoodConfigAndFlagsWork) {
  std::string path = Write("ok.yaml", "page_size: 2\ntokens: [1, 2, 3, 4]\n");
  CliResult r = Cli({"page-hashes", "--config", path});
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("0 "));
  EXPECT_THAT(r.output, HasSubstr("1 "));
  CliResult flags = Cli({"page-hashes", "--config=" + path, "--page-size=4"});
  EXPECT_EQ(flags.code, 0);
  EXPECT_THAT(flags.output, Not(HasSubstr("1 ")));  // one page of 4 now
}

TEST_F(ConfigCliTest, UnknownKeyExitsTwoNamingTheKey) {
  std::string path = Write("bad.yaml", "page_size: 2\npage_szie: 3\n");
  CliResult r = Cli({"page-hashes", "--config", path});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown key 'page_szie'"));
  EXPECT_THAT(r.output, HasSubstr("bad.yaml"));
  EXPECT_THAT(r.output, HasSubstr("--help"));
}

TEST_F(ConfigCliTest, WrongTypeExitsTwoNamingTheKey) {
  std::string path = Write("bad.json", R"({"page_size": "sixteen"})");
  CliResult r = Cli({"page-hashes", "--config", path});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("key 'page_size': expected an integer, got 'sixteen'"));
  CliResult flag = Cli({"page-hashes", "--tokens=1,x"});
  EXPECT_EQ(flag.code, 2);
  EXPECT_THAT(flag.output, HasSubstr("key 'tokens'"));
}

TEST_F(ConfigCliTest, MissingFileExitsTwo) {
  CliResult r = Cli({"page-hashes", "--config", "/nonexistent/cluster.yaml"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.output, HasSubstr("cannot read config file '/nonexistent/cluster.yaml'"));
}

TEST_F(ConfigCliTest, MalformedFileAndBadFlagsExitTwo) {
  CliResult yaml = Cli({"page-hashes", "--config", Write("broken.yaml", "tokens: [1,\n")});
  EXPECT_EQ(yaml.code, 2);
  EXPECT_THAT(yaml.output, HasSubstr("invalid YAML"));
  CliResult flag = Cli({"page-hashes", "--no-such-flag"});
  EXPECT_EQ(flag.code, 2);
  EXPECT_THAT(flag.output, HasSubstr("unknown flag '--no-such-flag'"));
  CliResult cmd = Cli({"frobnicate"});
  EXPECT_EQ(cmd.code, 2);
  EXPECT_THAT(cmd.output, HasSubstr("unknown command 'frobnicate'"));
}

TEST_F(ConfigCliTest, HelpExitsZero) {
  CliResult top = Cli({"--help"});
  EXPECT_EQ(top.code, 0);
  EXPECT_THAT(top.output, HasSubstr("page-hashes"));
  CliResult sub = Cli({"page-hashes", "--help"});
  EXPECT_EQ(sub.code, 0);
  EXPECT_THAT(sub.output, HasSubstr("--page_size (int, default 16)"));
}

}  // namespace
}  // namespace swaserve::base
