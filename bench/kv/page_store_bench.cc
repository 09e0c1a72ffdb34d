// L3 page-store read/write bandwidth, against memcpy and file read bandwidth
// measured in the same run.
//
// Pages of --page_bytes (default 819,200 B = 800 KiB: one MiMo-V2.5-Pro full
// page, 10 full layers x 8 KV heads x (192 + 128) dims x bf16 x 16 tokens),
// --pages of them (default 128, 100 MiB: more than the last-level cache, so
// every pass streams from memory), each pass reading every page once in a
// shuffled order. Measured in the same run, interleaved over --rounds rounds
// (median GB/s of the rounds reported, GB = 10^9 bytes of payload):
//   memcpy               memcpy of each page from a resident copy into the
//                        destination buffer (the memory-bandwidth bound)
//   xxh3-128             hashing each resident page (the verification cost)
//   hmac-sha256          the keyed MAC of each resident page (a keyed store's
//                        verification, kv::PageBlobMac)
//   read() warm / cold   open + read() of the blob file's bytes + close, with
//                        the file in the page cache / evicted from it first
//                        (fsync + posix_fadvise DONTNEED per file; nothing
//                        else on the machine is dropped)
//   file Get warm / cold FilePageStore::Get of the same files (header read,
//                        checks, payload read into the caller's buffer, XXH3
//                        verification, mtime touch)
//   file Get no-touch    the same with touch_on_get = false (a second store
//                        holding the same pages)
//   file Put             FilePageStore::Put (temp file, rename; no fsync)
//   redis GET raw        RedisClient GET of the same blob (the client's own
//                        cost: socket, hiredis parse, reply copy)
//   redis Get / Put      RedisPageStore::Get (GET + verify + copy) / Put
// The Redis rows need a redis-server: --redis HOST:PORT, or one started here
// on a free loopback port (no persistence) when the build has the test
// helper (tests/integration/cluster/redis_server.h); --no_redis skips them.
//
// Usage: page_store_bench [--json FILE] [--dir DIR] [--pages N]
//                         [--page_bytes N] [--rounds N] [--redis ADDR]
//                         [--no_redis] [--no_cold]
//   --dir   where the two file stores live (<dir>/touch, <dir>/no-touch;
//           default: a temp dir under $TMPDIR or /tmp, removed at exit)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/common/bench_util.h"
#include "lib/base/hash.h"
#include "lib/base/subprocess.h"
#include "lib/cluster/redis_client.h"
#include "lib/cluster/redis_page_store.h"
#include "lib/kv/file_page_store.h"
#include "lib/kv/page_blob.h"
#include "nlohmann/json.hpp"
#if SWASERVE_BENCH_HAVE_REDIS_SERVER
#include "tests/integration/cluster/redis_server.h"
#endif

namespace swaserve::kv {
namespace {

using bench::Check;
using bench::Die;

struct Flags {
  std::string json;
  std::string dir;
  int64_t pages = 128;
  int64_t page_bytes = 819200;
  int rounds = 5;
  std::string redis;
  bool no_redis = false;
  bool no_cold = false;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (bench::FlagReader r(argc, argv); r.Next();) {
    if (r.flag() == "--json") {
      f.json = r.Value();
    } else if (r.flag() == "--dir") {
      f.dir = r.Value();
    } else if (r.flag() == "--pages") {
      r.Integer(&f.pages);
    } else if (r.flag() == "--page_bytes") {
      r.Integer(&f.page_bytes);
    } else if (r.flag() == "--rounds") {
      r.Integer(&f.rounds);
    } else if (r.flag() == "--redis") {
      f.redis = r.Value();
    } else if (r.flag() == "--no_redis") {
      f.no_redis = true;
    } else if (r.flag() == "--no_cold") {
      f.no_cold = true;
    } else {
      Die("unknown flag " + r.flag() +
          " (see the header of page_store_bench.cc)");
    }
  }
  if (f.pages <= 0 || f.page_bytes <= 0 || f.rounds <= 0) {
    Die("--pages, --page_bytes and --rounds must be > 0");
  }
  return f;
}

PageKey KeyOf(int64_t i) {
  return PageKey{.hash = base::Hash64(&i, sizeof(i)), .layout = 0x6b76};
}

// The pages, resident, and the destination buffer.
struct Data {
  std::vector<std::vector<uint8_t>> pages;
  std::vector<uint8_t> out;
  std::vector<int64_t> order;  // shuffled page indices, one pass
  uint64_t sink = 0;           // keeps results observable
};

// One named measurement: runs one pass over every page per round.
struct Row {
  std::string name;
  std::function<void(Data&)> pass;
  std::function<void()> before_pass;  // untimed (cold: evict the files)
  std::vector<double> gbps;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes of `path` into `out` with open + read() + close.
void ReadFileInto(const std::string& path, std::vector<uint8_t>& buf) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + path);
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = read(fd, buf.data() + done, buf.size() - done);
    if (n <= 0) Die("read " + path);
    done += static_cast<size_t>(n);
  }
  close(fd);
}

