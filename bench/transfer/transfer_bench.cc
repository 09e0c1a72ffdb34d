// KV transfer engine benchmark, all in one run on one transport:
//
//  1. Bandwidth of TransferEngine sends between two processes on loopback,
//     1 MiB ... 256 MiB: each primitive forced (AM rendezvous, put) on one
//     contiguous copy, and the automatic choice (kAuto) on 800 KiB pages in
//     random order (the MiMo full page; the realistic case), into receiver
//     staging that is ordinary registered memory ("malloc") or memory from
//     TransferEngine::Allocate ("ucx"), against
//       - ucx_perftest ucp_put_bw and tag_bw on the same UCX_TLS, with and
//         without endpoint error handling (-e; the engine always uses it),
//       - single-thread memcpy of the same size in this process.
//     A send is timed from Send() to the receiver's commit acknowledgement
//     (data visible at the receiver, commit processed): the full cost a
//     prefill worker waits for. Target: kAuto on pages >= 80% of
//     ucx_perftest's best for sizes >= 16 MiB.
//  2. Bytes shipped per request for the MiMo-V2.5-Pro shape at 32K and 128K
//     prompt tokens (full KV for every token + SWA/MTP KV for the last
//     window, counted from PlanKvCopies over a real kv::Sequence) against
//     shipping SWA KV for every token.
//
// The receiver is a forked child (before any UCX initialisation) driven
// over a socketpair. ucx_perftest runs as server + client on 127.0.0.1.
//
// Usage: transfer_bench [--json FILE] [--tls LIST] [--sizes_mib LIST]
//                       [--min_bytes_mib N] [--rounds N] [--no_perftest]
//                       [--staging LIST] [--message_bytes N] [--inflight N]
//                       [--spin]
//   --tls        ';'-separated UCX_TLS values (default "posix,sysv,self;tcp")
//   --sizes_mib  ','-separated sizes (default 1,4,16,64,256)
//   --rounds     rounds per size (default 3); each round runs the engine's
//                sends and then the four ucx_perftest tests, so a load spike
//                on a shared machine does not hit only one side
//   --staging    malloc and/or ucx (default both): receiver staging memory
//   --min_bytes_mib  bytes per kind and size over all rounds (default 2048)
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "lib/base/subprocess.h"
#include "lib/kv/kv_shape.h"
#include "lib/kv/page_pool.h"
#include "lib/kv/sequence.h"
#include "lib/transfer/kv_destination.h"
#include "lib/transfer/transfer_engine.h"
#include "nlohmann/json.hpp"

namespace swaserve::transfer {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kPageBytes = 819200;  // MiMo-V2.5-Pro full page

struct Flags {
  std::string json;
  std::vector<std::string> tls = {"posix,sysv,self", "tcp"};
  std::vector<uint64_t> sizes_mib = {1, 4, 16, 64, 256};
  uint64_t min_bytes = 2048 * kMiB;  // per measurement
  bool perftest = true;
  // Measurement rounds per size (engine and ucx_perftest interleaved).
  int rounds = 3;
  uint64_t message_bytes = 8 * kMiB;
  int inflight = 16;
  bool spin = false;  // --spin: engine progress threads never yield
  // Receiver staging memory: "malloc" (ordinary, registered) and/or "ucx"
  // (TransferEngine::Allocate: a UCX-allocated shared-memory segment).
  std::vector<std::string> staging = {"malloc", "ucx"};
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(absl::StrCat(a, " needs a value"));
      return argv[++i];
    };
    if (a == "--json") {
      f.json = next();
    } else if (a == "--tls") {
      f.tls = absl::StrSplit(next(), ';', absl::SkipEmpty());
    } else if (a == "--sizes_mib") {
      f.sizes_mib.clear();
      for (absl::string_view s : absl::StrSplit(next(), ',')) {
        uint64_t v;
        if (!absl::SimpleAtoi(s, &v) || v == 0) Die("bad --sizes_mib");
        f.sizes_mib.push_back(v);
      }
    } else if (a == "--min_bytes_mib") {
      if (!absl::SimpleAtoi(next(), &f.min_bytes)) Die("bad --min_bytes_mib");
      f.min_bytes *= kMiB;
    } else if (a == "--rounds") {
      if (!absl::SimpleAtoi(next(), &f.rounds) || f.rounds < 1) {
        Die("bad --rounds");
      }
    } else if (a == "--spin") {
      f.spin = true;
    } else if (a == "--no_perftest") {
      f.perftest = false;
    } else if (a == "--message_bytes") {
      if (!absl::SimpleAtoi(next(), &f.message_bytes)) Die("bad value");
    } else if (a == "--staging") {
      f.staging = absl::StrSplit(next(), ',', absl::SkipEmpty());
    } else if (a == "--inflight") {
      if (!absl::SimpleAtoi(next(), &f.inflight)) Die("bad value");
    } else {
      Die(absl::StrCat("unknown flag ", a));
    }
  }
  return f;
}

