#include "lib/base/port_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace swaserve::base {

absl::Status WritePortFile(const std::string& path,
                           const std::vector<std::pair<std::string, int>>& ports) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, port] : ports) j[name] = port;
  j["pid"] = static_cast<int64_t>(getpid());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump() << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<int> ReadPort(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no port file ", path));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a port file (JSON object)"));
  }
  auto it = j.find(name);
  if (it == j.end()) return absl::NotFoundError(absl::StrCat(path, " has no ", name));
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", name, " is not an integer"));
  }
  return it->get<int>();
}

}  // namespace swaserve::base
