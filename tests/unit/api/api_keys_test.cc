#include "lib/api/api_keys.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/clock.h"
#include "lib/base/subprocess.h"

namespace swaserve::api {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

void WriteFile(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  ASSERT_TRUE(out.good()) << path;
}

class ApiKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = base::MakeTempDir("api-keys-test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<ApiKeyStore> MustCreate(const std::string& path,
                                          base::Clock* clock = nullptr) {
    ApiKeyStoreOptions options;
    options.path = path;
    options.clock = clock;
    absl::StatusOr<std::unique_ptr<ApiKeyStore>> store =
        ApiKeyStore::Create(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  absl::Status CreateError(const std::string& file_content) {
    const fs::path path = dir_ / "bad-keys";
    WriteFile(path, file_content);
    ApiKeyStoreOptions options;
    options.path = path.string();
    absl::StatusOr<std::unique_ptr<ApiKeyStore>> store =
        ApiKeyStore::Create(options);
    EXPECT_FALSE(store.ok()) << file_content;
    return store.status();
  }

  // A Kubernetes-style secret volume: <dir>/..<ts>/<name> files, ..data ->
  // ..<ts>, <name> -> ..data/<name>.
  void WriteSecret(
      const fs::path& root, const std::string& timestamp,
      const std::vector<std::pair<std::string, std::string>>& entries) {
    fs::create_directories(root);
    const fs::path data_dir = root / ("..2024_" + timestamp);
    fs::create_directories(data_dir);
    for (const auto& [name, content] : entries) {
      WriteFile(data_dir / name, content);
    }
    // Atomic swap of ..data, as the kubelet does.
    const fs::path tmp = root / "..data_tmp";
    fs::remove(tmp);
    fs::create_directory_symlink(data_dir.filename(), tmp);
    fs::rename(tmp, root / "..data");
    // Name links for the new entries; stale ones removed.
    for (const auto& entry : fs::directory_iterator(root)) {
      const std::string name = entry.path().filename().string();
      if (name[0] == '.') continue;
      const bool keep =
          std::any_of(entries.begin(), entries.end(),
                      [&](const auto& e) { return e.first == name; });
      if (!keep) fs::remove(entry.path());
    }
    for (const auto& [name, content] : entries) {
      if (!fs::is_symlink(fs::symlink_status(root / name))) {
        fs::create_symlink(fs::path("..data") / name, root / name);
      }
    }
  }

  fs::path dir_;
};

TEST_F(ApiKeysTest, FileFormat) {
  const fs::path path = dir_ / "keys";
  WriteFile(path,
            "# API keys\n"
            "\n"
            "team-a:sk-aaaaaaaa\n"
            "   sk-bbbbbbbb   \n"
            "  # indented comment\n"
            "team.b_2 : sk:with:colons\r\n");
  auto store = MustCreate(path.string());
  ASSERT_NE(store, nullptr);
  std::vector<std::string> names = store->KeyNames();
  ASSERT_THAT(names, SizeIs(3));
  EXPECT_THAT(names[0], StartsWith("key-"));
  EXPECT_EQ(names[0].size(), 12u);
  EXPECT_EQ(names[1], "team-a");
  EXPECT_EQ(names[2], "team.b_2");

  EXPECT_EQ(*store->Authorize("Bearer sk-aaaaaaaa"), "team-a");
  EXPECT_EQ(*store->Authorize("bearer sk-aaaaaaaa"), "team-a");
  EXPECT_EQ(*store->Authorize("  BEARER   sk-aaaaaaaa  "), "team-a");
  EXPECT_EQ(*store->Authorize("Bearer sk-bbbbbbbb"), names[0]);
  EXPECT_EQ(*store->Authorize("Bearer sk:with:colons"), "team.b_2");

  // The fingerprint name is stable.
  auto again = MustCreate(path.string());
  EXPECT_EQ(again->KeyNames(), names);
}

TEST_F(ApiKeysTest, RejectsWrongAndMissingKeys) {
  const fs::path path = dir_ / "keys";
  WriteFile(path, "a:sk-secret-1\n");
  auto store = MustCreate(path.string());
  ASSERT_NE(store, nullptr);
  for (const char* header :
       {"Bearer wrong", "Bearer sk-secret-", "Bearer sk-secret-12",
        "Bearer sk-secret-2", "Bearer SK-SECRET-1", "Bearer a"}) {
    absl::StatusOr<std::string> r = store->Authorize(header);
    ASSERT_FALSE(r.ok()) << header;
    EXPECT_TRUE(absl::IsUnauthenticated(r.status()));
    EXPECT_THAT(r.status().message(), HasSubstr("Invalid API key"));
    EXPECT_THAT(r.status().message(), Not(HasSubstr("sk-")));
  }
  for (const char* header : {"", "   ", "Bearer", "Bearer   "}) {
    absl::StatusOr<std::string> r = store->Authorize(header);
    ASSERT_FALSE(r.ok()) << header;
    EXPECT_TRUE(absl::IsUnauthenticated(r.status()));
    EXPECT_THAT(r.status().message(), HasSubstr("Missing API key"));
  }
  for (const char* header : {"Basic sk-secret-1", "sk-secret-1", "Token x"}) {
    absl::StatusOr<std::string> r = store->Authorize(header);
    ASSERT_FALSE(r.ok()) << header;
    EXPECT_TRUE(absl::IsUnauthenticated(r.status()));
    EXPECT_THAT(r.status().message(), HasSubstr("Bearer scheme"));
    EXPECT_THAT(r.status().message(), Not(HasSubstr("sk-")));
  }
  EXPECT_FALSE(store->Authorize("Bearer " + std::string(100000, 'x')).ok());
}

TEST_F(ApiKeysTest, CreateErrorsNeverShowKeys) {
  ApiKeyStoreOptions options;
  options.path = (dir_ / "missing").string();
  absl::StatusOr<std::unique_ptr<ApiKeyStore>> store =
      ApiKeyStore::Create(options);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsNotFound(store.status())) << store.status();
  options.path = "";
  EXPECT_FALSE(ApiKeyStore::Create(options).ok());

  for (const char* content :
       {"", "# only comments\n\n", "a:sk-one\na:sk-two\n",
        "a:sk-same\nb:sk-same\n", "bad name:sk-xyz\n", "a:sk with space\n",
        "a:\n", ":sk-xyz\n", "a:sk-\xc3\xa9\n"}) {
    absl::Status status = CreateError(content);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << content << " " << status;
    EXPECT_THAT(status.message(), Not(HasSubstr("sk-"))) << status;
    EXPECT_THAT(status.message(), HasSubstr("bad-keys")) << status;
  }
}

TEST_F(ApiKeysTest, KubernetesSecretDirectory) {
  const fs::path root = dir_ / "secret";
  WriteSecret(root, "01", {{"alice", "sk-alice-1\n"}, {"bob", "  sk-bob-1 "}});
  WriteFile(root / ".hidden", "sk-hidden");
  fs::create_directory(root / "subdir");
  ASSERT_TRUE(fs::is_symlink(fs::symlink_status(root / "alice")));

  auto store = MustCreate(root.string());
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(store->KeyNames(), ElementsAre("alice", "bob"));
  EXPECT_EQ(*store->Authorize("Bearer sk-alice-1"), "alice");
  EXPECT_EQ(*store->Authorize("Bearer sk-bob-1"), "bob");
  EXPECT_FALSE(store->Authorize("Bearer sk-hidden").ok());

  // The secret is updated: alice's key rotates, bob is removed, carol added.
  WriteSecret(root, "02", {{"alice", "sk-alice-2"}, {"carol", "sk-carol-1"}});
  ASSERT_TRUE(store->ReloadNow().ok());
  EXPECT_EQ(store->reload_count(), 1);
  EXPECT_THAT(store->KeyNames(), ElementsAre("alice", "carol"));
  EXPECT_FALSE(store->Authorize("Bearer sk-alice-1").ok());
  EXPECT_FALSE(store->Authorize("Bearer sk-bob-1").ok());
  EXPECT_EQ(*store->Authorize("Bearer sk-alice-2"), "alice");
  EXPECT_EQ(*store->Authorize("Bearer sk-carol-1"), "carol");

  // Unchanged content: no reload counted.
  ASSERT_TRUE(store->ReloadNow().ok());
  EXPECT_EQ(store->reload_count(), 1);
}

TEST_F(ApiKeysTest, DirectoryErrors) {
  const fs::path root = dir_ / "secret";
  fs::create_directories(root);
  ApiKeyStoreOptions options;
  options.path = root.string();
  EXPECT_TRUE(absl::IsInvalidArgument(ApiKeyStore::Create(options).status()));
  WriteFile(root / "empty", "  \n");
  absl::Status status = ApiKeyStore::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("empty"));
}

