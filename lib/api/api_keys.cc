#include "lib/api/api_keys.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lib/base/hash.h"
#include "lib/base/logging.h"

namespace swaserve::api {
namespace {

namespace fs = std::filesystem;

// Largest key file (or key directory entry) read.
constexpr uintmax_t kMaxKeyFileBytes = 1 << 20;
// Longest name and key accepted from the source.
constexpr size_t kMaxNameBytes = 128;
constexpr size_t kMaxKeyBytes = 1024;
// Presented keys longer than this are rejected without comparing.
constexpr size_t kMaxPresentedKeyBytes = 4096;

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) return false;
  for (char c : key) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

// "key-<8 hex digits>": a stable name for a key given without one.
std::string Fingerprint(absl::string_view key) {
  return absl::StrCat("key-",
                      absl::Hex(base::Hash64(key) >> 32, absl::kZeroPad8));
}

absl::StatusOr<std::string> ReadSmallFile(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path.string(), ": ", ec.message()));
  }
  if (size > kMaxKeyFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), " is larger than ", kMaxKeyFileBytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  }
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) {
    return absl::InternalError(absl::StrCat("error reading ", path.string()));
  }
  return content.str();
}

// Constant-time in the content of `stored`: always looks at every byte of
// `presented`, never stops early.
bool ConstantTimeEquals(absl::string_view presented, absl::string_view stored) {
  if (stored.empty()) return false;
  size_t diff = presented.size() ^ stored.size();
  unsigned char acc = 0;
  for (size_t i = 0; i < presented.size(); ++i) {
    acc |= static_cast<unsigned char>(presented[i] ^ stored[i % stored.size()]);
  }
  return (diff | acc) == 0;
}

}  // namespace

// --- ApiKeyStore
// --------------------------------------------------------------

ApiKeyStore::ApiKeyStore(const ApiKeyStoreOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : base::Clock::Real()) {}

absl::StatusOr<std::unique_ptr<ApiKeyStore>> ApiKeyStore::Create(
    const ApiKeyStoreOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("api keys: path is empty");
  }
  if (options.reload_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("api keys: reload_interval is negative");
  }
  std::unique_ptr<ApiKeyStore> store(new ApiKeyStore(options));
  absl::StatusOr<std::vector<Key>> keys = store->Load();
  if (!keys.ok()) return keys.status();
  {
    absl::MutexLock lock(&store->mu_);
    store->keys_ = std::make_shared<const std::vector<Key>>(*std::move(keys));
    store->last_load_ = store->clock_->Now();
  }
  return store;
}

