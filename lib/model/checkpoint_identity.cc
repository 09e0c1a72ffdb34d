#include "lib/model/checkpoint_identity.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"

namespace swaserve::model {

absl::StatusOr<uint64_t> CheckpointIdentity(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "config.json" || absl::EndsWith(name, ".safetensors")) files.push_back(name);
  }
  if (ec) return absl::NotFoundError(absl::StrCat("listing ", dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  std::vector<uint64_t> hashes(files.size(), 0);
  std::vector<std::string> errors(files.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    std::vector<char> buf(8 << 20);
    for (size_t i; (i = next.fetch_add(1)) < files.size();) {
      std::ifstream in(dir + "/" + files[i], std::ios::binary);
      XXH3_state_t* st = XXH3_createState();
      XXH3_64bits_reset(st);
      while (in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        if (in.gcount() > 0) XXH3_64bits_update(st, buf.data(), static_cast<size_t>(in.gcount()));
      }
      if (!in.eof()) errors[i] = absl::StrCat("reading ", dir, "/", files[i]);
      hashes[i] = XXH3_64bits_digest(st);
      XXH3_freeState(st);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  const size_t threads = std::max<size_t>(
      1, std::min<size_t>(files.size(), std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::string id;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!errors[i].empty()) return absl::InternalError(errors[i]);
    absl::StrAppend(&id, files[i], ":", hashes[i], ";");
  }
  SWA_LOG(info, "model identity for L3 keys: {} files hashed in {:.1f} s", files.size(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return base::Hash64(id.data(), id.size(), 0);
}

}  // namespace swaserve::model
