// Wire format of the KV transfer protocol (see transfer_engine.h for the
// protocol itself). Internal to lib/transfer; tests include it to forge
// malformed or foreign messages.
//
// Everything is little-endian with fixed-width fields, encoded with memcpy
// (no struct padding reaches the wire: every struct below is naturally
// aligned and its size is asserted). A version byte in every frame lets a
// receiver reject a peer that speaks another version with a clear error.
//
// Two opaque blobs travel in the gRPC handshake (KvDestination):
//   * the worker address: "SWWA" | version | engine id | process identity
//     (boot id, pid namespace, pid, start time) | XXH3 of all that and the
//     UCX address | length | UCX worker address bytes;
//   * each region's rkey: "SWRK" | version | tag | base | length | flags |
//     XXH3 of all that and the UCX rkey | length | packed UCX rkey bytes.
// The tag is a random 64-bit value chosen per (transfer, region) by the
// receiver; every data message and the commit carry it back, so a sender
// using a stale or foreign destination is rejected before a byte lands.
// The checksums make a truncated or corrupted blob an error instead of
// undefined behaviour inside UCX (whose unpack functions take no length).
//
// Pure functions; thread-safe.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swaserve::transfer::wire {

static_assert(std::endian::native == std::endian::little,
              "the transfer wire format assumes a little-endian host");

inline constexpr uint8_t kVersion = 1;
inline constexpr uint32_t kAddressMagic = 0x41575753;  // "SWWA"
inline constexpr uint32_t kRkeyMagic = 0x4b525753;     // "SWRK"
inline constexpr uint32_t kMessageMagic = 0x564b5753;  // "SWKV"

// Longest transfer id (bytes); ids travel in every message header.
inline constexpr size_t kMaxTransferIdBytes = 128;
// Most regions one destination may have (one per pool today: 2).
inline constexpr size_t kMaxRegions = 8;

// OK for an id of 1..kMaxTransferIdBytes bytes; InvalidArgument saying so
// otherwise.
absl::Status CheckTransferId(absl::string_view transfer_id);

// UCP active-message ids of the protocol.
enum AmId : uint32_t {
  kAmHello = 0x5301,   // sender -> receiver, once per endpoint
  kAmData = 0x5302,    // sender -> receiver, one per data message
  kAmCommit = 0x5303,  // sender -> receiver, after all data is visible
  kAmReply = 0x5304,   // receiver -> sender: ready, commit ack, rejection
  kAmBegin = 0x5305,   // sender -> receiver before puts: validate first
};

// --- Opaque handshake blobs ---------------------------------------------

// Identifies a process on a host, so that a peer on the same host (shared
// memory) can be declared dead when its process is gone: UCX 1.13 does not
// notice a dead shared-memory peer. Zero fields: unknown.
struct ProcessIdentity {
  uint64_t boot_id = 0;        // hash of /proc/sys/kernel/random/boot_id
  uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid
  uint64_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks)
};

struct WorkerAddress {
  uint64_t engine_id = 0;
  ProcessIdentity process;
  std::string ucx_address;
};
std::string PackWorkerAddress(const WorkerAddress& address);
// InvalidArgument (saying what is wrong) for a blob PackWorkerAddress did not
// produce intact.
absl::StatusOr<WorkerAddress> UnpackWorkerAddress(absl::string_view blob);

// Rkey::flags bit: the region lies in memory UCX allocated
// (TransferEngine::Allocate), which a peer on this host can map and write
// into directly (a single-copy put over shared memory).
inline constexpr uint64_t kRkeyUcxAllocated = 1;

struct Rkey {
  uint64_t tag = 0;
  uint64_t base_address = 0;
  uint64_t length = 0;
  std::string ucx_rkey;
  uint64_t flags = 0;
};
std::string PackRkey(const Rkey& rkey);
absl::StatusOr<Rkey> UnpackRkey(absl::string_view blob);

