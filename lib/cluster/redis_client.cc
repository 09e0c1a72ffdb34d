#include "lib/cluster/redis_client.h"
#include "lib/cluster/redis_client_internal.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/base/clock.h"
#include "lib/base/signals.h"
#include "lib/base/status.h"
#include "lib/cluster/redis_cluster_protocol.h"
#include "lib/metrics/buckets.h"

namespace swaserve::cluster {
namespace {

timeval DurationToTimeval(absl::Duration d) {
  timeval tv = absl::ToTimeval(d);
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  return tv;
}

// Whether a context's error is a timeout: the server did not answer within
// command_timeout (hiredis 0.14 reports a blocking socket's SO_RCVTIMEO as an
// I/O error with EAGAIN's text; later versions as REDIS_ERR_TIMEOUT).
bool TimedOut(const redisContext& ctx) {
#ifdef REDIS_ERR_TIMEOUT
  if (ctx.err == REDIS_ERR_TIMEOUT) return true;
#endif
  return ctx.err == REDIS_ERR_IO && (std::strcmp(ctx.errstr, std::strerror(EAGAIN)) == 0 ||
                                     std::strcmp(ctx.errstr, std::strerror(ETIMEDOUT)) == 0);
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

// The password in `path` (RedisOptions::password_file): the content without
// trailing line breaks; InvalidArgument naming the file when it cannot be
// read, is empty or holds more than one line. Never puts the content in a
// message.
absl::StatusOr<std::string> ReadPasswordFile(const std::string& path) {
  constexpr size_t kMaxBytes = 4096;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("Redis password file ", path,
                                                   ": cannot open (",
                                                   std::strerror(errno), ")"));
  }
  std::string content;
  content.resize(kMaxBytes + 1);
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Redis password file ", path, ": read error"));
  }
  content.resize(static_cast<size_t>(in.gcount()));
  if (content.size() > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Redis password file ", path, ": longer than ", kMaxBytes, " bytes"));
  }
  while (!content.empty() &&
         (content.back() == '\n' || content.back() == '\r')) {
    content.pop_back();
  }
  if (content.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Redis password file ", path, " is empty"));
  }
  if (content.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("Redis password file ", path,
                     " holds more than one line (one password expected)"));
  }
  return content;
}

