#include "lib/cluster/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/base/clock.h"
#include "lib/base/signals.h"
#include "lib/metrics/buckets.h"

namespace swaserve::cluster {
namespace {

timeval DurationToTimeval(absl::Duration d) {
  timeval tv = absl::ToTimeval(d);
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  return tv;
}

// Converts a hiredis reply tree into owned values.
RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) {
        out.elements.push_back(Convert(r->element[i]));
      }
      break;
    case REDIS_REPLY_NIL:
    default:
      out.type = RedisReply::Type::kNil;
      break;
  }
  return out;
}

struct ReplyDeleter {
  void operator()(void* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<void, ReplyDeleter>;

std::string OpFromCommand(const RedisCommand& command) {
  if (command.empty()) return "empty";
  return absl::AsciiStrToLower(command[0]);
}

}  // namespace

// ---------------------------------------------------------------------------
// RedisReply

absl::Status RedisReply::ToStatus() const {
  if (type != Type::kError) return absl::OkStatus();
  const std::string message = absl::StrCat("redis error reply: ", str);
  auto starts = [this](absl::string_view prefix) {
    return absl::StartsWith(str, prefix);
  };
  if (starts("NOSCRIPT")) return absl::NotFoundError(message);
  if (starts("WRONGTYPE")) return absl::FailedPreconditionError(message);
  if (starts("NOAUTH") || starts("WRONGPASS") || starts("NOPERM")) {
    return absl::PermissionDeniedError(absl::StrCat(
        message, " (set RedisOptions.password/username to the server's)"));
  }
  if (starts("OOM")) {
    return absl::ResourceExhaustedError(absl::StrCat(
        message, " (Redis hit maxmemory: raise it or lower index bounds)"));
  }
  if (starts("LOADING") || starts("BUSY") || starts("MASTERDOWN") ||
      starts("READONLY") || starts("TRYAGAIN")) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::StatusOr<int64_t> RedisReply::AsInteger() const {
  if (type == Type::kInteger) return integer;
  if (type == Type::kError) return ToStatus();
  if (type == Type::kString || type == Type::kStatus) {
    int64_t v = 0;
    if (absl::SimpleAtoi(str, &v)) return v;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected an integer reply, got ", DebugString()));
}

absl::StatusOr<std::string> RedisReply::AsString() const {
  if (type == Type::kString || type == Type::kStatus) return str;
  if (type == Type::kError) return ToStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("expected a string reply, got ", DebugString()));
}

std::string RedisReply::DebugString() const {
  switch (type) {
    case Type::kNil:
      return "(nil)";
    case Type::kString: {
      std::string shown;
      for (char c : str.substr(0, 64)) {
        if (absl::ascii_isprint(static_cast<unsigned char>(c))) {
          shown.push_back(c);
        } else {
          absl::StrAppend(
              &shown, "\\x",
              absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        }
      }
      if (str.size() > 64) absl::StrAppend(&shown, "...");
      return absl::StrCat("\"", shown, "\"");
    }
    case Type::kStatus:
      return absl::StrCat("+", str);
    case Type::kError:
      return absl::StrCat("(error) ", str);
    case Type::kInteger:
      return absl::StrCat("(integer) ", integer);
    case Type::kArray: {
      std::vector<std::string> parts;
      for (const RedisReply& e : elements) parts.push_back(e.DebugString());
      return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
    }
  }
  return "?";
}

absl::StatusOr<std::vector<RedisReply>> ParseRedisReplies(
    absl::string_view resp) {
  std::unique_ptr<redisReader, void (*)(redisReader*)> reader(
      redisReaderCreate(), redisReaderFree);
  if (reader == nullptr) return absl::ResourceExhaustedError("redisReader");
  if (!resp.empty() &&
      redisReaderFeed(reader.get(), resp.data(), resp.size()) != REDIS_OK) {
    return absl::InvalidArgumentError(absl::StrCat("RESP: ", reader->errstr));
  }
  std::vector<RedisReply> out;
  while (true) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("RESP protocol error: ", reader->errstr));
    }
    if (raw == nullptr) break;
    ReplyPtr reply(raw);
    out.push_back(Convert(static_cast<redisReply*>(raw)));
  }
  // After the last complete reply ridx is 0 (a fresh task) with every byte
  // consumed; a partial reply leaves bytes or a nested task behind.
  if (reader->ridx > 0 || reader->pos < reader->len) {
    return absl::InvalidArgumentError(
        "RESP: trailing incomplete reply after the last complete one");
  }
  return out;
}

