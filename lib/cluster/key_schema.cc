#include "lib/cluster/key_schema.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/cluster/redis_cluster_protocol.h"

namespace swaserve::cluster {
namespace {

constexpr size_t kMaxNameLength = 200;

template <typename T>
absl::Status ParseInt(absl::string_view field, absl::string_view value,
                      T* out) {
  if (!absl::SimpleAtoi(value, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker record field '", field,
                     "': expected an integer, got '", value, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateName(absl::string_view id, absl::string_view what) {
  if (id.empty() || id.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be 1-", kMaxNameLength,
                     " characters long, got ", id.size(), " ('", id, "')"));
  }
  for (char c : id) {
    const bool ok = absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", id,
          "' has a character outside [A-Za-z0-9._:-] (it is part of Redis "
          "key names)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KeySchema> KeySchema::Create(absl::string_view cluster, int index_shards) {
  absl::Status s = ValidateName(cluster, "cluster name");
  if (!s.ok()) return s;
  if (index_shards < 1 || index_shards > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("index shards must be in 1..64, got ", index_shards));
  }
  std::string prefix = absl::StrCat("swaserve:", kSchemaVersion, ":", cluster, ":");
  std::vector<std::string> tags;
  if (index_shards == 1) {
    tags.push_back(absl::StrCat(prefix, "{", cluster, ".ix.0}:"));
  } else {
    const int band = kRedisClusterSlots / index_shards;
    for (int shard = 0; shard < index_shards; ++shard) {
      // The least salt whose slot falls in the shard's band (about
      // index_shards tries on average; deterministic, so every process
      // builds the same names).
      for (int salt = 0;; ++salt) {
        std::string tag = absl::StrCat(cluster, ".ix.", shard, ".", salt);
        if (RedisKeySlot(tag) / band == shard) {
          tags.push_back(absl::StrCat(prefix, "{", tag, "}:"));
          break;
        }
      }
    }
  }
  return KeySchema(std::string(cluster), std::move(prefix), std::move(tags));
}

std::string KeySchema::WorkerKey(absl::string_view id) const {
  return absl::StrCat(registry_, "worker:", id);
}
std::string KeySchema::LoadKey(absl::string_view id) const {
  return absl::StrCat(registry_, "load:", id);
}
std::string KeySchema::PrefixKey(absl::string_view id, int shard) const {
  return absl::StrCat(shard_tags_[shard], "prefix:", id);
}
std::string KeySchema::PredictedKey(absl::string_view id, int shard) const {
  return absl::StrCat(shard_tags_[shard], "predicted:", id);
}
std::string KeySchema::SwaGoneKey(absl::string_view id, int shard) const {
  return absl::StrCat(shard_tags_[shard], "swa_gone:", id);
}
std::string KeySchema::LowerTierKey(absl::string_view id, int shard) const {
  return absl::StrCat(shard_tags_[shard], "lower:", id);
}
std::string KeySchema::KvPageKey(uint64_t layout, uint64_t hash) const {
  return absl::StrFormat("%skvpage:%016x:%016x", prefix_, layout, hash);
}

std::string EncodePageHash(uint64_t hash) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(hash & 0xff);
    hash >>= 8;
  }
  return out;
}

absl::StatusOr<uint64_t> DecodePageHash(absl::string_view bytes) {
  if (bytes.size() != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("page hash member must be 8 bytes, got ", bytes.size()));
  }
  uint64_t v = 0;
  for (char c : bytes) v = (v << 8) | static_cast<unsigned char>(c);
  return v;
}

std::vector<std::string> EncodePageHashes(const std::vector<uint64_t>& hashes) {
  std::vector<std::string> out;
  out.reserve(hashes.size());
  for (uint64_t h : hashes) out.push_back(EncodePageHash(h));
  return out;
}

