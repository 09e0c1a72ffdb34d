// RedisClient: a small synchronous Redis client (hiredis underneath) for the
// cluster state of docs/architecture.md#redis-state: worker registry, load reports and the
// prefix-affinity index.
//
//   ASSIGN_OR_RETURN(auto redis, RedisClient::Create({.host = "redis",
//                                                     .port = 6379}));
//   ASSIGN_OR_RETURN(RedisReply r, redis->Command({"GET", "k"}, "get"));
//   ASSIGN_OR_RETURN(auto replies, redis->Pipeline({{"SET", "a", "1"},
//                                                   {"INCR", "n"}}, "ops"));
//   static const RedisScript kScript{"my_script", "return #KEYS"};
//   ASSIGN_OR_RETURN(RedisReply r, redis->Evalsha(kScript, {"k"}, {}));
//
// Availability: Create() never needs Redis to be up. Connections are made
// lazily; after a transport error the connection is dropped and the next call
// reconnects at once. When a (re)connect fails, calls fail fast with
// Unavailable (without touching the network) for a backoff period that
// doubles from reconnect_backoff_initial to reconnect_backoff_max. So when
// Redis is down callers get a quick Unavailable and keep serving; when it
// returns they reconnect within one backoff period. A call that fails
// because Redis went away is not retried (the client cannot know whether the
// server ran it); the caller decides.
//
// Scripts: Evalsha() loads a script with SCRIPT LOAD on first use (its SHA1
// is cached for the process) and reloads it and retries once when the server
// answers NOSCRIPT (Redis restarted, SCRIPT FLUSH). A NOSCRIPT reply means the
// script did not run, so the retry is always safe.
//
// Redis Cluster (options.cluster_seeds non-empty): the client learns the slot
// map with CLUSTER SLOTS from any seed or known node, sends each command to
// the master of its key's slot (redis_cluster_protocol.h: hash tags decide
// the slot), splits a pipeline into one pipeline per node (each node's
// commands keep their order; nodes are visited one after another), and
// follows MOVED (refreshing the map) and ASK (ASKING first) redirections, up
// to 5 hops. A command without a key goes with the keyed command after it in
// its pipeline (EXEC and DISCARD: the one before), else to any master, so a
// MULTI ... EXEC on one slot stays on one node; commands inside a
// transaction are not redirected (the EXEC fails and the caller retries). A
// node that cannot be reached gets the same fail-fast backoff as a single
// server and marks the map stale: the next call (at most once per
// cluster_refresh_interval) asks the other nodes, so once a replica is
// promoted the client follows it. Scripts are loaded on every master on a
// NOSCRIPT. Multi-key commands and scripts must keep their keys in one slot
// (Redis answers CROSSSLOT otherwise).
//
// Metrics (when options.metrics is set): swaserve_redis_seconds{op}
// (histogram of call latency, round trip included) and
// swaserve_redis_errors_total{op} (transport errors, fail-fast refusals and
// error replies). `op` is a short name chosen by the caller from a small fixed
// set ("register", "match_prefixes", ...), never built from data.
//
// Signals: Create() makes the process ignore SIGPIPE if it still has the
// default disposition, so a Redis that dies mid-write cannot kill the
// process (as MetricsHttpServer does).
//
// Ownership: owns its connections. Thread-safety: thread-safe. Each call
// holds one connection of the pool for its duration (calls on one connection
// are serialized; set pool_size > 1 for concurrent callers such as a router).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/base/clock.h"
#include "lib/metrics/registry.h"

