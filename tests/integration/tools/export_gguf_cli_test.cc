// `swaserve export-gguf`'s command line on the real binary: the demo model
// exports (the summary line; the file reads back with lib/model's reader),
// a missing flag exits 2, what cannot be exported exits 1 naming it.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/subprocess.h"
#include "lib/model/gguf.h"

namespace swaserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

CliRun ExportGguf(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {SWASERVE_CLI_BIN, "export-gguf"};
  argv.insert(argv.end(), args.begin(), args.end());
  CliRun r;
  absl::StatusOr<int> code = base::RunCommand(argv, &r.out, absl::Seconds(120));
  EXPECT_TRUE(code.ok()) << code.status();
  r.code = code.ok() ? *code : -1;
  return r;
}

TEST(ExportGgufCli, ExportsTheDemoModelAndNamesWhatItCannot) {
  const std::string dir = *base::MakeTempDir("export-gguf-cli");
  const std::string demo = std::string(SWASERVE_SOURCE_DIR) + "/models/demo";
  const std::string out = dir + "/demo.gguf";

  CliRun r = ExportGguf({"--model=" + demo});
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--model and --out are required"));

  r = ExportGguf({"--model=" + demo, "--out=" + out, "--dtype=q4"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("dtype 'q4'"));
  EXPECT_FALSE(fs::exists(out));

  r = ExportGguf({"--model=" + demo, "--out=" + out, "--name=demo-bf16"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("179 tensors, matrices BF16"));
  absl::StatusOr<std::unique_ptr<model::GgufFile>> f = model::ReadGgufFile(out);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->contents.Find("general.name"), model::GgufValue::Str("demo-bf16"));
  EXPECT_EQ(*(*f)->contents.Find("general.architecture"), model::GgufValue::Str("mimo2"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace swaserve