struct ReplyDeleter {
  void operator()(void* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<void, ReplyDeleter>;

}  // namespace

std::string OpFromCommand(const RedisCommand& command) {
  if (command.empty()) return "empty";
  return absl::AsciiStrToLower(command[0]);
}

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
        message,
        " (give the server's password and ACL user: --redis_password_file and "
        "--redis_username, or redis://user:password@host:port)"));
  }
  if (starts("OOM")) {
    return absl::ResourceExhaustedError(absl::StrCat(
        message, " (Redis hit maxmemory: raise it or lower index bounds)"));
  }
  if (starts("LOADING") || starts("BUSY") || starts("MASTERDOWN") ||
      starts("READONLY") || starts("TRYAGAIN") || starts("CLUSTERDOWN") ||
      starts("MOVED") || starts("ASK ")) {
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

namespace {

// hiredis 0.14 (Debian 12) allocates an array reply's element table from the
// declared count before any element arrives, so "*500000061\r\n" alone
// asks for 4 GB (found by redis_cluster_fuzzer; hiredis 1.0's maxelements
// is not in this version). Every element takes at least 3 bytes ("+\r\n"),
// so in a complete stream a count above the bytes left / 3 cannot be
// honest: such a stream is refused before hiredis sees it. The walk follows
// the RESP framing (a bulk string's bytes are skipped, never read as
// headers); malformed framing is left to hiredis to report.
absl::Status CheckArrayCounts(absl::string_view resp) {
  size_t p = 0;
  while (p < resp.size()) {
    const size_t eol = resp.find("\r\n", p);
    if (eol == absl::string_view::npos) return absl::OkStatus();
    const char type = resp[p];
    int64_t n = 0;
    const bool counted = (type == '*' || type == '$') &&
                         absl::SimpleAtoi(resp.substr(p + 1, eol - p - 1), &n);
    p = eol + 2;
    if (!counted || n < 0) continue;
    if (type == '$') {
      p += static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(resp.size()))) + 2;
    } else if (static_cast<uint64_t>(n) > (resp.size() - p) / 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RESP: an array of ", n, " elements in ", resp.size() - p, " remaining bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<RedisReply>> ParseRedisReplies(
    absl::string_view resp) {
  if (absl::Status s = CheckArrayCounts(resp); !s.ok()) return s;
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

namespace {

// Takes "[user]:password@" or "password@" off the front of a URL's rest.
void ConsumeUserInfo(absl::string_view* rest, std::string* username, std::string* password) {
  const size_t at = rest->rfind('@');
  if (at == absl::string_view::npos) return;
  absl::string_view auth = rest->substr(0, at);
  rest->remove_prefix(at + 1);
  const size_t colon = auth.find(':');
  if (colon == absl::string_view::npos) {
    *password = std::string(auth);
  } else {
    *username = std::string(auth.substr(0, colon));
    *password = std::string(auth.substr(colon + 1));
  }
}

// "redis-cluster://[[user]:password@]h:p,h:p" or "h:p,h:p".
absl::Status ParseRedisClusterAddress(absl::string_view address, RedisOptions* options) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "redis cluster address '", address, "': ", why,
        " (expected redis-cluster://[[user]:password@]host:port[,host:port...] or "
        "host:port,host:port[,...])"));
  };
  absl::string_view rest = address;
  std::string username, password;
  if (absl::ConsumePrefix(&rest, "redis-cluster://")) {
    ConsumeUserInfo(&rest, &username, &password);
    if (absl::StrContains(rest, "/")) return bad("a Redis Cluster has no database number");
  }
  std::vector<std::string> seeds;
  for (absl::string_view seed : absl::StrSplit(rest, ',')) {
    std::string host;
    int port = 0;
    if (!SplitHostPort(seed, &host, &port)) {
      return bad(absl::StrCat("seed '", seed, "' is not host:port"));
    }
    seeds.emplace_back(seed);
  }
  if (seeds.empty()) return bad("no seed");
  std::string host;
  int port = 0;
  SplitHostPort(seeds[0], &host, &port);
  options->host = std::move(host);
  options->port = port;
  options->username = std::move(username);
  options->password = std::move(password);
  options->db = 0;
  options->cluster_seeds = std::move(seeds);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRedisAddress(absl::string_view address,
                               RedisOptions* options) {
  if (absl::StartsWith(address, "redis-cluster://") ||
      (!absl::StrContains(address, "://") && absl::StrContains(address, ','))) {
    return ParseRedisClusterAddress(address, options);
  }
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "redis address '", address, "': ", why,
        " (expected host:port or redis://[[user]:password@]host[:port][/db])"));
  };
  absl::string_view rest = address;
  std::string username, password;
  int db = 0;
  if (absl::ConsumePrefix(&rest, "redis://")) {
    ConsumeUserInfo(&rest, &username, &password);
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
  options->cluster_seeds.clear();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// RedisClient

RedisClient::RedisClient(const RedisOptions& options)
    : options_(options),
      address_(options.cluster_seeds.empty() ? absl::StrCat(options.host, ":", options.port)
                                             : absl::StrJoin(options.cluster_seeds, ",")),
      clock_(options.clock != nullptr ? options.clock : base::Clock::Real()) {
  if (options.cluster_seeds.empty()) {
    absl::MutexLock lock(&nodes_mu_);
    nodes_.push_back(std::make_unique<Node>(options.host, options.port, options.pool_size,
                                            options.reconnect_backoff_initial));
    single_ = nodes_[0].get();
  } else {
    absl::MutexLock lock(&slots_mu_);
    slot_owner_.assign(kRedisClusterSlots, nullptr);
  }
}

RedisClient::~RedisClient() = default;

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Create(
    const RedisOptions& options) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("RedisOptions: ", what));
  };
  if (options.host.empty()) return bad("host is empty");
  if (options.port <= 0 || options.port > 65535) {
    return bad(absl::StrCat("port must be in 1..65535, got ", options.port));
  }
  for (const std::string& seed : options.cluster_seeds) {
    std::string host;
    int port = 0;
    if (!SplitHostPort(seed, &host, &port)) {
      return bad(absl::StrCat("cluster seed '", seed, "' is not host:port"));
    }
  }
  if (!options.cluster_seeds.empty() && options.db != 0) {
    return bad("a Redis Cluster has only database 0 (db must be 0 with cluster_seeds)");
  }
  if (options.cluster_refresh_interval < absl::ZeroDuration()) {
    return bad("cluster_refresh_interval must be >= 0");
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
  if (options.coalesce_calls &&
      (options.coalesce_in_flight < 1 || options.coalesce_in_flight > options.pool_size ||
       options.coalesce_max_calls < 1)) {
    return bad(absl::StrCat("coalescing needs 1 <= coalesce_in_flight <= pool_size and "
                            "coalesce_max_calls >= 1, got ",
                            options.coalesce_in_flight, ", ", options.pool_size, " and ",
                            options.coalesce_max_calls));
  }
  if (options.db < 0) return bad("db must be >= 0");
  if (!options.password.empty() && !options.password_file.empty()) {
    return bad(
        "password and password_file are exclusive (the address holds a "
        "password and a password file was given)");
  }
  if (!options.username.empty() && options.password.empty() &&
      options.password_file.empty()) {
    return bad("an ACL username needs a password (password or password_file)");
  }
  std::string password = options.password;
  if (!options.password_file.empty()) {
    ASSIGN_OR_RETURN(password, ReadPasswordFile(options.password_file));
  }
  base::IgnoreSigpipeIfDefault();
  auto client = absl::WrapUnique(new RedisClient(options));
  {
    absl::MutexLock lock(&client->password_mu_);
    client->password_ = std::move(password);
  }
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
    if (options.coalesce_calls) {
      ASSIGN_OR_RETURN(std::vector<double> sizes, metrics::ExponentialBuckets(1, 2, 8));
      ASSIGN_OR_RETURN(metrics::HistogramFamily * coalesced,
                       options.metrics->AddHistogram(
                           "swaserve_redis_coalesced_calls",
                           "Calls per pipeline sent by a coalescing Redis client "
                           "(group commit: the calls that waited while the server's "
                           "in-flight pipelines ran).",
                           {}, sizes));
      client->coalesced_calls_ = &coalesced->WithLabels({});
    }
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

RedisClient::Connection& RedisClient::AcquireConnection(Node& node) {
  const size_t n = node.connections.size();
  const size_t start = node.next_connection.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    Connection& conn = *node.connections[(start + i) % n];
    if (conn.mu.TryLock()) return conn;
  }
  Connection& conn = *node.connections[start % n];
  conn.mu.Lock();
  return conn;
}

