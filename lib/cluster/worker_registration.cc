#include "lib/cluster/worker_registration.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"

namespace swaserve::cluster {
namespace {

// Retry period of a failed registration (on top of the client's backoff).
constexpr absl::Duration kRegisterRetry = absl::Milliseconds(100);

int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

absl::Status CheckReplies(const std::vector<RedisReply>& replies,
                          absl::string_view what) {
  for (const RedisReply& r : replies) {
    if (r.is_error()) return base::Annotate(r.ToStatus(), what);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerRegistration>> WorkerRegistration::Create(
    WorkerRegistrationOptions options) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("WorkerRegistrationOptions: ", what));
  };
  if (options.redis == nullptr) return bad("redis is required");
  RETURN_IF_ERROR(ValidateName(options.info.id, "worker id"));
  if (options.info.role == swaserve::v1::ROLE_UNSPECIFIED) {
    return bad("info.role is required");
  }
  if (options.record_ttl < absl::Milliseconds(10)) {
    return bad("record_ttl must be >= 10 ms");
  }
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_interval >= options.record_ttl) {
    return bad("need 0 < heartbeat_interval < record_ttl");
  }
  if (options.load_interval <= absl::ZeroDuration() ||
      options.load_ttl < absl::Milliseconds(1)) {
    return bad("need load_interval > 0 and load_ttl >= 1 ms");
  }
  if (options.event_flush_interval <= absl::ZeroDuration()) {
    return bad("event_flush_interval must be > 0");
  }
  if (options.max_queued_hashes < 1 || options.max_hashes_per_flush < 1) {
    return bad("max_queued_hashes and max_hashes_per_flush must be >= 1");
  }
  ASSIGN_OR_RETURN(KeySchema keys, KeySchema::Create(options.cluster,
                                                     IndexShardCount(*options.redis,
                                                                     options.index)));
  ASSIGN_OR_RETURN(std::unique_ptr<PrefixIndex> index,
                   PrefixIndex::Create(options.redis, keys, options.index));
  base::Clock* clock =
      options.clock != nullptr ? options.clock : base::Clock::Real();
  if (options.info.started_at_ms == 0) {
    options.info.started_at_ms = absl::ToUnixMillis(clock->Now());
  }
  if (options.info.incarnation == 0) {
    absl::BitGen gen;
    options.info.incarnation = absl::Uniform<uint64_t>(gen) | 1;
  }
  auto reg = absl::WrapUnique(
      new WorkerRegistration(std::move(options), keys, std::move(index)));
  if (reg->options_.metrics != nullptr) {
    metrics::Registry& m = *reg->options_.metrics;
    ASSIGN_OR_RETURN(metrics::GaugeFamily * registered,
                     m.AddGauge("swaserve_cluster_registered",
                                "1 while this worker's record is in Redis (as "
                                "of its last heartbeat), else 0."));
    ASSIGN_OR_RETURN(
        metrics::CounterFamily * registrations,
        m.AddCounter("swaserve_cluster_registrations_total",
                     "Times this worker wrote its record to Redis; more than "
                     "one means Redis lost it (restart, partition)."));
    ASSIGN_OR_RETURN(
        metrics::CounterFamily * events,
        m.AddCounter("swaserve_cluster_cache_event_hashes_total",
                     "Prefix-cache event page hashes, by outcome: written to "
                     "the Redis prefix index, or dropped (queue bound hit "
                     "while Redis was unavailable).",
                     {"outcome"}));
    reg->registered_gauge_ = &registered->WithLabels();
    reg->registrations_counter_ = &registrations->WithLabels();
    reg->events_written_counter_ = &events->WithLabels({"written"});
    reg->events_dropped_counter_ = &events->WithLabels({"dropped"});
  }
  reg->thread_ = std::thread([r = reg.get()] { r->Run(); });
  return reg;
}

WorkerRegistration::WorkerRegistration(WorkerRegistrationOptions options,
                                       KeySchema keys,
                                       std::unique_ptr<PrefixIndex> index)
    : options_(std::move(options)),
      keys_(std::move(keys)),
      clock_(options_.clock != nullptr ? options_.clock : base::Clock::Real()),
      index_(std::move(index)),
      events_(options_.max_queued_hashes) {
  if (index_->sharded()) {
    mapper_ = std::make_unique<IndexShardMapper>(keys_, options_.index.anchor_page);
  }
}

WorkerRegistration::~WorkerRegistration() { Stop(); }

