#include "lib/model/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// ---------------------------------------------------------------------------
// Header parsing.

TEST(ParseSafetensorsHeader, Good) {
  const std::string header = R"({
    "__metadata__": {"format": "pt"},
    "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [16, 28]},
    "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
    "scalar": {"dtype": "F16", "shape": [], "data_offsets": [28, 30]},
    "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [16, 16]}
  })"
                             "   ";  // padding spaces are allowed
  absl::StatusOr<std::vector<TensorInfo>> t =
      ParseSafetensorsHeader(header, 30);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 4u);
  // Sorted by name.
  EXPECT_EQ((*t)[0].name, "a");
  EXPECT_EQ((*t)[0].dtype, TensorDType::kF32);
  EXPECT_EQ((*t)[0].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ((*t)[0].begin, 0u);
  EXPECT_EQ((*t)[0].end, 16u);
  EXPECT_EQ((*t)[1].name, "b");
  EXPECT_EQ((*t)[1].dtype, TensorDType::kBF16);
  EXPECT_EQ((*t)[1].dtype_name, "BF16");
  EXPECT_EQ((*t)[1].numel(), 6);
  EXPECT_EQ((*t)[2].name, "empty");
  EXPECT_EQ((*t)[2].numel(), 0);
  EXPECT_EQ((*t)[3].name, "scalar");
  EXPECT_EQ((*t)[3].dtype, TensorDType::kF16);
  EXPECT_EQ((*t)[3].numel(), 1);
}

TEST(ParseSafetensorsHeader, EmptyObjectIsValid) {
  absl::StatusOr<std::vector<TensorInfo>> t = ParseSafetensorsHeader("{}", 0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->empty());
}

TEST(ParseSafetensorsHeader, UnknownDTypeIsOther) {
  // Defined by the format but not computable here: sizes still checked.
  absl::StatusOr<std::vector<TensorInfo>> t = ParseSafetensorsHeader(
      R"({"i": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},
          "q": {"dtype": "Q4_WEIRD", "shape": [3], "data_offsets": [16, 18]}})",
      18);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0].dtype, TensorDType::kOther);
  EXPECT_EQ((*t)[0].dtype_name, "I64");
  EXPECT_EQ((*t)[1].dtype, TensorDType::kOther);
  EXPECT_EQ((*t)[1].dtype_name, "Q4_WEIRD");
  absl::StatusOr<std::vector<TensorInfo>> bad = ParseSafetensorsHeader(
      R"({"i": {"dtype": "I64", "shape": [2], "data_offsets": [0, 12]}})", 18);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(Message(bad.status()), HasSubstr("16 bytes"));
}

struct BadHeader {
  const char* name;
  std::string header;
  uint64_t data_size;
  std::string want;  // substring of the error
};

TEST(ParseSafetensorsHeader, RejectsMalformed) {
  const std::vector<BadHeader> cases = {
      {"empty", "", 0, "invalid JSON"},
      {"truncated JSON", R"({"a": {"dtype": "F32", "sha)", 0, "invalid JSON"},
      {"not JSON", "hello", 0, "invalid JSON"},
      {"not an object", "[1, 2]", 0, "expected a JSON object"},
      {"entry not object", R"({"a": 5})", 0, "\"a\""},
      {"missing dtype", R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4,
       "missing \"dtype\""},
      {"dtype not string",
       R"({"a": {"dtype": 1, "shape": [1], "data_offsets": [0, 4]}})", 4,
       "\"dtype\" is not a string"},
      {"missing shape", R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4,
       "missing \"shape\""},
      {"shape not list",
       R"({"a": {"dtype": "F32", "shape": 4, "data_offsets": [0, 4]}})", 4,
       "\"shape\" is not a list"},
      {"negative dim",
       R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
       "not a non-negative integer"},
      {"float dim",
       R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
       "not a non-negative integer"},
      {"missing offsets", R"({"a": {"dtype": "F32", "shape": [1]}})", 4,
       "missing \"data_offsets\""},
      {"one offset",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", 4,
       "[begin, end]"},
      {"negative offset",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
       "[begin, end]"},
      {"begin > end",
       R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", 4,
       "begin > end"},
      {"out of file",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
       "run past the end of the data (4 bytes)"},
      {"huge offset",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612, 18446744073709551615]}})",
       4, "[begin, end]"},
      {"size mismatch",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8,
       "is 8 bytes, but data_offsets [0, 4] span 4"},
      {"bf16 size mismatch",
       R"({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", 8,
       "is 6 bytes"},
      {"overlap",
       R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "overlap"},
      {"identical ranges",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
       4, "overlap"},
      {"shape product overflow",
       R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 4]}})",
       4, "too many elements"},
      {"bytes overflow",
       R"({"a": {"dtype": "F64", "shape": [2305843009213693952, 2], "data_offsets": [0, 0]}})",
       4, "too many elements"},
      {"dim beyond int64",
       R"({"a": {"dtype": "F32", "shape": [9223372036854775808], "data_offsets": [0, 4]}})",
       4, "not a non-negative integer"},
      {"metadata not object", R"({"__metadata__": [1]})", 0, "__metadata__"},
      {"metadata value not string", R"({"__metadata__": {"format": 1}})", 0,
       "__metadata__"},
      {"duplicate tensor",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       8, "duplicate key"},
      {"duplicate field",
       R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "dtype": "F16"}})",
       8, "duplicate key"},
  };
  for (const BadHeader& c : cases) {
    absl::StatusOr<std::vector<TensorInfo>> t =
        ParseSafetensorsHeader(c.header, c.data_size);
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(Message(t.status()), HasSubstr(c.want)) << c.name;
  }
}