// --- socketpair framing ------------------------------------------------------

void WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w <= 0) Die("control socket write failed");
    c += w;
    n -= static_cast<size_t>(w);
  }
}

bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void SendFrame(int fd, const std::string& s) {
  const uint64_t n = s.size();
  WriteAll(fd, &n, sizeof(n));
  WriteAll(fd, s.data(), s.size());
}

bool RecvFrame(int fd, std::string* s) {
  uint64_t n = 0;
  if (!ReadAll(fd, &n, sizeof(n))) return false;
  s->resize(n);
  return ReadAll(fd, s->data(), n);
}

uint8_t* AllocTouched(uint64_t bytes, uint8_t fill) {
  auto* p = static_cast<uint8_t*>(
      std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (p == nullptr) Die("out of memory");
  std::memset(p, fill, bytes);
  return p;
}

TransferEngineOptions EngineOptions(const Flags& f, const std::string& name,
                                    const std::string& tls) {
  TransferEngineOptions o;
  o.name = name;
  o.ucx_tls = tls;
  o.max_message_bytes = f.message_bytes;
  o.max_inflight_messages = f.inflight;
  o.yield_while_polling = !f.spin;
  o.default_timeout = absl::Seconds(120);
  return o;
}

// --- the receiving child
// -------------------------------------------------------

int ReceiverMain(int fd, const Flags& flags) {
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<Registration> reg;
  uint8_t* buffer = nullptr;
  uint64_t capacity = 0;
  std::atomic<int> failures{0};
  std::string cmd;
  while (RecvFrame(fd, &cmd)) {
    std::vector<std::string> w = absl::StrSplit(cmd, ' ');
    if (w[0] == "engine") {
      reg.reset();
      engine.reset();
      std::free(buffer);
      uint64_t bytes = 0;
      (void)absl::SimpleAtoi(w[2], &bytes);
      auto e =
          TransferEngine::Create(EngineOptions(flags, "bench-receiver", w[1]));
      if (!e.ok()) {
        SendFrame(fd, absl::StrCat("err ", e.status().ToString()));
        continue;
      }
      engine = *std::move(e);
      capacity = bytes;
      absl::StatusOr<std::unique_ptr<Registration>> r;
      if (w.size() > 3 && w[3] == "ucx") {
        buffer = nullptr;
        r = engine->Allocate(capacity);
        if (r.ok()) std::memset((*r)->data(), 0, capacity);
      } else {
        buffer = AllocTouched(bytes, 0);
        r = engine->Register(buffer, capacity);
      }
      if (!r.ok()) Die(r.status().ToString());
      reg = *std::move(r);
      SendFrame(fd, "ok");
    } else if (w[0] == "expect") {
      uint64_t bytes = 0;
      (void)absl::SimpleAtoi(w[2], &bytes);
      ReceiveRequest rr;
      rr.transfer_id = w[1];
      rr.regions.push_back(
          LocalRegion{reg.get(), 0, capacity, kv::PoolKind::kFull});
      rr.expected_bytes = bytes;
      auto d = engine->ExpectTransfer(
          rr, [&failures](absl::StatusOr<ReceivedTransfer> r) {
            if (!r.ok()) {
              std::fprintf(stderr, "receive failed: %s\n",
                           r.status().ToString().c_str());
              failures.fetch_add(1);
            }
          });
      if (!d.ok()) {
        SendFrame(fd, absl::StrCat("err ", d.status().ToString()));
        continue;
      }
      v1::KvDestination proto;
      proto.set_transfer_id(d->transfer_id);
      proto.set_ucx_worker_address(d->worker_address);
      auto* region = proto.add_regions();
      region->set_pool(v1::KV_POOL_FULL);
      region->set_base_address(d->regions[0].base_address);
      region->set_length(d->regions[0].length);
      region->set_rkey(d->regions[0].rkey);
      SendFrame(fd, proto.SerializeAsString());
    } else if (w[0] == "failures") {
      SendFrame(fd, absl::StrCat(failures.load()));
    } else if (w[0] == "quit") {
      break;
    }
  }
  reg.reset();
  engine.reset();
  std::free(buffer);
  return 0;
}

// --- measurements
// --------------------------------------------------------------

struct Sample {
  double median_gbps = 0;
  double best_gbps = 0;
  int iterations = 0;
  std::string note;
};

Sample Summarize(std::vector<double> gbps) {
  Sample s;
  if (gbps.empty()) return s;
  std::sort(gbps.begin(), gbps.end());
  s.median_gbps = gbps[gbps.size() / 2];
  s.best_gbps = gbps.back();
  s.iterations = static_cast<int>(gbps.size());
  return s;
}

int Iterations(const Flags& f, uint64_t bytes) {
  return static_cast<int>(std::clamp<uint64_t>(f.min_bytes / bytes, 5, 200));
}

Sample MeasureMemcpy(const Flags& f, uint64_t bytes, uint8_t* a, uint8_t* b) {
  std::vector<double> gbps;
  std::memcpy(b, a, bytes);  // warm-up
  for (int i = 0; i < Iterations(f, bytes); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b, a, bytes);
    // The copy's bytes may be read: clang dropped the copy otherwise (b is
    // never read in this process), and memcpy read 52,000 GB/s.
    asm volatile("" : : "r"(b) : "memory");
    const auto t1 = std::chrono::steady_clock::now();
    gbps.push_back(bytes / std::chrono::duration<double>(t1 - t0).count() /
                   1e9);
    a[i % bytes] ^= 1;  // keep the copy from being elided
  }
  return Summarize(gbps);
}

