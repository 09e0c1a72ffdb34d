// swaserve: the command-line entry point of the project.
//
//   swaserve --help
//   swaserve version
//   swaserve page-hashes --page_size=16 --tokens=1,2,3,...
//
// Each subcommand takes --config FILE (YAML/JSON) and --key=value flags (see
// lib/base/config.h); a bad flag or config file exits 2 with a message.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/config.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"

namespace swaserve {
namespace {

constexpr char kVersion[] = "0.1.0";

constexpr char kTopUsage[] = R"(swaserve — serve hybrid SWA + MoE models, prefill and decode disaggregated.

Usage: swaserve <command> [--config FILE] [--key=value ...]

Commands:
  version       print the version and build options
  page-hashes   print the chained page hashes of a token sequence (the keys of
                the prefix cache and the router's affinity index)

Run 'swaserve <command> --help' for a command's options.
)";

int Version(int argc, const char* const* argv) {
  base::Config config("swaserve version", "Prints the version.");
  base::ParseConfigOrExit(config, argc, argv);
  std::printf("swaserve %s (page-hash v%llu)\n", kVersion,
              static_cast<unsigned long long>(base::kPageHashVersion));
  return 0;
}

int PageHashes(int argc, const char* const* argv) {
  int64_t page_size = 16;
  std::vector<int64_t> tokens;
  std::string log_level;
  base::Config config(
      "swaserve page-hashes",
      "Prints the chained XXH3 page hash of every complete page of --tokens.");
  config.Add("page_size", &page_size, "tokens per KV page")
      .Add("tokens", &tokens, "token ids, comma-separated")
      .Add("log_level", &log_level, "log level (default $SWASERVE_LOG_LEVEL or info)");
  base::ParseConfigOrExit(config, argc, argv);
  if (absl::Status s = base::InitLogging({.level = log_level, .name = "swaserve"});
      !s.ok()) {
    std::fprintf(stderr, "swaserve page-hashes: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (page_size <= 0) {
    std::fprintf(stderr, "swaserve page-hashes: key 'page_size': must be > 0, got %lld\n",
                 static_cast<long long>(page_size));
    return 2;
  }
  std::vector<uint32_t> ids;
  for (int64_t t : tokens) {
    if (t < 0 || t > 0xFFFFFFFFll) {
      std::fprintf(stderr, "swaserve page-hashes: key 'tokens': %lld is not a token id\n",
                   static_cast<long long>(t));
      return 2;
    }
    ids.push_back(static_cast<uint32_t>(t));
  }
  std::vector<uint64_t> hashes =
      base::ChainedPageHashes(ids, static_cast<int>(page_size));
  for (size_t i = 0; i < hashes.size(); ++i) {
    std::printf("%zu %016llx\n", i, static_cast<unsigned long long>(hashes[i]));
  }
  return 0;
}

int Main(int argc, const char* const* argv) {
  if (argc < 2) {
    std::fputs(kTopUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kTopUsage, stdout);
    return 0;
  }
  if (command == "--version") return Version(1, argv);
  // Subcommands see argv shifted by one (argv[0] = the command).
  if (command == "version") return Version(argc - 1, argv + 1);
  if (command == "page-hashes") return PageHashes(argc - 1, argv + 1);
  std::fprintf(stderr, "swaserve: unknown command '%s'\n\n%s", command.c_str(),
               kTopUsage);
  return 2;
}

}  // namespace
}  // namespace swaserve

int main(int argc, char** argv) { return swaserve::Main(argc, argv); }