TEST_F(ApiKeysTest, ReloadsAfterIntervalOnAccess) {
  const fs::path path = dir_ / "keys";
  WriteFile(path, "a:sk-old\n");
  base::FakeClock clock;
  auto store = MustCreate(path.string(), &clock);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Authorize("Bearer sk-old").ok());

  WriteFile(path, "a:sk-new\n");
  clock.Advance(absl::Seconds(1));
  // Interval (2 s) not passed: old keys still in use.
  EXPECT_TRUE(store->Authorize("Bearer sk-old").ok());
  EXPECT_FALSE(store->Authorize("Bearer sk-new").ok());
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(*store->Authorize("Bearer sk-new"), "a");
  EXPECT_FALSE(store->Authorize("Bearer sk-old").ok());
  EXPECT_EQ(store->reload_count(), 1);
}

TEST_F(ApiKeysTest, FailedReloadKeepsOldKeys) {
  const fs::path path = dir_ / "keys";
  WriteFile(path, "a:sk-good\n");
  base::FakeClock clock;
  auto store = MustCreate(path.string(), &clock);
  ASSERT_NE(store, nullptr);

  WriteFile(path, "a:sk-x\na:sk-y\n");  // duplicate name
  EXPECT_FALSE(store->ReloadNow().ok());
  EXPECT_TRUE(store->Authorize("Bearer sk-good").ok());
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(store->Authorize("Bearer sk-good").ok());

  fs::remove(path);
  EXPECT_TRUE(absl::IsNotFound(store->ReloadNow()));
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(store->Authorize("Bearer sk-good").ok());

  WriteFile(path, "b:sk-fixed\n");
  EXPECT_TRUE(store->ReloadNow().ok());
  EXPECT_EQ(*store->Authorize("Bearer sk-fixed"), "b");
  EXPECT_FALSE(store->Authorize("Bearer sk-good").ok());
}