// Drops the files' pages from the page cache (they are written back first).
void EvictFromPageCache(const FilePageStore& store, int64_t pages) {
  for (int64_t i = 0; i < pages; ++i) {
    const std::string path = store.PathOf(KeyOf(i));
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die("open " + path);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

// Rows over `store`; `untouched` holds the same pages with touch_on_get off.
void AddFileRows(const Flags& f, FilePageStore& store, FilePageStore& untouched,
                 std::vector<Row>& rows) {
  const size_t file_bytes = kPageBlobHeaderBytes + f.page_bytes;
  auto read_pass = [&store, file_bytes](Data& d) {
    std::vector<uint8_t> buf(file_bytes);
    for (int64_t i : d.order) {
      ReadFileInto(store.PathOf(KeyOf(i)), buf);
      d.sink += buf[file_bytes - 1];
    }
  };
  auto get_pass_of = [](FilePageStore& s) {
    return [&s](Data& d) {
      for (int64_t i : d.order) {
        Check(s.Get(KeyOf(i), absl::MakeSpan(d.out)), "file Get");
        d.sink += d.out.back();
      }
    };
  };
  auto get_pass = get_pass_of(store);
  rows.push_back({.name = "read() warm", .pass = read_pass});
  rows.push_back({.name = "file Get warm", .pass = get_pass});
  rows.push_back({.name = "file Get no-touch", .pass = get_pass_of(untouched)});
  if (!f.no_cold) {
    auto evict = [&store, pages = f.pages] {
      EvictFromPageCache(store, pages);
    };
    rows.push_back(
        {.name = "read() cold", .pass = read_pass, .before_pass = evict});
    rows.push_back(
        {.name = "file Get cold", .pass = get_pass, .before_pass = evict});
  }
  rows.push_back({.name = "file Put", .pass = [&store](Data& d) {
                    for (int64_t i : d.order) {
                      Check(store.Put(KeyOf(i), d.pages[i]), "file Put");
                    }
                  }});
}

struct RedisSetup {
#if SWASERVE_BENCH_HAVE_REDIS_SERVER
  std::unique_ptr<cluster::testing::RedisServer> server;
#endif
  std::unique_ptr<cluster::RedisClient> raw;
  std::unique_ptr<cluster::RedisPageStore> store;
  std::string address;
};

// Connects to --redis or starts a local redis-server; nullopt-like empty
// setup (no store) when neither is possible.
RedisSetup StartRedis(const Flags& f) {
  RedisSetup r;
  cluster::RedisOptions options;
  if (!f.redis.empty()) {
    Check(cluster::ParseRedisAddress(f.redis, &options), "--redis");
  } else {
#if SWASERVE_BENCH_HAVE_REDIS_SERVER
    r.server =
        Check(cluster::testing::RedisServer::Start(
                  {"--maxmemory", absl::StrCat(4 * f.pages * f.page_bytes),
                   "--maxmemory-policy", "allkeys-lru"}),
              "starting redis-server");
    options = r.server->ClientOptions();
#else
    std::fprintf(stderr,
                 "no --redis and no redis-server helper: Redis rows skipped\n");
    return r;
#endif
  }
  options.command_timeout = absl::Seconds(10);
  r.address = absl::StrCat(options.host, ":", options.port);
  r.raw = Check(cluster::RedisClient::Create(options), "redis client");
  r.store = Check(cluster::RedisPageStore::Create(
                      {.redis = options, .cluster = "page-store-bench"}),
                  "RedisPageStore");
  return r;
}

void AddRedisRows(RedisSetup& r, std::vector<Row>& rows) {
  cluster::RedisPageStore* store = r.store.get();
  cluster::RedisClient* raw = r.raw.get();
  rows.push_back({.name = "redis GET raw", .pass = [store, raw](Data& d) {
                    for (int64_t i : d.order) {
                      auto reply =
                          Check(raw->Command({"GET", store->KeyOf(KeyOf(i))}),
                                "redis GET");
                      d.sink += reply.str.size();
                    }
                  }});
  rows.push_back({.name = "redis Get", .pass = [store](Data& d) {
                    for (int64_t i : d.order) {
                      Check(store->Get(KeyOf(i), absl::MakeSpan(d.out)),
                            "redis Get");
                      d.sink += d.out.back();
                    }
                  }});
  rows.push_back({.name = "redis Put", .pass = [store](Data& d) {
                    for (int64_t i : d.order) {
                      Check(store->Put(KeyOf(i), d.pages[i]), "redis Put");
                    }
                  }});
}

int Main(int argc, char** argv) {
  bench::SetProgramName("page_store_bench");
  const Flags f = ParseFlags(argc, argv);
  std::string dir = f.dir;
  const bool own_dir = dir.empty();
  if (own_dir)
    dir = Check(base::MakeTempDir("swaserve-page-store-bench"), "temp dir");

  Data d;
  std::mt19937_64 rng(42);
  d.pages.resize(f.pages);
  for (auto& p : d.pages) {
    p.resize(f.page_bytes);
    for (size_t i = 0; i < p.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(p.data() + i, &v, std::min<size_t>(8, p.size() - i));
    }
  }
  d.out.resize(f.page_bytes);
  d.order.resize(f.pages);
  std::iota(d.order.begin(), d.order.end(), 0);

  const int64_t file_bytes = kPageBlobHeaderBytes + f.page_bytes;
  auto open = [&](const std::string& sub, bool touch) {
    auto s =
        Check(FilePageStore::Open({.dir = dir + "/" + sub,
                                   .capacity_bytes = 2 * f.pages * file_bytes,
                                   .touch_on_get = touch}),
              "FilePageStore::Open");
    for (int64_t i = 0; i < f.pages; ++i) {
      Check(s->Put(KeyOf(i), d.pages[i]), "Put");
    }
    return s;
  };
  auto store = open("touch", true);
  auto untouched = open("no-touch", false);

  std::vector<Row> rows;
  rows.push_back({.name = "memcpy", .pass = [](Data& d) {
                    for (int64_t i : d.order) {
                      std::memcpy(d.out.data(), d.pages[i].data(),
                                  d.out.size());
                      d.sink += d.out.back();
                    }
                  }});
  rows.push_back(
      {.name = "xxh3-128", .pass = [](Data& d) {
         for (int64_t i : d.order) {
           d.sink += base::Hash128Of(d.pages[i].data(), d.pages[i].size()).low;
         }
       }});
  // The keyed MAC of a shared L3 (kv::PageBlobMac, --kv.l3_mac_key_file):
  // what a keyed store adds to every Put and Get.
  static const std::shared_ptr<const kv::PageBlobMac> mac =
      *kv::PageBlobMac::FromKey(std::string(32, 'k'));
  rows.push_back(
      {.name = "hmac-sha256", .pass = [](Data& d) {
         for (int64_t i : d.order) {
           d.sink += mac->Tag({}, d.pages[i]).low;
         }
       }});
  AddFileRows(f, *store, *untouched, rows);
  RedisSetup redis;
  if (!f.no_redis) {
    redis = StartRedis(f);
    if (redis.store != nullptr) {
      for (int64_t i = 0; i < f.pages; ++i) {
        Check(redis.store->Put(KeyOf(i), d.pages[i]), "redis Put");
      }
      AddRedisRows(redis, rows);
    }
  }

  const double pass_bytes = static_cast<double>(f.pages * f.page_bytes);
  for (int round = 0; round < f.rounds; ++round) {
    std::shuffle(d.order.begin(), d.order.end(), rng);
    for (Row& row : rows) {
      if (row.before_pass) row.before_pass();
      const auto t0 = std::chrono::steady_clock::now();
      row.pass(d);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      row.gbps.push_back(pass_bytes / s / 1e9);
    }
  }

  double memcpy_gbps = 0, read_warm = 0, read_cold = 0;
  for (const Row& row : rows) {
    if (row.name == "memcpy") memcpy_gbps = Median(row.gbps);
    if (row.name == "read() warm") read_warm = Median(row.gbps);
    if (row.name == "read() cold") read_cold = Median(row.gbps);
  }
  std::printf(
      "page_store_bench: %ld pages of %ld B (%.1f MiB per pass), %d rounds, "
      "dir %s%s\n",
      static_cast<long>(f.pages), static_cast<long>(f.page_bytes),
      pass_bytes / (1 << 20), f.rounds, dir.c_str(),
      redis.store ? absl::StrCat(", redis ", redis.address).c_str() : "");
  std::printf("%-18s %9s %9s %9s %10s %10s\n", "kind", "GB/s", "min", "max",
              "vs memcpy", "vs read()");
  nlohmann::json out = {{"pages", f.pages},
                        {"page_bytes", f.page_bytes},
                        {"rounds", f.rounds},
                        {"rows", nlohmann::json::array()}};
  for (const Row& row : rows) {
    const double med = Median(row.gbps);
    const bool cold = row.name.find("cold") != std::string::npos;
    const double read_base = cold ? read_cold : read_warm;
    const bool file_row =
        row.name.rfind("file Get", 0) == 0 || row.name.rfind("read", 0) == 0;
    std::printf(
        "%-18s %9.2f %9.2f %9.2f %9.0f%% %9s\n", row.name.c_str(), med,
        *std::min_element(row.gbps.begin(), row.gbps.end()),
        *std::max_element(row.gbps.begin(), row.gbps.end()),
        100 * med / memcpy_gbps,
        file_row && read_base > 0
            ? absl::StrCat(static_cast<int>(100 * med / read_base + 0.5), "%")
                  .c_str()
            : "");
    out["rows"].push_back(
        {{"kind", row.name}, {"median_gbps", med}, {"gbps", row.gbps}});
  }
  std::printf("(sink %lu)\n", static_cast<unsigned long>(d.sink % 10));
  if (!f.json.empty()) bench::WriteJsonFile(f.json, out);
  store.reset();
  untouched.reset();
  if (own_dir) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace swaserve::kv

int main(int argc, char** argv) { return swaserve::kv::Main(argc, argv); }
