// The file handshake between the multi-process transfer tests and their
// child processes (transfer_peer): small text requests and binary results
// in a shared temp directory, each written atomically (write + rename), and
// bounded waits for them. Thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/base/subprocess.h"

namespace swaserve::transfer::testing {

// Writes `content` to `path` via a temporary file and rename, so a reader
// never sees a partial file.
absl::Status WriteFileAtomic(const std::string& path,
                             const std::string& content);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Waits until `path` exists (polling), up to `timeout`. When `process` is
// set and exits first, fails with its log.
absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                        absl::Duration timeout,
                                        base::Subprocess* process = nullptr);

// A receiver child is asked to expect a transfer.
struct ExpectSpec {
  std::string transfer_id;
  uint64_t region0 = 0;
  uint64_t region1 = 0;
  uint64_t expected_bytes = 0;
  int64_t timeout_ms = 10000;
  uint64_t gap = 4096;  // canary bytes around each region
};
std::string FormatExpect(const ExpectSpec& spec);
absl::StatusOr<ExpectSpec> ParseExpect(const std::string& text);

// A sender child is asked to send a transfer: pattern `seed` fills a source
// buffer of src_bytes; each copy is (src offset, region, offset, bytes).
struct SendSpec {
  std::string destination_path;  // a serialized swaserve.v1.KvDestination
  uint64_t seed = 0;
  uint64_t src_bytes = 0;
  int64_t timeout_ms = 10000;
  std::string payload;
  struct Copy {
    uint64_t src_offset = 0;
    uint32_t region = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  std::vector<Copy> copies;
};
std::string FormatSend(const SendSpec& spec);
absl::StatusOr<SendSpec> ParseSend(const std::string& text);

// "OK <bytes> <payload>" or "ERR <code> <message>".
std::string FormatResult(const absl::Status& status, uint64_t bytes,
                         const std::string& payload);
struct Result {
  absl::Status status;
  uint64_t bytes = 0;
  std::string payload;
};
absl::StatusOr<Result> ParseResult(const std::string& text);

}  // namespace swaserve::transfer::testing
