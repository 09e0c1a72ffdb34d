// transfer_peer: the other process of the multi-process transfer tests.
//
//   transfer_peer --role=receiver|sender --dir=DIR [--tls=UCX_TLS]
//                 [--primitive=auto|am|put] [--max_message_bytes=N]
//                 [--max_inflight=N] [--die_on_first_byte] [--idle_exit_ms=N]
//
// Receiver: for n = 0, 1, ... waits for DIR/expect_<n>.req (peer_protocol.h),
// stages canary-filled memory (gap | region 0 | gap | region 1 | gap),
// writes DIR/dest_<n>.pb (a serialized swaserve.v1.KvDestination), waits for
// the transfer, then writes the whole staging buffer to DIR/recv_<n>.bin and
// the outcome to DIR/result_<n>.txt. With --die_on_first_byte it SIGKILLs
// itself as soon as any staged byte changes (a peer dying mid-transfer).
// Sender: for n = 0, 1, ... waits for DIR/send_<n>.req, fills a source buffer
// with the seed's pattern, sends the listed copies to the destination and
// writes DIR/sent_<n>.txt.
// Exits 0 when DIR/done appears or after idle_exit_ms without a request.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "lib/transfer/kv_destination.h"
#include "lib/transfer/transfer_engine.h"
#include "tests/integration/transfer/peer_protocol.h"
#include "tests/unit/transfer/transfer_test_util.h"

namespace swaserve::transfer::testing {
namespace {

struct Flags {
  std::string role;
  std::string dir;
  std::string tls;
  Primitive primitive = Primitive::kAuto;
  uint64_t max_message_bytes = 8 << 20;
  int max_inflight = 16;
  bool die_on_first_byte = false;
  int64_t idle_exit_ms = 60000;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name, std::string* out) {
      const std::string prefix = absl::StrCat("--", name, "=");
      if (!absl::StartsWith(a, prefix)) return false;
      *out = a.substr(prefix.size());
      return true;
    };
    std::string v;
    if (value("role", &f->role) || value("dir", &f->dir) ||
        value("tls", &f->tls)) {
      continue;
    }
    if (value("primitive", &v)) {
      f->primitive = v == "put"  ? Primitive::kPut
                     : v == "am" ? Primitive::kActiveMessage
                                 : Primitive::kAuto;
    } else if (value("max_message_bytes", &v)) {
      if (!absl::SimpleAtoi(v, &f->max_message_bytes)) return false;
    } else if (value("max_inflight", &v)) {
      if (!absl::SimpleAtoi(v, &f->max_inflight)) return false;
    } else if (value("idle_exit_ms", &v)) {
      if (!absl::SimpleAtoi(v, &f->idle_exit_ms)) return false;
    } else if (a == "--die_on_first_byte") {
      f->die_on_first_byte = true;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return false;
    }
  }
  return (f->role == "receiver" || f->role == "sender") && !f->dir.empty();
}