void WorkerRegistration::PublishCacheEvent(bool stored,
                                           std::vector<uint64_t> hashes) {
  PublishCacheEvent(stored ? CacheEventOp::Kind::kStored : CacheEventOp::Kind::kRemoved,
                    std::move(hashes));
}

void WorkerRegistration::PublishCacheEvent(CacheEventOp::Kind kind,
                                           std::vector<uint64_t> hashes) {
  const size_t k = static_cast<size_t>(options_.index.anchor_page);
  const uint64_t anchor = hashes.size() > k ? hashes[k] : 0;
  PublishCacheEvent(kind, std::move(hashes), /*depth=*/0, /*parent=*/0, anchor);
}

void WorkerRegistration::PublishCacheEvent(CacheEventOp::Kind kind,
                                           std::vector<uint64_t> hashes, int depth,
                                           uint64_t parent, uint64_t anchor) {
  if (hashes.empty()) return;
  if (kind == CacheEventOp::Kind::kCleared) {
    PublishCacheCleared();
    return;
  }
  if (mapper_ == nullptr) {
    events_.Push(kind, hashes);
  } else {
    absl::MutexLock lock(&mapper_mu_);
    const uint64_t dropped = events_.dropped_hashes();
    if (dropped != mapper_dropped_) {
      // The queue dropped events and cleared the index: no copies remain.
      mapper_->ForgetCopies();
      mapper_dropped_ = dropped;
    }
    std::vector<CacheEventOp> ops;
    mapper_->Map(PathEvent{.kind = kind, .hashes = hashes, .depth = depth, .parent = parent,
                           .anchor = anchor},
                 &ops);
    for (const CacheEventOp& op : ops) events_.Push(op);
  }
  const size_t queued = events_.queued_hashes();
  absl::MutexLock lock(&mu_);
  if (first_event_at_ == absl::InfiniteFuture()) {
    first_event_at_ = absl::Now();
    wake_ = true;
  }
  if (queued >= options_.max_hashes_per_flush) wake_ = true;
}

void WorkerRegistration::PublishCacheCleared() {
  if (mapper_ == nullptr) {
    events_.PushCleared();
  } else {
    absl::MutexLock lock(&mapper_mu_);
    mapper_->Clear();
    events_.PushCleared();
  }
  absl::MutexLock lock(&mu_);
  if (first_event_at_ == absl::InfiniteFuture()) first_event_at_ = absl::Now();
  wake_ = true;
}

bool WorkerRegistration::WaitRegistered(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto cond = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stats_.registered || !refused_.ok();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
}

bool WorkerRegistration::WaitEventsFlushed(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (!batch_in_flight_ && events_.empty()) return true;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

WorkerRegistration::Stats WorkerRegistration::stats() const {
  Stats s;
  {
    absl::MutexLock lock(&mu_);
    s = stats_;
  }
  s.event_hashes_dropped = events_.dropped_hashes();
  s.event_hashes_queued = events_.queued_hashes();
  return s;
}

std::string DefaultWorkerId(absl::string_view role) {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "host");
  }
  absl::BitGen gen;
  return absl::StrFormat("%s-%s-%d-%04x", role, host, static_cast<int>(getpid()),
                         absl::Uniform<uint32_t>(gen, 0, 0x10000));
}

absl::Status WorkerRegistration::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

absl::Status WorkerRegistration::CheckIdentity(const std::string& record) {
  ASSIGN_OR_RETURN(RedisReply r, options_.redis->Command({"HGETALL", record}, "register"));
  if (!r.is_array() || r.elements.empty()) return absl::OkStatus();
  std::vector<std::pair<std::string, std::string>> fields;
  for (size_t i = 0; i + 1 < r.elements.size(); i += 2) {
    fields.emplace_back(r.elements[i].str, r.elements[i + 1].str);
  }
  absl::StatusOr<WorkerInfo> other = DecodeWorkerInfo(fields);
  if (!other.ok()) return absl::OkStatus();  // a malformed record is replaced
  if (other->incarnation == options_.info.incarnation) return absl::OkStatus();
  if (other->grpc_address == options_.info.grpc_address) return absl::OkStatus();
  if (!options_.is_live || !options_.is_live(*other)) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "worker id '", options_.info.id, "' is already registered by a live worker at ",
      other->grpc_address, " (incarnation ", other->incarnation,
      "); give this worker another --worker_id, or leave it empty for a unique default"));
}

