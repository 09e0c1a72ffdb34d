// FilePageStore (lib/kv/file_page_store.h): round trip, the LRU bound,
// warm restart (index and recency rebuilt from the directory), every kind of
// on-disk damage read as a counted miss and erased, bad directories, and a
// model-checked random single-thread sequence plus a multi-thread stress run
// where every successful Get must return bytes some Put wrote for that key.
#include "lib/kv/file_page_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/kv/page_blob.h"
#include "tests/unit/kv/page_store_test_util.h"

namespace swaserve::kv {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::IsSomeVersion;
using testing::Payload;

constexpr int64_t kHeader = static_cast<int64_t>(kPageBlobHeaderBytes);

PageKey Key(uint64_t i) { return PageKey{.hash = 1000 + i, .layout = 0xABC}; }

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class FilePageStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = base::MakeTempDir("swaserve-l3");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // (Re)opens the store on dir_ with `capacity` bytes.
  void Open(int64_t capacity) {
    store_.reset();
    absl::StatusOr<std::unique_ptr<FilePageStore>> store =
        FilePageStore::Open({.dir = dir_, .capacity_bytes = capacity});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  void Put(uint64_t key, uint64_t version, size_t size) {
    ASSERT_TRUE(store_->Put(Key(key), Payload(key, version, size)).ok());
  }

  // Puts keys 1, 2, 3 (version 0, `size` bytes) into a store bounded to
  // exactly three of them, then reads 1: 2 is the least recently used.
  void FillThreeAndRead1(size_t size) {
    Open(3 * (kHeader + static_cast<int64_t>(size)));
    for (uint64_t k : {1, 2, 3}) Put(k, 0, size);
    ASSERT_TRUE(GetAndCheck(1, 0, size).ok());
  }

  // Get of `key` with a `size`-byte buffer; on OK, checks the bytes are
  // version `version`'s.
  absl::Status GetAndCheck(uint64_t key, uint64_t version, size_t size) {
    std::vector<uint8_t> out(size);
    absl::Status s = store_->Get(Key(key), absl::MakeSpan(out));
    if (s.ok()) {
      EXPECT_EQ(out, Payload(key, version, size)) << key;
    }
    return s;
  }

  // The blob of `key` is gone from the index and the directory, and its
  // Get is a miss counted as corrupt.
  void ExpectCorruptMiss(uint64_t key, size_t size) {
    const int64_t corrupt = store_->stats().corrupt.load();
    absl::Status s = GetAndCheck(key, 0, size);
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_EQ(store_->stats().corrupt.load(), corrupt + 1);
    EXPECT_FALSE(store_->Contains(Key(key)));
    EXPECT_FALSE(fs::exists(store_->PathOf(Key(key))));
  }

  std::string dir_;
  std::unique_ptr<FilePageStore> store_;
};

TEST_F(FilePageStoreTest, PutGetEraseRoundTrip) {
  Open(1 << 20);
  EXPECT_EQ(store_->backend(), "file");
  Put(1, 0, 5000);
  EXPECT_TRUE(store_->Contains(Key(1)));
  EXPECT_FALSE(store_->Contains(Key(2)));
  EXPECT_TRUE(GetAndCheck(1, 0, 5000).ok());
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(2, 0, 5000)));
  EXPECT_EQ(ListDir(dir_),
            (std::vector<std::string>{
                "0000000000000abc-00000000000003e9.kvpage", "LOCK"}));
  EXPECT_EQ(FilePageStore::FileName(Key(1)),
            "0000000000000abc-00000000000003e9.kvpage");

  // Replacing a blob: new bytes, accounting follows the new size.
  Put(1, 7, 3000);
  EXPECT_TRUE(GetAndCheck(1, 7, 3000).ok());
  EXPECT_EQ(store_->bytes(), kHeader + 3000);
  EXPECT_EQ(store_->entries(), 1);

  store_->Erase(Key(1));
  store_->Erase(Key(2));  // absent: no-op
  EXPECT_FALSE(store_->Contains(Key(1)));
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(1, 7, 3000)));
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"LOCK"});

  const PageStoreStats& st = store_->stats();
  EXPECT_EQ(st.puts.load(), 2);
  EXPECT_EQ(st.put_bytes.load(), 8000);
  EXPECT_EQ(st.gets.load(), 4);
  EXPECT_EQ(st.hits.load(), 2);
  EXPECT_EQ(st.get_bytes.load(), 8000);
  EXPECT_EQ(st.misses.load(), 2);
  EXPECT_EQ(st.corrupt.load(), 0);
  EXPECT_EQ(st.bytes.load(), 0);
  EXPECT_EQ(st.entries.load(), 0);
}