absl::Status ParseRedisAddress(absl::string_view address,
                               RedisOptions* options) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "redis address '", address, "': ", why,
        " (expected host:port or redis://[[user]:password@]host[:port][/db])"));
  };
  absl::string_view rest = address;
  std::string username, password;
  int db = 0;
  if (absl::ConsumePrefix(&rest, "redis://")) {
    const size_t at = rest.rfind('@');
    if (at != absl::string_view::npos) {
      absl::string_view auth = rest.substr(0, at);
      rest.remove_prefix(at + 1);
      const size_t colon = auth.find(':');
      if (colon == absl::string_view::npos) {
        password = std::string(auth);
      } else {
        username = std::string(auth.substr(0, colon));
        password = std::string(auth.substr(colon + 1));
      }
    }
    const size_t slash = rest.find('/');
    if (slash != absl::string_view::npos) {
      absl::string_view db_text = rest.substr(slash + 1);
      rest = rest.substr(0, slash);
      if (!db_text.empty() && (!absl::SimpleAtoi(db_text, &db) || db < 0)) {
        return bad("bad database number");
      }
    }
  } else if (absl::StrContains(rest, "://")) {
    return bad("unknown scheme");
  }
  std::string host;
  int port = 6379;
  absl::string_view port_text;
  if (absl::ConsumePrefix(&rest, "[")) {  // [v6]:port
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return bad("unclosed '['");
    host = std::string(rest.substr(0, close));
    rest.remove_prefix(close + 1);
    if (!rest.empty() && !absl::ConsumePrefix(&rest, ":")) {
      return bad("junk after ']'");
    }
    port_text = rest;
  } else {
    const size_t colon = rest.rfind(':');
    if (colon != absl::string_view::npos) {
      if (rest.find(':') != colon) return bad("IPv6 hosts need [brackets]");
      port_text = rest.substr(colon + 1);
      rest = rest.substr(0, colon);
    }
    host = std::string(rest);
  }
  if (host.empty()) return bad("no host");
  if (!port_text.empty() &&
      (!absl::SimpleAtoi(port_text, &port) || port <= 0 || port > 65535)) {
    return bad("port must be in 1..65535");
  }
  options->host = std::move(host);
  options->port = port;
  options->username = std::move(username);
  options->password = std::move(password);
  options->db = db;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// RedisClient

struct RedisClient::Connection {
  absl::Mutex mu;
  redisContext* ctx ABSL_GUARDED_BY(mu) = nullptr;

  void Drop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (ctx != nullptr) redisFree(ctx);
    ctx = nullptr;
  }
};

struct RedisClient::OpMetrics {
  metrics::Histogram* latency = nullptr;
  metrics::Counter* errors = nullptr;
};

RedisClient::RedisClient(const RedisOptions& options)
    : options_(options),
      address_(absl::StrCat(options.host, ":", options.port)),
      clock_(options.clock != nullptr ? options.clock : base::Clock::Real()),
      backoff_(options.reconnect_backoff_initial) {
  for (int i = 0; i < options.pool_size; ++i) {
    connections_.push_back(std::make_unique<Connection>());
  }
}

RedisClient::~RedisClient() {
  for (auto& conn : connections_) {
    absl::MutexLock lock(&conn->mu);
    conn->Drop();
  }
}

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Create(
    const RedisOptions& options) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("RedisOptions: ", what));
  };
  if (options.host.empty()) return bad("host is empty");
  if (options.port <= 0 || options.port > 65535) {
    return bad(absl::StrCat("port must be in 1..65535, got ", options.port));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return bad("connect_timeout must be > 0");
  }
  if (options.command_timeout <= absl::ZeroDuration()) {
    return bad("command_timeout must be > 0");
  }
  if (options.reconnect_backoff_initial <= absl::ZeroDuration() ||
      options.reconnect_backoff_max < options.reconnect_backoff_initial) {
    return bad("need 0 < reconnect_backoff_initial <= reconnect_backoff_max");
  }
  if (options.pool_size < 1 || options.pool_size > 64) {
    return bad(
        absl::StrCat("pool_size must be in 1..64, got ", options.pool_size));
  }
  if (options.db < 0) return bad("db must be >= 0");
  base::IgnoreSigpipeIfDefault();
  auto client = absl::WrapUnique(new RedisClient(options));
  if (options.metrics != nullptr) {
    absl::StatusOr<std::vector<double>> buckets =
        metrics::ExponentialBuckets(50e-6, 2, 17);  // 50 us .. 3.3 s
    if (!buckets.ok()) return buckets.status();
    absl::StatusOr<metrics::HistogramFamily*> latency =
        options.metrics->AddHistogram(
            "swaserve_redis_seconds",
            "Latency of Redis calls (commands, pipelines, scripts), round "
            "trip included, by operation.",
            {"op"}, *buckets);
    if (!latency.ok()) return latency.status();
    absl::StatusOr<metrics::CounterFamily*> errors =
        options.metrics->AddCounter(
            "swaserve_redis_errors_total",
            "Redis calls that failed (unreachable, timed out, refused during "
            "reconnect backoff, or answered with an error), by operation.",
            {"op"});
    if (!errors.ok()) return errors.status();
    client->latency_family_ = *latency;
    client->error_family_ = *errors;
  }
  return client;
}