TEST(ParseSafetensorsHeader, ErrorsNameTheTensor) {
  absl::StatusOr<std::vector<TensorInfo>> t = ParseSafetensorsHeader(
      R"({"model.norm.weight": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}})",
      4);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(Message(t.status()), HasSubstr("\"model.norm.weight\""));
}

TEST(ParseSafetensorsHeader, AllowsEmptyTensorsAtAnyOffset) {
  absl::StatusOr<std::vector<TensorInfo>> t = ParseSafetensorsHeader(
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
      8);
  ASSERT_TRUE(t.ok()) << t.status();
}

// ---------------------------------------------------------------------------
// Conversions.

TEST(Conversions, Bf16KnownValues) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  // Ties round to even.
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(F32ToBf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  // The largest float rounds up to infinity.
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);
  const uint16_t nan = F32ToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16ToF32(nan)));
  // A NaN whose payload sits only in the low bits must stay a NaN.
  EXPECT_TRUE(
      std::isnan(Bf16ToF32(F32ToBf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(
      std::isnan(Bf16ToF32(F32ToBf16(std::bit_cast<float>(0xff800001u)))));
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isinf(Bf16ToF32(0xff80)));
}

TEST(Conversions, Bf16RoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = Bf16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(f)))) << h;
    } else {
      EXPECT_EQ(F32ToBf16(f), h) << h;
    }
  }
}

// Reference: the nearer of the two neighbouring bf16 values, ties to even.
uint16_t Bf16Reference(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double dx = x;
  const double dlo = Bf16ToF32(lo);
  const double dhi = std::isinf(Bf16ToF32(hi)) && !std::isinf(x)
                         ? std::ldexp(1.0, 128) * (x < 0 ? -1 : 1)
                         : static_cast<double>(Bf16ToF32(hi));
  const double elo = std::fabs(dx - dlo), ehi = std::fabs(dhi - dx);
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Conversions, Bf16MatchesReferenceOnRandomFloats) {
  std::mt19937 gen(7);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(gen()));
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(F32ToBf16(x), Bf16Reference(x))
        << std::hex << std::bit_cast<uint32_t>(x);
  }
}

TEST(Conversions, F16KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(0.5f), 0x3800);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);  // largest half
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);  // rounds down
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // ties away to infinity (even)
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e6f), 0xfc00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie -> even
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_TRUE(
      std::isnan(F16ToF32(F32ToF16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(
      std::isnan(F16ToF32(F32ToF16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x8400), -std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(F16ToF32(0xfc00)));
}

TEST(Conversions, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
    } else {
      EXPECT_EQ(F32ToF16(f), h) << h;
    }
  }
}

#if defined(__FLT16_MAX__)
TEST(Conversions, F16MatchesCompilerOnRandomFloats) {
  std::mt19937 gen(11);
  for (int i = 0; i < 500000; ++i) {
    uint32_t u = static_cast<uint32_t>(gen());
    // Bias towards the interesting range (subnormal .. overflow).
    if (i % 2 == 0) u = (u & 0x80ffffffu) | ((100u + (u >> 24) % 50u) << 23);
    const float x = std::bit_cast<float>(u);
    if (std::isnan(x)) continue;
    const _Float16 ref = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(F32ToF16(x), want) << std::hex << u;
    ASSERT_EQ(F16ToF32(want), static_cast<float>(ref)) << std::hex << want;
  }
}
#endif

// ---------------------------------------------------------------------------
// Files.

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("checkpoint_test_", info->test_suite_name(), "_",
                        info->name(), "_", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }

  fs::path dir_;
};

