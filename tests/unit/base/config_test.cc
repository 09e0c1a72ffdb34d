#include "lib/base/config.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"

namespace swaserve::base {
namespace {

using ::testing::HasSubstr;

struct Options {
  int64_t port = 8080;
  uint32_t workers = 4;
  int32_t small = 1;
  bool verbose = false;
  double ratio = 0.5;
  std::string name = "router";
  std::vector<std::string> hosts;
  std::vector<int64_t> buckets = {65536, 262144};
  absl::Duration timeout = absl::Seconds(5);
  std::string redis_address = "127.0.0.1:6379";
  int64_t redis_db = 0;
};

class ConfigTest : public ::testing::Test {
 protected:
  ConfigTest() : config_("test-prog", "A test program.") {
    config_.Add("port", &o_.port, "port")
        .Add("workers", &o_.workers, "worker count")
        .Add("small", &o_.small, "an int32")
        .Add("verbose", &o_.verbose, "chatty")
        .Add("ratio", &o_.ratio, "a ratio")
        .Add("name", &o_.name, "a name")
        .Add("hosts", &o_.hosts, "hosts")
        .Add("buckets", &o_.buckets, "bucket bounds")
        .Add("timeout", &o_.timeout, "a timeout")
        .Add("redis.address", &o_.redis_address, "redis host:port")
        .Add("redis.db", &o_.redis_db, "redis db");
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    if (dir_.empty()) dir_ = *MakeTempDir("config-test");
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  absl::Status Parse(std::vector<const char*> args) {
    args.insert(args.begin(), "prog");
    return config_.ParseArgs(static_cast<int>(args.size()), args.data(), &positional_);
  }

  Options o_;
  Config config_;
  std::string dir_;
  std::vector<std::string> positional_;
};

TEST_F(ConfigTest, DefaultsStayWithoutInput) {
  ASSERT_TRUE(Parse({}).ok());
  EXPECT_EQ(o_.port, 8080);
  EXPECT_EQ(o_.redis_address, "127.0.0.1:6379");
}

TEST_F(ConfigTest, YamlFileSetsEveryType) {
  std::string path = WriteFile("c.yaml", R"(
port: 9000
workers: 16
verbose: yes
ratio: 0.25
name: "prefill-0"
hosts: [a, b]
buckets:
  - 1
  - 2
timeout: 250ms
redis:
  address: 10.0.0.1:6380
  db: 3
)");
  ASSERT_TRUE(config_.LoadFile(path).ok());
  EXPECT_EQ(o_.port, 9000);
  EXPECT_EQ(o_.workers, 16u);
  EXPECT_TRUE(o_.verbose);
  EXPECT_DOUBLE_EQ(o_.ratio, 0.25);
  EXPECT_EQ(o_.name, "prefill-0");
  EXPECT_THAT(o_.hosts, ::testing::ElementsAre("a", "b"));
  EXPECT_THAT(o_.buckets, ::testing::ElementsAre(1, 2));
  EXPECT_EQ(o_.timeout, absl::Milliseconds(250));
  EXPECT_EQ(o_.redis_address, "10.0.0.1:6380");
  EXPECT_EQ(o_.redis_db, 3);
}

TEST_F(ConfigTest, JsonFileSetsValues) {
  std::string path = WriteFile(
      "c.json", R"({"port": 1234, "verbose": true, "redis": {"db": 2}, "hosts": ["x"]})");
  ASSERT_TRUE(config_.LoadFile(path).ok());
  EXPECT_EQ(o_.port, 1234);
  EXPECT_TRUE(o_.verbose);
  EXPECT_EQ(o_.redis_db, 2);
  EXPECT_THAT(o_.hosts, ::testing::ElementsAre("x"));
}

TEST_F(ConfigTest, FlagsOverrideFileWhereverConfigAppears) {
  std::string path = WriteFile("c.yaml", "port: 9000\nname: fromfile\n");
  ASSERT_TRUE(Parse({"--port=7000", "--config", path.c_str(), "--redis.db", "5",
                     "--hosts=a,b,c", "--verbose", "pos1"})
                  .ok());
  EXPECT_EQ(o_.port, 7000);  // flag beats file even though it came first
  EXPECT_EQ(o_.name, "fromfile");
  EXPECT_EQ(o_.redis_db, 5);
  EXPECT_THAT(o_.hosts, ::testing::ElementsAre("a", "b", "c"));
  EXPECT_TRUE(o_.verbose);
  EXPECT_THAT(positional_, ::testing::ElementsAre("pos1"));
}

TEST_F(ConfigTest, DashesAndNegatedBools) {
  ASSERT_TRUE(Parse({"--verbose", "--no-verbose", "--redis.address=h:1"}).ok());
  EXPECT_FALSE(o_.verbose);
  EXPECT_EQ(o_.redis_address, "h:1");
}

TEST_F(ConfigTest, UnknownKeyInFileNamesKeyAndFile) {
  std::string path = WriteFile("c.yaml", "port: 1\nprot: 2\nredis:\n  adress: x\n");
  absl::Status s = config_.LoadFile(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unknown key 'prot'"));
  EXPECT_THAT(s.message(), HasSubstr("unknown key 'redis.adress'"));
  EXPECT_THAT(s.message(), HasSubstr("c.yaml"));
}

TEST_F(ConfigTest, WrongTypesNameTheKey) {
  struct Case {
    std::string file;
    std::string expect;
  } cases[] = {
      {"port: abc\n", "key 'port': expected an integer, got 'abc'"},
      {"port: 1.5\n", "key 'port': expected an integer"},
      {"verbose: maybe\n", "key 'verbose': expected a boolean"},
      {"ratio: [1]\n", "key 'ratio': expected a number, got a list"},
      {"redis: 5\n", "key 'redis': is a section"},
      {"port: {a: 1}\n", "key 'port': expected a value, got a mapping"},
      {"timeout: 5\n", "key 'timeout': expected a duration"},
      {"workers: -1\n", "key 'workers': expected a non-negative integer"},
      {"small: 99999999999\n", "key 'small': 99999999999 is out of range"},
      {"buckets: [1, x]\n", "key 'buckets': expected an integer, got 'x' (in a list)"},
      {"port:\n", "key 'port': has no value"},
      {"- a\n- b\n", "top level must be a mapping"},
  };
  for (const Case& c : cases) {
    std::string path = WriteFile("bad.yaml", c.file);
    absl::Status s = config_.LoadFile(path);
    EXPECT_FALSE(s.ok()) << c.file;
    EXPECT_THAT(s.message(), HasSubstr(c.expect)) << c.file;
  }
  std::string path = WriteFile("bad.json", R"({"port": "80", "name": 5})");
  absl::Status s = config_.LoadFile(path);
  EXPECT_THAT(s.message(), HasSubstr("key 'port': expected an integer, got '80'"));
  EXPECT_THAT(s.message(), HasSubstr("key 'name': expected a string, got '5'"));
}

TEST_F(ConfigTest, MissingAndUnparsableFiles) {
  absl::Status s = config_.LoadFile("/nonexistent/swaserve.yaml");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/swaserve.yaml"));
  std::string yaml = WriteFile("broken.yaml", "port: [1, 2\n");
  s = config_.LoadFile(yaml);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("invalid YAML"));
  std::string json = WriteFile("broken.json", "{\"port\": ");
  s = config_.LoadFile(json);
  EXPECT_THAT(s.message(), HasSubstr("invalid JSON"));
}

TEST_F(ConfigTest, FlagErrors) {
  EXPECT_THAT(Parse({"--nope=1"}).message(), HasSubstr("unknown flag '--nope'"));
  EXPECT_THAT(Parse({"--port=x"}).message(),
              HasSubstr("flag --port: key 'port': expected an integer"));
  EXPECT_THAT(Parse({"--port"}).message(), HasSubstr("needs a value"));
  EXPECT_THAT(Parse({"--config"}).message(), HasSubstr("needs a file name"));
  EXPECT_THAT(Parse({"-x"}).message(), HasSubstr("unknown flag '-x'"));
  Config strict("p", "d");
  const char* args[] = {"p", "stray"};
  EXPECT_THAT(strict.ParseArgs(2, args).message(), HasSubstr("unexpected argument 'stray'"));
}

TEST_F(ConfigTest, FlagThatFailsLeavesValueUnchanged) {
  ASSERT_FALSE(Parse({"--buckets=1,x"}).ok());
  EXPECT_THAT(o_.buckets, ::testing::ElementsAre(65536, 262144));
}

TEST_F(ConfigTest, HelpAndUsage) {
  ASSERT_TRUE(Parse({"--help"}).ok());
  EXPECT_TRUE(config_.help_requested());
  std::string usage = config_.Usage();
  EXPECT_THAT(usage, HasSubstr("--redis.address (string, default \"127.0.0.1:6379\")"));
  EXPECT_THAT(usage, HasSubstr("--timeout (duration, default 5s)"));
  EXPECT_THAT(config_.Dump(), HasSubstr("port = 8080"));
}

// ChangedFlags round-trips: parsing them into a fresh config with the same
// options reproduces every value, and only changed options are listed.
TEST_F(ConfigTest, ChangedFlagsReproduceTheConfiguration) {
  EXPECT_TRUE(config_.ChangedFlags().empty());
  ASSERT_TRUE(Parse({"--port=9", "--verbose", "--name=a b", "--hosts=x,y", "--buckets=1,2,3",
                     "--timeout=250ms", "--redis.db=3", "--ratio=0.25"})
                  .ok());
  const std::vector<std::string> flags = config_.ChangedFlags();
  EXPECT_THAT(flags, ::testing::ElementsAre("--port=9", "--verbose=true", "--ratio=0.25",
                                            "--name=a b", "--hosts=x,y", "--buckets=1,2,3",
                                            "--timeout=250ms", "--redis.db=3"));
  Options copy;
  Config again("again", "");
  again.Add("port", &copy.port, "").Add("workers", &copy.workers, "")
      .Add("small", &copy.small, "").Add("verbose", &copy.verbose, "")
      .Add("ratio", &copy.ratio, "").Add("name", &copy.name, "")
      .Add("hosts", &copy.hosts, "").Add("buckets", &copy.buckets, "")
      .Add("timeout", &copy.timeout, "").Add("redis.address", &copy.redis_address, "")
      .Add("redis.db", &copy.redis_db, "");
  std::vector<const char*> argv = {"again"};
  for (const std::string& f : flags) argv.push_back(f.c_str());
  ASSERT_TRUE(again.ParseArgs(static_cast<int>(argv.size()), argv.data()).ok());
  EXPECT_EQ(again.Dump(), config_.Dump());
}

TEST(ConfigDeathTest, ClashingDeclarationsAbort) {
  int64_t a = 0, b = 0;
  EXPECT_DEATH(
      {
        Config c("p", "d");
        c.Add("x", &a, "").Add("x.y", &b, "");
      },
      "clashes");
}

}  // namespace
}  // namespace swaserve::base

namespace swaserve::base {
namespace {

// Found by config_fuzzer: a YAML complex key used to throw out of LoadString.
TEST(ConfigRegression, ComplexYamlKeyIsAnErrorNotACrash) {
  int64_t port = 0;
  Config c("p", "d");
  c.Add("port", &port, "");
  absl::Status s = c.LoadString("? [a, b]\n: 1\nport: 2\n", "k.yaml");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("not a plain name"));
  s = c.LoadString("a:\n  ? {x: 1}\n  : 2\n", "k.yaml");
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace swaserve::base

namespace swaserve::base {
namespace {

// Found by config_fuzzer: a JSON number overflow throws out_of_range, which
// used to escape LoadString.
TEST(ConfigRegression, JsonNumberOverflowIsAnErrorNotACrash) {
  double d = 0;
  Config c("p", "d");
  c.Add("d", &d, "");
  absl::Status s = c.LoadString("{\"d\": 1e999999}", "n.json");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("invalid JSON"));
  s = c.LoadString(".6e9200000795565 62t=", "n.json");
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace swaserve::base