// Waits for `name` in the directory or DIR/done; returns nullopt on done or
// idle timeout.
std::optional<std::string> Next(const Flags& f, const std::string& name) {
  const absl::Time give_up = absl::Now() + absl::Milliseconds(f.idle_exit_ms);
  const std::string path = absl::StrCat(f.dir, "/", name);
  while (absl::Now() < give_up) {
    if (std::filesystem::exists(path)) {
      auto text = ReadFile(path);
      if (text.ok()) return *text;
    }
    if (std::filesystem::exists(f.dir + "/done")) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return std::nullopt;
}

int RunReceiver(const Flags& f, TransferEngine& engine) {
  for (int n = 0;; ++n) {
    std::optional<std::string> req =
        Next(f, absl::StrCat("expect_", n, ".req"));
    if (!req) return 0;
    auto spec = ParseExpect(*req);
    if (!spec.ok()) {
      std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
      return 2;
    }
    const uint64_t size = spec->gap * 3 + spec->region0 + spec->region1;
    std::vector<uint8_t> buffer(size, 0xAB);
    auto reg = engine.Register(buffer.data(), buffer.size());
    if (!reg.ok()) {
      std::fprintf(stderr, "%s\n", reg.status().ToString().c_str());
      return 2;
    }
    ReceiveRequest rr;
    rr.transfer_id = spec->transfer_id;
    rr.regions.push_back(
        LocalRegion{reg->get(), spec->gap, spec->region0, kv::PoolKind::kFull});
    if (spec->region1 > 0) {
      rr.regions.push_back(LocalRegion{reg->get(),
                                       spec->gap * 2 + spec->region0,
                                       spec->region1, kv::PoolKind::kSwa});
    }
    rr.expected_bytes = spec->expected_bytes;
    rr.timeout = absl::Milliseconds(spec->timeout_ms);
    Completion<ReceivedTransfer> done;
    auto dest = engine.ExpectTransfer(rr, done.Callback());
    if (!dest.ok()) {
      (void)WriteFileAtomic(absl::StrCat(f.dir, "/result_", n, ".txt"),
                            FormatResult(dest.status(), 0, ""));
      continue;
    }
    v1::KvDestination proto;
    proto.set_transfer_id(dest->transfer_id);
    proto.set_ucx_worker_address(dest->worker_address);
    for (const RemoteRegion& r : dest->regions) {
      v1::KvMemoryRegion* m = proto.add_regions();
      m->set_pool(r.pool == kv::PoolKind::kFull ? v1::KV_POOL_FULL
                                                : v1::KV_POOL_SWA);
      m->set_base_address(r.base_address);
      m->set_length(r.length);
      m->set_rkey(r.rkey);
    }
    std::atomic<bool> stop{false};
    std::thread watcher;
    if (f.die_on_first_byte) {
      watcher = std::thread([&] {
        volatile const uint8_t* p = buffer.data();
        while (!stop.load(std::memory_order_relaxed)) {
          for (uint64_t i = spec->gap; i < size; i += 4096) {
            if (p[i] != 0xAB) {
              std::fprintf(stderr, "first byte landed at %lu: dying\n",
                           static_cast<unsigned long>(i));
              raise(SIGKILL);
            }
          }
        }
      });
    }
    (void)WriteFileAtomic(absl::StrCat(f.dir, "/dest_", n, ".pb"),
                          proto.SerializeAsString());
    absl::StatusOr<ReceivedTransfer> got = done.Wait();
    stop = true;
    if (watcher.joinable()) watcher.join();
    (void)WriteFileAtomic(
        absl::StrCat(f.dir, "/recv_", n, ".bin"),
        std::string(reinterpret_cast<const char*>(buffer.data()), size));
    (void)WriteFileAtomic(absl::StrCat(f.dir, "/result_", n, ".txt"),
                          FormatResult(got.status(), got.ok() ? got->bytes : 0,
                                       got.ok() ? got->commit_payload : ""));
  }
}

int RunSender(const Flags& f, TransferEngine& engine) {
  for (int n = 0;; ++n) {
    std::optional<std::string> req = Next(f, absl::StrCat("send_", n, ".req"));
    if (!req) return 0;
    auto spec = ParseSend(*req);
    if (!spec.ok()) {
      std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
      return 2;
    }
    auto text = ReadFile(spec->destination_path);
    v1::KvDestination proto;
    if (!text.ok() || !proto.ParseFromString(*text)) {
      std::fprintf(stderr, "cannot read %s\n", spec->destination_path.c_str());
      return 2;
    }
    auto dest = DestinationFromProto(proto);
    if (!dest.ok()) {
      std::fprintf(stderr, "%s\n", dest.status().ToString().c_str());
      return 2;
    }
    std::vector<uint8_t> src(spec->src_bytes);
    FillPattern(src.data(), src.size(), spec->seed);
    auto reg = engine.Register(src.data(), src.size());
    if (!reg.ok()) return 2;
    SendRequest sr;
    sr.destination = *dest;
    for (const SendSpec::Copy& c : spec->copies) {
      sr.copies.push_back(
          PageCopy{src.data() + c.src_offset, c.region, c.offset, c.bytes});
    }
    sr.commit_payload = spec->payload;
    sr.timeout = absl::Milliseconds(spec->timeout_ms);
    auto result = engine.SendAndWait(sr);
    (void)WriteFileAtomic(
        absl::StrCat(f.dir, "/sent_", n, ".txt"),
        FormatResult(result.status(), result.ok() ? result->bytes : 0, ""));
  }
}

}  // namespace
}  // namespace swaserve::transfer::testing

int main(int argc, char** argv) {
  using namespace swaserve::transfer;
  testing::Flags flags;
  if (!testing::ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: transfer_peer --role=receiver|sender --dir=DIR "
                 "[--tls=..] [--primitive=auto|am|put] ...\n");
    return 2;
  }
  TransferEngineOptions options;
  options.name = flags.role;
  options.ucx_tls = flags.tls;
  options.primitive = flags.primitive;
  options.max_message_bytes = flags.max_message_bytes;
  options.max_inflight_messages = flags.max_inflight;
  auto engine = TransferEngine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 2;
  }
  const int rc = flags.role == "receiver"
                     ? testing::RunReceiver(flags, **engine)
                     : testing::RunSender(flags, **engine);
  const EngineStats s = (*engine)->Stats();
  std::fprintf(stderr, "exit: %s\n", testing::StatsString(s).c_str());
  return rc;
}