std::string PackPageHashes(absl::Span<const uint64_t> hashes) {
  std::string out(hashes.size() * 8, '\0');
  char* p = out.data();
  for (uint64_t h : hashes) {
    for (int i = 7; i >= 0; --i) {
      p[i] = static_cast<char>(h & 0xff);
      h >>= 8;
    }
    p += 8;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> EncodeWorkerInfo(
    const WorkerInfo& info) {
  return {
      {"id", info.id},
      {"role", swaserve::v1::Role_Name(info.role)},
      {"model", info.model},
      {"bucket", absl::StrCat(info.bucket)},
      {"bucket_min_tokens", absl::StrCat(info.bucket_min_tokens)},
      {"bucket_max_tokens", absl::StrCat(info.bucket_max_tokens)},
      {"grpc_address", info.grpc_address},
      {"ucx_address", info.ucx_address},
      {"page_size", absl::StrCat(info.page_size)},
      {"full_pages", absl::StrCat(info.full_pages)},
      {"swa_pages", absl::StrCat(info.swa_pages)},
      {"max_running_requests", absl::StrCat(info.max_running_requests)},
      {"sliding_window", absl::StrCat(info.sliding_window)},
      {"swa_chain_layers", absl::StrCat(info.swa_chain_layers)},
      {"window_restore", info.window_restore ? "1" : "0"},
      {"window_restore_work", absl::StrCat(info.window_restore_work)},
      {"started_at_ms", absl::StrCat(info.started_at_ms)},
      {"incarnation", absl::StrFormat("%016x", info.incarnation)},
  };
}

absl::StatusOr<WorkerInfo> DecodeWorkerInfo(
    const std::vector<std::pair<std::string, std::string>>& fields) {
  WorkerInfo info;
  bool has_id = false;
  bool has_role = false;
  for (const auto& [field, value] : fields) {
    absl::Status s;
    if (field == "id") {
      info.id = value;
      has_id = true;
    } else if (field == "role") {
      if (!swaserve::v1::Role_Parse(value, &info.role)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "worker record field 'role': unknown role '", value, "'"));
      }
      has_role = true;
    } else if (field == "model") {
      info.model = value;
    } else if (field == "bucket") {
      s = ParseInt(field, value, &info.bucket);
    } else if (field == "bucket_min_tokens") {
      s = ParseInt(field, value, &info.bucket_min_tokens);
    } else if (field == "bucket_max_tokens") {
      s = ParseInt(field, value, &info.bucket_max_tokens);
    } else if (field == "grpc_address") {
      info.grpc_address = value;
    } else if (field == "ucx_address") {
      info.ucx_address = value;
    } else if (field == "page_size") {
      s = ParseInt(field, value, &info.page_size);
    } else if (field == "full_pages") {
      s = ParseInt(field, value, &info.full_pages);
    } else if (field == "swa_pages") {
      s = ParseInt(field, value, &info.swa_pages);
    } else if (field == "max_running_requests") {
      s = ParseInt(field, value, &info.max_running_requests);
    } else if (field == "sliding_window") {
      s = ParseInt(field, value, &info.sliding_window);
    } else if (field == "swa_chain_layers") {
      s = ParseInt(field, value, &info.swa_chain_layers);
    } else if (field == "window_restore") {
      int32_t v = 0;
      s = ParseInt(field, value, &v);
      info.window_restore = v != 0;
    } else if (field == "window_restore_work") {
      s = ParseInt(field, value, &info.window_restore_work);
    } else if (field == "started_at_ms") {
      s = ParseInt(field, value, &info.started_at_ms);
    } else if (field == "incarnation") {
      if (!absl::SimpleHexAtoi(value, &info.incarnation)) {
        s = absl::InvalidArgumentError(absl::StrCat(
            "worker record field 'incarnation': expected hex, got '", value,
            "'"));
      }
    }
    // Unknown fields: written by a newer release; ignored.
    if (!s.ok()) return s;
  }
  if (!has_id) {
    return absl::InvalidArgumentError("worker record has no 'id' field");
  }
  if (!has_role) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker record of '", info.id, "' has no 'role' field"));
  }
  return info;
}

}  // namespace swaserve::cluster