class Bench {
 public:
  explicit Bench(int fd) : fd_(fd) {}

  std::string Ask(const std::string& cmd) {
    SendFrame(fd_, cmd);
    std::string reply;
    if (!RecvFrame(fd_, &reply)) Die("the receiver process died");
    return reply;
  }

  Destination Expect(uint64_t bytes) {
    const std::string id = absl::StrCat("bench-", next_id_++);
    const std::string reply = Ask(absl::StrCat("expect ", id, " ", bytes));
    v1::KvDestination proto;
    if (absl::StartsWith(reply, "err ") || !proto.ParseFromString(reply)) {
      Die(absl::StrCat("expect failed: ", reply));
    }
    auto d = DestinationFromProto(proto);
    if (!d.ok()) Die(d.status().ToString());
    return *d;
  }

  // Sends `copies` (their bytes) with `primitive`, warm-up + iterations.
  // Appends the rate of `iters` sends (after one warm-up) to *gbps; returns
  // the error of a failed send ("" when all succeeded).
  std::string MeasureSends(TransferEngine& engine, uint64_t bytes,
                           const std::vector<PageCopy>& copies,
                           Primitive primitive, int iters,
                           std::vector<double>* gbps) {
    for (int i = -1; i < iters; ++i) {
      SendRequest sr;
      sr.destination = Expect(bytes);
      sr.copies = copies;
      sr.primitive = primitive;
      sr.timeout = absl::Seconds(60);
      const auto t0 = std::chrono::steady_clock::now();
      auto r = engine.SendAndWait(std::move(sr));
      const auto t1 = std::chrono::steady_clock::now();
      if (!r.ok()) return std::string(r.status().message().substr(0, 120));
      if (i >= 0) {
        gbps->push_back(bytes / std::chrono::duration<double>(t1 - t0).count() /
                        1e9);
      }
    }
    return "";
  }

 private:
  int fd_;
  uint64_t next_id_ = 0;
};