RedisClient::OpMetrics* RedisClient::MetricsFor(absl::string_view op) {
  if (latency_family_ == nullptr) return nullptr;
  absl::MutexLock lock(&metrics_mu_);
  auto it = op_metrics_.find(op);
  if (it == op_metrics_.end()) {
    auto m = std::make_unique<OpMetrics>();
    m->latency = &latency_family_->WithLabels({op});
    m->errors = &error_family_->WithLabels({op});
    it = op_metrics_.emplace(std::string(op), std::move(m)).first;
  }
  return it->second.get();
}

RedisClient::Connection& RedisClient::AcquireConnection() {
  const size_t n = connections_.size();
  const size_t start = next_connection_.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    Connection& conn = *connections_[(start + i) % n];
    if (conn.mu.TryLock()) return conn;
  }
  Connection& conn = *connections_[start % n];
  conn.mu.Lock();
  return conn;
}

absl::Status RedisClient::Connect(Connection& conn) {
  conn.mu.AssertHeld();
  conn.Drop();
  redisContext* ctx =
      redisConnectWithTimeout(options_.host.c_str(), options_.port,
                              DurationToTimeval(options_.connect_timeout));
  auto fail = [&](absl::string_view what) {
    std::string message =
        absl::StrCat("redis at ", address_, ": ", what,
                     "; is redis-server running at ", address_, "?");
    if (ctx != nullptr) redisFree(ctx);
    return absl::UnavailableError(message);
  };
  if (ctx == nullptr) return fail("cannot allocate a connection");
  if (ctx->err != 0) return fail(absl::StrCat("connect: ", ctx->errstr));
  if (redisSetTimeout(ctx, DurationToTimeval(options_.command_timeout)) !=
      REDIS_OK) {
    return fail(absl::StrCat("setting timeouts: ", ctx->errstr));
  }
  redisEnableKeepAlive(ctx);
  auto setup = [&](std::vector<std::string> args) -> absl::Status {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    ReplyPtr reply(redisCommandArgv(ctx, static_cast<int>(argv.size()),
                                    argv.data(), lens.data()));
    if (reply == nullptr) {
      return absl::UnavailableError(absl::StrCat(args[0], ": ", ctx->errstr));
    }
    RedisReply r = Convert(static_cast<redisReply*>(reply.get()));
    return r.ToStatus();
  };
  if (!options_.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!options_.username.empty()) auth.push_back(options_.username);
    auth.push_back(options_.password);
    absl::Status s = setup(std::move(auth));
    if (!s.ok()) return fail(s.message());
  }
  if (options_.db != 0) {
    absl::Status s = setup({"SELECT", absl::StrCat(options_.db)});
    if (!s.ok()) return fail(s.message());
  }
  conn.ctx = ctx;
  return absl::OkStatus();
}

absl::Status RedisClient::RunOn(Connection& conn,
                                absl::Span<const RedisCommand> commands,
                                std::vector<RedisReply>* replies) {
  conn.mu.AssertHeld();
  redisContext* ctx = conn.ctx;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const RedisCommand& command : commands) {
    if (command.empty()) {
      return absl::InvalidArgumentError("redis: empty command");
    }
    argv.clear();
    lens.clear();
    for (const std::string& a : command) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(),
                               lens.data()) != REDIS_OK) {
      return absl::ResourceExhaustedError(
          absl::StrCat("redis: cannot format command ", command[0]));
    }
  }
  replies->clear();
  replies->reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx, &raw) != REDIS_OK || raw == nullptr) {
      std::string message =
          absl::StrCat("redis at ", address_, ": ",
                       ctx->errstr[0] != '\0' ? ctx->errstr : "no reply",
                       " (after ", i, " of ", commands.size(),
                       " replies); is redis-server running at ", address_, "?");
      if (raw != nullptr) freeReplyObject(raw);
      conn.Drop();
      return absl::UnavailableError(message);
    }
    ReplyPtr reply(raw);
    replies->push_back(Convert(static_cast<redisReply*>(raw)));
  }
  return absl::OkStatus();
}

