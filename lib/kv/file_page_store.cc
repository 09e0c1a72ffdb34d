#include "lib/kv/file_page_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/memory/memory.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/base/logging.h"
#include "lib/base/status.h"
#include "lib/kv/page_blob.h"

namespace swaserve::kv {
namespace {

constexpr char kTempPrefix[] = "tmp-";
constexpr char kLockName[] = "LOCK";
constexpr char kBlobSuffix[] = ".kvpage";
constexpr size_t kHexDigits = 16;

// Closes a file descriptor on scope exit.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  // Closes now; close()'s result (errno set when it failed).
  int Close() {
    const int rc = close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status ErrnoError(absl::string_view what, const std::string& path,
                        int err) {
  return absl::InternalError(absl::StrCat("L3 file store: ", what, " ", path,
                                          ": ", std::strerror(err)));
}

bool ParseHex64(absl::string_view s, uint64_t* out) {
  if (s.size() != kHexDigits) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

// Inverse of FilePageStore::FileName; nullopt for any other name.
std::optional<PageKey> ParseFileName(absl::string_view name) {
  constexpr size_t kSuffix = sizeof(kBlobSuffix) - 1;
  if (name.size() != 2 * kHexDigits + 1 + kSuffix || name[kHexDigits] != '-' ||
      !absl::EndsWith(name, kBlobSuffix)) {
    return std::nullopt;
  }
  PageKey key;
  if (!ParseHex64(name.substr(0, kHexDigits), &key.layout) ||
      !ParseHex64(name.substr(kHexDigits + 1, kHexDigits), &key.hash)) {
    return std::nullopt;
  }
  return key;
}

// Writes all of `iov` (partial writes and EINTR retried); false with errno
// set on failure.
bool WriteAll(int fd, struct iovec* iov, int iovcnt) {
  while (iovcnt > 0) {
    const ssize_t n = writev(fd, iov, iovcnt);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

// Reads exactly `size` bytes at `offset`; the number of bytes read (fewer at
// end of file), or -1 with errno set.
ssize_t PreadAll(int fd, uint8_t* data, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n =
        pread(fd, data + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

// Sets the file's mtime to `stamp_ns` (atime untouched). Best effort: a
// failure only loses recency across a restart.
void SetMtime(int fd, int64_t stamp_ns) {
  const struct timespec times[2] = {
      {.tv_sec = 0, .tv_nsec = UTIME_OMIT},
      {.tv_sec = static_cast<time_t>(stamp_ns / 1000000000),
       .tv_nsec = static_cast<long>(stamp_ns % 1000000000)},
  };
  (void)futimens(fd, times);
}

void FsyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    SWA_LOG(warn, "L3 file store: fsync of {} failed: {}", dir,
            std::strerror(errno));
  }
  if (fd >= 0) close(fd);
}

}  // namespace

struct FilePageStore::ScannedBlob {
  PageKey key;
  int64_t bytes = 0;
  int64_t mtime_ns = 0;
  std::string name;
};

absl::StatusOr<std::unique_ptr<FilePageStore>> FilePageStore::Open(
    const FilePageStoreOptions& options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("FilePageStoreOptions.dir is empty");
  }
  if (options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FilePageStoreOptions.capacity_bytes must be > 0, got ",
                     options.capacity_bytes));
  }
  const std::string& dir = options.dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "L3 file store: '", dir, "' is not a directory and cannot be created",
        ec ? absl::StrCat(": ", ec.message()) : ""));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("L3 file store: directory '", dir,
                     "' is not writable: ", std::strerror(errno)));
  }
  const std::string lock_path = absl::StrCat(dir, "/", kLockName);
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "L3 file store: directory '", dir, "' is not writable (creating ",
        kLockName, "): ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "L3 file store: directory '", dir, "' is in use by another store (",
        lock_path, " is locked): ", std::strerror(err)));
  }
  auto store = absl::WrapUnique(new FilePageStore(options, fd));
  RETURN_IF_ERROR(store->Scan());
  return store;
}

FilePageStore::FilePageStore(FilePageStoreOptions options, int lock_fd)
    : options_(std::move(options)), lock_fd_(lock_fd) {}

FilePageStore::~FilePageStore() { close(lock_fd_); }

std::string FilePageStore::FileName(const PageKey& key) {
  return absl::StrFormat("%016x-%016x%s", key.layout, key.hash, kBlobSuffix);
}

std::string FilePageStore::PathOf(const PageKey& key) const {
  return absl::StrCat(options_.dir, "/", FileName(key));
}