namespace swaserve::cluster {

struct RedisOptions {
  // Host name or IP address of the Redis server, and its port.
  std::string host = "127.0.0.1";
  int port = 6379;
  // Time allowed for a TCP connect (and AUTH/SELECT after it).
  absl::Duration connect_timeout = absl::Milliseconds(500);
  // Time allowed for one call (a command, a pipeline or a script) to be
  // written and answered; on expiry the connection is dropped.
  absl::Duration command_timeout = absl::Seconds(2);
  // When a password is set (here or through password_file), AUTH is sent
  // after every connect and reconnect (with `username` when that is
  // non-empty: Redis 6 ACL users). A refused AUTH fails the call with
  // PermissionDenied. A username without a password is InvalidArgument.
  std::string username;
  std::string password;
  // A file holding the password instead (a mounted Kubernetes Secret): its
  // content without trailing line breaks. Create() reads it and fails with
  // InvalidArgument naming the file when it cannot be read, is empty or holds
  // more than one line; it is read again before every (re)connection, so a
  // rotated Secret is used from the next connection on (a failed read then
  // keeps the last password). Exclusive with `password`. Default: empty.
  std::string password_file;
  // Logical database (SELECT) when non-zero. Must be 0 for a Redis Cluster.
  int db = 0;
  // Redis Cluster: "host:port" of one or more of its nodes (any, masters or
  // replicas; the rest are discovered). Non-empty turns cluster mode on:
  // host and port above are then only used in messages. Default: empty (a
  // single Redis server).
  std::vector<std::string> cluster_seeds;
  // Cluster mode: least time between two slot-map refreshes after a MOVED
  // or a node failure (a failover takes seconds; this bounds the CLUSTER
  // SLOTS calls meanwhile). Default 100 ms.
  absl::Duration cluster_refresh_interval = absl::Milliseconds(100);
  // Fail-fast period after a failed connect: starts at
  // reconnect_backoff_initial and doubles up to reconnect_backoff_max.
  absl::Duration reconnect_backoff_initial = absl::Milliseconds(50);
  absl::Duration reconnect_backoff_max = absl::Seconds(1);
  // Connections kept (each call uses one). Default 1.
  int pool_size = 1;
  // Group commit ("auto-pipelining", as ioredis and Lettuce do it): with
  // coalesce_calls, at most coalesce_in_flight calls (pipelines) run on a
  // server at a time; a call that finds them all busy waits, and the calls
  // waiting when one finishes go out together as ONE pipeline (at most
  // coalesce_max_calls calls, oldest first), so Redis reads, parses and
  // answers them with one read() and one write(): under load a server spends
  // a fraction of a round trip's CPU per call (bench/RESULTS.md, "Router
  // decision latency"). A call that finds a free slot goes at once, so an
  // idle client adds no latency. Each call keeps its own replies, error
  // replies and NOSCRIPT handling; when a pipeline's connection fails, every
  // call in it gets Unavailable (some may have run), as a call alone would.
  // Never send blocking commands (XREAD BLOCK, BLPOP, WAIT) through a
  // coalescing client: the calls batched with or behind one would wait for
  // it. Needs pool_size >= coalesce_in_flight. Defaults: off, 2, 64.
  bool coalesce_calls = false;
  int coalesce_in_flight = 2;
  int coalesce_max_calls = 64;
  // Where swaserve_redis_seconds / swaserve_redis_errors_total are
  // registered; not owned, must outlive the client. nullptr: no metrics.
  metrics::Registry* metrics = nullptr;
  // Time source for the backoff; not owned. nullptr: base::Clock::Real().
  base::Clock* clock = nullptr;
};

// One reply from Redis (RESP2), decoded into owned values.
struct RedisReply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray, kError };

  Type type = Type::kNil;
  // kString, kStatus ("OK") and kError ("ERR ...") text; binary-safe.
  std::string str;
  // kInteger.
  int64_t integer = 0;
  // kArray.
  std::vector<RedisReply> elements;

  bool is_nil() const { return type == Type::kNil; }
  bool is_error() const { return type == Type::kError; }
  bool is_array() const { return type == Type::kArray; }

  // OK unless this is an error reply, which maps to a status by its prefix:
  // NOSCRIPT -> NotFound, WRONGTYPE -> FailedPrecondition, NOAUTH/WRONGPASS/
  // NOPERM -> PermissionDenied, OOM -> ResourceExhausted, LOADING/BUSY/
  // MASTERDOWN/READONLY/TRYAGAIN/CLUSTERDOWN (and a MOVED/ASK left after
  // the client's redirections) -> Unavailable, anything else -> Internal.
  absl::Status ToStatus() const;
  // The integer of a kInteger reply, or a kString/kStatus that parses as
  // one; InvalidArgument otherwise (an error reply gives its ToStatus()).
  absl::StatusOr<int64_t> AsInteger() const;
  // The text of a kString or kStatus reply; InvalidArgument otherwise.
  absl::StatusOr<std::string> AsString() const;
  // Human-readable rendering for logs and test failures.
  std::string DebugString() const;

  static RedisReply Nil() { return RedisReply{}; }
  static RedisReply String(std::string s) {
    return RedisReply{.type = Type::kString, .str = std::move(s)};
  }
  static RedisReply Integer(int64_t v) {
    return RedisReply{.type = Type::kInteger, .integer = v};
  }
  static RedisReply Array(std::vector<RedisReply> elements) {
    return RedisReply{.type = Type::kArray, .elements = std::move(elements)};
  }
};