// One ucx_perftest server + client run; bandwidth "overall" in GB/s (it
// prints MB/s meaning MiB/s).
Sample RunPerftest(const std::string& tls, const std::string& test,
                   uint64_t bytes, int iters, bool error_handling,
                   const std::string& dir) {
  Sample s;
  auto port = base::PickFreePort();
  if (!port.ok()) {
    s.note = "no free port";
    return s;
  }
  std::vector<std::string> args = {
      "ucx_perftest",      "-t", test, "-s", absl::StrCat(bytes), "-n",
      absl::StrCat(iters), "-w", "2",  "-p", absl::StrCat(*port), "-f"};
  if (error_handling) args.push_back("-e");
  std::vector<std::string> env = {absl::StrCat("UCX_TLS=", tls)};
  if (error_handling) env.push_back("UCX_MM_ERROR_HANDLING=y");
  base::SubprocessOptions server;
  server.argv = args;
  server.env = env;
  server.log_path = dir + "/perftest_server.log";
  server.stop_grace = absl::Seconds(1);
  auto srv = base::Subprocess::Start(server);
  if (!srv.ok()) {
    s.note = std::string(srv.status().message());
    return s;
  }
  std::string line;
  for (int attempt = 0; attempt < 30; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    base::SubprocessOptions client;
    client.argv = args;
    client.argv.insert(client.argv.begin() + 1, "127.0.0.1");
    client.env = env;
    client.log_path = dir + "/perftest_client.log";
    client.stop_grace = absl::Seconds(1);
    auto cli = base::Subprocess::Start(client);
    if (!cli.ok()) break;
    auto rc = (*cli)->Wait(absl::Seconds(120));
    const std::string log = (*cli)->ReadLog();
    if (!rc.ok()) {
      s.note = "timed out after 120 s";
      return s;
    }
    if (*rc == 0) {
      std::vector<std::string> lines =
          absl::StrSplit(log, '\n', absl::SkipEmpty());
      if (!lines.empty()) line = lines.back();
      break;
    }
    if (!absl::StrContains(log, "connect") &&
        !absl::StrContains(log, "refused")) {
      s.note = "perftest failed";
      return s;
    }
  }
  (void)(*srv)->Wait(absl::Seconds(10));
  std::vector<std::string> cols = absl::StrSplit(line, ' ', absl::SkipEmpty());
  double mib_s = 0;
  // iterations, p50, avg, overall overhead, bw avg, bw overall, ...
  if (cols.size() >= 6 && absl::SimpleAtod(cols[5], &mib_s)) {
    s.best_gbps = s.median_gbps = mib_s * kMiB / 1e9;
    s.iterations = iters;
  } else {
    s.note = absl::StrCat("unparsed: ", line);
  }
  return s;
}

// --- bytes per request -------------------------------------------------------

nlohmann::json BytesPerRequest() {
  nlohmann::json out = nlohmann::json::array();
  const kv::KvShape shape = kv::KvShape::MiMoV25Pro();
  std::printf(
      "\nBytes shipped per request, MiMo-V2.5-Pro shape (10 full + 60 SWA "
      "layers, W=128, 8 KV heads, K192/V128, bf16, 16-token pages)\n");
  std::printf("%8s  %14s  %14s  %14s  %14s  %8s\n", "tokens", "full KV",
              "SWA KV (window)", "shipped", "SWA every tok", "ratio");
  for (int n : {32768, 131072}) {
    kv::KvPoolsOptions po;
    po.shape = shape;
    po.full_pages = n / shape.page_size + 16;
    po.swa_pages = n / shape.page_size + 16;
    po.allocate_memory = false;
    auto pools = kv::KvPools::Create(po);
    if (!pools.ok()) Die(pools.status().ToString());
    kv::Sequence seq({pools->get(), nullptr, 0});
    for (int done = 0; done < n; done += 4096) {
      if (!seq.Append(std::min(4096, n - done)).ok()) Die("append failed");
      seq.TrimWindow();
    }
    auto plan = PlanStaging(shape, n);
    if (!plan.ok()) Die(plan.status().ToString());
    v1::KvDestination dest;
    dest.set_transfer_id("bytes");
    *dest.mutable_layout() = LayoutOf(shape);
    dest.set_num_tokens(n);
    dest.set_first_swa_token(plan->first_swa_token);
    dest.add_regions()->set_pool(v1::KV_POOL_FULL);
    dest.mutable_regions(0)->set_length(plan->full_bytes());
    dest.add_regions()->set_pool(v1::KV_POOL_SWA);
    dest.mutable_regions(1)->set_length(plan->swa_bytes());
    auto copies = PlanKvCopies(seq, **pools, dest);
    if (!copies.ok()) Die(copies.status().ToString());
    uint64_t full = 0, swa = 0;
    for (const PageCopy& c : *copies) (c.region == 0 ? full : swa) += c.bytes;
    const uint64_t shipped = full + swa;
    const uint64_t naive = NaiveTransferBytes(shape, n);
    std::printf("%8d  %11.3f GB  %11.4f GB  %11.3f GB  %11.3f GB  %7.2fx\n", n,
                full / 1e9, swa / 1e9, shipped / 1e9, naive / 1e9,
                static_cast<double>(naive) / shipped);
    out.push_back({{"tokens", n},
                   {"full_bytes", full},
                   {"swa_bytes", swa},
                   {"shipped_bytes", shipped},
                   {"swa_every_token_bytes", naive},
                   {"first_swa_token", plan->first_swa_token},
                   {"ratio", static_cast<double>(naive) / shipped}});
  }
  return out;
}