int64_t FilePageStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t FilePageStore::entries() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(index_.size());
}

absl::Status FilePageStore::Scan() {
  std::vector<ScannedBlob> blobs;
  int temps = 0;
  int foreign = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(options_.dir, ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    if (absl::StartsWith(name, kTempPrefix)) {
      if (unlink(path.c_str()) == 0) ++temps;
      continue;
    }
    if (name == kLockName) continue;
    std::optional<PageKey> key = ParseFileName(name);
    struct stat st;
    if (!key.has_value() || lstat(path.c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode)) {
      ++foreign;
      continue;
    }
    blobs.push_back(ScannedBlob{
        .key = *key,
        .bytes = static_cast<int64_t>(st.st_size),
        .mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                    st.st_mtim.tv_nsec,
        .name = name,
    });
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("L3 file store: listing '",
                                            options_.dir, "': ", ec.message()));
  }
  std::sort(blobs.begin(), blobs.end(),
            [](const ScannedBlob& a, const ScannedBlob& b) {
              return std::tie(a.mtime_ns, a.name) <
                     std::tie(b.mtime_ns, b.name);
            });
  int64_t evicted = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const ScannedBlob& b : blobs) {  // oldest first: ends at the back
      lru_.push_front(b.key);
      index_[b.key] = Entry{.bytes = b.bytes,
                            .generation = ++next_generation_,
                            .lru = lru_.begin()};
      bytes_ += b.bytes;
    }
    if (!blobs.empty()) last_stamp_.store(blobs.back().mtime_ns);
    const int64_t before = stats_.evictions.load();
    EvictFor(0, nullptr);
    evicted = stats_.evictions.load() - before;
    UpdateGauges();
  }
  SWA_LOG(info,
          "L3 file store {}: {} blobs, {} bytes (capacity {}); removed {} temp "
          "files, evicted {} over capacity, ignored {} other entries",
          options_.dir, static_cast<int64_t>(blobs.size()) - evicted,
          stats_.bytes.load(), options_.capacity_bytes, temps, evicted,
          foreign);
  return absl::OkStatus();
}

int64_t FilePageStore::NextStamp() {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  int64_t last = last_stamp_.load(std::memory_order_relaxed);
  while (true) {
    const int64_t next = std::max(now, last + 1);
    if (last_stamp_.compare_exchange_weak(last, next,
                                          std::memory_order_relaxed)) {
      return next;
    }
  }
}