std::string F32Bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

std::string U16Bytes(const std::vector<uint16_t>& v) {
  std::string s(v.size() * 2, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A file image: 8-byte length + header + data.
std::string Image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

using SafetensorsFileTest = TempDir;

TEST_F(SafetensorsFileTest, WriterOutputReadsBack) {
  SafetensorsWriter w;
  ASSERT_TRUE(
      w.Add("z.f32", TensorDType::kF32, {2, 2}, F32Bytes({1, 2, 3, 4})).ok());
  ASSERT_TRUE(w.Add("a.bf16", TensorDType::kBF16, {3},
                    U16Bytes({F32ToBf16(1), F32ToBf16(-2), F32ToBf16(0.5)}))
                  .ok());
  ASSERT_TRUE(
      w.Add("m.f16", TensorDType::kF16, {1}, U16Bytes({F32ToF16(3.0f)})).ok());
  ASSERT_TRUE(w.Add("e.empty", TensorDType::kF32, {0, 3}, "").ok());
  ASSERT_TRUE(
      w.AddLazy("b.lazy", TensorDType::kF32, {3}, [](absl::Span<uint8_t> out) {
         ASSERT_EQ(out.size(), 12u);
         const float v[3] = {7, 8, 9};
         std::memcpy(out.data(), v, 12);
       }).ok());
  std::vector<uint64_t> progress;
  ASSERT_TRUE(
      w.Write(Path("x.safetensors"), [&](uint64_t done, uint64_t total) {
         EXPECT_EQ(total, 16u + 12 + 0 + 6 + 2);
         progress.push_back(done);
       }).ok());
  EXPECT_EQ(progress.size(), 5u);
  EXPECT_EQ(progress.back(), 36u);
  EXPECT_FALSE(fs::exists(Path("x.safetensors.tmp")));

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(Path("x.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 5u);
  const TensorInfo* z = (*f)->Find("z.f32");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->shape, (std::vector<int64_t>{2, 2}));
  float zv[4];
  std::memcpy(zv, z->data, 16);
  EXPECT_EQ(zv[3], 4.0f);
  const TensorInfo* lazy = (*f)->Find("b.lazy");
  ASSERT_NE(lazy, nullptr);
  float lv[3];
  std::memcpy(lv, lazy->data, 12);
  EXPECT_EQ(lv[2], 9.0f);
  const TensorInfo* a = (*f)->Find("a.bf16");
  ASSERT_NE(a, nullptr);
  uint16_t av[3];
  std::memcpy(av, a->data, 6);
  EXPECT_EQ(Bf16ToF32(av[1]), -2.0f);
  EXPECT_EQ((*f)->Find("nope"), nullptr);

  // Layout: data starts 8-byte aligned, f32 tensors first (by name), then the
  // 2-byte ones; contiguous; every tensor aligned to its element size.
  std::ifstream in(Path("x.safetensors"), std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  Json j = Json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["b.lazy"]["data_offsets"], Json({0, 12}));
  EXPECT_EQ(j["e.empty"]["data_offsets"], Json({12, 12}));
  EXPECT_EQ(j["z.f32"]["data_offsets"], Json({12, 28}));
  EXPECT_EQ(j["a.bf16"]["data_offsets"], Json({28, 34}));
  EXPECT_EQ(j["m.f16"]["data_offsets"], Json({34, 36}));
  EXPECT_EQ(fs::file_size(Path("x.safetensors")), 8 + n + 36);
  for (const TensorInfo& t : (*f)->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % TensorDTypeSize(t.dtype),
              0u)
        << t.name;
  }
}

TEST_F(SafetensorsFileTest, WriterRejectsBadInput) {
  SafetensorsWriter w;
  EXPECT_FALSE(w.Add("a", TensorDType::kF32, {2}, F32Bytes({1})).ok());
  EXPECT_FALSE(w.Add("a", TensorDType::kOther, {1}, "x").ok());
  EXPECT_FALSE(w.Add("a", TensorDType::kF32, {-1}, "").ok());
  EXPECT_FALSE(
      w.Add("__metadata__", TensorDType::kF32, {1}, F32Bytes({1})).ok());
  EXPECT_FALSE(w.Add("", TensorDType::kF32, {1}, F32Bytes({1})).ok());
  ASSERT_TRUE(w.Add("a", TensorDType::kF32, {1}, F32Bytes({1})).ok());
  absl::Status dup = w.Add("a", TensorDType::kF32, {1}, F32Bytes({1}));
  EXPECT_THAT(Message(dup), HasSubstr("added twice"));
  EXPECT_FALSE(
      w.AddLazy("a", TensorDType::kF32, {1}, [](absl::Span<uint8_t>) {}).ok());
  EXPECT_FALSE(w.AddLazy("b", TensorDType::kF32, {1}, nullptr).ok());
  absl::Status s = w.Write(Path("no/such/dir/x.safetensors"));
  EXPECT_FALSE(s.ok());
}

TEST_F(SafetensorsFileTest, RejectsBadFiles) {
  const std::string header =
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  struct Case {
    const char* name;
    std::string bytes;
    std::string want;
  };
  std::string huge_len(8, '\0');
  const uint64_t big = 1ull << 40;
  std::memcpy(huge_len.data(), &big, 8);
  const std::vector<Case> cases = {
      {"empty file", "", "truncated: 0 bytes"},
      {"short prefix", std::string("\x05\x00\x00", 3), "truncated: 3 bytes"},
      {"header past end", huge_len + "{}", "runs past the end of the file"},
      {"header truncated", Image(header, std::string(8, '\0')).substr(0, 30),
       "runs past the end of the file"},
      {"data truncated", Image(header, std::string(4, '\0')),
       "run past the end of the data (4 bytes)"},
      {"bad JSON", Image("{\"a\": [", ""), "invalid JSON"},
      {"NUL in header", Image(std::string("{}\0\0", 4), ""),
       "NUL byte at offset 2"},
  };
  for (const Case& c : cases) {
    WriteRaw(Path("bad.safetensors"), c.bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
        SafetensorsFile::Open(Path("bad.safetensors"));
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_THAT(Message(f.status()), HasSubstr(c.want)) << c.name;
    EXPECT_THAT(Message(f.status()), HasSubstr("bad.safetensors")) << c.name;
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> missing =
      SafetensorsFile::Open(Path("missing.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> dir =
      SafetensorsFile::Open(dir_.string());
  EXPECT_FALSE(dir.ok());
}

TEST_F(SafetensorsFileTest, RejectsHeaderOverLimit) {
  // A sparse file big enough to hold a 200 MiB header: the length is
  // plausible for the file but over the 100 MiB limit.
  const uint64_t n = 200ull << 20;
  std::string prefix(8, '\0');
  std::memcpy(prefix.data(), &n, 8);
  WriteRaw(Path("big.safetensors"), prefix);
  fs::resize_file(Path("big.safetensors"), n + 8 + 16);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(Path("big.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(Message(f.status()), HasSubstr("exceeds the limit"));
}

TEST_F(SafetensorsFileTest, AcceptsPaddedHeader) {
  const std::string header =
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})" +
      std::string(5, ' ');
  WriteRaw(Path("p.safetensors"), Image(header, F32Bytes({2.5f})));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(Path("p.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  float v;
  std::memcpy(&v, (*f)->Find("a")->data, 4);
  EXPECT_EQ(v, 2.5f);
}

// ---------------------------------------------------------------------------
// ExpectedTensors and Checkpoint.

ModelConfig SmallConfig(bool tied = false, const char* dtype = "float32") {
  Json j = {
      {"vocab_size", 16},
      {"hidden_size", 8},
      {"num_hidden_layers", 3},
      {"hybrid_layer_pattern", {0, 1, 1}},
      {"sliding_window", 4},
      {"num_attention_heads", 2},
      {"num_key_value_heads", 1},
      {"head_dim", 4},
      {"v_head_dim", 2},
      {"swa_num_attention_heads", 2},
      {"swa_num_key_value_heads", 2},
      {"partial_rotary_factor", 0.5},
      {"add_swa_attention_sink_bias", true},
      {"moe_layer_freq", {0, 1, 1}},
      {"n_routed_experts", 2},
      {"num_experts_per_tok", 1},
      {"moe_intermediate_size", 3},
      {"intermediate_size", 5},
      {"num_nextn_predict_layers", 1},
      {"tie_word_embeddings", tied},
      {"torch_dtype", dtype},
  };
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(j.dump(), "small");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(ExpectedTensors, SmallModel) {
  const ModelConfig c = SmallConfig();
  std::map<std::string, std::vector<int64_t>> t = ExpectedTensors(c);
  using S = std::vector<int64_t>;
  EXPECT_EQ(t.at("model.embed_tokens.weight"), (S{16, 8}));
  EXPECT_EQ(t.at("model.norm.weight"), (S{8}));
  EXPECT_EQ(t.at("lm_head.weight"), (S{16, 8}));
  // Layer 0: full attention (2 heads, 1 KV head, K 4, V 2), dense MLP.
  EXPECT_EQ(t.at("model.layers.0.input_layernorm.weight"), (S{8}));
  EXPECT_EQ(t.at("model.layers.0.post_attention_layernorm.weight"), (S{8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.q_proj.weight"), (S{8, 8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.k_proj.weight"), (S{4, 8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.v_proj.weight"), (S{2, 8}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.o_proj.weight"), (S{8, 4}));
  EXPECT_EQ(t.count("model.layers.0.self_attn.attention_sink_bias"), 0u);
  EXPECT_EQ(t.at("model.layers.0.mlp.gate_proj.weight"), (S{5, 8}));
  EXPECT_EQ(t.at("model.layers.0.mlp.up_proj.weight"), (S{5, 8}));
  EXPECT_EQ(t.at("model.layers.0.mlp.down_proj.weight"), (S{8, 5}));
  EXPECT_EQ(t.count("model.layers.0.mlp.gate.weight"), 0u);
  // Layer 1: SWA (2 KV heads) with sink, MoE.
  EXPECT_EQ(t.at("model.layers.1.self_attn.k_proj.weight"), (S{8, 8}));
  EXPECT_EQ(t.at("model.layers.1.self_attn.v_proj.weight"), (S{4, 8}));
  EXPECT_EQ(t.at("model.layers.1.self_attn.attention_sink_bias"), (S{2}));
  EXPECT_EQ(t.at("model.layers.1.mlp.gate.weight"), (S{2, 8}));
  EXPECT_EQ(t.at("model.layers.1.mlp.gate.e_score_correction_bias"), (S{2}));
  EXPECT_EQ(t.at("model.layers.1.mlp.experts.1.gate_proj.weight"), (S{3, 8}));
  EXPECT_EQ(t.at("model.layers.1.mlp.experts.1.up_proj.weight"), (S{3, 8}));
  EXPECT_EQ(t.at("model.layers.1.mlp.experts.1.down_proj.weight"), (S{8, 3}));
  EXPECT_EQ(t.count("model.layers.1.mlp.experts.2.up_proj.weight"), 0u);
  EXPECT_EQ(t.count("model.layers.1.mlp.gate_proj.weight"), 0u);
  // MTP layer 0: SWA geometry + sink, dense MLP.
  const std::string m = "model.mtp.layers.0.";
  EXPECT_EQ(t.at(m + "enorm.weight"), (S{8}));
  EXPECT_EQ(t.at(m + "hnorm.weight"), (S{8}));
  EXPECT_EQ(t.at(m + "eh_proj.weight"), (S{8, 16}));
  EXPECT_EQ(t.at(m + "final_layernorm.weight"), (S{8}));
  EXPECT_EQ(t.at(m + "input_layernorm.weight"), (S{8}));
  EXPECT_EQ(t.at(m + "post_attention_layernorm.weight"), (S{8}));
  EXPECT_EQ(t.at(m + "self_attn.k_proj.weight"), (S{8, 8}));
  EXPECT_EQ(t.at(m + "self_attn.attention_sink_bias"), (S{2}));
  EXPECT_EQ(t.at(m + "mlp.down_proj.weight"), (S{8, 5}));
  // 3 globals; layer 0: 2 norms + 4 attn + 3 mlp; layers 1-2: 2 norms + 4 attn
  // + sink + 2 router + 2*3 experts; MTP: 6 norms/proj + 4 attn + sink + 3.
  EXPECT_EQ(t.size(), 3u + 9 + 2 * 15 + 14);
  for (const auto& [name, shape] : t) {
    EXPECT_EQ(name.find("bias") != std::string::npos &&
                  name.find("attention_sink_bias") == std::string::npos &&
                  name.find("e_score_correction_bias") == std::string::npos,
              false)
        << name;
  }
  EXPECT_EQ(ExpectedTensors(SmallConfig(/*tied=*/true)).count("lm_head.weight"),
            0u);
}

TEST(CountParams, SmallModel) {
  const ModelConfig c = SmallConfig();
  int64_t total = 0;
  for (const auto& [name, shape] : ExpectedTensors(c)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total += n;
  }
  ParamCounts p = CountParams(c);
  EXPECT_EQ(p.total, total);
  // MTP: 5 norms of 8, eh_proj 8x16, q 8x8, k 8x8, v 4x8, o 8x4, sink 2,
  // MLP 3 x 5x8.
  EXPECT_EQ(p.mtp, 5 * 8 + 128 + 64 + 64 + 32 + 32 + 2 + 120);
  // Each MoE layer has 2 experts of 3 x 3x8 = 72; one is active.
  EXPECT_EQ(p.active, total - p.mtp - 2 * 72);
}

// Writes `config` and one tensor per ExpectedTensors entry (value = index of
// the element, as f32) to `dir`, minus `drop`, plus `extra`, with `reshape`.
void WriteCheckpoint(
    const fs::path& dir, const ModelConfig& config,
    const std::set<std::string>& drop = {},
    const std::map<std::string, std::vector<int64_t>>& extra = {}) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.ToJson();
  std::map<std::string, std::vector<int64_t>> tensors = ExpectedTensors(config);
  for (const std::string& d : drop) tensors.erase(d);
  for (const auto& [name, shape] : extra) tensors[name] = shape;
  SafetensorsWriter w;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
    ASSERT_TRUE(w.Add(name, TensorDType::kF32, shape, F32Bytes(v)).ok());
  }
  ASSERT_TRUE(w.Write((dir / "model.safetensors").string()).ok());
}

using CheckpointTest = TempDir;

TEST_F(CheckpointTest, OpensValidCheckpoint) {
  const ModelConfig c = SmallConfig();
  WriteCheckpoint(dir_, c);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_TRUE((*ck)->config() == c);
  EXPECT_EQ((*ck)->dir(), dir_.string());
  const TensorInfo* t = (*ck)->Find("model.layers.0.self_attn.k_proj.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{4, 8}));
  absl::StatusOr<std::vector<float>> v =
      (*ck)->ReadF32("model.layers.0.self_attn.k_proj.weight", {4, 8});
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), 32u);
  EXPECT_EQ((*v)[31], 31.0f);
  EXPECT_TRUE((*ck)->ReadF32("model.norm.weight").ok());
  absl::StatusOr<std::vector<float>> wrong =
      (*ck)->ReadF32("model.norm.weight", {4});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(wrong.status()), HasSubstr("model.norm.weight"));
  absl::StatusOr<std::vector<float>> missing = (*ck)->ReadF32("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*ck)->Find("nope"), nullptr);
}

TEST_F(CheckpointTest, ReadF32WidensBf16AndF16) {
  for (const char* dtype : {"bfloat16", "float16"}) {
    const bool bf16 = std::string(dtype) == "bfloat16";
    const ModelConfig c = SmallConfig(false, dtype);
    const fs::path dir = dir_ / dtype;
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << c.ToJson();
    SafetensorsWriter w;
    for (const auto& [name, shape] : ExpectedTensors(c)) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<uint16_t> v(n);
      for (int64_t i = 0; i < n; ++i) {
        const float x = 0.1f * static_cast<float>(i) - 1.0f;
        v[i] = bf16 ? F32ToBf16(x) : F32ToF16(x);
      }
      ASSERT_TRUE(w.Add(name, bf16 ? TensorDType::kBF16 : TensorDType::kF16,
                        shape, U16Bytes(v))
                      .ok());
    }
    ASSERT_TRUE(w.Write((dir / "model.safetensors").string()).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
        Checkpoint::Open(dir.string());
    ASSERT_TRUE(ck.ok()) << ck.status();
    absl::StatusOr<std::vector<float>> v = (*ck)->ReadF32("lm_head.weight");
    ASSERT_TRUE(v.ok()) << v.status();
    for (size_t i = 0; i < v->size(); ++i) {
      const float x = 0.1f * static_cast<float>(i) - 1.0f;
      const float want = bf16 ? Bf16ToF32(F32ToBf16(x)) : F16ToF32(F32ToF16(x));
      ASSERT_EQ((*v)[i], want) << dtype << " " << i;
    }
  }
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
  WriteCheckpoint(dir_, SmallConfig(),
                  {"model.layers.2.mlp.experts.1.up_proj.weight"});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      Message(ck.status()),
      HasSubstr(
          "missing tensor \"model.layers.2.mlp.experts.1.up_proj.weight\""));
}

TEST_F(CheckpointTest, UnexpectedTensorIsNamedWithFile) {
  WriteCheckpoint(dir_, SmallConfig(), {},
                  {{"model.layers.0.self_attn.q_proj.bias", {8}}});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(
      Message(ck.status()),
      HasSubstr("unexpected tensor \"model.layers.0.self_attn.q_proj.bias\""));
  EXPECT_THAT(Message(ck.status()), HasSubstr("model.safetensors"));
}

// MiMo checkpoints call the MTP block's post-attention norm
// "pre_mlp_layernorm"; it loads under the canonical name.
TEST_F(CheckpointTest, AcceptsMimoMtpNormName) {
  const std::string canonical = "model.mtp.layers.0.post_attention_layernorm.weight";
  const std::string mimo = "model.mtp.layers.0.pre_mlp_layernorm.weight";
  WriteCheckpoint(dir_, SmallConfig(), {canonical}, {{mimo, {8}}});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  const TensorInfo* t = (*ck)->Find(canonical);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name, mimo);
  EXPECT_TRUE((*ck)->ReadF32(canonical, {8}).ok());

  // Both names at once: the alias is an unexpected tensor.
  const fs::path both = dir_ / "both";
  WriteCheckpoint(both, SmallConfig(), {}, {{mimo, {8}}});
  ck = Checkpoint::Open(both.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()), HasSubstr("unexpected tensor \"" + mimo + "\""));
}

TEST_F(CheckpointTest, TiedModelRejectsLmHead) {
  WriteCheckpoint(dir_, SmallConfig(/*tied=*/true), {},
                  {{"lm_head.weight", {16, 8}}});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()),
              HasSubstr("unexpected tensor \"lm_head.weight\""));
}

TEST_F(CheckpointTest, WrongShapeIsNamed) {
  WriteCheckpoint(dir_, SmallConfig(), {},
                  {{"model.layers.1.self_attn.k_proj.weight", {4, 8}}});
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(
      Message(ck.status()),
      HasSubstr("tensor \"model.layers.1.self_attn.k_proj.weight\" in "));
  EXPECT_THAT(Message(ck.status()),
              HasSubstr("has shape [4, 8], expected [8, 8]"));
}

TEST_F(CheckpointTest, ManyProblemsAreCounted) {
  std::set<std::string> drop;
  for (const auto& [name, shape] : ExpectedTensors(SmallConfig())) {
    if (name.find("experts") != std::string::npos) drop.insert(name);
  }
  WriteCheckpoint(dir_, SmallConfig(), drop);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()), HasSubstr("(12 problems)"));
  EXPECT_THAT(Message(ck.status()), HasSubstr("and 2 more"));
}

TEST_F(CheckpointTest, UnsupportedDTypeIsNamed) {
  const ModelConfig c = SmallConfig();
  WriteCheckpoint(dir_, c, {"model.norm.weight"});
  // Rewrite the file with model.norm.weight as I64 (valid safetensors).
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open((dir_ / "model.safetensors").string());
  ASSERT_TRUE(f.ok()) << f.status();
  Json header = Json::object();
  std::string data;
  for (const TensorInfo& t : (*f)->tensors()) {
    header[t.name] = {
        {"dtype", t.dtype_name},
        {"shape", t.shape},
        {"data_offsets", {data.size(), data.size() + t.end - t.begin}}};
    data.append(reinterpret_cast<const char*>(t.data), t.end - t.begin);
  }
  header["model.norm.weight"] = {
      {"dtype", "I64"},
      {"shape", {8}},
      {"data_offsets", {data.size(), data.size() + 64}}};
  data.append(64, '\0');
  f->reset();
  WriteRaw((dir_ / "model.safetensors").string(), Image(header.dump(), data));
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()),
              HasSubstr("tensor \"model.norm.weight\" in "));
  EXPECT_THAT(Message(ck.status()), HasSubstr("unsupported dtype \"I64\""));
}