// Decodes a byte stream in the Redis serialization protocol (RESP2, what a
// server sends) into its replies, in order. InvalidArgument on a protocol
// error or a trailing incomplete reply. Used by tests and tools; the client
// decodes the same way.
absl::StatusOr<std::vector<RedisReply>> ParseRedisReplies(
    absl::string_view resp);

// Fills host, port, username, password, db and cluster_seeds of `*options`
// from an address as given on a command line: "host", "host:port",
// "[v6addr]:port", "redis://[[user]:password@]host[:port][/db]" (port
// default 6379) for a single server; a Redis Cluster as a seed list:
// "redis-cluster://[[user]:password@]host:port[,host:port...]" or
// "host:port,host:port[,...]" (two or more seeds; no database).
// InvalidArgument naming the address when it is malformed; other fields of
// `*options` are left as they are.
absl::Status ParseRedisAddress(absl::string_view address,
                               RedisOptions* options);

// A Lua script run with EVALSHA. `name` labels metrics and errors; `source`
// is the script text. Define scripts as static constants.
struct RedisScript {
  std::string name;
  std::string source;
};

// One command: its name and arguments, each binary-safe
// ({"HSET", key, field, value}).
using RedisCommand = std::vector<std::string>;

// One EVALSHA of a pipeline (RedisClient::EvalshaPipeline).
struct RedisScriptCall {
  const RedisScript* script = nullptr;  // not owned
  std::vector<std::string> keys;
  std::vector<std::string> args;
};

class RedisClient {
 public:
  // Validates the options; does not connect. InvalidArgument names the bad
  // field.
  static absl::StatusOr<std::unique_ptr<RedisClient>> Create(
      const RedisOptions& options);

  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Sends one command and returns its reply. Unavailable when Redis cannot be
  // reached (or is in its backoff period); an error reply is returned as its
  // ToStatus(). `op` labels the metrics; empty means the command name in
  // lower case.
  absl::StatusOr<RedisReply> Command(const RedisCommand& command,
                                     absl::string_view op = "");

  // Sends all commands in one write and reads every reply (one round trip).
  // Error replies come back as kError elements: check each one. Unavailable
  // when the connection fails part-way (some commands may have run).
  absl::StatusOr<std::vector<RedisReply>> Pipeline(
      absl::Span<const RedisCommand> commands, absl::string_view op);

  // EVALSHA of `script` with KEYS and ARGV (see class comment for loading).
  // The script's error reply is returned as a status. `op` empty: the
  // script's name.
  absl::StatusOr<RedisReply> Evalsha(const RedisScript& script,
                                     absl::Span<const std::string> keys,
                                     absl::Span<const std::string> args,
                                     absl::string_view op = "");

  // Runs every call as one pipeline (in cluster mode: one per master owning
  // a call's keys). Calls refused with NOSCRIPT did not run: their scripts
  // are loaded (on every master) and they run once more, as in Evalsha.
  // Each call's reply, error replies included, comes back in its element
  // (check each). Unavailable as Pipeline. `op` labels the metrics.
  absl::StatusOr<std::vector<RedisReply>> EvalshaPipeline(
      absl::Span<const RedisScriptCall> calls, absl::string_view op);

  // PING; OK when Redis answers (in cluster mode: any master).
  absl::Status Ping();

  // The start-up check of a service's credentials: one PING. PermissionDenied
  // when the server refuses them (a wrong password or user, or none given
  // where the server requires one), its message naming what to set; OK when
  // the server accepts them and also when it cannot be reached now (calls
  // then fail with Unavailable until it is back, as without credentials).
  absl::Status CheckCredentials();

  // Runs `command` on every master (one server when not in cluster mode):
  // INFO, SCRIPT FLUSH, FLUSHALL and the like. Returns ("host:port", reply)
  // per master in slot order; an error reply is kept as a kError element.
  absl::StatusOr<std::vector<std::pair<std::string, RedisReply>>> CommandOnEveryMaster(
      const RedisCommand& command, absl::string_view op = "");

  bool cluster_mode() const { return !options_.cluster_seeds.empty(); }

  // "host:port" of the server (cluster mode: the seeds, comma-separated),
  // for messages.
  const std::string& address() const { return address_; }

 private:
  struct Connection;
  struct Node;
  struct OpMetrics;
  struct PendingCall;

  explicit RedisClient(const RedisOptions& options);

