// Fuzzes base::Config: YAML and JSON documents and command lines must give
// OK or a clean error, never a crash, hang or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/base/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 3;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  bool flag = false;
  int32_t i32 = 0;
  uint32_t u32 = 0;
  int64_t i64 = 0;
  uint64_t u64 = 0;
  double d = 0;
  std::string s;
  std::vector<std::string> strings;
  std::vector<int64_t> ints;
  absl::Duration duration;
  swaserve::base::Config config("fuzz", "fuzz target");
  config.Add("flag", &flag, "")
      .Add("a.i32", &i32, "")
      .Add("a.u32", &u32, "")
      .Add("a.b.i64", &i64, "")
      .Add("a.b.u64", &u64, "")
      .Add("d", &d, "")
      .Add("s", &s, "")
      .Add("list.strings", &strings, "")
      .Add("list.ints", &ints, "")
      .Add("timeout", &duration, "");

  if (mode == 0) {
    (void)config.LoadString(text, "fuzz.yaml");
  } else if (mode == 1) {
    (void)config.LoadString(text, "fuzz.json");
  } else {
    // NUL-separated arguments; --config is dropped so no file is read.
    std::vector<std::string> args = {"fuzz"};
    std::string cur;
    for (char c : text) {
      if (c == '\0') {
        args.push_back(cur);
        cur.clear();
      } else {
        cur.push_back(c);
      }
    }
    args.push_back(cur);
    std::vector<const char*> argv;
    for (const std::string& a : args) {
      if (a.rfind("--config", 0) == 0) continue;
      argv.push_back(a.c_str());
    }
    std::vector<std::string> positional;
    (void)config.ParseArgs(static_cast<int>(argv.size()), argv.data(), &positional);
  }
  (void)config.Dump();
  return 0;
}