TEST_F(CheckpointTest, MissingFiles) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> none =
      Checkpoint::Open((dir_ / "nope").string());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<Checkpoint>> no_config =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(no_config.ok());
  EXPECT_THAT(Message(no_config.status()), HasSubstr("config.json"));
  std::ofstream(dir_ / "config.json") << SmallConfig().ToJson();
  absl::StatusOr<std::unique_ptr<Checkpoint>> no_weights =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(no_weights.ok());
  EXPECT_EQ(no_weights.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(no_weights.status()), HasSubstr("model.safetensors"));
}

TEST_F(CheckpointTest, BadConfigIsReported) {
  WriteCheckpoint(dir_, SmallConfig());
  std::ofstream(dir_ / "config.json") << R"({"vocab_size": 16})";
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()), HasSubstr("hidden_size"));
}

// Splits the tensors of a valid checkpoint into two shards + an index.
class ShardedTest : public TempDir {
 protected:
  void SetUp() override {
    TempDir::SetUp();
    config_ = SmallConfig();
    std::ofstream(dir_ / "config.json") << config_.ToJson();
    SafetensorsWriter w1, w2;
    int i = 0;
    for (const auto& [name, shape] : ExpectedTensors(config_)) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> v(n, static_cast<float>(i));
      const std::string file = i % 2 == 0 ? "model-00001-of-00002.safetensors"
                                          : "model-00002-of-00002.safetensors";
      ASSERT_TRUE((i % 2 == 0 ? w1 : w2)
                      .Add(name, TensorDType::kF32, shape, F32Bytes(v))
                      .ok());
      index_["weight_map"][name] = file;
      ++i;
    }
    index_["metadata"] = {{"total_size", 0}};
    ASSERT_TRUE(w1.Write(Path("model-00001-of-00002.safetensors")).ok());
    ASSERT_TRUE(w2.Write(Path("model-00002-of-00002.safetensors")).ok());
  }
  void WriteIndex() {
    std::ofstream(dir_ / "model.safetensors.index.json") << index_.dump(2);
  }
  ModelConfig config_;
  Json index_;
};