absl::StatusOr<std::string> FilePageStore::WriteTemp(
    const PageKey& key, absl::Span<const uint8_t> bytes) {
  const std::string path = absl::StrCat(
      options_.dir, "/", kTempPrefix,
      next_temp_.fetch_add(1, std::memory_order_relaxed), "-", FileName(key));
  ScopedFd fd(
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError("creating", path, errno);
  uint8_t header[kPageBlobHeaderBytes];
  EncodePageBlobHeader(MakePageBlobHeader(key, bytes, options_.mac.get()),
                       absl::MakeSpan(header));
  struct iovec iov[2] = {
      {.iov_base = header, .iov_len = sizeof(header)},
      {.iov_base = const_cast<uint8_t*>(bytes.data()), .iov_len = bytes.size()},
  };
  absl::Status status;
  if (!WriteAll(fd.get(), iov, bytes.empty() ? 1 : 2)) {
    status = ErrnoError("writing", path, errno);
  } else if (options_.fsync && fsync(fd.get()) != 0) {
    status = ErrnoError("fsync of", path, errno);
  } else {
    SetMtime(fd.get(), NextStamp());
    if (fd.Close() != 0) status = ErrnoError("closing", path, errno);
  }
  if (!status.ok()) {
    unlink(path.c_str());
    return status;
  }
  return path;
}

absl::Status FilePageStore::Put(const PageKey& key,
                                absl::Span<const uint8_t> bytes) {
  const int64_t size =
      static_cast<int64_t>(kPageBlobHeaderBytes + bytes.size());
  if (size > options_.capacity_bytes) {
    stats_.put_errors.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("L3 file store: a ", size, "-byte blob exceeds capacity ",
                     options_.capacity_bytes));
  }
  absl::StatusOr<std::string> temp = WriteTemp(key, bytes);
  if (!temp.ok()) {
    stats_.put_errors.fetch_add(1, std::memory_order_relaxed);
    return temp.status();
  }
  const std::string path = PathOf(key);
  {
    absl::MutexLock lock(&mu_);
    int64_t existing = 0;
    if (auto it = index_.find(key); it != index_.end()) {
      existing = it->second.bytes;
      lru_.splice(lru_.begin(), lru_, it->second.lru);  // never its own victim
    }
    EvictFor(size - existing, &key);
    if (rename(temp->c_str(), path.c_str()) != 0) {
      const absl::Status error = ErrnoError("renaming into", path, errno);
      unlink(temp->c_str());
      UpdateGauges();
      stats_.put_errors.fetch_add(1, std::memory_order_relaxed);
      return error;
    }
    auto [it, inserted] = index_.try_emplace(key);
    if (inserted) {
      lru_.push_front(key);
      it->second.lru = lru_.begin();
    }
    it->second.bytes = size;
    it->second.generation = ++next_generation_;
    bytes_ += size - existing;
    UpdateGauges();
  }
  if (options_.fsync) FsyncDir(options_.dir);
  stats_.puts.fetch_add(1, std::memory_order_relaxed);
  stats_.put_bytes.fetch_add(static_cast<int64_t>(bytes.size()),
                             std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status FilePageStore::ReadVerified(const PageKey& key,
                                         absl::Span<uint8_t> out) {
  const std::string path = PathOf(key);
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("L3 file store: ", path, " vanished"));
    }
    return ErrnoError("opening", path, errno);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError("stat of", path, errno);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  uint8_t header_bytes[kPageBlobHeaderBytes];
  const ssize_t got =
      file_bytes < kPageBlobHeaderBytes
          ? 0
          : PreadAll(fd.get(), header_bytes, sizeof(header_bytes), 0);
  if (got < 0) return ErrnoError("reading", path, errno);
  ASSIGN_OR_RETURN(PageBlobHeader header,
                   DecodePageBlobHeader(absl::MakeConstSpan(
                       header_bytes, static_cast<size_t>(got))));
  RETURN_IF_ERROR(CheckPageBlobHeader(
      header, key, file_bytes - kPageBlobHeaderBytes, out.size()));
  const ssize_t n =
      PreadAll(fd.get(), out.data(), out.size(), kPageBlobHeaderBytes);
  if (n < 0) return ErrnoError("reading", path, errno);
  if (static_cast<size_t>(n) != out.size()) {
    return absl::DataLossError(
        absl::StrCat("page blob: ", path, " shrank while being read"));
  }
  RETURN_IF_ERROR(CheckPageBlobPayload(header, out, options_.mac.get()));
  if (options_.touch_on_get) SetMtime(fd.get(), NextStamp());
  return absl::OkStatus();
}

absl::Status FilePageStore::Get(const PageKey& key, absl::Span<uint8_t> out) {
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      return CountGet(stats_, absl::NotFoundError("not in the L3 file store"),
                      0);
    }
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    generation = it->second.generation;
  }
  absl::Status status = ReadVerified(key, out);
  if (absl::IsNotFound(status) || absl::IsDataLoss(status)) {
    RemoveIfGeneration(key, generation);
  }
  return CountGet(stats_, std::move(status), out.size());
}

bool FilePageStore::Contains(const PageKey& key) {
  absl::MutexLock lock(&mu_);
  return index_.contains(key);
}

void FilePageStore::Erase(const PageKey& key) {
  absl::MutexLock lock(&mu_);
  if (index_.contains(key)) RemoveLocked(key);
  UpdateGauges();
}

void FilePageStore::EvictFor(int64_t incoming, const PageKey* keep) {
  while (bytes_ + incoming > options_.capacity_bytes && !lru_.empty()) {
    const PageKey victim = lru_.back();
    if (keep != nullptr && victim == *keep) break;
    RemoveLocked(victim);
    stats_.evictions.fetch_add(1, std::memory_order_relaxed);
  }
}

void FilePageStore::RemoveLocked(const PageKey& key) {
  auto it = index_.find(key);
  const std::string path = PathOf(key);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    SWA_LOG(warn, "L3 file store: removing {}: {}", path, std::strerror(errno));
  }
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

void FilePageStore::RemoveIfGeneration(const PageKey& key,
                                       uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it != index_.end() && it->second.generation == generation) {
    RemoveLocked(key);
    UpdateGauges();
  }
}

void FilePageStore::UpdateGauges() {
  stats_.bytes.store(bytes_, std::memory_order_relaxed);
  stats_.entries.store(static_cast<int64_t>(index_.size()),
                       std::memory_order_relaxed);
}

}  // namespace swaserve::kv
