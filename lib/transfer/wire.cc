#include "lib/transfer/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"

namespace swaserve::transfer::wire {
namespace {

// Seeds the blob checksums so a blob of one kind never validates as another.
constexpr uint64_t kAddressSeed = 0x5357574100000001ull;
constexpr uint64_t kRkeySeed = 0x535752534b000001ull;

template <typename T>
void Put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// Reads fixed-width values from a byte range; every read is bounds-checked.
class Reader {
 public:
  Reader(const void* data, size_t size)
      : data_(static_cast<const char*>(data)), size_(size) {}
  template <typename T>
  bool Get(T* value) {
    if (size_ - pos_ < sizeof(T)) return false;
    std::memcpy(value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, std::string* out) {
    if (size_ - pos_ < n) return false;
    out->assign(data_ + pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return size_ - pos_; }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

struct BlobPrefix {
  uint32_t magic = 0;
  uint8_t version = 0;
  uint8_t pad[3] = {0, 0, 0};
};
static_assert(sizeof(BlobPrefix) == 8);

absl::Status CheckBlobPrefix(Reader& r, uint32_t magic, const char* what) {
  BlobPrefix p;
  if (!r.Get(&p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is truncated: it is not a swaserve ", what,
        "; pass the bytes the receiver's TransferEngine produced"));
  }
  if (p.magic != magic) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has the wrong magic: it is not a swaserve ", what,
        "; pass the bytes the receiver's TransferEngine produced"));
  }
  if (p.version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has wire version ", p.version, ", this build speaks ", kVersion,
        ": run the same swaserve release on both workers"));
  }
  if (p.pad[0] != 0 || p.pad[1] != 0 || p.pad[2] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is corrupted (nonzero padding)"));
  }
  return absl::OkStatus();
}

uint64_t AddressHash(const WorkerAddress& a) {
  const uint64_t fields[5] = {a.engine_id, a.process.boot_id,
                              a.process.pid_namespace, a.process.pid,
                              a.process.start_time};
  return base::Hash64(a.ucx_address,
                      base::Hash64(fields, sizeof(fields), kAddressSeed));
}

uint64_t RkeyHash(const Rkey& k) {
  const uint64_t fields[4] = {k.tag, k.base_address, k.length, k.flags};
  return base::Hash64(k.ucx_rkey,
                      base::Hash64(fields, sizeof(fields), kRkeySeed));
}

absl::Status CheckPrefix(const Prefix& p, AmId id) {
  if (p.magic != kMessageMagic) {
    return absl::InvalidArgumentError("message has the wrong magic");
  }
  if (p.version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message has wire version ", p.version, ", this build speaks ",
        kVersion, ": run the same swaserve release on both workers"));
  }
  if (p.kind != static_cast<uint8_t>(id & 0xff)) {
    return absl::InvalidArgumentError("message kind does not match its id");
  }
  return absl::OkStatus();
}

Prefix MakePrefix(AmId id) {
  Prefix p;
  p.kind = static_cast<uint8_t>(id & 0xff);
  return p;
}

absl::Status Truncated(const char* what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " header is truncated or malformed"));
}

}  // namespace

absl::Status CheckTransferId(absl::string_view transfer_id) {
  if (transfer_id.empty() || transfer_id.size() > kMaxTransferIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer id must be 1..", kMaxTransferIdBytes,
                     " bytes, got ", transfer_id.size()));
  }
  return absl::OkStatus();
}

std::string PackWorkerAddress(const WorkerAddress& address) {
  std::string out;
  BlobPrefix p;
  p.magic = kAddressMagic;
  p.version = kVersion;
  Put(out, p);
  Put(out, address.engine_id);
  Put(out, address.process.boot_id);
  Put(out, address.process.pid_namespace);
  Put(out, address.process.pid);
  Put(out, address.process.start_time);
  Put(out, AddressHash(address));
  Put(out, static_cast<uint64_t>(address.ucx_address.size()));
  out.append(address.ucx_address);
  return out;
}

absl::StatusOr<WorkerAddress> UnpackWorkerAddress(absl::string_view blob) {
  Reader r(blob.data(), blob.size());
  if (absl::Status s = CheckBlobPrefix(r, kAddressMagic, "worker address");
      !s.ok()) {
    return s;
  }
  WorkerAddress a;
  uint64_t hash = 0, length = 0;
  if (!r.Get(&a.engine_id) || !r.Get(&a.process.boot_id) ||
      !r.Get(&a.process.pid_namespace) || !r.Get(&a.process.pid) ||
      !r.Get(&a.process.start_time) || !r.Get(&hash) || !r.Get(&length) ||
      r.remaining() != length || !r.GetBytes(length, &a.ucx_address)) {
    return absl::InvalidArgumentError(
        "worker address is truncated (its length field does not match): the "
        "KvDestination was corrupted in transit");
  }
  if (AddressHash(a) != hash) {
    return absl::InvalidArgumentError(
        "worker address fails its checksum: the KvDestination was corrupted "
        "in transit");
  }
  return a;
}

std::string PackRkey(const Rkey& rkey) {
  std::string out;
  BlobPrefix p;
  p.magic = kRkeyMagic;
  p.version = kVersion;
  Put(out, p);
  Put(out, rkey.tag);
  Put(out, rkey.base_address);
  Put(out, rkey.length);
  Put(out, rkey.flags);
  Put(out, RkeyHash(rkey));
  Put(out, static_cast<uint64_t>(rkey.ucx_rkey.size()));
  out.append(rkey.ucx_rkey);
  return out;
}

