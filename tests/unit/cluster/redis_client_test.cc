// RedisClient without a Redis server: RESP decoding, error mapping, option
// checks, fail-fast backoff (FakeClock), and the client's wire behaviour
// against an in-process fake server that answers scripted replies.
#include "lib/cluster/redis_client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/clock.h"
#include "lib/base/subprocess.h"
#include "lib/metrics/registry.h"

namespace swaserve::cluster {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using Type = RedisReply::Type;
using namespace std::string_literals;

// ---------------------------------------------------------------------------
// RESP decoding and reply helpers.

TEST(ParseRedisReplies, DecodesEveryReplyType) {
  const std::string resp =
      "+OK\r\n-ERR bad thing\r\n:42\r\n:-7\r\n$5\r\nhe\0lo\r\n$-1\r\n"
      "*-1\r\n*0\r\n*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n+x\r\n"
      "$0\r\n\r\n"s;
  absl::StatusOr<std::vector<RedisReply>> r = ParseRedisReplies(resp);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 10u);
  const std::vector<RedisReply>& v = *r;
  EXPECT_EQ(v[0].type, Type::kStatus);
  EXPECT_EQ(v[0].str, "OK");
  EXPECT_EQ(v[1].type, Type::kError);
  EXPECT_EQ(v[1].str, "ERR bad thing");
  EXPECT_EQ(v[2].integer, 42);
  EXPECT_EQ(v[3].integer, -7);
  EXPECT_EQ(v[4].type, Type::kString);
  EXPECT_EQ(v[4].str, std::string("he\0lo", 5));
  EXPECT_TRUE(v[5].is_nil());
  EXPECT_TRUE(v[6].is_nil());
  EXPECT_TRUE(v[7].is_array());
  EXPECT_TRUE(v[7].elements.empty());
  ASSERT_TRUE(v[8].is_array());
  ASSERT_EQ(v[8].elements.size(), 3u);
  EXPECT_EQ(v[8].elements[0].integer, 1);
  ASSERT_EQ(v[8].elements[1].elements.size(), 2u);
  EXPECT_EQ(v[8].elements[1].elements[0].str, "a");
  EXPECT_TRUE(v[8].elements[1].elements[1].is_nil());
  EXPECT_EQ(v[8].elements[2].type, Type::kStatus);
  EXPECT_EQ(v[9].type, Type::kString);
  EXPECT_EQ(v[9].str, "");
}

