// RedisClient in cluster mode (redis_client.h): the slot map from CLUSTER
// SLOTS, the node owning a slot, MOVED/ASK redirects, pipelines split per
// node, commands on every master. Split from redis_client.cc, which holds the
// connections, the single-node path and the RESP helpers.
#include "lib/cluster/redis_client.h"
#include "lib/cluster/redis_client_internal.h"

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
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/base/clock.h"
#include "lib/base/signals.h"
#include "lib/base/status.h"
#include "lib/cluster/redis_cluster_protocol.h"
#include "lib/metrics/buckets.h"

namespace swaserve::cluster {

RedisClient::Node* RedisClient::NodeFor(absl::string_view address) {
  absl::MutexLock lock(&nodes_mu_);
  for (auto& node : nodes_) {
    if (node->address == address) return node.get();
  }
  std::string host;
  int port = 0;
  if (!SplitHostPort(address, &host, &port)) return nullptr;
  nodes_.push_back(std::make_unique<Node>(std::move(host), port, options_.pool_size,
                                          options_.reconnect_backoff_initial));
  return nodes_.back().get();
}

RedisClient::Node* RedisClient::SlotOwner(int slot) {
  absl::MutexLock lock(&slots_mu_);
  return slot_owner_[slot];
}

std::vector<RedisClient::Node*> RedisClient::Masters() {
  absl::MutexLock lock(&slots_mu_);
  return masters_;
}

RedisClient::Node* RedisClient::AnyMaster() {
  absl::MutexLock lock(&slots_mu_);
  if (masters_.empty()) return nullptr;
  return masters_[next_master_.fetch_add(1, std::memory_order_relaxed) % masters_.size()];
}

void RedisClient::MarkSlotMapStale() {
  absl::MutexLock lock(&slots_mu_);
  slots_stale_ = true;
}

absl::Status RedisClient::EnsureSlotMap() {
  std::vector<Node*> candidates;
  {
    absl::MutexLock lock(&slots_mu_);
    if (slots_loaded_ && (!slots_stale_ || refreshing_ ||
                          clock_->Now() - last_refresh_ < options_.cluster_refresh_interval)) {
      return absl::OkStatus();
    }
    refreshing_ = true;
    last_refresh_ = clock_->Now();
    // Masters first (after a failover the old one fails fast in its
    // backoff), then every other known node and the seeds.
    candidates = masters_;
  }
  for (const std::string& seed : options_.cluster_seeds) candidates.push_back(NodeFor(seed));
  {
    absl::MutexLock lock(&nodes_mu_);
    for (auto& node : nodes_) candidates.push_back(node.get());
  }
  std::string errors;
  std::vector<RedisSlotRange> ranges;
  bool got = false;
  std::vector<Node*> tried;
  for (Node* node : candidates) {
    if (node == nullptr || std::find(tried.begin(), tried.end(), node) != tried.end()) continue;
    tried.push_back(node);
    std::vector<RedisReply> replies;
    const RedisCommand command = {"CLUSTER", "SLOTS"};
    absl::Status s = RunOnNode(*node, absl::MakeConstSpan(&command, 1), &replies);
    if (s.ok() && replies[0].is_error()) {
      s = absl::FailedPreconditionError(absl::StrCat(
          node->address, " answered CLUSTER SLOTS with '", replies[0].str,
          "' (is it a Redis Cluster node? a single server takes redis://host:port)"));
    }
    absl::StatusOr<std::vector<RedisSlotRange>> parsed =
        s.ok() ? ParseClusterSlots(replies[0], node->host)
               : absl::StatusOr<std::vector<RedisSlotRange>>(s);
    if (parsed.ok() && !parsed->empty()) {
      ranges = *std::move(parsed);
      got = true;
      break;
    }
    absl::StrAppend(&errors, errors.empty() ? "" : "; ",
                    parsed.ok() ? absl::StrCat(node->address, ": no slots assigned")
                                : std::string(parsed.status().message()));
  }
  std::vector<Node*> owner(kRedisClusterSlots, nullptr);
  std::vector<Node*> masters;
  if (got) {
    for (const RedisSlotRange& r : ranges) {
      Node* master = NodeFor(r.master);
      for (int slot = r.start; slot <= r.end; ++slot) owner[slot] = master;
      if (std::find(masters.begin(), masters.end(), master) == masters.end()) {
        masters.push_back(master);
      }
    }
  }
  absl::MutexLock lock(&slots_mu_);
  refreshing_ = false;
  if (!got) {
    if (slots_loaded_) return absl::OkStatus();  // keep the old map; calls fail on their own
    return absl::UnavailableError(absl::StrCat(
        "redis cluster at ", address_, ": no node answered CLUSTER SLOTS (", errors, ")"));
  }
  slot_owner_ = std::move(owner);
  masters_ = std::move(masters);
  slots_loaded_ = true;
  slots_stale_ = false;
  return absl::OkStatus();
}

void RedisClient::FollowRedirects(const RedisCommand& command, Node* from, RedisReply* reply) {
  for (int hop = 0; hop < 5; ++hop) {
    std::optional<RedisRedirect> redirect = ParseRedisRedirect(*reply);
    if (!redirect) return;
    std::string address = redirect->address;
    if (absl::StartsWith(address, ":")) address = absl::StrCat(from->host, address);
    Node* to = NodeFor(address);
    if (to == nullptr) return;
    std::vector<RedisReply> replies;
    absl::Status s;
    if (redirect->ask) {
      const RedisCommand both[] = {{"ASKING"}, command};
      s = RunOnNode(*to, both, &replies);
      if (s.ok()) replies.erase(replies.begin());
    } else {
      MarkSlotMapStale();
      s = RunOnNode(*to, absl::MakeConstSpan(&command, 1), &replies);
    }
    if (!s.ok()) {
      MarkSlotMapStale();
      *reply = RedisReply{.type = RedisReply::Type::kError,
                          .str = absl::StrCat("MASTERDOWN following ", reply->str, ": ",
                                              s.message())};
      return;
    }
    *reply = std::move(replies[0]);
    from = to;
  }
}

absl::Status RedisClient::RunCluster(absl::Span<const RedisCommand> commands,
                                     std::vector<RedisReply>* replies) {
  RETURN_IF_ERROR(EnsureSlotMap());
  const size_t n = commands.size();
  std::vector<Node*> target(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    std::optional<absl::string_view> key = RedisCommandKey(commands[i]);
    if (!key) continue;
    const int slot = RedisKeySlot(*key);
    target[i] = SlotOwner(slot);
    if (target[i] == nullptr) {
      MarkSlotMapStale();
      return absl::UnavailableError(absl::StrCat("redis cluster at ", address_, ": hash slot ",
                                                 slot, " has no master (cluster down?)"));
    }
  }
  // Keyless commands go with the next keyed one (EXEC/DISCARD: the one
  // before), so a MULTI ... EXEC stays on its node.
  Node* next = nullptr;
  for (size_t i = n; i-- > 0;) {
    if (target[i] != nullptr) {
      next = target[i];
    } else if (!commands[i].empty() && !absl::EqualsIgnoreCase(commands[i][0], "exec") &&
               !absl::EqualsIgnoreCase(commands[i][0], "discard")) {
      target[i] = next;
    }
  }
  Node* prev = nullptr;
  for (size_t i = 0; i < n; ++i) {
    if (target[i] == nullptr) target[i] = prev;
    if (target[i] == nullptr) target[i] = AnyMaster();
    if (target[i] == nullptr) return absl::UnavailableError("redis cluster: no master known");
    prev = target[i];
  }
  replies->assign(n, RedisReply{});
  // One pipeline per node, in order of first appearance.
  std::vector<Node*> order;
  for (Node* t : target) {
    if (std::find(order.begin(), order.end(), t) == order.end()) order.push_back(t);
  }
  for (Node* node : order) {
    std::vector<size_t> idx;
    std::vector<RedisReply> got;
    absl::Status s;
    if (order.size() == 1) {
      s = RunOnNode(*node, commands, &got);
      for (size_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      std::vector<RedisCommand> sub;
      for (size_t i = 0; i < n; ++i) {
        if (target[i] != node) continue;
        idx.push_back(i);
        sub.push_back(commands[i]);
      }
      s = RunOnNode(*node, sub, &got);
    }
    if (!s.ok()) {
      MarkSlotMapStale();
      return s;
    }
    for (size_t j = 0; j < idx.size(); ++j) (*replies)[idx[j]] = std::move(got[j]);
  }
  bool in_transaction = false;
  for (size_t i = 0; i < n; ++i) {
    const RedisCommand& c = commands[i];
    if (!c.empty() && absl::EqualsIgnoreCase(c[0], "multi")) in_transaction = true;
    if (!c.empty() && (absl::EqualsIgnoreCase(c[0], "exec") ||
                       absl::EqualsIgnoreCase(c[0], "discard"))) {
      in_transaction = false;
    }
    if (!in_transaction && (*replies)[i].is_error()) FollowRedirects(c, target[i], &(*replies)[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, RedisReply>>> RedisClient::CommandOnEveryMaster(
    const RedisCommand& command, absl::string_view op) {
  std::vector<std::pair<std::string, RedisReply>> out;
  std::vector<Node*> masters;
  if (single_ != nullptr) {
    masters.push_back(single_);
  } else {
    RETURN_IF_ERROR(EnsureSlotMap());
    masters = Masters();
  }
  OpMetrics* m = MetricsFor(op.empty() ? OpFromCommand(command) : std::string(op));
  for (Node* node : masters) {
    const int64_t start = base::MonotonicNanos();
    std::vector<RedisReply> replies;
    absl::Status s = RunOnNode(*node, absl::MakeConstSpan(&command, 1), &replies);
    if (m != nullptr) {
      m->latency->Observe(static_cast<double>(base::MonotonicNanos() - start) * 1e-9);
      if (!s.ok() || replies[0].is_error()) m->errors->Increment();
    }
    if (!s.ok()) {
      if (single_ == nullptr) MarkSlotMapStale();
      return s;
    }
    out.emplace_back(node->address, std::move(replies[0]));
  }
  return out;
}

}  // namespace swaserve::cluster