std::string RedisClient::CurrentPassword() {
  absl::StatusOr<std::string> fresh =
      options_.password_file.empty() ? absl::NotFoundError("")
                                     : ReadPasswordFile(options_.password_file);
  absl::MutexLock lock(&password_mu_);
  if (fresh.ok()) password_ = *std::move(fresh);
  return password_;
}

absl::Status RedisClient::Connect(Node& node, Connection& conn) {
  conn.mu.AssertHeld();
  conn.Drop();
  redisContext* ctx =
      redisConnectWithTimeout(node.host.c_str(), node.port,
                              DurationToTimeval(options_.connect_timeout));
  auto fail = [&](absl::string_view what) {
    std::string message =
        absl::StrCat("redis at ", node.address, ": ", what,
                     "; is redis-server running at ", node.address, "?");
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
  if (std::string password = CurrentPassword(); !password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!options_.username.empty()) auth.push_back(options_.username);
    auth.push_back(std::move(password));
    absl::Status s = setup(std::move(auth));
    if (!s.ok() && !absl::IsUnavailable(s)) {
      // The server is up and refuses the credentials (WRONGPASS, or an ERR
      // where it has no password set): not a transport error.
      redisFree(ctx);
      return absl::PermissionDeniedError(absl::StrCat(
          "redis at ", node.address, ": AUTH refused: ", s.message()));
    }
    if (!s.ok()) return fail(s.message());
  }
  if (options_.db != 0) {
    absl::Status s = setup({"SELECT", absl::StrCat(options_.db)});
    if (!s.ok()) return fail(s.message());
  }
  conn.ctx = ctx;
  return absl::OkStatus();
}

absl::Status RedisClient::RunOn(Node& node, Connection& conn,
                                absl::Span<const RedisCommand* const> commands,
                                std::vector<RedisReply>* replies) {
  conn.mu.AssertHeld();
  redisContext* ctx = conn.ctx;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const RedisCommand* command : commands) {
    argv.clear();
    lens.clear();
    for (const std::string& a : *command) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(),
                               lens.data()) != REDIS_OK) {
      // The context's output buffer may hold part of the pipeline: drop it.
      conn.Drop();
      return absl::ResourceExhaustedError(
          absl::StrCat("redis: cannot format command ", (*command)[0]));
    }
  }
  replies->clear();
  replies->reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx, &raw) != REDIS_OK || raw == nullptr) {
      std::string message =
          absl::StrCat("redis at ", node.address, ": ",
                       ctx->errstr[0] != '\0' ? ctx->errstr : "no reply",
                       " (after ", i, " of ", commands.size(),
                       " replies); is redis-server running at ", node.address, "?");
      if (raw != nullptr) freeReplyObject(raw);
      if (TimedOut(*ctx)) {
        // The server does not answer (hung, or silently cut off): the other
        // connections to it would wait command_timeout each. Fail fast
        // instead, as after a failed connect, and reconnect them later.
        absl::MutexLock lock(&node.backoff_mu);
        ++node.timeouts;
        node.last_error = message;
        node.last_refused_auth = false;
        node.retry_at = clock_->Now() + node.backoff;
        node.backoff = std::min(node.backoff * 2, options_.reconnect_backoff_max);
      }
      conn.Drop();
      return absl::UnavailableError(message);
    }
    ReplyPtr reply(raw);
    replies->push_back(Convert(static_cast<redisReply*>(raw)));
  }
  return absl::OkStatus();
}