TEST_F(FilePageStoreTest, LruBoundEvictsOldestAndGetRefreshes) {
  constexpr size_t kSize = 1000;
  const int64_t blob = kHeader + kSize;
  FillThreeAndRead1(kSize);  // 2 is the oldest
  Put(4, 0, kSize);
  EXPECT_FALSE(store_->Contains(Key(2)));
  EXPECT_FALSE(fs::exists(store_->PathOf(Key(2))));
  for (uint64_t k : {1, 3, 4}) EXPECT_TRUE(GetAndCheck(k, 0, kSize).ok()) << k;
  EXPECT_EQ(store_->bytes(), 3 * blob);
  EXPECT_EQ(store_->stats().evictions.load(), 1);

  // A blob twice the size evicts the two oldest: the gets above refreshed
  // 1, 3, 4 in that order, so 1 and 3 go.
  Put(5, 0, 2 * kSize);
  EXPECT_FALSE(store_->Contains(Key(1)));
  EXPECT_FALSE(store_->Contains(Key(3)));
  EXPECT_TRUE(store_->Contains(Key(4)));
  EXPECT_TRUE(store_->Contains(Key(5)));
  EXPECT_LE(store_->bytes(), 3 * blob);

  // Larger than the whole store: refused, nothing evicted.
  absl::Status too_big =
      store_->Put(Key(6), Payload(6, 0, 3 * blob - kHeader + 1));
  EXPECT_TRUE(absl::IsResourceExhausted(too_big)) << too_big;
  EXPECT_EQ(store_->stats().put_errors.load(), 1);
  EXPECT_TRUE(store_->Contains(Key(4)));
  // Exactly the capacity fits (and takes everything else).
  Put(7, 0, 3 * kSize + 2 * kHeader);
  EXPECT_EQ(store_->entries(), 1);
  EXPECT_EQ(store_->bytes(), 3 * blob);
}

TEST_F(FilePageStoreTest, ReplacingTheOldestBlobDoesNotEvictIt) {
  constexpr size_t kSize = 1000;
  Open(2 * (kHeader + kSize));
  Put(1, 0, kSize);
  Put(2, 0, kSize);
  Put(1, 1, kSize);  // same size: fits in place, nothing evicted
  EXPECT_EQ(store_->stats().evictions.load(), 0);
  EXPECT_TRUE(GetAndCheck(1, 1, kSize).ok());
  EXPECT_TRUE(GetAndCheck(2, 0, kSize).ok());
  Put(2, 1, kSize + 500);  // larger: evicts 1, the other one
  EXPECT_FALSE(store_->Contains(Key(1)));
  EXPECT_TRUE(GetAndCheck(2, 1, kSize + 500).ok());
}

TEST_F(FilePageStoreTest, WarmRestartKeepsBlobsAndRecency) {
  constexpr size_t kSize = 4096;
  const int64_t blob = kHeader + kSize;
  FillThreeAndRead1(kSize);  // order now 2 < 3 < 1

  Open(3 * blob);  // a restarted worker
  EXPECT_EQ(store_->entries(), 3);
  EXPECT_EQ(store_->bytes(), 3 * blob);
  EXPECT_EQ(store_->stats().bytes.load(), 3 * blob);
  EXPECT_EQ(store_->stats().gets.load(), 0);  // counters are per process
  Put(4, 0, kSize);
  EXPECT_FALSE(store_->Contains(Key(2)));  // the oldest, by persisted recency
  for (uint64_t k : {1, 3, 4}) EXPECT_TRUE(GetAndCheck(k, 0, kSize).ok()) << k;

  // Reopened with a smaller bound: the oldest go at Open (the gets above
  // made the order 1 < 3 < 4, so 1 and 3 go).
  Open(blob);
  EXPECT_EQ(store_->entries(), 1);
  EXPECT_TRUE(store_->Contains(Key(4)));
  EXPECT_EQ(store_->stats().evictions.load(), 2);
  EXPECT_EQ(ListDir(dir_).size(), 2u);  // the blob and LOCK
}

TEST_F(FilePageStoreTest, OpenRemovesTempFilesAndIgnoresForeignFiles) {
  Open(1 << 20);
  Put(1, 0, 100);
  store_.reset();
  WriteFile(dir_ + "/tmp-0-0000000000000abc-00000000000003ea.kvpage", "half");
  WriteFile(dir_ + "/tmp-9-junk", "");
  WriteFile(dir_ + "/README", "not a blob");
  WriteFile(dir_ + "/0000000000000abc-00000000000003eX.kvpage", "bad hex");
  fs::create_directory(dir_ + "/0000000000000abc-00000000000003eb.kvpage");
  Open(1 << 20);
  EXPECT_EQ(store_->entries(), 1);
  EXPECT_EQ(ListDir(dir_),
            (std::vector<std::string>{
                "0000000000000abc-00000000000003e9.kvpage",
                "0000000000000abc-00000000000003eX.kvpage",
                "0000000000000abc-00000000000003eb.kvpage", "LOCK", "README"}));
  EXPECT_TRUE(GetAndCheck(1, 0, 100).ok());
}