absl::Status WorkerRegistration::Register() {
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = !ever_registered_;
  }
  const std::string record = keys_.WorkerKey(options_.info.id);
  if (absl::Status id = CheckIdentity(record); !id.ok()) {
    if (absl::IsAlreadyExists(id)) {
      absl::MutexLock lock(&mu_);
      refused_ = id;
    }
    return id;
  }
  RedisCommand hset = {"HSET", record};
  for (auto& [field, value] : EncodeWorkerInfo(options_.info)) {
    hset.push_back(field);
    hset.push_back(value);
  }
  std::vector<RedisCommand> commands;
  if (first && options_.clear_index_on_start) {
    // Before the record, outside its transaction (on a Redis Cluster the
    // index and event keys live in other hash slots): a router that sees
    // the record sees no stale entries. The KV event stream restarts too:
    // its consumers see the sequence start over and resync from a snapshot
    // (kv_events.h).
    const std::string& id = options_.info.id;
    commands = index_->ClearCommands(id);
    commands.push_back({"DEL", keys_.EventsKey(id), keys_.EventSeqKey(id), keys_.EventEpochKey(id)});
  }
  commands.push_back({"MULTI"});
  commands.push_back({"DEL", record});
  commands.push_back(std::move(hset));
  commands.push_back({"PEXPIRE", record, absl::StrCat(ToMs(options_.record_ttl))});
  commands.push_back({"SADD", keys_.WorkersKey(), options_.info.id});
  commands.push_back({"EXEC"});
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                   options_.redis->Pipeline(commands, "register"));
  RETURN_IF_ERROR(CheckReplies(replies, "registering the worker record"));
  const RedisReply& exec = replies.back();
  if (!exec.is_array()) {
    return absl::InternalError(absl::StrCat(
        "registering the worker record: EXEC returned ", exec.DebugString()));
  }
  RETURN_IF_ERROR(CheckReplies(exec.elements, "registering the worker record"));
  absl::MutexLock lock(&mu_);
  ever_registered_ = true;
  stats_.registered = true;
  ++stats_.registrations;
  if (registered_gauge_ != nullptr) registered_gauge_->Set(1);
  if (registrations_counter_ != nullptr) registrations_counter_->Increment();
  return absl::OkStatus();
}

absl::Status WorkerRegistration::Heartbeat(bool publish_load,
                                           bool refresh_record) {
  std::vector<RedisCommand> commands;
  if (publish_load && options_.load_fn) {
    swaserve::v1::WorkerLoad load = options_.load_fn();
    if (load.worker_id().empty()) load.set_worker_id(options_.info.id);
    if (load.role() == swaserve::v1::ROLE_UNSPECIFIED) {
      load.set_role(options_.info.role);
    }
    if (load.timestamp_ms() == 0) {
      load.set_timestamp_ms(absl::ToUnixMillis(clock_->Now()));
    }
    commands.push_back({"SET", keys_.LoadKey(options_.info.id),
                        load.SerializeAsString(), "PX",
                        absl::StrCat(ToMs(options_.load_ttl))});
  }
  const size_t pexpire_index = commands.size();
  if (refresh_record) {
    commands.push_back({"PEXPIRE", keys_.WorkerKey(options_.info.id),
                        absl::StrCat(ToMs(options_.record_ttl))});
    commands.push_back({"SADD", keys_.WorkersKey(), options_.info.id});
    // A live worker's index entries do not expire (prefix_index.h): every
    // shard it has written (a single Redis: the one shard), an eighth of
    // index_ttl apart (on a Redis Cluster that is up to 194 commands; once a
    // heartbeat would be 2 per second per worker for nothing). Event writes
    // refresh what they touch in between.
    // (The reply read below is the record's PEXPIRE, the first of these.)
    const absl::Time now = absl::Now();
    if (now >= next_index_refresh_) {
      next_index_refresh_ = now + options_.index.index_ttl / 8;
      uint64_t shards = 1;
      if (mapper_ != nullptr) {
        absl::MutexLock lock(&mapper_mu_);
        shards = mapper_->touched_shards();
      }
      for (RedisCommand& c : index_->ExpireCommands(options_.info.id, shards)) {
        commands.push_back(std::move(c));
      }
      for (const std::string& key :
           {keys_.EventsKey(options_.info.id), keys_.EventSeqKey(options_.info.id),
            keys_.EventEpochKey(options_.info.id)}) {
        commands.push_back({"PEXPIRE", key, absl::StrCat(ToMs(options_.index.index_ttl))});
      }
    }
  }
  if (commands.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                   options_.redis->Pipeline(commands, "heartbeat"));
  RETURN_IF_ERROR(CheckReplies(replies, "heartbeat"));
  absl::MutexLock lock(&mu_);
  if (publish_load && options_.load_fn) ++stats_.load_reports;
  if (refresh_record) {
    ASSIGN_OR_RETURN(int64_t refreshed, replies[pexpire_index].AsInteger());
    if (refreshed == 0) {
      // The record is gone (Redis restarted or the TTL lapsed): register
      // again.
      stats_.registered = false;
      if (registered_gauge_ != nullptr) registered_gauge_->Set(0);
    } else {
      ++stats_.heartbeats;
    }
  }
  return absl::OkStatus();
}