  // Runs `commands` (pipelined), on the server or, in cluster mode, on the
  // masters of their slots; fills `replies`. Records metrics under `op`.
  absl::Status Run(absl::Span<const RedisCommand> commands,
                   absl::string_view op, std::vector<RedisReply>* replies);
  // Runs `commands` on `node`: coalesced with other callers' calls when
  // options_.coalesce_calls, else on a free connection (RunOnConnection).
  absl::Status RunOnNode(Node& node, absl::Span<const RedisCommand> commands,
                         std::vector<RedisReply>* replies);
  // Group commit (RedisOptions::coalesce_calls): queues the call, and leads
  // a pipeline of the queued calls whenever fewer than coalesce_in_flight run.
  absl::Status RunCoalesced(Node& node, absl::Span<const RedisCommand> commands,
                            std::vector<RedisReply>* replies);
  // Runs `commands` on a free connection of `node`, connecting first when
  // needed (and not in its backoff period).
  absl::Status RunOnConnection(Node& node, absl::Span<const RedisCommand* const> commands,
                               std::vector<RedisReply>* replies);
  // Both require conn.mu held.
  absl::Status RunOn(Node& node, Connection& conn,
                     absl::Span<const RedisCommand* const> commands,
                     std::vector<RedisReply>* replies);
  absl::Status Connect(Node& node, Connection& conn);
  // Returns a connection of the node's pool with its mutex held (the caller
  // unlocks it): a free one if any, else waits for one.
  Connection& AcquireConnection(Node& node) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::StatusOr<std::string> ScriptSha(const RedisScript& script, bool reload);
  // After NOSCRIPT: loads `script` again (cluster mode: on every master) and
  // returns its SHA1.
  absl::StatusOr<std::string> ReloadScript(const RedisScript& script);
  OpMetrics* MetricsFor(absl::string_view op);

  // Cluster mode (redis_client_cluster.cc).
  absl::Status RunCluster(absl::Span<const RedisCommand> commands,
                          std::vector<RedisReply>* replies);
  // Follows MOVED / ASK for one command whose reply is `*reply`.
  void FollowRedirects(const RedisCommand& command, Node* from, RedisReply* reply);
  // Loads the slot map when it was never loaded or is stale (and the last
  // attempt is older than cluster_refresh_interval).
  absl::Status EnsureSlotMap();
  void MarkSlotMapStale();
  // The node of "host:port", created on first use (never destroyed).
  Node* NodeFor(absl::string_view address);
  Node* SlotOwner(int slot);
  Node* AnyMaster();
  std::vector<Node*> Masters();

  const RedisOptions options_;
  const std::string address_;
  base::Clock* const clock_;

  // Every server this client talks to: one when not in cluster mode (set in
  // the constructor, then constant), the known cluster nodes otherwise.
  // Nodes are never removed, so Node* stay valid.
  absl::Mutex nodes_mu_;
  std::vector<std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(nodes_mu_);
  Node* single_ = nullptr;  // nodes_[0] when not in cluster mode

  // Cluster mode: slot -> master (nullptr: not served), and its freshness.
  absl::Mutex slots_mu_;
  std::vector<Node*> slot_owner_ ABSL_GUARDED_BY(slots_mu_);
  std::vector<Node*> masters_ ABSL_GUARDED_BY(slots_mu_);
  bool slots_loaded_ ABSL_GUARDED_BY(slots_mu_) = false;
  bool slots_stale_ ABSL_GUARDED_BY(slots_mu_) = true;
  bool refreshing_ ABSL_GUARDED_BY(slots_mu_) = false;
  absl::Time last_refresh_ ABSL_GUARDED_BY(slots_mu_) = absl::InfinitePast();
  std::atomic<uint32_t> next_master_{0};

  // The password AUTH sends: options_.password, or password_file's content
  // as last read (Connect re-reads it).
  absl::Mutex password_mu_;
  std::string password_ ABSL_GUARDED_BY(password_mu_);
  // Reads options_.password_file into password_ when set; returns the
  // password to send (the last one when the file cannot be read now).
  std::string CurrentPassword();

  // Script source -> SHA1 (as SCRIPT LOAD returned it).
  absl::Mutex scripts_mu_;
  absl::flat_hash_map<std::string, std::string> script_shas_
      ABSL_GUARDED_BY(scripts_mu_);

  metrics::HistogramFamily* latency_family_ = nullptr;
  metrics::CounterFamily* error_family_ = nullptr;
  // swaserve_redis_coalesced_calls (calls per pipeline a coalescing client
  // sent); nullptr without metrics or coalescing.
  metrics::Histogram* coalesced_calls_ = nullptr;
  absl::Mutex metrics_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<OpMetrics>> op_metrics_
      ABSL_GUARDED_BY(metrics_mu_);
};

}  // namespace swaserve::cluster