absl::StatusOr<std::vector<ApiKeyStore::Key>> ApiKeyStore::Load() const {
  const fs::path root(options_.path);
  std::error_code ec;
  const fs::file_status st = fs::status(root, ec);
  if (ec || !fs::exists(st)) {
    return absl::NotFoundError(absl::StrCat(
        "api keys: cannot read ", options_.path, ": ",
        ec ? ec.message() : std::string("no such file or directory")));
  }
  std::vector<Key> keys;
  if (fs::is_directory(st)) {
    fs::directory_iterator it(root, ec);
    if (ec) {
      return absl::NotFoundError(absl::StrCat(
          "api keys: cannot list ", options_.path, ": ", ec.message()));
    }
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.empty() || name[0] == '.') continue;  // ..data, ..2024_.., etc.
      std::error_code entry_ec;
      // fs::status follows symlinks (<name> -> ..data/<name>).
      if (!fs::is_regular_file(fs::status(it->path(), entry_ec))) continue;
      if (!ValidName(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("api keys: ", options_.path, ": file name '", name,
                         "' is not a valid key name ([A-Za-z0-9._-]+, at most ",
                         kMaxNameBytes, " bytes)"));
      }
      absl::StatusOr<std::string> content = ReadSmallFile(it->path());
      if (!content.ok()) {
        return absl::Status(
            content.status().code(),
            absl::StrCat("api keys: ", content.status().message()));
      }
      const absl::string_view key = absl::StripAsciiWhitespace(*content);
      if (!ValidKey(key)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "api keys: ", options_.path, "/", name,
            ": the key is empty, too long or holds spaces or non-ASCII "
            "characters"));
      }
      keys.push_back(Key{name, std::string(key)});
    }
    if (ec) {
      return absl::NotFoundError(absl::StrCat(
          "api keys: cannot list ", options_.path, ": ", ec.message()));
    }
  } else {
    absl::StatusOr<std::string> content = ReadSmallFile(root);
    if (!content.ok()) {
      return absl::Status(
          content.status().code(),
          absl::StrCat("api keys: ", content.status().message()));
    }
    int line_number = 0;
    for (absl::string_view line : absl::StrSplit(*content, '\n')) {
      ++line_number;
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      std::string name;
      absl::string_view key = line;
      if (const size_t colon = line.find(':');
          colon != absl::string_view::npos) {
        name = std::string(absl::StripAsciiWhitespace(line.substr(0, colon)));
        key = absl::StripAsciiWhitespace(line.substr(colon + 1));
        if (!ValidName(name)) {
          return absl::InvalidArgumentError(
              absl::StrCat("api keys: ", options_.path, ":", line_number,
                           ": the name before ':' is not a valid key name "
                           "([A-Za-z0-9._-]+, at most ",
                           kMaxNameBytes, " bytes)"));
        }
      }
      if (!ValidKey(key)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "api keys: ", options_.path, ":", line_number,
            ": the key is empty, too long or holds spaces or non-ASCII "
            "characters"));
      }
      if (name.empty()) name = Fingerprint(key);
      keys.push_back(Key{std::move(name), std::string(key)});
    }
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("api keys: no keys in ", options_.path));
  }
  std::sort(keys.begin(), keys.end(),
            [](const Key& a, const Key& b) { return a.name < b.name; });
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys[i].name == keys[i - 1].name) {
      return absl::InvalidArgumentError(
          absl::StrCat("api keys: ", options_.path, ": duplicate key name '",
                       keys[i].name, "'"));
    }
  }
  absl::flat_hash_map<absl::string_view, absl::string_view> seen;
  for (const Key& key : keys) {
    auto [it, inserted] = seen.emplace(key.key, key.name);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("api keys: ", options_.path, ": keys '", it->second,
                       "' and '", key.name, "' are the same"));
    }
  }
  return keys;
}

absl::Status ApiKeyStore::Reload() {
  absl::StatusOr<std::vector<Key>> loaded = Load();
  const absl::Time now = clock_->Now();
  if (!loaded.ok()) {
    {
      absl::MutexLock lock(&mu_);
      last_load_ = now;
    }
    const std::string error(loaded.status().message());
    if (error != last_error_) {
      SWA_LOG(warn, "{}; keeping the previous API keys", error);
      last_error_ = error;
    }
    return loaded.status();
  }
  last_error_.clear();
  auto fresh = std::make_shared<const std::vector<Key>>(*std::move(loaded));
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    last_load_ = now;
    const std::vector<Key>& old = *keys_;
    changed = old.size() != fresh->size() ||
              !std::equal(old.begin(), old.end(), fresh->begin(),
                          [](const Key& a, const Key& b) {
                            return a.name == b.name && a.key == b.key;
                          });
    if (changed) keys_ = fresh;
  }
  if (changed) {
    reload_count_.fetch_add(1);
    SWA_LOG(info, "API keys reloaded from {}: {} keys", options_.path,
            fresh->size());
  }
  return absl::OkStatus();
}

absl::Status ApiKeyStore::ReloadNow() {
  absl::MutexLock lock(&reload_mu_);
  return Reload();
}

void ApiKeyStore::MaybeReload() {
  {
    absl::MutexLock lock(&mu_);
    if (clock_->Now() - last_load_ < options_.reload_interval) return;
  }
  // Another thread is reloading: use the current keys.
  if (!reload_mu_.TryLock()) return;
  bool due = false;
  {
    absl::MutexLock lock(&mu_);
    due = clock_->Now() - last_load_ >= options_.reload_interval;
  }
  if (due) (void)Reload();
  reload_mu_.Unlock();
}

