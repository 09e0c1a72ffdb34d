// Optional bearer-key access control for the router's HTTP API, and a
// per-key concurrency limiter.
//
// ApiKeyStore holds the accepted API keys, each with a name (used in logs,
// metrics and the limiter; the key itself is never logged or put in a
// message). Keys come from `path`, which is either
//
//   * a file, one key per line:
//       # comment (lines starting with '#', after leading blanks)
//       team-a:sk-0123456789abcdef     name:key
//       sk-fedcba9876543210            key alone: named "key-<8 hex digits>"
//                                      (a fingerprint: XXH3 of the key)
//     Blank lines are ignored and lines are trimmed. A line holding ':' is
//     split at the first ':' (so names cannot contain ':', keys can). Names
//     are [A-Za-z0-9._-]+; keys are printable ASCII without spaces.
//   * a directory, e.g. a mounted Kubernetes secret: each entry whose name
//     does not start with '.' and that is (or links to) a regular file is one
//     key; the file name is the key name and its trimmed content is the key.
//     Kubernetes mounts a secret as `..2024_..` (a directory), `..data` (a
//     link to it) and `<name>` -> `..data/<name>` links; dot-entries are
//     skipped and the name links followed, so atomic secret updates are seen
//     whole.
//
// Duplicate names or keys, an empty key, or no key at all make a load fail.
//
// Reloading: on access. Authorize() re-reads the source when
// `reload_interval` has passed since the last read (one caller reads, under
// a separate mutex; the others keep using the current keys), and swaps the
// key set in when its content changed. ReloadNow() does the same at once. A
// failed reload keeps the old keys and logs a warning (once per distinct
// error). So a key revoked from the file stops working within one interval
// of the next request.
//
// Keys are compared in constant time with respect to their content: every
// stored key is compared in full against the presented one, whichever
// matches.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
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
#include "lib/base/clock.h"

namespace swaserve::api {

struct ApiKeyStoreOptions {
  // File or directory holding the keys (see above). Required.
  std::string path;
  // How often Authorize() re-reads `path`. Zero: on every call.
  absl::Duration reload_interval = absl::Seconds(2);
  // Time source for the reload interval; nullptr means base::Clock::Real().
  // Not owned; must outlive the store.
  base::Clock* clock = nullptr;
};

class ApiKeyStore {
 public:
  // Loads the keys; InvalidArgument / NotFound (naming the path, never a key)
  // when the path cannot be read or holds no valid key set.
  static absl::StatusOr<std::unique_ptr<ApiKeyStore>> Create(
      const ApiKeyStoreOptions& options);

  ApiKeyStore(const ApiKeyStore&) = delete;
  ApiKeyStore& operator=(const ApiKeyStore&) = delete;

  // Checks an HTTP Authorization header value ("Bearer <key>"; the scheme is
  // case-insensitive). Returns the key's name, or Unauthenticated with a
  // message fit for the client (missing header, wrong scheme, invalid key).
  absl::StatusOr<std::string> Authorize(absl::string_view authorization_header);

  // Re-reads the source now. OK when the keys were loaded (changed or not);
  // on error the old keys stay and the error is returned (and logged once).
  absl::Status ReloadNow();

  // Names of the current keys, sorted.
  std::vector<std::string> KeyNames() const;
  // Number of successful reloads that changed the key set (not counting the
  // initial load).
  int64_t reload_count() const { return reload_count_.load(); }

 private:
  struct Key {
    std::string name;
    std::string key;
  };
  explicit ApiKeyStore(const ApiKeyStoreOptions& options);

  // Reads and validates the source.
  absl::StatusOr<std::vector<Key>> Load() const;
  // Reloads when the interval passed (called from Authorize()).
  void MaybeReload();
  absl::Status Reload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);

  const ApiKeyStoreOptions options_;
  base::Clock* const clock_;

  // Held while reading the source, so only one thread reloads at a time.
  absl::Mutex reload_mu_;
  std::string last_error_ ABSL_GUARDED_BY(reload_mu_);

  mutable absl::Mutex mu_;
  // Sorted by name.
  std::shared_ptr<const std::vector<Key>> keys_ ABSL_GUARDED_BY(mu_);
  absl::Time last_load_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> reload_count_{0};
};

struct ConcurrencyLimiterOptions {
  // Most requests in flight per key name; 0 means unlimited.
  uint32_t per_key_limit = 0;
  // Per-name overrides of per_key_limit (0 = unlimited for that name).
  absl::flat_hash_map<std::string, uint32_t> limits;
};

// Counts requests in flight per key name and refuses new ones beyond the
// limit. TryAcquire() gives a Lease that releases its slot when destroyed.
// Leases must not outlive the limiter. Thread-safe.
class ConcurrencyLimiter {
 public:
  // A held slot; move-only, released on destruction (or Release()).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    // Gives the slot back now (no-op when already released or moved from).
    void Release();
    // The key name this lease counts against ("" when released).
    const std::string& name() const { return name_; }

   private:
    friend class ConcurrencyLimiter;
    Lease(ConcurrencyLimiter* limiter, std::string name)
        : limiter_(limiter), name_(std::move(name)) {}
    ConcurrencyLimiter* limiter_ = nullptr;
    std::string name_;
  };

  explicit ConcurrencyLimiter(ConcurrencyLimiterOptions options = {});

  // A lease when `name` has fewer than its limit in flight, else nullopt.
  std::optional<Lease> TryAcquire(absl::string_view name);

  // Requests in flight for `name`, and for all names together (for metrics;
  // the total is a relaxed atomic read).
  uint32_t InFlight(absl::string_view name) const;
  int64_t TotalInFlight() const {
    return total_.load(std::memory_order_relaxed);
  }
  // The limit applying to `name` (0 = unlimited).
  uint32_t LimitFor(absl::string_view name) const;

 private:
  void Release(const std::string& name);

  const ConcurrencyLimiterOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> in_flight_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> total_{0};
};

}  // namespace swaserve::api