TEST_F(FilePageStoreTest, FlippedPayloadByteIsACorruptMiss) {
  Open(1 << 20);
  Put(1, 0, 2000);
  Put(2, 0, 2000);
  std::string bytes = ReadFile(store_->PathOf(Key(1)));
  bytes[kHeader + 1234] ^= 0x01;
  WriteFile(store_->PathOf(Key(1)), bytes);
  ExpectCorruptMiss(1, 2000);
  EXPECT_EQ(store_->bytes(), kHeader + 2000);  // only 2 left
  EXPECT_TRUE(GetAndCheck(2, 0, 2000).ok());
}

TEST_F(FilePageStoreTest, FlippedHeaderByteAnywhereIsACorruptMiss) {
  Open(1 << 20);
  for (int64_t i = 0; i < kHeader; ++i) {
    Put(1, 0, 300);
    std::string bytes = ReadFile(store_->PathOf(Key(1)));
    bytes[i] ^= 0x10;
    WriteFile(store_->PathOf(Key(1)), bytes);
    ExpectCorruptMiss(1, 300);
  }
  EXPECT_EQ(store_->stats().corrupt.load(), kHeader);
  EXPECT_EQ(store_->bytes(), 0);
}

TEST_F(FilePageStoreTest, TruncatedExtendedAndEmptyFilesAreCorruptMisses) {
  Open(1 << 20);
  const std::string path = store_->PathOf(Key(1));
  for (int64_t len : {int64_t{0}, int64_t{1}, kHeader - 1, kHeader,
                      kHeader + 500, kHeader + 999}) {
    Put(1, 0, 1000);
    ASSERT_EQ(truncate(path.c_str(), len), 0);
    ExpectCorruptMiss(1, 1000);
  }
  Put(1, 0, 1000);
  WriteFile(path, ReadFile(path) + "extra");
  ExpectCorruptMiss(1, 1000);

  // The same damage found at the next start (index from the directory).
  Put(1, 0, 1000);
  Put(2, 0, 1000);
  store_.reset();
  ASSERT_EQ(truncate(path.c_str(), kHeader + 10), 0);
  WriteFile(dir_ + "/" + FilePageStore::FileName(Key(2)), "");
  Open(1 << 20);
  EXPECT_EQ(store_->entries(), 2);
  ExpectCorruptMiss(1, 1000);
  ExpectCorruptMiss(2, 1000);
  EXPECT_EQ(store_->bytes(), 0);
}

TEST_F(FilePageStoreTest, BlobUnderAnotherKeysNameIsACorruptMiss) {
  Open(1 << 20);
  Put(1, 0, 1000);
  Put(2, 0, 1000);
  // Same size and a valid blob, but of key 1, under key 2's name.
  fs::copy_file(store_->PathOf(Key(1)), store_->PathOf(Key(2)),
                fs::copy_options::overwrite_existing);
  ExpectCorruptMiss(2, 1000);
  EXPECT_TRUE(GetAndCheck(1, 0, 1000).ok());

  // Renamed while the store was down.
  store_.reset();
  fs::rename(dir_ + "/" + FilePageStore::FileName(Key(1)),
             dir_ + "/" + FilePageStore::FileName(Key(3)));
  Open(1 << 20);
  EXPECT_FALSE(store_->Contains(Key(1)));
  EXPECT_TRUE(store_->Contains(Key(3)));
  ExpectCorruptMiss(3, 1000);
}

TEST_F(FilePageStoreTest, DeletedFileIsAPlainMiss) {
  Open(1 << 20);
  Put(1, 0, 100);
  fs::remove(store_->PathOf(Key(1)));
  EXPECT_TRUE(absl::IsNotFound(GetAndCheck(1, 0, 100)));
  EXPECT_EQ(store_->stats().misses.load(), 1);
  EXPECT_EQ(store_->stats().corrupt.load(), 0);
  EXPECT_FALSE(store_->Contains(Key(1)));
  EXPECT_EQ(store_->bytes(), 0);
}