absl::StatusOr<Rkey> UnpackRkey(absl::string_view blob) {
  Reader r(blob.data(), blob.size());
  if (absl::Status s = CheckBlobPrefix(r, kRkeyMagic, "rkey"); !s.ok()) {
    return s;
  }
  Rkey k;
  uint64_t hash = 0, length = 0;
  if (!r.Get(&k.tag) || !r.Get(&k.base_address) || !r.Get(&k.length) ||
      !r.Get(&k.flags) || !r.Get(&hash) || !r.Get(&length) ||
      r.remaining() != length || !r.GetBytes(length, &k.ucx_rkey)) {
    return absl::InvalidArgumentError(
        "rkey is truncated (its length field does not match): the "
        "KvDestination was corrupted in transit");
  }
  if (RkeyHash(k) != hash) {
    return absl::InvalidArgumentError(
        "rkey fails its checksum: the KvDestination was corrupted in transit");
  }
  return k;
}

std::string EncodeHello(const HelloHeader& header) {
  HelloHeader h = header;
  h.prefix = MakePrefix(kAmHello);
  std::string out;
  Put(out, h);
  return out;
}

absl::StatusOr<HelloHeader> DecodeHello(const void* data, size_t size) {
  Reader r(data, size);
  HelloHeader h;
  if (!r.Get(&h) || r.remaining() != 0) return Truncated("hello");
  if (absl::Status s = CheckPrefix(h.prefix, kAmHello); !s.ok()) return s;
  return h;
}

std::string EncodeData(const DataHeader& header,
                       absl::string_view transfer_id) {
  DataHeader h = header;
  h.prefix = MakePrefix(kAmData);
  h.id_length = static_cast<uint32_t>(transfer_id.size());
  std::string out;
  out.reserve(sizeof(h) + transfer_id.size());
  Put(out, h);
  out.append(transfer_id.data(), transfer_id.size());
  return out;
}

absl::StatusOr<DecodedData> DecodeData(const void* data, size_t size) {
  Reader r(data, size);
  DecodedData d;
  if (!r.Get(&d.header)) return Truncated("data");
  if (absl::Status s = CheckPrefix(d.header.prefix, kAmData); !s.ok()) return s;
  if (d.header.id_length > kMaxTransferIdBytes ||
      r.remaining() != d.header.id_length ||
      !r.GetBytes(d.header.id_length, &d.transfer_id)) {
    return Truncated("data");
  }
  return d;
}

namespace {

std::string EncodeTagged(AmId id, const CommitHeader& header,
                         const std::vector<uint64_t>& region_tags,
                         absl::string_view transfer_id) {
  CommitHeader h = header;
  h.prefix = MakePrefix(id);
  h.num_regions = static_cast<uint32_t>(region_tags.size());
  h.id_length = static_cast<uint32_t>(transfer_id.size());
  std::string out;
  Put(out, h);
  for (uint64_t tag : region_tags) Put(out, tag);
  out.append(transfer_id.data(), transfer_id.size());
  return out;
}

absl::StatusOr<DecodedCommit> DecodeTagged(AmId id, const void* data,
                                           size_t size) {
  Reader r(data, size);
  DecodedCommit c;
  if (!r.Get(&c.header)) return Truncated("commit");
  if (absl::Status s = CheckPrefix(c.header.prefix, id); !s.ok()) {
    return s;
  }
  if (c.header.num_regions > kMaxRegions ||
      c.header.id_length > kMaxTransferIdBytes) {
    return Truncated("commit");
  }
  c.region_tags.resize(c.header.num_regions);
  for (uint64_t& tag : c.region_tags) {
    if (!r.Get(&tag)) return Truncated("commit");
  }
  if (r.remaining() != c.header.id_length ||
      !r.GetBytes(c.header.id_length, &c.transfer_id)) {
    return Truncated("commit");
  }
  return c;
}

}  // namespace

std::string EncodeCommit(const CommitHeader& header,
                         const std::vector<uint64_t>& region_tags,
                         absl::string_view transfer_id) {
  return EncodeTagged(kAmCommit, header, region_tags, transfer_id);
}

absl::StatusOr<DecodedCommit> DecodeCommit(const void* data, size_t size) {
  return DecodeTagged(kAmCommit, data, size);
}

std::string EncodeBegin(const CommitHeader& header,
                        const std::vector<uint64_t>& region_tags,
                        absl::string_view transfer_id) {
  return EncodeTagged(kAmBegin, header, region_tags, transfer_id);
}

absl::StatusOr<DecodedCommit> DecodeBegin(const void* data, size_t size) {
  return DecodeTagged(kAmBegin, data, size);
}

std::string EncodeReply(const ReplyHeader& header) {
  ReplyHeader h = header;
  h.prefix = MakePrefix(kAmReply);
  std::string out;
  Put(out, h);
  return out;
}

absl::StatusOr<ReplyHeader> DecodeReply(const void* data, size_t size) {
  Reader r(data, size);
  ReplyHeader h;
  if (!r.Get(&h) || r.remaining() != 0) return Truncated("reply");
  if (absl::Status s = CheckPrefix(h.prefix, kAmReply); !s.ok()) return s;
  if (h.reply_kind != static_cast<uint8_t>(ReplyKind::kAck) &&
      h.reply_kind != static_cast<uint8_t>(ReplyKind::kReject) &&
      h.reply_kind != static_cast<uint8_t>(ReplyKind::kReady)) {
    return Truncated("reply");
  }
  return h;
}

size_t MaxHeaderBytes() {
  return sizeof(CommitHeader) + kMaxRegions * sizeof(uint64_t) +
         kMaxTransferIdBytes;
}

}  // namespace swaserve::transfer::wire