TEST_F(ApiKeysTest, ConcurrentAuthorizeAndReload) {
  const fs::path path = dir_ / "keys";
  WriteFile(path, "a:sk-a\nb:sk-b\n");
  ApiKeyStoreOptions options;
  options.path = path.string();
  options.reload_interval = absl::ZeroDuration();  // reload on every call
  auto store = *ApiKeyStore::Create(options);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<std::string> r = store->Authorize("Bearer sk-a");
        if (!r.ok() || *r != "a") failures.fetch_add(1);
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 50; ++i) (void)store->ReloadNow();
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// --- ConcurrencyLimiter
// -------------------------------------------------------

TEST(ConcurrencyLimiterTest, AcquireRelease) {
  ConcurrencyLimiterOptions options;
  options.per_key_limit = 2;
  options.limits["vip"] = 0;
  options.limits["small"] = 1;
  ConcurrencyLimiter limiter(options);
  EXPECT_EQ(limiter.LimitFor("a"), 2u);
  EXPECT_EQ(limiter.LimitFor("vip"), 0u);

  std::optional<ConcurrencyLimiter::Lease> a1 = limiter.TryAcquire("a");
  std::optional<ConcurrencyLimiter::Lease> a2 = limiter.TryAcquire("a");
  ASSERT_TRUE(a1.has_value());
  ASSERT_TRUE(a2.has_value());
  EXPECT_EQ(a1->name(), "a");
  EXPECT_FALSE(limiter.TryAcquire("a").has_value());
  EXPECT_EQ(limiter.InFlight("a"), 2u);
  auto b = limiter.TryAcquire("b");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(limiter.TotalInFlight(), 3);

  a1.reset();  // destruction releases
  EXPECT_EQ(limiter.InFlight("a"), 1u);
  auto a3 = limiter.TryAcquire("a");
  EXPECT_TRUE(a3.has_value());

  // Moves transfer the slot; the moved-from lease releases nothing.
  ConcurrencyLimiter::Lease moved = std::move(*a3);
  a3.reset();
  EXPECT_EQ(limiter.InFlight("a"), 2u);
  moved.Release();
  moved.Release();
  EXPECT_EQ(limiter.InFlight("a"), 1u);
  EXPECT_EQ(moved.name(), "");

  std::vector<ConcurrencyLimiter::Lease> vip;
  for (int i = 0; i < 100; ++i) {
    auto lease = limiter.TryAcquire("vip");
    ASSERT_TRUE(lease.has_value());
    vip.push_back(std::move(*lease));
  }
  EXPECT_EQ(limiter.InFlight("vip"), 100u);
  auto s1 = limiter.TryAcquire("small");
  EXPECT_TRUE(s1.has_value());
  EXPECT_FALSE(limiter.TryAcquire("small").has_value());
  vip.clear();
  s1.reset();
  a2.reset();
  b.reset();
  EXPECT_EQ(limiter.TotalInFlight(), 0);
  EXPECT_EQ(limiter.InFlight("a"), 0u);
}