TEST_F(FilePageStoreTest, WrongOutSizeIsInvalidArgumentAndKeepsTheBlob) {
  Open(1 << 20);
  Put(1, 0, 1000);
  for (size_t size : {size_t{0}, size_t{999}, size_t{1001}}) {
    absl::Status s = GetAndCheck(1, 0, size);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << size << ": " << s;
  }
  EXPECT_EQ(store_->stats().get_errors.load(), 3);
  EXPECT_EQ(store_->stats().corrupt.load(), 0);
  EXPECT_TRUE(GetAndCheck(1, 0, 1000).ok());
}

TEST_F(FilePageStoreTest, BadOptionsAndDirectories) {
  auto open = [](std::string dir, int64_t capacity) {
    return FilePageStore::Open(
               {.dir = std::move(dir), .capacity_bytes = capacity})
        .status();
  };
  EXPECT_TRUE(absl::IsInvalidArgument(open("", 1000)));
  EXPECT_TRUE(absl::IsInvalidArgument(open(dir_, 0)));
  // A regular file, and a path below one.
  WriteFile(dir_ + "/file", "x");
  absl::Status s = open(dir_ + "/file", 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not a directory"));
  s = open(dir_ + "/file/sub", 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(dir_ + "/file/sub"));
  // Not writable (procfs refuses new files even to root).
  s = open("/proc/self/fdinfo", 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not writable"));
  // Missing parents are created.
  EXPECT_TRUE(open(dir_ + "/a/b/c", 1000).ok());
}

TEST_F(FilePageStoreTest, OneStorePerDirectory) {
  Open(1 << 20);
  absl::Status s =
      FilePageStore::Open({.dir = dir_, .capacity_bytes = 1 << 20}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("in use"));
  store_.reset();
  EXPECT_TRUE(
      FilePageStore::Open({.dir = dir_, .capacity_bytes = 1 << 20}).ok());
}

// A reference model of the store for one thread: key -> (version, size) in
// LRU order (front most recent).
struct Model {
  struct Blob {
    uint64_t key;
    uint64_t version;
    size_t size;
  };
  std::list<Blob> lru;
  int64_t capacity = 0;

  std::list<Blob>::iterator Find(uint64_t key) {
    return std::find_if(lru.begin(), lru.end(),
                        [&](const Blob& b) { return b.key == key; });
  }
  int64_t Bytes() const {
    int64_t n = 0;
    for (const Blob& b : lru) n += kHeader + static_cast<int64_t>(b.size);
    return n;
  }
  void Put(uint64_t key, uint64_t version, size_t size) {
    if (auto it = Find(key); it != lru.end()) lru.erase(it);
    while (!lru.empty() &&
           Bytes() + kHeader + static_cast<int64_t>(size) > capacity) {
      lru.pop_back();
    }
    lru.push_front({.key = key, .version = version, .size = size});
  }
};

// Random Put/Get/Erase/Contains/corrupt/restart sequences against the model:
// the store must agree exactly (which blobs exist, their bytes, LRU order
// across restarts, the byte gauge) and corrupted blobs must read as misses.
TEST_F(FilePageStoreTest, RandomSequencesMatchAModel) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    TearDown();
    SetUp();
    std::mt19937_64 rng(seed);
    Model model;
    model.capacity = 8 * (kHeader + 600);
    Open(model.capacity);
    uint64_t version = 0;
    for (int op = 0; op < 600; ++op) {
      const uint64_t key = rng() % 20;
      const size_t size = 200 + 40 * key;  // fixed per key, as per layout
      const int what = static_cast<int>(rng() % 100);
      auto it = model.Find(key);
      if (what < 40) {
        Put(key, ++version, size);
        model.Put(key, version, size);
      } else if (what < 75) {
        absl::Status s =
            GetAndCheck(key, it == model.lru.end() ? 0 : it->version, size);
        ASSERT_EQ(s.ok(), it != model.lru.end()) << op << ": " << s;
        if (s.ok()) model.lru.splice(model.lru.begin(), model.lru, it);
      } else if (what < 85) {
        store_->Erase(Key(key));
        if (it != model.lru.end()) model.lru.erase(it);
      } else if (what < 93) {
        ASSERT_EQ(store_->Contains(Key(key)), it != model.lru.end());
      } else if (what < 97 && it != model.lru.end()) {
        // Damage the file on disk: the next Get is a corrupt miss.
        std::string bytes = ReadFile(store_->PathOf(Key(key)));
        bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
        WriteFile(store_->PathOf(Key(key)), bytes);
        ExpectCorruptMiss(key, size);
        model.lru.erase(it);
      } else {
        Open(model.capacity);  // restart
      }
      ASSERT_EQ(store_->bytes(), model.Bytes()) << op;
      ASSERT_LE(store_->bytes(), model.capacity);
      ASSERT_EQ(store_->entries(), static_cast<int64_t>(model.lru.size()));
    }
    const PageStoreStats& st = store_->stats();
    EXPECT_EQ(st.gets.load(), st.hits.load() + st.misses.load() +
                                  st.corrupt.load() + st.get_errors.load());
  }
}