bool WorkerRegistration::FlushEvents() {
  while (true) {
    std::vector<CacheEventOp> batch;
    {
      absl::MutexLock lock(&mu_);
      batch = events_.TakeBatch(options_.max_hashes_per_flush);
      if (batch.empty()) {
        first_event_at_ = absl::InfiniteFuture();
        return true;
      }
      batch_in_flight_ = true;
    }
    uint64_t hashes = 0;
    for (const CacheEventOp& op : batch) hashes += op.hashes.size();
    absl::StatusOr<int64_t> size =
        index_->Apply(options_.info.id, batch, "cache_events");
    absl::MutexLock lock(&mu_);
    batch_in_flight_ = false;
    if (!size.ok()) {
      events_.Requeue(std::move(batch));
      ++stats_.failures;
      SWA_LOG(debug, "cluster: writing {} cache event hashes failed: {}",
              hashes, size.status().ToString());
      return false;
    }
    stats_.event_hashes_written += hashes;
    if (events_written_counter_ != nullptr) {
      events_written_counter_->Increment(static_cast<double>(hashes));
    }
  }
}

absl::Status WorkerRegistration::Deregister() {
  const std::string& id = options_.info.id;
  // One DEL per hash tag (a Redis Cluster refuses keys of several slots).
  std::vector<RedisCommand> commands = {
      {"DEL", keys_.WorkerKey(id), keys_.LoadKey(id)},
      {"SREM", keys_.WorkersKey(), id},
      {"DEL", keys_.EventsKey(id), keys_.EventSeqKey(id), keys_.EventEpochKey(id)},
  };
  for (RedisCommand& c : index_->ClearCommands(id)) commands.push_back(std::move(c));
  ASSIGN_OR_RETURN(std::vector<RedisReply> replies,
                   options_.redis->Pipeline(commands, "deregister"));
  RETURN_IF_ERROR(CheckReplies(replies, "deregistering"));
  absl::MutexLock lock(&mu_);
  stats_.registered = false;
  if (registered_gauge_ != nullptr) registered_gauge_->Set(0);
  return absl::OkStatus();
}