TEST(ConcurrencyLimiterTest, UnlimitedByDefault) {
  ConcurrencyLimiter limiter;
  std::vector<ConcurrencyLimiter::Lease> leases;
  for (int i = 0; i < 1000; ++i) leases.push_back(*limiter.TryAcquire("k"));
  EXPECT_EQ(limiter.TotalInFlight(), 1000);
  leases.clear();
  EXPECT_EQ(limiter.TotalInFlight(), 0);
}

TEST(ConcurrencyLimiterTest, LimitHoldsUnderThreads) {
  ConcurrencyLimiterOptions options;
  options.per_key_limit = 3;
  options.limits["even-other"] = 0;
  options.limits["shared-other"] = 0;
  ConcurrencyLimiter limiter(options);
  std::atomic<int> holding{0};
  std::atomic<int> max_holding{0};
  std::atomic<int> acquired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const std::string name = t % 2 == 0 ? "even" : "shared";
      for (int i = 0; i < 2000; ++i) {
        std::optional<ConcurrencyLimiter::Lease> lease =
            limiter.TryAcquire("shared");
        if (!lease) continue;
        acquired.fetch_add(1);
        const int now = holding.fetch_add(1) + 1;
        int prev = max_holding.load();
        while (now > prev && !max_holding.compare_exchange_weak(prev, now)) {
        }
        if (i % 7 == 0) std::this_thread::yield();
        holding.fetch_sub(1);
        // A second name in parallel does not interfere.
        auto other = limiter.TryAcquire(name + "-other");
        EXPECT_TRUE(other.has_value());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(max_holding.load(), 3);
  EXPECT_GT(acquired.load(), 0);
  EXPECT_EQ(limiter.TotalInFlight(), 0);
  EXPECT_EQ(limiter.InFlight("shared"), 0u);
}

}  // namespace
}  // namespace swaserve::api
