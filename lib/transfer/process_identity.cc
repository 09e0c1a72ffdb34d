#include "lib/transfer/process_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lib/base/hash.h"

namespace swaserve::transfer::internal {

bool ReadProcStat(uint64_t pid, char* state, uint64_t* start_time) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text;
  std::getline(in, text);
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return false;
  std::vector<absl::string_view> fields = absl::StrSplit(
      absl::string_view(text).substr(close + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_time);
}

wire::ProcessIdentity SelfIdentity() {
  wire::ProcessIdentity id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  if (!boot_id.empty()) id.boot_id = base::Hash64(boot_id);
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) == 0) id.pid_namespace = st.st_ino;
  id.pid = static_cast<uint64_t>(getpid());
  char state = 0;
  if (!ReadProcStat(id.pid, &state, &id.start_time)) id.boot_id = 0;
  return id;
}

bool ProcessGone(const wire::ProcessIdentity& peer,
                 const wire::ProcessIdentity& self) {
  if (peer.boot_id == 0 || peer.pid == 0 || peer.boot_id != self.boot_id ||
      peer.pid_namespace != self.pid_namespace) {
    return false;
  }
  char state = 0;
  uint64_t start = 0;
  if (!ReadProcStat(peer.pid, &state, &start)) return true;
  return start != peer.start_time || state == 'Z' || state == 'X';
}

}  // namespace swaserve::transfer::internal