absl::Status RedisClient::RunOnNode(Node& node, absl::Span<const RedisCommand> commands,
                                     std::vector<RedisReply>* replies) {
  for (const RedisCommand& command : commands) {
    if (command.empty()) return absl::InvalidArgumentError("redis: empty command");
  }
  if (options_.coalesce_calls) return RunCoalesced(node, commands, replies);
  std::vector<const RedisCommand*> list;
  list.reserve(commands.size());
  for (const RedisCommand& command : commands) list.push_back(&command);
  return RunOnConnection(node, list, replies);
}

absl::Status RedisClient::RunCoalesced(Node& node, absl::Span<const RedisCommand> commands,
                                       std::vector<RedisReply>* replies) {
  PendingCall me{.commands = commands, .replies = replies};
  const int max_in_flight = options_.coalesce_in_flight;
  const size_t max_calls = static_cast<size_t>(options_.coalesce_max_calls);
  absl::MutexLock lock(&node.coalesce_mu);
  node.pending.push_back(&me);
  // Only a caller whose call still waits leads: one already taken into a
  // pipeline waits for it (no empty pipelines, no spinning).
  auto done_or_free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(node.coalesce_mu) {
    return me.done || (!me.taken && node.in_flight < max_in_flight);
  };
  while (true) {
    node.coalesce_mu.Await(absl::Condition(&done_or_free));
    if (me.done) return me.status;
    // Lead one pipeline: the oldest waiting calls (this one, or the ones
    // before it; then this one waits for the next free slot).
    std::vector<PendingCall*> batch;
    while (!node.pending.empty() && batch.size() < max_calls) {
      batch.push_back(node.pending.front());
      batch.back()->taken = true;
      node.pending.pop_front();
    }
    ++node.in_flight;
    node.coalesce_mu.Unlock();
    std::vector<const RedisCommand*> list;
    for (const PendingCall* call : batch) {
      for (const RedisCommand& command : call->commands) list.push_back(&command);
    }
    std::vector<RedisReply> all;
    const absl::Status status = RunOnConnection(node, list, &all);
    if (coalesced_calls_ != nullptr) coalesced_calls_->Observe(static_cast<double>(batch.size()));
    size_t next = 0;
    for (PendingCall* call : batch) {
      call->status = status;
      call->replies->clear();
      if (status.ok()) {
        const size_t n = call->commands.size();
        call->replies->assign(std::make_move_iterator(all.begin() + next),
                              std::make_move_iterator(all.begin() + next + n));
        next += n;
      }
    }
    node.coalesce_mu.Lock();
    --node.in_flight;
    for (PendingCall* call : batch) call->done = true;
  }
}

absl::Status RedisClient::RunOnConnection(Node& node,
                                          absl::Span<const RedisCommand* const> commands,
                                          std::vector<RedisReply>* replies) {
  absl::Status status;
  Connection& conn = AcquireConnection(node);
  conn.mu.AssertHeld();
  if (conn.ctx != nullptr) {
    // Opened before a call on another connection of the node timed out: as
    // likely to hang; reconnect instead (after the backoff).
    absl::MutexLock lock(&node.backoff_mu);
    if (conn.timeouts_seen != node.timeouts) conn.Drop();
  }
  if (conn.ctx == nullptr) {
    const absl::Time now = clock_->Now();
    bool refused = false, refused_auth = false;
    std::string refusal;
    {
      absl::MutexLock lock(&node.backoff_mu);
      conn.timeouts_seen = node.timeouts;
      if (now < node.retry_at) {
        refused = true;
        refused_auth = node.last_refused_auth;
        refusal = absl::StrCat("redis at ", node.address, " is unavailable (", node.last_error,
                               "); next reconnect attempt in ",
                               absl::FormatDuration(
                                   absl::Ceil(node.retry_at - now, absl::Milliseconds(1))));
      }
    }
    if (refused) {
      status = refused_auth ? absl::PermissionDeniedError(refusal)
                            : absl::UnavailableError(refusal);
    } else {
      status = Connect(node, conn);
      absl::MutexLock lock(&node.backoff_mu);
      if (status.ok()) {
        node.backoff = options_.reconnect_backoff_initial;
        node.retry_at = absl::InfinitePast();
      } else {
        node.last_error = std::string(status.message());
        node.last_refused_auth = absl::IsPermissionDenied(status);
        node.retry_at = clock_->Now() + node.backoff;
        node.backoff = std::min(node.backoff * 2, options_.reconnect_backoff_max);
      }
    }
  }
  if (status.ok()) status = RunOn(node, conn, commands, replies);
  conn.mu.Unlock();
  return status;
}

