// make_mini_checkpoints: writes the mini MiMo-V2 checkpoints of
// lib/model/mini_checkpoints.h (one directory per layout) for the golden
// fixture script and by hand:
//   build/tools/mini_checkpoints/make_mini_checkpoints OUT_DIR [SEED] [LAYOUT...]
// Default seed 25; default: every layout. Exit 1 with the error on failure.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/model/mini_checkpoints.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [SEED] [LAYOUT...]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 25;
  std::vector<std::string> names;
  for (int i = 3; i < argc; ++i) names.push_back(argv[i]);
  if (names.empty()) {
    for (const swaserve::model::MiniLayout& l : swaserve::model::MiniLayouts()) {
      names.push_back(l.name);
    }
  }
  for (const std::string& name : names) {
    const absl::Status s =
        swaserve::model::WriteMiniCheckpoint(name, seed, out + "/" + name);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(s.message()).c_str());
      return 1;
    }
    std::printf("%s/%s\n", out.c_str(), name.c_str());
  }
  return 0;
}
