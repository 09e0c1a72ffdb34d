// RedisClient against a real redis-server: commands, pipelines, binary
// values, scripts (load once, reload after SCRIPT FLUSH and after a restart),
// AUTH (password, password file, ACL user, rotation), concurrent callers, and
// Redis being killed and restarted.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/redis_client.h"
#include "lib/metrics/registry.h"
#include "tests/integration/cluster/redis_server.h"

namespace swaserve::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class RedisClientIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<RedisClient> NewClient(RedisOptions options) {
    auto client = RedisClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<testing::RedisServer> server_;
};

TEST_F(RedisClientIntegrationTest, CommandsPipelinesAndBinaryValues) {
  auto redis = NewClient(server_->ClientOptions());
  const std::string binary("\0\r\n\xff$*", 6);
  ASSERT_TRUE(redis->Command({"SET", "k", binary}).ok());
  absl::StatusOr<RedisReply> got = redis->Command({"GET", "k"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->str, binary);
  absl::StatusOr<std::vector<RedisReply>> replies =
      redis->Pipeline({{"DEL", "n"},
                       {"INCR", "n"},
                       {"INCR", "n"},
                       {"LPUSH", "k", "x"},
                       {"HSET", "h", "f", "v"},
                       {"HGETALL", "h"},
                       {"GET", "missing"}},
                      "test");
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 7u);
  EXPECT_EQ((*replies)[2].integer, 2);
  EXPECT_TRUE((*replies)[3].is_error());  // WRONGTYPE, in place
  EXPECT_EQ((*replies)[3].ToStatus().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ((*replies)[5].elements.size(), 2u);
  EXPECT_EQ((*replies)[5].elements[1].str, "v");
  EXPECT_TRUE((*replies)[6].is_nil());
  // A command error does not poison the connection.
  EXPECT_EQ(redis->Command({"NOSUCHCOMMAND"}).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(redis->Ping().ok());
}

TEST_F(RedisClientIntegrationTest, ScriptsReloadAfterFlushAndRestart) {
  auto redis = NewClient(server_->ClientOptions());
  const RedisScript script{"sum_args", R"lua(
local s = 0
for i = 1, #ARGV do s = s + tonumber(ARGV[i]) end
return {#KEYS, s}
)lua"};
  auto run = [&]() -> absl::StatusOr<int64_t> {
    absl::StatusOr<RedisReply> r =
        redis->Evalsha(script, {"a", "b"}, {"1", "2", "39"});
    if (!r.ok()) return r.status();
    EXPECT_EQ(r->elements.at(0).integer, 2);
    return r->elements.at(1).integer;
  };
  ASSERT_EQ(*run(), 42);
  // The sha the client uses is the server's.
  absl::StatusOr<RedisReply> sha =
      redis->Command({"SCRIPT", "LOAD", script.source});
  ASSERT_TRUE(sha.ok());
  auto exists = [&] {
    return redis->Command({"SCRIPT", "EXISTS", sha->str})->elements[0].integer;
  };
  EXPECT_EQ(exists(), 1);
  ASSERT_TRUE(redis->Command({"SCRIPT", "FLUSH"}).ok());
  EXPECT_EQ(exists(), 0);
  ASSERT_EQ(*run(), 42);  // NOSCRIPT -> reload -> retry, transparently
  EXPECT_EQ(exists(), 1);

  ASSERT_TRUE(server_->Kill().ok());
  ASSERT_TRUE(server_->Restart().ok());
  // The first call on the dead connection fails (the client cannot know
  // whether it ran); the next reconnects and reloads the script.
  absl::StatusOr<int64_t> after = run();
  if (!after.ok()) {
    EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
    after = run();
  }
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, 42);
  // A script error is reported with the script's name.
  const RedisScript broken{"broken", "return redis.call('NOSUCHCMD')"};
  absl::Status s = redis->Evalsha(broken, {}, {}).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("broken"));
}

TEST_F(RedisClientIntegrationTest, DownThenBackWithinOneBackoff) {
  metrics::Registry registry;
  RedisOptions options = server_->ClientOptions();
  options.metrics = &registry;
  auto redis = NewClient(options);
  ASSERT_TRUE(redis->Ping().ok());
  ASSERT_TRUE(server_->Kill().ok());
  // Down: every call fails quickly with Unavailable, never hangs.
  int failed = 0;
  for (int i = 0; i < 20; ++i) {
    const absl::Time t0 = absl::Now();
    absl::Status s = redis->Ping();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("127.0.0.1:", server_->port())));
    EXPECT_LT(absl::Now() - t0, absl::Milliseconds(500));
    failed += !s.ok();
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(server_->Restart().ok());
  const absl::Time back = absl::Now();
  while (!redis->Ping().ok()) {
    ++failed;
    ASSERT_LT(absl::Now() - back, absl::Seconds(2));
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Back within the maximum backoff (200 ms) plus scheduling slack.
  EXPECT_LT(absl::Now() - back, absl::Milliseconds(600));
  // Every failed call was counted, and every call timed.
  const std::string text = registry.RenderText();
  EXPECT_THAT(
      text, HasSubstr(absl::StrCat("swaserve_redis_errors_total{op=\"ping\"} ",
                                   failed, "\n")));
  EXPECT_THAT(
      text, HasSubstr(absl::StrCat("swaserve_redis_seconds_count{op=\"ping\"} ",
                                   failed + 2, "\n")));
}

// A hung server (SIGSTOP: connections stay open, nothing answers): the
// first call waits command_timeout; the calls after it fail fast on every
// other pooled connection instead of each waiting command_timeout too, until
// the backoff ends; once the server answers again, calls succeed.
TEST_F(RedisClientIntegrationTest, AHungServerCostsOneTimeoutNotOnePerConnection) {
  RedisOptions options = server_->ClientOptions();
  options.pool_size = 4;
  options.command_timeout = absl::Milliseconds(300);
  options.reconnect_backoff_initial = absl::Milliseconds(500);
  options.reconnect_backoff_max = absl::Seconds(1);
  auto redis = NewClient(options);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(redis->Ping().ok());  // opens the pool
  ASSERT_EQ(kill(server_->pid(), SIGSTOP), 0);
  absl::Time t0 = absl::Now();
  EXPECT_EQ(redis->Ping().code(), absl::StatusCode::kUnavailable);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(250));
  for (int i = 0; i < 6; ++i) {
    t0 = absl::Now();
    const absl::Status s = redis->Ping();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_LT(absl::Now() - t0, absl::Milliseconds(100)) << "call " << i << ": " << s;
  }
  ASSERT_EQ(kill(server_->pid(), SIGCONT), 0);
  const absl::Time back = absl::Now();
  while (!redis->Ping().ok()) {
    ASSERT_LT(absl::Now() - back, absl::Seconds(5));
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(redis->Ping().ok());
}

TEST_F(RedisClientIntegrationTest, PasswordProtectedServer) {
  auto server = testing::RedisServer::Start({"--requirepass", "s3cret"});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options = (*server)->ClientOptions();
  auto anonymous = NewClient(options);
  absl::Status s = anonymous->Ping();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("password"));
  options.password = "wrong";
  EXPECT_THAT(NewClient(options)->Ping().message(), HasSubstr("WRONGPASS"));
  options.password = "s3cret";
  options.db = 2;
  auto authed = NewClient(options);
  ASSERT_TRUE(authed->Command({"SET", "k", "db2"}).ok());
  absl::StatusOr<RedisReply> info = authed->Command({"CLIENT", "INFO"});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->str, HasSubstr("db=2"));
}