// Several threads Put/Get/Erase random keys under a small bound while one
// thread damages files on disk. Every successful Get returns exactly the
// bytes of some Put of that key; the bound holds throughout; afterwards the
// stats add up, the directory holds exactly the indexed blobs (no temp
// files), and a restarted store reads every surviving blob back intact.
TEST_F(FilePageStoreTest, ConcurrentOperationsNeverReturnWrongBytes) {
  constexpr int kThreads = 4;
  constexpr int kOps = 1500;
  constexpr uint64_t kKeys = 48;
  constexpr int64_t kMinCorrupt = 5;
  auto size_of = [](uint64_t key) { return size_t{512} + 64 * key; };
  const int64_t capacity = 12 * (kHeader + 2048);
  Open(capacity);
  std::atomic<uint64_t> next_version[kKeys];
  for (auto& v : next_version) v.store(0);
  std::atomic<int64_t> wrong{0}, over_capacity{0}, hits{0};
  std::atomic<bool> stop{false};

  // Workers run kOps each, and on until the damage has been seen (some Gets
  // found corrupt blobs), so the run always exercises it; bounded in time.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto worker = [&](int t) {
    std::mt19937_64 rng(100 + t);
    for (int i = 0; i < kOps || (store_->stats().corrupt.load() < kMinCorrupt &&
                                 std::chrono::steady_clock::now() < deadline);
         ++i) {
      const uint64_t key = rng() % kKeys;
      const int what = static_cast<int>(rng() % 10);
      if (what < 4) {
        const uint64_t v = next_version[key].fetch_add(1) + 1;
        (void)store_->Put(Key(key), Payload(key, v, size_of(key)));
      } else if (what < 9) {
        std::vector<uint8_t> out(size_of(key));
        if (store_->Get(Key(key), absl::MakeSpan(out)).ok()) {
          ++hits;
          if (!IsSomeVersion(out, key, next_version[key].load())) ++wrong;
        }
      } else {
        store_->Erase(Key(key));
      }
      if (store_->stats().bytes.load() > capacity) ++over_capacity;
    }
  };
  auto vandal = [&] {
    std::mt19937_64 rng(7);
    while (!stop.load()) {
      const std::string path = store_->PathOf(Key(rng() % kKeys));
      const int fd = open(path.c_str(), O_WRONLY);
      if (fd >= 0) {
        const char junk = static_cast<char>(rng());
        // In place (every blob is >= 576 bytes): sizes stay right.
        (void)pwrite(fd, &junk, 1, static_cast<off_t>(rng() % 576));
        close(fd);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  std::thread damage(vandal);
  for (auto& t : threads) t.join();
  stop = true;
  damage.join();

  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(over_capacity.load(), 0);
  EXPECT_GT(hits.load(), 100);
  const PageStoreStats& st = store_->stats();
  EXPECT_GE(st.corrupt.load(), kMinCorrupt);
  EXPECT_EQ(st.gets.load(), st.hits.load() + st.misses.load() +
                                st.corrupt.load() + st.get_errors.load());
  EXPECT_EQ(st.get_errors.load(), 0);
  int64_t versions = 0;
  for (auto& v : next_version) versions += static_cast<int64_t>(v.load());
  EXPECT_EQ(st.puts.load() + st.put_errors.load(), versions);
  EXPECT_GT(st.evictions.load(), 0);

  // The directory agrees with the index.
  int64_t files = 0, file_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (name == "LOCK") continue;
    EXPECT_FALSE(absl::StartsWith(name, "tmp-")) << name;
    ++files;
    file_bytes += static_cast<int64_t>(e.file_size());
  }
  EXPECT_EQ(files, store_->entries());
  EXPECT_EQ(file_bytes, store_->bytes());

  // Restarted: every blob reads back as a valid version or a corrupt miss.
  const int64_t entries = store_->entries();
  Open(capacity);
  EXPECT_EQ(store_->entries(), entries);
  for (uint64_t key = 0; key < kKeys; ++key) {
    std::vector<uint8_t> out(size_of(key));
    if (!store_->Get(Key(key), absl::MakeSpan(out)).ok()) continue;
    EXPECT_TRUE(IsSomeVersion(out, key, next_version[key].load())) << key;
  }
}

}  // namespace
}  // namespace swaserve::kv