TEST(ParseRedisReplies, RejectsIncompleteAndMalformedInput) {
  EXPECT_TRUE(ParseRedisReplies("")->empty());
  EXPECT_EQ(ParseRedisReplies("+OK\r\n$5\r\nab").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseRedisReplies("*2\r\n:1\r\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseRedisReplies("?what\r\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An array whose declared count the input cannot hold is refused before
// hiredis 0.14 allocates its element table (redis_cluster_fuzzer: 4 GB for
// "*500000061"); a bulk string's bytes are not read as headers; honest
// arrays, nested and empty, still parse.
TEST(ParseRedisReplies, RefusesArrayCountsTheInputCannotHold) {
  absl::StatusOr<std::vector<RedisReply>> huge =
      ParseRedisReplies("*0\r\n*4\r\n:0\r\n*500000061\r\n:16383\r\n");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("500000061"), absl::string_view::npos);
  EXPECT_EQ(ParseRedisReplies("*3\r\n:1\r\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<RedisReply>> ok =
      ParseRedisReplies("$12\r\n*999999999\r\n\r\n*2\r\n*0\r\n+\r\n*-1\r\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 3u);
  EXPECT_EQ((*ok)[0].str, "*999999999\r\n");
  EXPECT_EQ((*ok)[1].elements.size(), 2u);
}

TEST(RedisReply, ErrorRepliesMapToActionableStatuses) {
  auto err = [](std::string s) {
    return RedisReply{.type = Type::kError, .str = std::move(s)};
  };
  EXPECT_TRUE(RedisReply::Integer(1).ToStatus().ok());
  EXPECT_EQ(err("NOSCRIPT No matching script").ToStatus().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(err("WRONGTYPE Operation").ToStatus().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status auth = err("NOAUTH Authentication required.").ToStatus();
  EXPECT_EQ(auth.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(auth.message(), HasSubstr("password"));
  EXPECT_EQ(err("WRONGPASS invalid").ToStatus().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(err("OOM command not allowed").ToStatus().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(err("LOADING Redis is loading").ToStatus().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(err("READONLY You can't write").ToStatus().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(err("ERR unknown command").ToStatus().code(),
            absl::StatusCode::kInternal);
}

TEST(RedisReply, TypedAccessors) {
  EXPECT_EQ(*RedisReply::Integer(5).AsInteger(), 5);
  EXPECT_EQ(*RedisReply::String("17").AsInteger(), 17);
  EXPECT_FALSE(RedisReply::String("x").AsInteger().ok());
  EXPECT_FALSE(RedisReply::Nil().AsInteger().ok());
  EXPECT_EQ(*RedisReply::String("v").AsString(), "v");
  EXPECT_FALSE(RedisReply::Integer(1).AsString().ok());
  const RedisReply noscript{.type = Type::kError, .str = "NOSCRIPT x"};
  EXPECT_EQ(noscript.AsInteger().status().code(), absl::StatusCode::kNotFound);
  const RedisReply array = RedisReply::Array(
      {RedisReply::Integer(1), RedisReply::Nil(), RedisReply::String("a\0"s)});
  EXPECT_EQ(array.DebugString(), "[(integer) 1, (nil), \"a\\x00\"]");
}

// ---------------------------------------------------------------------------
// Options and the unreachable-server path.

TEST(ParseRedisAddress, AcceptsTheCommonForms) {
  struct Case {
    std::string address, host, username, password;
    int port, db;
  };
  for (const Case& c : std::vector<Case>{
           {"redis", "redis", "", "", 6379, 0},
           {"10.0.0.5:6380", "10.0.0.5", "", "", 6380, 0},
           {"[::1]:7000", "::1", "", "", 7000, 0},
           {"[fe80::1]", "fe80::1", "", "", 6379, 0},
           {"redis://cache.svc", "cache.svc", "", "", 6379, 0},
           {"redis://:pw@cache:1234/3", "cache", "", "pw", 1234, 3},
           {"redis://router:p:w@cache", "cache", "router", "p:w", 6379, 0},
           {"redis://user:pw@[::1]:9/", "::1", "user", "pw", 9, 0},
       }) {
    RedisOptions o;
    o.command_timeout = absl::Seconds(7);
    ASSERT_TRUE(ParseRedisAddress(c.address, &o).ok()) << c.address;
    EXPECT_EQ(o.host, c.host) << c.address;
    EXPECT_EQ(o.port, c.port) << c.address;
    EXPECT_EQ(o.username, c.username) << c.address;
    EXPECT_EQ(o.password, c.password) << c.address;
    EXPECT_EQ(o.db, c.db) << c.address;
    EXPECT_EQ(o.command_timeout, absl::Seconds(7));  // untouched
  }
}

TEST(ParseRedisAddress, RejectsMalformedAddressesByName) {
  for (const char* bad :
       {"", ":6379", "host:0", "host:99999", "host:x", "::1:6379", "[::1",
        "[::1]x", "http://host", "redis://host/x", "redis://"}) {
    RedisOptions o;
    absl::Status s = ParseRedisAddress(bad, &o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("redis address")) << bad;
    EXPECT_EQ(o.host, "127.0.0.1") << bad;  // untouched on error
  }
}

TEST(RedisClient, CreateValidatesOptions) {
  EXPECT_FALSE(RedisClient::Create({.host = ""}).ok());
  EXPECT_FALSE(RedisClient::Create({.port = 0}).ok());
  EXPECT_FALSE(RedisClient::Create({.port = 70000}).ok());
  EXPECT_FALSE(
      RedisClient::Create({.command_timeout = absl::ZeroDuration()}).ok());
  EXPECT_FALSE(RedisClient::Create({.pool_size = 0}).ok());
  absl::Status s =
      RedisClient::Create({.reconnect_backoff_initial = absl::Seconds(2),
                           .reconnect_backoff_max = absl::Seconds(1)})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("reconnect_backoff"));
  // Creating never needs a server.
  EXPECT_TRUE(RedisClient::Create({.port = 1}).ok());
}

TEST(RedisClient, UnreachableServerFailsFastWithBackoff) {
  absl::StatusOr<int> port = base::PickFreePort();  // nothing listens there
  ASSERT_TRUE(port.ok()) << port.status();
  base::FakeClock clock;
  metrics::Registry registry;
  auto client =
      RedisClient::Create({.port = *port,
                           .reconnect_backoff_initial = absl::Milliseconds(50),
                           .reconnect_backoff_max = absl::Milliseconds(150),
                           .metrics = &registry,
                           .clock = &clock});
  ASSERT_TRUE(client.ok()) << client.status();
  RedisClient& redis = **client;

  absl::Status s = redis.Ping();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("connect"));
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat(
                  "is redis-server running at 127.0.0.1:", *port, "?")));
  // Within the backoff: refused without a connect attempt.
  s = redis.Command({"GET", "k"}, "get").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("next reconnect attempt in 50ms"));
  // After it: a new attempt, and the backoff doubles, up to the maximum.
  clock.Advance(absl::Milliseconds(50));
  EXPECT_THAT(redis.Ping().message(), HasSubstr("connect:"));
  EXPECT_THAT(redis.Ping().message(), HasSubstr("in 100ms"));
  clock.Advance(absl::Milliseconds(100));
  EXPECT_THAT(redis.Ping().message(), HasSubstr("connect:"));
  EXPECT_THAT(redis.Ping().message(), HasSubstr("in 150ms"));
  clock.Advance(absl::Milliseconds(150));
  EXPECT_THAT(redis.Ping().message(), HasSubstr("connect:"));
  EXPECT_THAT(redis.Ping().message(), HasSubstr("in 150ms"));

  // Errors are counted per op.
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr("swaserve_redis_errors_total{op=\"ping\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("swaserve_redis_errors_total{op=\"get\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("swaserve_redis_seconds_count{op=\"ping\"} 7\n"));
}

// ---------------------------------------------------------------------------
// A fake server on loopback: parses RESP requests, answers with `handler`.

// Parses one complete request (array of bulk strings) from the front of
// `buf`; returns false when incomplete.
bool TakeRequest(std::string* buf, std::vector<std::string>* args) {
  args->clear();
  size_t pos = 0;
  auto line = [&](std::string* out) {
    size_t end = buf->find("\r\n", pos);
    if (end == std::string::npos) return false;
    *out = buf->substr(pos, end - pos);
    pos = end + 2;
    return true;
  };
  std::string header;
  if (!line(&header) || header.empty() || header[0] != '*') return false;
  int n = 0;
  if (!absl::SimpleAtoi(header.substr(1), &n)) return false;
  for (int i = 0; i < n; ++i) {
    std::string len_line;
    if (!line(&len_line) || len_line.empty() || len_line[0] != '$') {
      return false;
    }
    size_t len = 0;
    if (!absl::SimpleAtoi(len_line.substr(1), &len)) return false;
    if (buf->size() < pos + len + 2) return false;
    args->push_back(buf->substr(pos, len));
    pos += len + 2;
  }
  buf->erase(0, pos);
  return true;
}

class FakeRedis {
 public:
  using Handler = std::function<std::string(const std::vector<std::string>&)>;

  explicit FakeRedis(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(
        bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeRedis() {
    stop_ = true;
    thread_.join();
    close(listen_fd_);
  }

  int port() const { return port_; }
  // Every request received, in order.
  std::vector<std::vector<std::string>> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  int connections() {
    absl::MutexLock lock(&mu_);
    return connections_;
  }
  // The next request closes the connection instead of answering.
  void DropNextRequest() { drop_next_ = true; }

 private:
  void Serve() {
    std::vector<std::thread> connections;
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      {
        absl::MutexLock lock(&mu_);
        ++connections_;
      }
      connections.emplace_back([this, fd] { ServeConnection(fd); });
    }
    for (std::thread& t : connections) t.join();
  }

  void ServeConnection(int fd) {
    std::string buf;
    bool open = true;
    while (open && !stop_) {
      pollfd c{fd, POLLIN, 0};
      if (poll(&c, 1, 20) <= 0) continue;
      char chunk[65536];
      const ssize_t n = read(fd, chunk, sizeof(chunk));
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
      std::vector<std::string> args;
      std::string out;
      while (TakeRequest(&buf, &args)) {
        {
          absl::MutexLock lock(&mu_);
          requests_.push_back(args);
        }
        if (drop_next_.exchange(false)) {
          open = false;
          break;
        }
        out += handler_(args);
      }
      if (!out.empty() && write(fd, out.data(), out.size()) < 0) break;
    }
    close(fd);
  }

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drop_next_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::vector<std::string>> requests_ ABSL_GUARDED_BY(mu_);
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
};

std::string Bulk(const std::string& s) {
  return absl::StrCat("$", s.size(), "\r\n", s, "\r\n");
}

TEST(RedisClientWire, SendsBinarySafeArgumentsAndPipelinesInOrder) {
  FakeRedis fake([](const std::vector<std::string>& args) -> std::string {
    if (args[0] == "ECHO") return Bulk(args[1]);
    if (args[0] == "INCR") return ":1\r\n";
    if (args[0] == "BAD") return "-ERR unknown command 'BAD'\r\n";
    return "+OK\r\n";
  });
  auto client = RedisClient::Create({.port = fake.port()});
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string binary("a\0b\r\n$3\r\n", 10);
  absl::StatusOr<RedisReply> echo = (*client)->Command({"ECHO", binary});
  ASSERT_TRUE(echo.ok()) << echo.status();
  EXPECT_EQ(echo->str, binary);

  absl::StatusOr<std::vector<RedisReply>> replies = (*client)->Pipeline(
      {{"SET", "k", "v"}, {"BAD"}, {"INCR", "n"}, {"ECHO", ""}}, "test");
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 4u);
  EXPECT_EQ((*replies)[0].str, "OK");
  EXPECT_TRUE((*replies)[1].is_error());
  EXPECT_EQ((*replies)[2].integer, 1);
  EXPECT_EQ((*replies)[3].str, "");
  // An error reply to a single command is a status.
  EXPECT_EQ((*client)->Command({"BAD"}).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(fake.connections(), 1);  // one connection reused
  EXPECT_EQ(fake.requests()[0], (std::vector<std::string>{"ECHO", binary}));
}

TEST(RedisClientWire, AuthenticatesAndSelectsAfterConnecting) {
  FakeRedis fake([](const std::vector<std::string>&) { return "+OK\r\n"; });
  auto client = RedisClient::Create({.port = fake.port(),
                                     .username = "router",
                                     .password = "s3cret",
                                     .db = 3});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Ping().ok());
  EXPECT_THAT(fake.requests(),
              ElementsAre(ElementsAre("AUTH", "router", "s3cret"),
                          ElementsAre("SELECT", "3"), ElementsAre("PING")));
}

TEST(RedisClientWire, RejectedAuthIsPermissionDenied) {
  FakeRedis fake([](const std::vector<std::string>& args) -> std::string {
    if (args[0] == "AUTH") return "-WRONGPASS invalid username-password\r\n";
    return "+OK\r\n";
  });
  auto client = RedisClient::Create({.port = fake.port(), .password = "x"});
  ASSERT_TRUE(client.ok());
  absl::Status s = (*client)->Ping();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("AUTH refused"));
  EXPECT_THAT(s.message(), HasSubstr("WRONGPASS"));
  EXPECT_THAT(s.message(), Not(HasSubstr("\"x\"")));
  EXPECT_EQ((*client)->CheckCredentials().code(),
            absl::StatusCode::kPermissionDenied);
}

// A file for RedisOptions::password_file, in a fresh temporary directory.
std::string WriteFile(const std::string& name, const std::string& content) {
  static const std::string dir = *base::MakeTempDir("redis-client-test");
  const std::string path = absl::StrCat(dir, "/", name);
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(content.data(), 1, content.size(), f);
  std::fclose(f);
  return path;
}

TEST(RedisClient, PasswordFileIsCheckedAtCreate) {
  auto code = [](const RedisOptions& o) {
    return RedisClient::Create(o).status().code();
  };
  auto message = [](const RedisOptions& o) {
    return std::string(RedisClient::Create(o).status().message());
  };
  EXPECT_EQ(code({.password_file = "/nonexistent/password"}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message({.password_file = "/nonexistent/password"}),
              HasSubstr("/nonexistent/password"));
  const std::string empty = WriteFile("empty", "\n");
  EXPECT_THAT(message({.password_file = empty}), HasSubstr("is empty"));
  const std::string two = WriteFile("two", "s3cret\nother\n");
  EXPECT_THAT(message({.password_file = two}), HasSubstr("more than one line"));
  EXPECT_THAT(message({.password_file = two}), Not(HasSubstr("s3cret")));
  const std::string good = WriteFile("good", "s3cret\r\n");
  EXPECT_EQ(code({.password_file = good}), absl::StatusCode::kOk);
  EXPECT_THAT(message({.password = "a", .password_file = good}),
              HasSubstr("exclusive"));
  EXPECT_THAT(message({.username = "router"}), HasSubstr("needs a password"));
  EXPECT_EQ(code({.username = "router", .password_file = good}),
            absl::StatusCode::kOk);
}

TEST(RedisClientWire, PasswordFileIsReadAgainOnReconnect) {
  absl::Mutex mu;
  std::string accepted = "first";
  FakeRedis fake([&](const std::vector<std::string>& args) -> std::string {
    if (args[0] == "AUTH") {
      absl::MutexLock lock(&mu);
      return args.back() == accepted
                 ? "+OK\r\n"
                 : "-WRONGPASS invalid username-password\r\n";
    }
    return "+PONG\r\n";
  });
  const std::string file = WriteFile("rotated", "first\n");
  auto client =
      RedisClient::Create({.port = fake.port(),
                           .username = "router",
                           .password_file = file,
                           .reconnect_backoff_initial = absl::Milliseconds(1),
                           .reconnect_backoff_max = absl::Milliseconds(1)});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CheckCredentials().ok());
  ASSERT_TRUE((*client)->Ping().ok());
  EXPECT_THAT(fake.requests()[0], ElementsAre("AUTH", "router", "first"));
  // The Secret is rotated: the server wants the new password, the file has it.
  {
    absl::MutexLock lock(&mu);
    accepted = "second";
  }
  WriteFile("rotated", "second\n");
  fake.DropNextRequest();
  EXPECT_FALSE((*client)->Ping().ok());  // the connection is gone
  absl::Status s;
  for (int i = 0; i < 100; ++i) {
    s = (*client)->Ping();
    if (s.ok()) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(fake.requests(),
              Contains(ElementsAre("AUTH", "router", "second")));
}

TEST(RedisClientWire, EvalshaLoadsOnceAndReloadsOnNoscript) {
  std::atomic<int> noscript_left{0};
  FakeRedis fake([&](const std::vector<std::string>& args) -> std::string {
    if (args[0] == "SCRIPT" && args[1] == "LOAD") {
      return Bulk("0123456789abcdef0123456789abcdef01234567");
    }
    if (args[0] == "EVALSHA") {
      if (noscript_left > 0) {
        --noscript_left;
        return "-NOSCRIPT No matching script. Please use EVAL.\r\n";
      }
      // Echo the number of keys and the first arg.
      return absl::StrCat("*2\r\n:", args[2], "\r\n", Bulk(args.back()));
    }
    return "+OK\r\n";
  });
  auto client = RedisClient::Create({.port = fake.port()});
  ASSERT_TRUE(client.ok());
  const RedisScript script{"test_script", "return 1"};
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<RedisReply> r =
        (*client)->Evalsha(script, {"k1", "k2"}, {"a"});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->elements[0].integer, 2);
    EXPECT_EQ(r->elements[1].str, "a");
  }
  auto count = [&](const std::string& cmd) {
    int n = 0;
    for (const auto& req : fake.requests()) n += req[0] == cmd;
    return n;
  };
  EXPECT_EQ(count("SCRIPT"), 1);  // loaded once
  EXPECT_EQ(count("EVALSHA"), 3);
  EXPECT_EQ(fake.requests()[1],
            (std::vector<std::string>{
                "EVALSHA", "0123456789abcdef0123456789abcdef01234567", "2",
                "k1", "k2", "a"}));
  // Server lost its scripts: reload and retry once, transparently.
  noscript_left = 1;
  ASSERT_TRUE((*client)->Evalsha(script, {}, {"b"}).ok());
  EXPECT_EQ(count("SCRIPT"), 2);
  // NOSCRIPT twice in a row is reported, not looped on.
  noscript_left = 2;
  absl::Status s = (*client)->Evalsha(script, {}, {"c"}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("test_script"));
}

TEST(RedisClientWire, ConnectionLossFailsOneCallThenReconnects) {
  FakeRedis fake([](const std::vector<std::string>&) { return "+PONG\r\n"; });
  auto client = RedisClient::Create({.port = fake.port()});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Ping().ok());
  fake.DropNextRequest();
  absl::Status s = (*client)->Ping();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("is redis-server running"));
  // The next call reconnects at once (no backoff after a lost connection).
  EXPECT_TRUE((*client)->Ping().ok());
  EXPECT_EQ(fake.connections(), 2);
}

TEST(RedisClientWire, CommandTimeoutDropsTheConnection) {
  std::atomic<bool> slow{true};
  FakeRedis fake([&](const std::vector<std::string>&) -> std::string {
    if (slow.exchange(false)) absl::SleepFor(absl::Milliseconds(400));
    return "+PONG\r\n";
  });
  auto client = RedisClient::Create(
      {.port = fake.port(), .command_timeout = absl::Milliseconds(100)});
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  absl::Status s = (*client)->Ping();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(350));
  // The late reply of the timed-out call must not be read as the answer to
  // the next one: the client uses a fresh connection.
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_TRUE((*client)->Ping().ok());
  EXPECT_EQ(fake.connections(), 2);
}

TEST(RedisClientWire, PoolServesConcurrentCallers) {
  FakeRedis fake(
      [](const std::vector<std::string>& args) { return Bulk(args[1]); });
  auto client = RedisClient::Create({.port = fake.port(), .pool_size = 3});
  ASSERT_TRUE(client.ok());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string v = absl::StrCat(t, "-", i);
        absl::StatusOr<RedisReply> r = (*client)->Command({"ECHO", v});
        if (r.ok() && r->str == v) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, 200);
  // Connections are opened lazily, at most pool_size.
  EXPECT_GE(fake.connections(), 1);
  EXPECT_LE(fake.connections(), 3);
}

// Group commit: calls that wait while the in-flight pipeline runs go out as
// ONE pipeline; each caller still gets exactly its own replies, in order,
// its error replies included.
TEST(RedisClientWire, CoalescedCallsShareOnePipelineAndKeepTheirReplies) {
  std::atomic<bool> slow_started{false};
  FakeRedis fake([&](const std::vector<std::string>& args) -> std::string {
    if (args[0] == "SLOW") {
      slow_started = true;
      absl::SleepFor(absl::Milliseconds(400));
      return "+OK\r\n";
    }
    if (args[0] == "BAD") return "-ERR bad " + args[1] + "\r\n";
    return Bulk(args[1]);
  });
  metrics::Registry registry;
  auto client = RedisClient::Create({.port = fake.port(),
                                     .pool_size = 1,
                                     .coalesce_calls = true,
                                     .coalesce_in_flight = 1,
                                     .metrics = &registry});
  ASSERT_TRUE(client.ok()) << client.status();
  std::thread slow([&] { EXPECT_TRUE((*client)->Command({"SLOW"}).ok()); });
  while (!slow_started) absl::SleepFor(absl::Milliseconds(1));
  constexpr int kCallers = 8;
  std::vector<std::thread> callers;
  std::atomic<int> right{0};
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      const std::string a = absl::StrCat(t, "a"), b = absl::StrCat(t, "b");
      if (t % 4 == 3) {  // an error reply stays this caller's
        absl::StatusOr<RedisReply> r = (*client)->Command({"BAD", a});
        if (!r.ok() && absl::StrContains(r.status().message(), "bad " + a)) ++right;
        return;
      }
      absl::StatusOr<std::vector<RedisReply>> r =
          (*client)->Pipeline({{"ECHO", a}, {"ECHO", b}}, "test");
      if (r.ok() && r->size() == 2 && (*r)[0].str == a && (*r)[1].str == b) ++right;
    });
  }
  for (std::thread& th : callers) th.join();
  slow.join();
  EXPECT_EQ(right, kCallers);
  // The SLOW call alone, then the callers that queued behind it together:
  // fewer pipelines than calls, each caller's commands adjacent and in order.
  const std::string text = registry.RenderText();
  EXPECT_THAT(text, HasSubstr(absl::StrCat("swaserve_redis_coalesced_calls_sum ",
                                           kCallers + 1, "\n")));
  int64_t pipelines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "swaserve_redis_coalesced_calls_count ")) {
      ASSERT_TRUE(absl::SimpleAtoi(line, &pipelines));
    }
  }
  EXPECT_GE(pipelines, 2);
  EXPECT_LE(pipelines, 3) << text;  // 8 callers queued in 400 ms: one or two pipelines
  const auto requests = fake.requests();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i][0] == "ECHO" && absl::EndsWith(requests[i][1], "a")) {
      ASSERT_LT(i + 1, requests.size());
      EXPECT_EQ(requests[i + 1][1], absl::StrCat(requests[i][1].substr(0, 1), "b"));
    }
  }
  EXPECT_EQ(fake.connections(), 1);
}