absl::Status RedisClient::Run(absl::Span<const RedisCommand> commands,
                              absl::string_view op,
                              std::vector<RedisReply>* replies) {
  OpMetrics* m = MetricsFor(op);
  const int64_t start = base::MonotonicNanos();
  absl::Status status;
  {
    Connection& conn = AcquireConnection();
    conn.mu.AssertHeld();
    if (conn.ctx == nullptr) {
      const absl::Time now = clock_->Now();
      bool refused = false;
      std::string refusal;
      {
        absl::MutexLock lock(&backoff_mu_);
        if (now < retry_at_) {
          refused = true;
          refusal = absl::StrCat("redis at ", address_, " is unavailable (",
                                 last_error_, "); next reconnect attempt in ",
                                 absl::FormatDuration(absl::Ceil(
                                     retry_at_ - now, absl::Milliseconds(1))));
        }
      }
      if (refused) {
        status = absl::UnavailableError(refusal);
      } else {
        status = Connect(conn);
        absl::MutexLock lock(&backoff_mu_);
        if (status.ok()) {
          backoff_ = options_.reconnect_backoff_initial;
          retry_at_ = absl::InfinitePast();
        } else {
          last_error_ = std::string(status.message());
          retry_at_ = clock_->Now() + backoff_;
          backoff_ = std::min(backoff_ * 2, options_.reconnect_backoff_max);
        }
      }
    }
    if (status.ok()) status = RunOn(conn, commands, replies);
    conn.mu.Unlock();
  }
  if (m != nullptr) {
    m->latency->Observe(static_cast<double>(base::MonotonicNanos() - start) *
                        1e-9);
    bool error_reply = false;
    if (status.ok()) {
      for (const RedisReply& r : *replies) error_reply |= r.is_error();
    }
    if (!status.ok() || error_reply) m->errors->Increment();
  }
  return status;
}

absl::StatusOr<RedisReply> RedisClient::Command(const RedisCommand& command,
                                                absl::string_view op) {
  const std::string op_name =
      op.empty() ? OpFromCommand(command) : std::string(op);
  std::vector<RedisReply> replies;
  absl::Status status =
      Run(absl::MakeConstSpan(&command, 1), op_name, &replies);
  if (!status.ok()) return status;
  RedisReply reply = std::move(replies[0]);
  if (reply.is_error()) return reply.ToStatus();
  return reply;
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Pipeline(
    absl::Span<const RedisCommand> commands, absl::string_view op) {
  std::vector<RedisReply> replies;
  if (commands.empty()) return replies;
  absl::Status status = Run(commands, op.empty() ? "pipeline" : op, &replies);
  if (!status.ok()) return status;
  return replies;
}

absl::StatusOr<std::string> RedisClient::ScriptSha(const RedisScript& script,
                                                   bool reload) {
  if (!reload) {
    absl::MutexLock lock(&scripts_mu_);
    auto it = script_shas_.find(script.source);
    if (it != script_shas_.end()) return it->second;
  }
  absl::StatusOr<RedisReply> loaded =
      Command({"SCRIPT", "LOAD", script.source}, absl::StrCat("script_load"));
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat("loading script ", script.name, ": ",
                                     loaded.status().message()));
  }
  absl::StatusOr<std::string> sha = loaded->AsString();
  if (!sha.ok()) return sha.status();
  absl::MutexLock lock(&scripts_mu_);
  script_shas_[script.source] = *sha;
  return *sha;
}

absl::StatusOr<RedisReply> RedisClient::Evalsha(
    const RedisScript& script, absl::Span<const std::string> keys,
    absl::Span<const std::string> args, absl::string_view op) {
  const std::string op_name = op.empty() ? script.name : std::string(op);
  absl::StatusOr<std::string> sha = ScriptSha(script, /*reload=*/false);
  if (!sha.ok()) return sha.status();
  RedisCommand command;
  command.reserve(3 + keys.size() + args.size());
  command.push_back("EVALSHA");
  command.push_back(*sha);
  command.push_back(absl::StrCat(keys.size()));
  command.insert(command.end(), keys.begin(), keys.end());
  command.insert(command.end(), args.begin(), args.end());
  for (int attempt = 0;; ++attempt) {
    std::vector<RedisReply> replies;
    absl::Status status =
        Run(absl::MakeConstSpan(&command, 1), op_name, &replies);
    if (!status.ok()) return status;
    RedisReply& reply = replies[0];
    if (reply.is_error() && absl::StartsWith(reply.str, "NOSCRIPT") &&
        attempt == 0) {
      // Redis restarted or the script cache was flushed: the script did not
      // run. Load it again and retry once.
      sha = ScriptSha(script, /*reload=*/true);
      if (!sha.ok()) return sha.status();
      command[1] = *sha;
      continue;
    }
    if (reply.is_error()) {
      absl::Status s = reply.ToStatus();
      return absl::Status(
          s.code(), absl::StrCat("script ", script.name, ": ", s.message()));
    }
    return std::move(reply);
  }
}

absl::Status RedisClient::Ping() {
  absl::StatusOr<RedisReply> reply = Command({"PING"}, "ping");
  return reply.status();
}

}  // namespace swaserve::cluster