// --- Active-message headers ----------------------------------------------

// Common prefix of every header.
struct Prefix {
  uint32_t magic = kMessageMagic;
  uint8_t version = kVersion;
  uint8_t kind = 0;  // the AmId's low byte, checked against the handler
  uint16_t reserved = 0;
};
static_assert(sizeof(Prefix) == 8);

// kAmHello; the data is the sender's packed worker address.
struct HelloHeader {
  Prefix prefix;
  uint64_t sender_engine = 0;
};
static_assert(sizeof(HelloHeader) == 16);

// kAmData; followed by the transfer id. The data is written at
// remote_address (which must lie in region `region` of the transfer).
struct DataHeader {
  Prefix prefix;
  uint64_t sender_engine = 0;
  uint64_t send_id = 0;
  uint64_t rkey_tag = 0;
  uint64_t remote_address = 0;
  uint64_t length = 0;
  uint32_t region = 0;
  uint32_t id_length = 0;
};
static_assert(sizeof(DataHeader) == 56);

// kAmCommit; followed by num_regions rkey tags (u64 each) and the transfer
// id. The data is the commit payload.
struct CommitHeader {
  Prefix prefix;
  uint64_t sender_engine = 0;
  uint64_t send_id = 0;
  uint64_t am_bytes = 0;   // bytes sent as data messages
  uint64_t put_bytes = 0;  // bytes written with RMA puts (flushed)
  uint64_t messages = 0;
  uint32_t num_regions = 0;
  uint32_t id_length = 0;
};
static_assert(sizeof(CommitHeader) == 56);

// kAck answers a commit, kReady a begin, kReject any message.
enum class ReplyKind : uint8_t { kAck = 1, kReject = 2, kReady = 3 };

// kAmReply; the data is the status message (empty for an OK ack).
struct ReplyHeader {
  Prefix prefix;
  uint64_t send_id = 0;
  uint32_t code = 0;  // absl::StatusCode
  uint8_t reply_kind = 0;
  uint8_t pad[3] = {0, 0, 0};
};
static_assert(sizeof(ReplyHeader) == 24);

// Encode*: the header bytes of one message (magic, version and kind filled
// in; id/tag lengths taken from the arguments). Decode*: the inverse;
// InvalidArgument for a header that is truncated, has trailing bytes, the
// wrong magic/version/kind, or lengths beyond kMaxTransferIdBytes /
// kMaxRegions.
std::string EncodeHello(const HelloHeader& header);
absl::StatusOr<HelloHeader> DecodeHello(const void* data, size_t size);

std::string EncodeData(const DataHeader& header, absl::string_view transfer_id);
struct DecodedData {
  DataHeader header;
  std::string transfer_id;
};
absl::StatusOr<DecodedData> DecodeData(const void* data, size_t size);

std::string EncodeCommit(const CommitHeader& header,
                         const std::vector<uint64_t>& region_tags,
                         absl::string_view transfer_id);
struct DecodedCommit {
  CommitHeader header;
  std::vector<uint64_t> region_tags;
  std::string transfer_id;
};
absl::StatusOr<DecodedCommit> DecodeCommit(const void* data, size_t size);

// kAmBegin uses the commit layout (byte counts zero): the transfer id and
// the region tags, checked by the receiver before any put lands.
std::string EncodeBegin(const CommitHeader& header,
                        const std::vector<uint64_t>& region_tags,
                        absl::string_view transfer_id);
absl::StatusOr<DecodedCommit> DecodeBegin(const void* data, size_t size);

std::string EncodeReply(const ReplyHeader& header);
absl::StatusOr<ReplyHeader> DecodeReply(const void* data, size_t size);

// Largest header this protocol sends (a commit with kMaxRegions tags and
// the longest id); the worker's maximum AM header must be at least this.
size_t MaxHeaderBytes();

}  // namespace swaserve::transfer::wire