absl::Status RedisClient::Run(absl::Span<const RedisCommand> commands,
                              absl::string_view op,
                              std::vector<RedisReply>* replies) {
  OpMetrics* m = MetricsFor(op);
  const int64_t start = base::MonotonicNanos();
  const absl::Status status = single_ != nullptr ? RunOnNode(*single_, commands, replies)
                                                 : RunCluster(commands, replies);
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
      // Redis restarted or the script cache was flushed (or, in a cluster,
      // this master never saw the script): it did not run. Load it again
      // (on every master) and retry once.
      ASSIGN_OR_RETURN(command[1], ReloadScript(script));
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

absl::StatusOr<std::string> RedisClient::ReloadScript(const RedisScript& script) {
  if (single_ != nullptr) return ScriptSha(script, /*reload=*/true);
  ASSIGN_OR_RETURN(auto loaded,
                   CommandOnEveryMaster({"SCRIPT", "LOAD", script.source}, "script_load"));
  for (auto& [address, r] : loaded) {
    if (r.is_error()) {
      return absl::Status(r.ToStatus().code(), absl::StrCat("loading script ", script.name,
                                                            " on ", address, ": ", r.str));
    }
  }
  return ScriptSha(script, /*reload=*/false);
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::EvalshaPipeline(
    absl::Span<const RedisScriptCall> calls, absl::string_view op) {
  auto command_of = [&](const RedisScriptCall& c) -> absl::StatusOr<RedisCommand> {
    if (c.script == nullptr) return absl::InvalidArgumentError("EvalshaPipeline: null script");
    ASSIGN_OR_RETURN(std::string sha, ScriptSha(*c.script, /*reload=*/false));
    RedisCommand command = {"EVALSHA", std::move(sha), absl::StrCat(c.keys.size())};
    command.insert(command.end(), c.keys.begin(), c.keys.end());
    command.insert(command.end(), c.args.begin(), c.args.end());
    return command;
  };
  std::vector<RedisCommand> commands;
  commands.reserve(calls.size());
  for (const RedisScriptCall& c : calls) {
    ASSIGN_OR_RETURN(RedisCommand command, command_of(c));
    commands.push_back(std::move(command));
  }
  std::vector<RedisReply> replies;
  if (commands.empty()) return replies;
  RETURN_IF_ERROR(Run(commands, op, &replies));
  // Calls refused with NOSCRIPT did not run: load their scripts, run them
  // again (once).
  std::vector<size_t> again;
  std::vector<const RedisScript*> reloaded;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!replies[i].is_error() || !absl::StartsWith(replies[i].str, "NOSCRIPT")) continue;
    again.push_back(i);
    if (std::find(reloaded.begin(), reloaded.end(), calls[i].script) == reloaded.end()) {
      RETURN_IF_ERROR(ReloadScript(*calls[i].script).status());
      reloaded.push_back(calls[i].script);
    }
  }
  if (again.empty()) return replies;
  std::vector<RedisCommand> retry;
  for (size_t i : again) {
    ASSIGN_OR_RETURN(RedisCommand command, command_of(calls[i]));
    retry.push_back(std::move(command));
  }
  std::vector<RedisReply> retried;
  RETURN_IF_ERROR(Run(retry, op, &retried));
  for (size_t j = 0; j < again.size(); ++j) replies[again[j]] = std::move(retried[j]);
  return replies;
}

absl::Status RedisClient::CheckCredentials() {
  const absl::Status s = Ping();
  return absl::IsPermissionDenied(s) ? s : absl::OkStatus();
}

absl::Status RedisClient::Ping() {
  absl::StatusOr<RedisReply> reply = Command({"PING"}, "ping");
  return reply.status();
}

}  // namespace swaserve::cluster