TEST_F(ShardedTest, OpensThroughIndex) {
  WriteIndex();
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  int i = 0;
  for (const auto& [name, shape] : ExpectedTensors(config_)) {
    absl::StatusOr<std::vector<float>> v = (*ck)->ReadF32(name, shape);
    ASSERT_TRUE(v.ok()) << name << ": " << v.status();
    if (!v->empty()) {
      EXPECT_EQ((*v)[0], static_cast<float>(i)) << name;
    }
    ++i;
  }
}

TEST_F(ShardedTest, MissingShardIsNamed) {
  WriteIndex();
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()),
              HasSubstr("\"model-00002-of-00002.safetensors\""));
  EXPECT_THAT(Message(ck.status()), HasSubstr("does not exist"));
}

TEST_F(ShardedTest, TensorInTwoFiles) {
  // A tensor of shard 2 written into shard 1 as well.
  const std::string name = "model.norm.weight";
  const std::string in_shard = index_["weight_map"][name];
  const std::string other = in_shard == "model-00001-of-00002.safetensors"
                                ? "model-00002-of-00002.safetensors"
                                : "model-00001-of-00002.safetensors";
  SafetensorsWriter w;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(Path(other));
  ASSERT_TRUE(f.ok());
  for (const TensorInfo& t : (*f)->tensors()) {
    ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape,
                      std::string(reinterpret_cast<const char*>(t.data),
                                  t.end - t.begin))
                    .ok());
  }
  ASSERT_TRUE(
      w.Add(name, TensorDType::kF32, {8}, F32Bytes(std::vector<float>(8, 1)))
          .ok());
  f->reset();
  ASSERT_TRUE(w.Write(Path(other)).ok());
  WriteIndex();
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()),
              HasSubstr("\"model.norm.weight\" is in two files"));
}