absl::StatusOr<std::string> ApiKeyStore::Authorize(
    absl::string_view authorization_header) {
  const absl::string_view header =
      absl::StripAsciiWhitespace(authorization_header);
  constexpr absl::string_view kMissing =
      "Missing API key: send it in an 'Authorization: Bearer <key>' header.";
  if (header.empty()) return absl::UnauthenticatedError(kMissing);
  const size_t space = header.find_first_of(" \t");
  const absl::string_view scheme = header.substr(0, space);
  if (!absl::EqualsIgnoreCase(scheme, "Bearer")) {
    return absl::UnauthenticatedError(
        "The Authorization header must use the Bearer scheme: "
        "'Authorization: Bearer <key>'.");
  }
  const absl::string_view presented =
      space == absl::string_view::npos
          ? absl::string_view()
          : absl::StripAsciiWhitespace(header.substr(space));
  if (presented.empty()) return absl::UnauthenticatedError(kMissing);

  MaybeReload();
  std::shared_ptr<const std::vector<Key>> keys;
  {
    absl::MutexLock lock(&mu_);
    keys = keys_;
  }
  constexpr absl::string_view kInvalid =
      "Invalid API key. Check the key you sent in the Authorization header.";
  if (presented.size() > kMaxPresentedKeyBytes) {
    return absl::UnauthenticatedError(kInvalid);
  }
  const Key* match = nullptr;
  for (const Key& key : *keys) {
    // Every key is compared in full; no early exit.
    if (ConstantTimeEquals(presented, key.key)) match = &key;
  }
  if (match == nullptr) return absl::UnauthenticatedError(kInvalid);
  return match->name;
}

std::vector<std::string> ApiKeyStore::KeyNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  names.reserve(keys_->size());
  for (const Key& key : *keys_) names.push_back(key.name);
  return names;
}

// --- ConcurrencyLimiter
// -------------------------------------------------------

ConcurrencyLimiter::Lease& ConcurrencyLimiter::Lease::operator=(
    Lease&& other) noexcept {
  if (this != &other) {
    Release();
    limiter_ = other.limiter_;
    name_ = std::move(other.name_);
    other.limiter_ = nullptr;
    other.name_.clear();
  }
  return *this;
}

void ConcurrencyLimiter::Lease::Release() {
  if (limiter_ == nullptr) return;
  limiter_->Release(name_);
  limiter_ = nullptr;
  name_.clear();
}

ConcurrencyLimiter::ConcurrencyLimiter(ConcurrencyLimiterOptions options)
    : options_(std::move(options)) {}

uint32_t ConcurrencyLimiter::LimitFor(absl::string_view name) const {
  auto it = options_.limits.find(name);
  return it != options_.limits.end() ? it->second : options_.per_key_limit;
}

std::optional<ConcurrencyLimiter::Lease> ConcurrencyLimiter::TryAcquire(
    absl::string_view name) {
  const uint32_t limit = LimitFor(name);
  {
    absl::MutexLock lock(&mu_);
    auto it = in_flight_.find(name);
    if (it == in_flight_.end()) {
      it = in_flight_.emplace(std::string(name), 0).first;
    } else if (limit != 0 && it->second >= limit) {
      return std::nullopt;
    }
    ++it->second;
  }
  total_.fetch_add(1, std::memory_order_relaxed);
  return Lease(this, std::string(name));
}

void ConcurrencyLimiter::Release(const std::string& name) {
  {
    absl::MutexLock lock(&mu_);
    auto it = in_flight_.find(name);
    if (it == in_flight_.end()) return;
    if (--it->second == 0) in_flight_.erase(it);
  }
  total_.fetch_sub(1, std::memory_order_relaxed);
}

uint32_t ConcurrencyLimiter::InFlight(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(name);
  return it == in_flight_.end() ? 0 : it->second;
}

}  // namespace swaserve::api