// A password file in a fresh temporary directory (a mounted Secret's file).
std::string WritePasswordFile(const std::string& content) {
  static const std::string dir = *base::MakeTempDir("redis-auth-test");
  static int n = 0;
  const std::string path = absl::StrCat(dir, "/password-", n++);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST_F(RedisClientIntegrationTest, PasswordFileAndAclUser) {
  auto server = testing::RedisServer::Start({"--requirepass", "s3cret"});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options = (*server)->ClientOptions();
  // None given: the start-up check names what to set.
  absl::Status none = NewClient(options)->CheckCredentials();
  EXPECT_EQ(none.code(), absl::StatusCode::kPermissionDenied) << none;
  EXPECT_THAT(none.message(), HasSubstr("NOAUTH"));
  EXPECT_THAT(none.message(), HasSubstr("--redis_password_file"));
  // A wrong one: AUTH refused, as PermissionDenied (not "is Redis running?").
  options.password_file = WritePasswordFile("n0t-it\n");
  auto wrong = NewClient(options);
  absl::Status refused = wrong->CheckCredentials();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("AUTH refused"));
  EXPECT_THAT(refused.message(), HasSubstr("WRONGPASS"));
  EXPECT_THAT(refused.message(), Not(HasSubstr("n0t-it")));
  // The right one (a file written with a trailing newline, as `echo` does).
  options.password_file = WritePasswordFile("s3cret\n");
  auto authed = NewClient(options);
  ASSERT_TRUE(authed->CheckCredentials().ok());
  ASSERT_TRUE(authed->Command({"SET", "k", "v"}).ok());
  // An ACL user with its own password.
  ASSERT_TRUE(authed
                  ->Command({"ACL", "SETUSER", "router", "on", ">r0uter", "~*",
                             "&*", "+@all"})
                  .ok());
  options.username = "router";
  options.password_file = WritePasswordFile("r0uter");
  auto user = NewClient(options);
  ASSERT_TRUE(user->CheckCredentials().ok());
  absl::StatusOr<RedisReply> whoami = user->Command({"ACL", "WHOAMI"});
  ASSERT_TRUE(whoami.ok()) << whoami.status();
  EXPECT_EQ(whoami->str, "router");
  options.username = "nobody";
  EXPECT_EQ(NewClient(options)->CheckCredentials().code(),
            absl::StatusCode::kPermissionDenied);
  // A Redis that is not up is no credential error (the client reconnects).
  ASSERT_TRUE((*server)->Kill().ok());
  EXPECT_TRUE(NewClient(options)->CheckCredentials().ok());
}

