// FilePageStore: the local-file L3 backend of PageStore (page_store.h,
// docs/architecture.md#kv-cache). One file per blob in one directory:
//
//   <dir>/<layout 16 hex>-<hash 16 hex>.kvpage   a blob (page_blob.h format)
//   <dir>/tmp-<n>-<name>                        a Put in flight
//   <dir>/LOCK                                  flock'd by the open store
//
// Writes are atomic: Put writes the blob to a temp file and renames it over
// the real name, so a crash mid-write leaves at most a temp file (Open
// removes them) and never a half blob under a real name. Even so, every Get
// verifies the header (magic, version, header checksum, key equal to the
// file's name, length equal to the file's size and to out.size()) and the
// payload checksum; any failure erases the file, counts `corrupt` and reads
// as NotFound (a power loss without `fsync` can leave an empty or torn file
// under a real name: it reads as a miss).
//
// Bound: the bytes of blob files (headers included, file-system block
// rounding and temp files of Puts in flight not) never exceed
// capacity_bytes: Put evicts least-recently-used blobs (an in-memory LRU
// list) until the new one fits, before it becomes visible.
//
// Warm restart: Open() lists the directory and rebuilds the index from the
// names, sizes and modification times, without reading any blob (they are
// verified lazily, on Get). Recency survives the restart: Put and Get (with
// touch_on_get) set the file's mtime to a per-store stamp that increases
// strictly (max(now, last + 1 ns)), so Open restores the LRU order exactly
// on file systems with nanosecond timestamps (ext4, xfs, tmpfs; coarser
// ones order ties by name). If the directory holds more than capacity_bytes
// (a smaller bound than last time), Open evicts the oldest.
//
// One store per directory: Open takes an exclusive flock on <dir>/LOCK and
// fails with FailedPrecondition while another store (in this or another
// process) holds it, so two workers never delete each other's temp files or
// fight over the bound. Files it does not recognise are left alone.
//
// Thread-safety: thread-safe. One mutex guards the index and LRU list; blob
// writes and reads run outside it; renames and unlinks run under it (so the
// index and the directory never disagree about which blob a name holds).
// Ownership: owns its index and the LOCK file descriptor; the directory and
// the blobs outlive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/kv/page_blob.h"
#include "lib/kv/page_store.h"

namespace swaserve::kv {

struct FilePageStoreOptions {
  // Directory of the blobs; created with its parents when missing.
  // Required.
  std::string dir;
  // Bound on the bytes of blob files, headers included. Required, > 0.
  int64_t capacity_bytes = 0;
  // fsync each blob before its rename and the directory after it. Default
  // false: the store is a cache and every Get verifies checksums, so what a
  // power loss can do without fsync (an empty or torn blob under a real
  // name) reads as a miss; a process crash loses nothing either way (the
  // kernel holds the data). true: blobs written before a power loss survive
  // it, at the cost of a disk flush per Put.
  bool fsync = false;
  // Stamp the file's mtime on every Get hit (one futimens), so a restart
  // restores read recency and not only write order. Default true.
  bool touch_on_get = true;
  // Blobs carry a MAC under this key and only blobs whose MAC verifies are
  // read (page_blob.h): a directory others can write to then cannot plant
  // KV. Null (default): XXH3 checksums only.
  std::shared_ptr<const PageBlobMac> mac;
};

class FilePageStore final : public PageStore {
 public:
  // Creates the directory if needed, takes its lock, removes leftover temp
  // files and rebuilds the index (see the file comment). Errors:
  // InvalidArgument (empty dir, capacity_bytes <= 0), FailedPrecondition
  // (dir is not a directory, cannot be created, is not writable, or is in
  // use by another store), Internal (listing it failed). Each message names
  // the directory.
  static absl::StatusOr<std::unique_ptr<FilePageStore>> Open(
      const FilePageStoreOptions& options);

  ~FilePageStore() override;  // releases the lock; blobs stay
  FilePageStore(const FilePageStore&) = delete;
  FilePageStore& operator=(const FilePageStore&) = delete;

  // PageStore. Put errors: ResourceExhausted (header + bytes larger than
  // capacity_bytes), Internal (a write, fsync or rename failed; errno text).
  absl::Status Put(const PageKey& key,
                   absl::Span<const uint8_t> bytes) override;
  absl::Status Get(const PageKey& key, absl::Span<uint8_t> out) override;
  bool Contains(const PageKey& key) override;
  void Erase(const PageKey& key) override;
  std::string_view backend() const override { return "file"; }
  const PageStoreStats& stats() const override { return stats_; }

  // The blob file name of `key` ("<layout hex>-<hash hex>.kvpage") and its
  // path in this store (tests, tools).
  static std::string FileName(const PageKey& key);
  std::string PathOf(const PageKey& key) const;
  const FilePageStoreOptions& options() const { return options_; }
  // Bytes and blobs in the index now (the stats gauges, read under the lock).
  int64_t bytes() const;
  int64_t entries() const;

 private:
  struct Entry {
    int64_t bytes = 0;        // file size, header included
    uint64_t generation = 0;  // changes whenever the name gets a new blob
    std::list<PageKey>::iterator lru;
  };
  // What Open found on disk.
  struct ScannedBlob;

  FilePageStore(FilePageStoreOptions options, int lock_fd);

  absl::Status Scan();
  // Writes the blob to a new temp file; returns its path; fd closed.
  absl::StatusOr<std::string> WriteTemp(const PageKey& key,
                                        absl::Span<const uint8_t> bytes);
  // Reads and verifies `key`'s file into `out`: DataLoss when corrupt,
  // NotFound when the file is gone, InvalidArgument for a wrong out size.
  absl::Status ReadVerified(const PageKey& key, absl::Span<uint8_t> out);
  // Evicts LRU blobs other than `keep` until `incoming` more bytes fit.
  void EvictFor(int64_t incoming, const PageKey* keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unlinks the file and forgets the entry (which must exist).
  void RemoveLocked(const PageKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `key` when it still holds the blob of `generation` (a Get saw
  // it corrupt or gone; a Put since then replaced it with a fresh blob).
  void RemoveIfGeneration(const PageKey& key, uint64_t generation);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next recency stamp in ns since the epoch (strictly increasing).
  int64_t NextStamp();

  const FilePageStoreOptions options_;
  const int lock_fd_;
  std::atomic<int64_t> last_stamp_{0};
  std::atomic<uint64_t> next_temp_{0};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<PageKey, Entry> index_ ABSL_GUARDED_BY(mu_);
  std::list<PageKey> lru_ ABSL_GUARDED_BY(mu_);  // front: most recent
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 0;

  PageStoreStats stats_;
};

}  // namespace swaserve::kv
