#include "tests/integration/transfer/peer_protocol.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace swaserve::transfer::testing {

absl::Status WriteFileAtomic(const std::string& path,
                             const std::string& content) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                        absl::Duration timeout,
                                        base::Subprocess* process) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!std::filesystem::exists(path)) {
    if (process != nullptr && !process->Running()) {
      return absl::AbortedError(absl::StrCat("the peer exited before writing ",
                                             path, "; its log:\n",
                                             process->ReadLog()));
    }
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no ", path, " within ", absl::FormatDuration(timeout),
          process != nullptr ? absl::StrCat("; peer log:\n", process->ReadLog())
                             : ""));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return ReadFile(path);
}

std::string FormatExpect(const ExpectSpec& s) {
  return absl::StrCat(s.transfer_id, " ", s.region0, " ", s.region1, " ",
                      s.expected_bytes, " ", s.timeout_ms, " ", s.gap, "\n");
}

absl::StatusOr<ExpectSpec> ParseExpect(const std::string& text) {
  std::istringstream in(text);
  ExpectSpec s;
  if (!(in >> s.transfer_id >> s.region0 >> s.region1 >> s.expected_bytes >>
        s.timeout_ms >> s.gap)) {
    return absl::InvalidArgumentError(absl::StrCat("bad expect spec: ", text));
  }
  return s;
}

std::string FormatSend(const SendSpec& s) {
  std::string out = absl::StrCat(s.destination_path, " ", s.seed, " ",
                                 s.src_bytes, " ", s.timeout_ms, " ",
                                 s.payload.empty() ? "-" : s.payload, "\n");
  for (const SendSpec::Copy& c : s.copies) {
    absl::StrAppend(&out, c.src_offset, " ", c.region, " ", c.offset, " ",
                    c.bytes, "\n");
  }
  return out;
}

absl::StatusOr<SendSpec> ParseSend(const std::string& text) {
  std::istringstream in(text);
  SendSpec s;
  if (!(in >> s.destination_path >> s.seed >> s.src_bytes >> s.timeout_ms >>
        s.payload)) {
    return absl::InvalidArgumentError(absl::StrCat("bad send spec: ", text));
  }
  if (s.payload == "-") s.payload.clear();
  SendSpec::Copy c;
  while (in >> c.src_offset >> c.region >> c.offset >> c.bytes) {
    s.copies.push_back(c);
  }
  return s;
}

std::string FormatResult(const absl::Status& status, uint64_t bytes,
                         const std::string& payload) {
  if (status.ok()) return absl::StrCat("OK ", bytes, " ", payload);
  return absl::StrCat("ERR ", static_cast<int>(status.code()), " ",
                      status.message());
}

absl::StatusOr<Result> ParseResult(const std::string& text) {
  Result r;
  std::vector<std::string> parts =
      absl::StrSplit(text, absl::MaxSplits(' ', 2));
  if (parts.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("bad result: ", text));
  }
  if (parts[0] == "OK") {
    if (!absl::SimpleAtoi(parts[1], &r.bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("bad result: ", text));
    }
    if (parts.size() > 2) r.payload = parts[2];
    return r;
  }
  int code = 0;
  if (parts[0] != "ERR" || !absl::SimpleAtoi(parts[1], &code)) {
    return absl::InvalidArgumentError(absl::StrCat("bad result: ", text));
  }
  r.status = absl::Status(static_cast<absl::StatusCode>(code),
                          parts.size() > 2 ? parts[2] : "");
  return r;
}

}  // namespace swaserve::transfer::testing