TEST_F(RedisClientIntegrationTest, RotatedPasswordFileIsUsedOnReconnect) {
  auto server = testing::RedisServer::Start({"--requirepass", "old"});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions options = (*server)->ClientOptions();
  const std::string file = WritePasswordFile("old\n");
  options.password_file = file;
  auto client = NewClient(options);
  ASSERT_TRUE(client->Ping().ok());
  // The operator rotates: the Secret's file first, then the server, which
  // drops its clients.
  std::ofstream(file, std::ios::binary | std::ios::trunc) << "new\n";
  RedisOptions admin_options = (*server)->ClientOptions();
  admin_options.password = "old";
  auto admin = NewClient(admin_options);
  ASSERT_TRUE(admin->Command({"CONFIG", "SET", "requirepass", "new"}).ok());
  (void)admin->Command({"CLIENT", "KILL", "TYPE", "normal"});
  const absl::Time start = absl::Now();
  absl::Status s;
  while (!(s = client->Ping()).ok()) {
    ASSERT_LT(absl::Now() - start, absl::Seconds(5)) << s;
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::StatusOr<RedisReply> got =
      client->Command({"SET", "after", "rotation"});
  EXPECT_TRUE(got.ok()) << got.status();
}

// 8 threads, each 200 pipelines {INCR <prefix><t>, GET <prefix><t>};
// returns how many came back right (INCR's count, and GET seeing it).
int RunIncrGetCallers(RedisClient* redis, absl::string_view prefix) {
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string key = absl::StrCat(prefix, t);
        absl::StatusOr<std::vector<RedisReply>> r =
            redis->Pipeline({{"INCR", key}, {"GET", key}}, "incr");
        if (r.ok() && (*r)[0].integer == i + 1 && (*r)[1].str == absl::StrCat(i + 1)) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  return ok;
}

TEST_F(RedisClientIntegrationTest, ConcurrentCallersShareThePool) {
  RedisOptions options = server_->ClientOptions();
  options.pool_size = 4;
  auto redis = NewClient(options);
  EXPECT_EQ(RunIncrGetCallers(redis.get(), "t"), 8 * 200);
  absl::StatusOr<RedisReply> clients = redis->Command({"CLIENT", "LIST"});
  ASSERT_TRUE(clients.ok());
  int n = 0;
  for (size_t p = 0; (p = clients->str.find("cmd=", p)) != std::string::npos;
       ++p) {
    ++n;
  }
  EXPECT_GE(n, 1);
  EXPECT_LE(n, 4);
}

// Group commit against a real Redis: 8 callers, one pipeline in flight;
// every caller's INCR/GET pair stays adjacent and its own (GET sees its INCR).
TEST_F(RedisClientIntegrationTest, CoalescedCallersKeepTheirOwnReplies) {
  RedisOptions options = server_->ClientOptions();
  options.pool_size = 2;
  options.coalesce_calls = true;
  options.coalesce_in_flight = 1;
  auto redis = NewClient(options);
  EXPECT_EQ(RunIncrGetCallers(redis.get(), "c"), 8 * 200);
}

}  // namespace
}  // namespace swaserve::cluster