// Pages: 800 KiB MiMo pages from a random permutation (seeded) of the
// source's first `bytes`, to consecutive destination slots (what
// PlanKvCopies produces); *total is their bytes.
std::vector<PageCopy> ShuffledPages(uint8_t* src, uint64_t bytes, uint64_t seed, uint64_t* total) {
  std::vector<PageCopy> pages;
  const uint64_t n_pages = std::max<uint64_t>(1, bytes / kPageBytes);
  std::vector<uint64_t> perm(n_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
  *total = 0;
  for (uint64_t i = 0; i < n_pages; ++i) {
    const uint64_t len = std::min<uint64_t>(kPageBytes, bytes);
    pages.push_back(PageCopy{src + perm[i] * len, 0, i * len, len});
    *total += len;
  }
  return pages;
}

// One size's row of the table, its notes, and its samples in `results`.
void ReportSize(const std::string& tls, const std::string& staging, uint64_t mib,
                const Sample& am, const Sample& put, const Sample& am_pages,
                const std::array<Sample, 4>& pt, const Sample& mc, nlohmann::json& results) {
  const uint64_t bytes = mib * kMiB;
  double best_pt = 0;
  for (const Sample& s : pt) best_pt = std::max(best_pt, s.best_gbps);
  auto cell = [](const Sample& s) {
    if (s.iterations == 0) return std::string("n/a");
    return absl::StrFormat("%.2f / %.2f", s.median_gbps, s.best_gbps);
  };
  auto pcell = [](const Sample& s) {
    if (s.iterations == 0) return std::string("n/a");
    return absl::StrFormat("%.2f", s.best_gbps);
  };
  // The target: the engine as a service uses it (kAuto, MiMo pages)
  // against ucx_perftest's best on the same transport.
  const double ratio = best_pt > 0 ? am_pages.median_gbps / best_pt : 0;
  std::printf(
      "%5lu MiB  %13s  %13s  %13s  %9s  %9s  %9s  %9s  %9s  %6.0f%%\n",
      static_cast<unsigned long>(mib), cell(am).c_str(),
      cell(put).c_str(), cell(am_pages).c_str(), pcell(pt[0]).c_str(),
      pcell(pt[1]).c_str(), pcell(pt[2]).c_str(), pcell(pt[3]).c_str(),
      absl::StrFormat("%.2f", mc.median_gbps).c_str(), ratio * 100);
  for (const auto& [name, s] :
       std::vector<std::pair<std::string, Sample>>{
           {"engine_am", am},
           {"engine_put", put},
           {"engine_auto_pages", am_pages},
           {"perftest_ucp_put_bw", pt[0]},
           {"perftest_ucp_put_bw_e", pt[1]},
           {"perftest_tag_bw", pt[2]},
           {"perftest_tag_bw_e", pt[3]},
           {"memcpy", mc}}) {
    if (!s.note.empty()) {
      std::printf("    note: %s: %s\n", name.c_str(), s.note.c_str());
    }
    results.push_back({{"tls", tls},
                       {"staging", staging},
                       {"size_bytes", bytes},
                       {"kind", name},
                       {"median_gbps", s.median_gbps},
                       {"best_gbps", s.best_gbps},
                       {"iterations", s.iterations},
                       {"note", s.note}});
  }
}

int SenderMain(const Flags& flags, int fd) {
  const uint64_t max_bytes =
      *std::max_element(flags.sizes_mib.begin(), flags.sizes_mib.end()) * kMiB;
  uint8_t* src = AllocTouched(max_bytes, 0x5a);
  for (uint64_t i = 0; i < max_bytes; i += 4096)
    src[i] = static_cast<uint8_t>(i >> 12);
  uint8_t* scratch = AllocTouched(max_bytes, 0);
  auto dir = base::MakeTempDir("transfer_bench");
  if (!dir.ok()) Die(dir.status().ToString());
  Bench bench(fd);
  nlohmann::json results = nlohmann::json::array();

  std::map<uint64_t, Sample> memcpy_results;
  for (uint64_t mib : flags.sizes_mib) {
    memcpy_results[mib] = MeasureMemcpy(flags, mib * kMiB, src, scratch);
  }

  for (const std::string& tls : flags.tls) {
    std::map<uint64_t, std::array<Sample, 4>> perftest;
    for (const std::string& staging : flags.staging) {
      const std::string reply =
          bench.Ask(absl::StrCat("engine ", tls, " ", max_bytes, " ", staging));
      if (reply != "ok") Die(reply);
      auto engine =
          TransferEngine::Create(EngineOptions(flags, "bench-sender", tls));
      if (!engine.ok()) Die(engine.status().ToString());
      auto reg = (*engine)->Register(src, max_bytes);
      if (!reg.ok()) Die(reg.status().ToString());

      std::printf(
          "\nUCX_TLS=%s, receiver staging: %s  (GB/s = 1e9 B/s; engine: median "
          "/ best of all sends, Send() to commit ack; perftest: best of %d "
          "runs' overall; memcpy: median)\n",
          tls.c_str(), staging.c_str(), flags.rounds);
      std::printf("%9s  %13s  %13s  %13s  %9s  %9s  %9s  %9s  %9s  %7s\n",
                  "size", "engine am", "engine put", "auto 800K pgs", "pt put",
                  "pt put -e", "pt tag", "pt tag -e", "memcpy", "auto/best");
      for (uint64_t mib : flags.sizes_mib) {
        const uint64_t bytes = mib * kMiB;
        std::vector<PageCopy> one = {PageCopy{src, 0, 0, bytes}};
        uint64_t page_total = 0;
        const std::vector<PageCopy> pages = ShuffledPages(src, bytes, mib, &page_total);
        // Rounds interleave the engine and ucx_perftest, so that a load
        // spike on this shared machine does not hit only one of them.
        const int iters = std::max(3, Iterations(flags, bytes) / flags.rounds);
        std::vector<double> am_r, put_r, pages_r;
        std::string am_note, put_note, pages_note;
        const bool run_perftest = flags.perftest && !perftest.contains(mib);
        std::array<std::vector<double>, 4> pt_r;
        std::array<std::string, 4> pt_note;
        for (int round = 0; round < flags.rounds; ++round) {
          am_note += bench.MeasureSends(
              **engine, bytes, one, Primitive::kActiveMessage, iters, &am_r);
          put_note += bench.MeasureSends(**engine, bytes, one, Primitive::kPut,
                                         iters, &put_r);
          pages_note += bench.MeasureSends(**engine, page_total, pages,
                                           Primitive::kAuto, iters, &pages_r);
          if (!run_perftest) continue;
          const int pt_iters = std::max(5, iters);
          const std::pair<const char*, bool> tests[4] = {{"ucp_put_bw", false},
                                                         {"ucp_put_bw", true},
                                                         {"tag_bw", false},
                                                         {"tag_bw", true}};
          for (int k = 0; k < 4; ++k) {
            Sample one_run = RunPerftest(tls, tests[k].first, bytes, pt_iters,
                                         tests[k].second, *dir);
            if (one_run.iterations > 0) pt_r[k].push_back(one_run.best_gbps);
            if (!one_run.note.empty()) pt_note[k] = one_run.note;
          }
        }
        if (run_perftest) {
          std::array<Sample, 4>& p = perftest[mib];
          for (int k = 0; k < 4; ++k) {
            p[k] = Summarize(pt_r[k]);
            p[k].note = pt_note[k];
          }
        }
        Sample am = Summarize(am_r), put = Summarize(put_r),
               am_pages = Summarize(pages_r);
        am.note = am_note;
        put.note = put_note;
        am_pages.note = pages_note;
        ReportSize(tls, staging, mib, am, put, am_pages, perftest[mib], memcpy_results[mib],
                   results);
        std::fflush(stdout);
      }
      reg->reset();
      engine->reset();
    }
  }
  if (bench.Ask("failures") != "0") {
    std::printf("WARNING: the receiver saw failed transfers (see stderr)\n");
  }
  nlohmann::json bytes = BytesPerRequest();
  SendFrame(fd, "quit");
  if (!flags.json.empty()) {
    std::ofstream out(flags.json);
    out << nlohmann::json{{"bandwidth", results}, {"bytes_per_request", bytes}}
               .dump(2)
        << "\n";
  }
  std::free(src);
  std::free(scratch);
  std::error_code ignored;
  std::filesystem::remove_all(*dir, ignored);
  return 0;
}

}  // namespace
}  // namespace swaserve::transfer

int main(int argc, char** argv) {
  using namespace swaserve::transfer;
  const Flags flags = ParseFlags(argc, argv);
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) Die("socketpair failed");
  const pid_t pid = fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    close(fds[0]);
    _exit(ReceiverMain(fds[1], flags));
  }
  close(fds[1]);
  const int rc = SenderMain(flags, fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc;
}
