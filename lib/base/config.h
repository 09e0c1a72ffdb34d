// Typed configuration from a YAML or JSON file, overridden by command-line
// flags. Every process (services, the CLI) declares its options once:
//
//   struct RouterConfig { int64_t http_port = 8080; std::string redis; ... };
//   RouterConfig c;
//   base::Config config("swaserve-router", "Routes requests to workers.");
//   config.Add("http_port", &c.http_port, "OpenAI HTTP port")
//         .Add("redis.address", &c.redis, "Redis host:port");
//   base::ParseConfigOrExit(config, argc, argv);   // --config FILE, --flags
//
// Keys are dotted paths: "redis.address" is `redis: {address: ...}` in a file
// and `--redis.address=...` (or `--redis.address ...`) on the command line.
// Dashes in flag names are read as underscores (`--http-port`). Precedence:
// declared default < file < flags. Unknown keys, wrong types, out-of-range
// numbers, a missing or unparsable file are errors that name the key (and the
// file); nothing is applied partially from a flag that fails.
//
// Not thread-safe; configure once at start-up. The bound variables must
// outlive the Config.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace swaserve::base {

class Config {
 public:
  // Supported option types. Durations are written like "250ms", "5s", "1m".
  using Target =
      std::variant<bool*, int32_t*, int64_t*, uint32_t*, uint64_t*, double*,
                   std::string*, std::vector<std::string>*,
                   std::vector<int64_t>*, absl::Duration*>;

  Config(std::string program, std::string description);

  // Declares an option bound to `*target` (whose current value is the
  // default). Declaring the same key twice, or a key that is a prefix of
  // another ("a" and "a.b"), is a programming error and aborts.
  template <typename T>
  Config& Add(absl::string_view key, T* target, absl::string_view help) {
    AddTarget(key, Target(target), help);
    return *this;
  }

  // Applies a YAML (.yaml/.yml) or JSON (.json) file. Other extensions are
  // parsed as YAML, of which JSON is a subset.
  absl::Status LoadFile(const std::string& path);
  // Applies YAML/JSON text; `source` names it in errors.
  absl::Status LoadString(absl::string_view text, absl::string_view source);

  // Sets one option from its string form, as a flag would.
  absl::Status Set(absl::string_view key, absl::string_view value);

  // Parses argv[1..]: `--config FILE` is loaded first (wherever it appears),
  // then every other flag in order. Non-flag arguments go to *positional (an
  // error when positional is null). `--help`/`-h` sets help_requested().
  // `--` ends flags.
  absl::Status ParseArgs(int argc, const char* const* argv,
                         std::vector<std::string>* positional = nullptr);

  bool help_requested() const { return help_requested_; }
  const std::string& program_name() const { return program_; }

  // Usage text: the program, its description and every option with type,
  // default and help.
  std::string Usage() const;

  // "key = value" lines of the effective configuration (for logs).
  std::string Dump() const;

  // "--key=value" for every option whose value differs from the one it had
  // when it was added, in the order added: a command line that reproduces
  // this configuration for another process with the same options.
  std::vector<std::string> ChangedFlags() const;

 private:
  struct Option {
    std::string key;
    Target target;
    std::string help;
    std::string default_text;
  };
  void AddTarget(absl::string_view key, Target target, absl::string_view help);
  const Option* Find(absl::string_view key) const;
  bool IsPrefix(absl::string_view key) const;

  std::string program_;
  std::string description_;
  std::vector<Option> options_;
  bool help_requested_ = false;

  friend class ConfigApplier;
};

// For main(): ParseArgs, then on --help print Usage() to stdout and exit 0; on
// error print "<program>: <error>" and a hint to stderr and exit 2.
void ParseConfigOrExit(Config& config, int argc, const char* const* argv,
                       std::vector<std::string>* positional = nullptr);

}  // namespace swaserve::base
