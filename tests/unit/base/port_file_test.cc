// Port files: written whole, read back by name, errors for missing files,
// missing keys and malformed content.
#include "lib/base/port_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "lib/base/subprocess.h"

namespace swaserve::base {
namespace {

TEST(PortFileTest, WritesAndReadsBack) {
  const std::string dir = *MakeTempDir("port-file");
  const std::string path = dir + "/ports.json";
  ASSERT_TRUE(WritePortFile(path, {{"grpc_port", 40123}, {"http_port", 8000}}).ok());
  EXPECT_EQ(*ReadPort(path, "grpc_port"), 40123);
  EXPECT_EQ(*ReadPort(path, "http_port"), 8000);
  EXPECT_EQ(*ReadPort(path, "pid"), static_cast<int>(getpid()));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  // Rewriting replaces the file.
  ASSERT_TRUE(WritePortFile(path, {{"grpc_port", 1}}).ok());
  EXPECT_EQ(*ReadPort(path, "grpc_port"), 1);
  EXPECT_EQ(ReadPort(path, "http_port").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(PortFileTest, Errors) {
  const std::string dir = *MakeTempDir("port-file");
  EXPECT_EQ(ReadPort(dir + "/missing.json", "x").status().code(), absl::StatusCode::kNotFound);
  {
    std::ofstream(dir + "/bad.json") << "{not json";
    std::ofstream(dir + "/str.json") << R"({"grpc_port": "80"})";
  }
  EXPECT_EQ(ReadPort(dir + "/bad.json", "grpc_port").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadPort(dir + "/str.json", "grpc_port").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(WritePortFile(dir + "/no/such/dir/p.json", {{"a", 1}}).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace swaserve::base
