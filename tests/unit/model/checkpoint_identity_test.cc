// CheckpointIdentity: equal for equal checkpoints wherever they lie, different
// as soon as one weight byte differs, even with every file name and size the
// same (what an identity of names and sizes would miss).
#include "lib/model/checkpoint_identity.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;

std::string CopyDemo(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/checkpoint_identity_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(std::string(SWASERVE_SOURCE_DIR) + "/models/demo/" + f, dir + "/" + f);
  }
  return dir;
}

TEST(CheckpointIdentityTest, FollowsTheWeightsContent) {
  const std::string a = CopyDemo("a"), b = CopyDemo("b");
  absl::StatusOr<uint64_t> ia = CheckpointIdentity(a), ib = CheckpointIdentity(b);
  ASSERT_TRUE(ia.ok() && ib.ok()) << ia.status() << ib.status();
  EXPECT_EQ(*ia, *ib);
  // One byte deep in the weights (past the safetensors header), same size.
  const auto size = fs::file_size(b + "/model.safetensors");
  {
    std::fstream f(b + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size - 1000));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size - 1000));
    c = static_cast<char>(c ^ 1);
    f.write(&c, 1);
  }
  ASSERT_EQ(fs::file_size(b + "/model.safetensors"), size);
  absl::StatusOr<uint64_t> changed = CheckpointIdentity(b);
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(*changed, *ia);
  EXPECT_TRUE(absl::IsNotFound(CheckpointIdentity("/nonexistent/checkpoint").status()));
}

}  // namespace
}  // namespace swaserve::model