// A pipeline whose connection fails fails every call in it (Unavailable,
// as a call alone would); the next calls reconnect.
TEST(RedisClientWire, CoalescedPipelineLostFailsItsCallsThenReconnects) {
  FakeRedis fake([](const std::vector<std::string>& args) { return Bulk(args[1]); });
  auto client = RedisClient::Create(
      {.port = fake.port(), .pool_size = 2, .coalesce_calls = true, .coalesce_in_flight = 2});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Command({"ECHO", "x"}).ok());
  fake.DropNextRequest();
  EXPECT_EQ((*client)->Command({"ECHO", "y"}).status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<RedisReply> again = (*client)->Command({"ECHO", "z"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->str, "z");
}

// Property: many callers, random pipelines, two pipelines in flight, a
// batch bound of 3 calls: every caller gets exactly its replies, and no
// pipeline goes out empty (a caller whose call is already in a pipeline
// must wait for it, not lead empty ones while a slot is free).
TEST(RedisClientWire, CoalescingUnderRandomConcurrentLoadKeepsEveryReply) {
  FakeRedis fake([](const std::vector<std::string>& args) { return Bulk(args[1]); });
  metrics::Registry registry;
  auto client = RedisClient::Create({.port = fake.port(),
                                     .pool_size = 3,
                                     .coalesce_calls = true,
                                     .coalesce_in_flight = 2,
                                     .coalesce_max_calls = 3,
                                     .metrics = &registry});
  ASSERT_TRUE(client.ok()) << client.status();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      uint64_t rng = 0x9E3779B97F4A7C15ull * (t + 1);
      for (int i = 0; i < 150; ++i) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int n = 1 + static_cast<int>((rng >> 33) % 5);
        std::vector<RedisCommand> commands;
        for (int k = 0; k < n; ++k) commands.push_back({"ECHO", absl::StrCat(t, ":", i, ":", k)});
        absl::StatusOr<std::vector<RedisReply>> r = (*client)->Pipeline(commands, "test");
        bool ok = r.ok() && r->size() == commands.size();
        for (int k = 0; ok && k < n; ++k) ok = (*r)[k].str == commands[k][1];
        if (!ok) ++wrong;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_LE(fake.connections(), 3);  // at most pool_size
  int64_t calls = 0, pipelines = 0;
  for (absl::string_view line : absl::StrSplit(registry.RenderText(), '\n')) {
    if (absl::ConsumePrefix(&line, "swaserve_redis_coalesced_calls_sum ")) {
      ASSERT_TRUE(absl::SimpleAtoi(line, &calls)) << line;
    } else if (absl::ConsumePrefix(&line, "swaserve_redis_coalesced_calls_count ")) {
      ASSERT_TRUE(absl::SimpleAtoi(line, &pipelines)) << line;
    }
  }
  EXPECT_EQ(calls, 6 * 150);
  EXPECT_GE(pipelines, calls / 3);  // at most 3 calls per pipeline
  EXPECT_LE(pipelines, calls);      // none empty
}

TEST(RedisClient, CoalescingOptionsAreChecked) {
  EXPECT_EQ(RedisClient::Create({.pool_size = 1, .coalesce_calls = true, .coalesce_in_flight = 2})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RedisClient::Create({.coalesce_calls = true, .coalesce_max_calls = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RedisClient::Create({.pool_size = 2, .coalesce_calls = true}).ok());
}

}  // namespace
}  // namespace swaserve::cluster