TEST_F(ShardedTest, IndexPointsToWrongShard) {
  const std::string name = "model.norm.weight";
  const std::string in_shard = index_["weight_map"][name];
  index_["weight_map"][name] = in_shard == "model-00001-of-00002.safetensors"
                                   ? "model-00002-of-00002.safetensors"
                                   : "model-00001-of-00002.safetensors";
  WriteIndex();
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()), HasSubstr("\"model.norm.weight\""));
  EXPECT_THAT(Message(ck.status()), HasSubstr("does not hold it"));
}

TEST_F(ShardedTest, TensorMissingFromIndex) {
  index_["weight_map"].erase("model.norm.weight");
  WriteIndex();
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
      Checkpoint::Open(dir_.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(Message(ck.status()),
              HasSubstr("\"model.norm.weight\" is not listed"));
}

TEST_F(ShardedTest, RejectsBadIndex) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not a JSON object"},
      {"[]", "not a JSON object"},
      {R"({"metadata": {}})", "weight_map"},
      {R"({"weight_map": {}})", "empty weight_map"},
      {R"({"weight_map": {"a": 1}})", "not a file name"},
      {R"({"weight_map": {"a": "../x.safetensors"}})", "not a plain file name"},
      {R"({"weight_map": {"a": "/etc/passwd"}})", "not a plain file name"},
  };
  for (const auto& [text, want] : cases) {
    std::ofstream(dir_ / "model.safetensors.index.json") << text;
    absl::StatusOr<std::unique_ptr<Checkpoint>> ck =
        Checkpoint::Open(dir_.string());
    ASSERT_FALSE(ck.ok()) << text;
    EXPECT_THAT(Message(ck.status()), HasSubstr(want)) << text;
    EXPECT_THAT(Message(ck.status()), HasSubstr("model.safetensors.index.json"))
        << text;
  }
}

}  // namespace
}  // namespace swaserve::model