void WorkerRegistration::Run() {
  absl::Time next_heartbeat = absl::InfinitePast();
  absl::Time next_load = absl::InfinitePast();
  absl::Time next_register = absl::InfinitePast();
  uint64_t dropped_reported = 0;
  bool last_failed = false;
  // When the last registration or heartbeat that reached Redis was sent:
  // the record expires record_ttl after it.
  absl::Time record_refreshed = absl::InfinitePast();
  while (true) {
    const absl::Time now = absl::Now();
    bool registered;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      wake_ = false;
      registered = stats_.registered;
    }
    bool failed = false;
    if (!registered && now >= next_register) {
      absl::Status s = Register();
      if (absl::IsAlreadyExists(s)) {
        SWA_LOG(err, "cluster: {}", s.ToString());
        return;  // refused for good: refused() says why
      }
      if (s.ok()) {
        registered = true;
        record_refreshed = now;
        next_heartbeat = now + options_.heartbeat_interval;
        SWA_LOG(info, "cluster: registered worker {} ({}) in Redis at {}",
                options_.info.id, swaserve::v1::Role_Name(options_.info.role),
                options_.redis->address());
      } else {
        failed = true;
        next_register = now + kRegisterRetry;
        if (!last_failed) {
          SWA_LOG(warn, "cluster: cannot register worker {}: {}",
                  options_.info.id, s.ToString());
        }
      }
    }
    const bool load_due = options_.load_fn && now >= next_load;
    const bool heartbeat_due = registered && now >= next_heartbeat;
    if (load_due || heartbeat_due) {
      absl::Status s = Heartbeat(load_due, heartbeat_due);
      if (load_due) next_load = now + options_.load_interval;
      if (heartbeat_due) next_heartbeat = now + options_.heartbeat_interval;
      if (!s.ok()) {
        failed = true;
        if (!last_failed) {
          SWA_LOG(warn, "cluster: heartbeat of worker {} failed: {}",
                  options_.info.id, s.ToString());
        }
        const absl::Duration silent = absl::Now() - record_refreshed;
        if (heartbeat_due && silent >= options_.record_ttl) {
          // No heartbeat reached Redis for a whole TTL (a partition, a hung
          // Redis): the record has expired, so routers no longer see this
          // worker. Say so, and register again as soon as Redis answers
          // instead of one heartbeat later.
          absl::MutexLock lock(&mu_);
          if (stats_.registered) {
            SWA_LOG(warn,
                    "cluster: no heartbeat of worker {} reached Redis for {}: its record "
                    "has expired; registering again when Redis answers",
                    options_.info.id, absl::FormatDuration(silent));
            stats_.registered = false;
            if (registered_gauge_ != nullptr) registered_gauge_->Set(0);
          }
          registered = false;
          next_register = absl::InfinitePast();
        }
      } else {
        if (heartbeat_due) record_refreshed = now;
        absl::MutexLock lock(&mu_);
        if (!stats_.registered && registered) {
          SWA_LOG(warn,
                  "cluster: the record of worker {} vanished from Redis; "
                  "registering again",
                  options_.info.id);
          registered = false;
          next_register = absl::InfinitePast();
        }
      }
    }
    if (failed) {
      absl::MutexLock lock(&mu_);
      ++stats_.failures;
    }
    bool flush_due = false;
    {
      absl::MutexLock lock(&mu_);
      flush_due = registered && stats_.registered &&
                  (now >= first_event_at_ + options_.event_flush_interval ||
                   events_.queued_hashes() >= options_.max_hashes_per_flush);
    }
    if (flush_due && !FlushEvents()) failed = true;
    const uint64_t dropped = events_.dropped_hashes();
    if (dropped > dropped_reported) {
      if (events_dropped_counter_ != nullptr) {
        events_dropped_counter_->Increment(
            static_cast<double>(dropped - dropped_reported));
      }
      SWA_LOG(warn,
              "cluster: dropped {} cache event hashes (queue bound {} hit "
              "while Redis was unavailable)",
              dropped - dropped_reported, options_.max_queued_hashes);
      dropped_reported = dropped;
    }
    // A load report alone touches one Redis Cluster node: its success says
    // nothing of the others, so only a heartbeat or an event flush ends a
    // failure episode (else one dead master would log a warning and a
    // recovery every load interval).
    if (failed || heartbeat_due || flush_due) {
      if (last_failed && !failed) {
        SWA_LOG(info, "cluster: Redis at {} reachable again",
                options_.redis->address());
      }
      last_failed = failed;
    }

    // Sleep until the next thing is due, or a producer wakes us.
    absl::MutexLock lock(&mu_);
    absl::Time deadline = absl::InfiniteFuture();
    if (options_.load_fn) deadline = std::min(deadline, next_load);
    if (stats_.registered) {
      deadline = std::min(deadline, next_heartbeat);
      if (first_event_at_ != absl::InfiniteFuture()) {
        deadline = std::min(
            deadline, failed ? absl::Now() + kRegisterRetry
                             : first_event_at_ + options_.event_flush_interval);
      }
    } else {
      deadline = std::min(deadline, next_register);
    }
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || wake_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&wake), deadline);
  }
}

void WorkerRegistration::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  bool registered;
  bool refused;
  {
    absl::MutexLock lock(&mu_);
    registered = stats_.registered;
    refused = !refused_.ok();
  }
  if (refused) return;  // the record is the live owner's, not ours
  if (options_.deregister_on_stop) {
    absl::Status s = Deregister();
    if (!s.ok()) {
      SWA_LOG(warn,
              "cluster: could not deregister worker {} ({}); its record "
              "expires within {}",
              options_.info.id, s.ToString(),
              absl::FormatDuration(options_.record_ttl));
    }
  } else if (registered) {
    FlushEvents();
  }
}

}  // namespace swaserve::cluster
