// The GGUF writer and reader (lib/model/gguf.h): what is written reads back
// (metadata of every type, tensor names, shapes, bytes, alignment), and
// malformed input is an error naming what is wrong, never a crash.
#include "lib/model/gguf.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swaserve::model {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/gguf_test_", ::getpid(), "_", name);
}

GgufWriter Sample() {
  GgufWriter w;
  EXPECT_TRUE(w.AddMetadata("general.architecture", GgufValue::Str("mimo2")).ok());
  EXPECT_TRUE(w.AddMetadata("mimo2.block_count", GgufValue::U32(7)).ok());
  EXPECT_TRUE(w.AddMetadata("mimo2.rope.freq_base", GgufValue::F32(5e6f)).ok());
  EXPECT_TRUE(w.AddMetadata("flag", GgufValue::Bool(true)).ok());
  EXPECT_TRUE(w.AddMetadata("pattern", GgufValue::I32Array({1, 0, -3})).ok());
  EXPECT_TRUE(w.AddMetadata("floats", GgufValue::F32Array({0.5f, -2.0f})).ok());
  EXPECT_TRUE(w.AddMetadata("tokens", GgufValue::StrArray({"a", "", "Ġb"})).ok());
  EXPECT_TRUE(w.AddTensor("t.f32", GgmlType::kF32, {3, 2},
                          [](absl::Span<uint8_t> out) {
                            for (size_t i = 0; i < out.size(); ++i) out[i] = i;
                            return absl::OkStatus();
                          })
                  .ok());
  EXPECT_TRUE(w.AddTensor("t.bf16", GgmlType::kBF16, {5},
                          [](absl::Span<uint8_t> out) {
                            for (size_t i = 0; i < out.size(); ++i) out[i] = 100 + i;
                            return absl::OkStatus();
                          })
                  .ok());
  return w;
}

TEST(Gguf, WhatIsWrittenReadsBack) {
  const std::string path = TempPath("roundtrip.gguf");
  ASSERT_TRUE(Sample().Write(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> f = ReadGgufFile(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufContents& c = (*f)->contents;
  EXPECT_EQ(c.version, 3u);
  ASSERT_EQ(c.metadata.size(), 7u);
  EXPECT_EQ(c.metadata[0].first, "general.architecture");
  EXPECT_EQ(*c.Find("general.architecture"), GgufValue::Str("mimo2"));
  EXPECT_EQ(*c.Find("mimo2.block_count"), GgufValue::U32(7));
  EXPECT_EQ(*c.Find("mimo2.rope.freq_base"), GgufValue::F32(5e6f));
  EXPECT_EQ(*c.Find("flag"), GgufValue::Bool(true));
  EXPECT_EQ(*c.Find("pattern"), GgufValue::I32Array({1, 0, -3}));
  EXPECT_EQ(*c.Find("floats"), GgufValue::F32Array({0.5f, -2.0f}));
  EXPECT_EQ(*c.Find("tokens"), GgufValue::StrArray({"a", "", "Ġb"}));
  ASSERT_EQ(c.tensors.size(), 2u);
  const GgufTensorInfo* a = c.FindTensor("t.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ne, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a->type, GgmlType::kF32);
  ASSERT_EQ(a->data.size(), 24u);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(static_cast<uint8_t>(a->data[i]), i);
  const GgufTensorInfo* b = c.FindTensor("t.bf16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->offset % 32, 0u);
  EXPECT_EQ(b->offset, 32u);  // 24 bytes padded to the alignment
  ASSERT_EQ(b->data.size(), 10u);
  EXPECT_EQ(static_cast<uint8_t>(b->data[9]), 109);
  // Data starts aligned in the file.
  EXPECT_EQ((a->data.data() - (*f)->bytes.data()) % 32, 0);
  std::filesystem::remove(path);
}

TEST(Gguf, WriterRejectsDuplicatesAndBadShapes) {
  GgufWriter w;
  ASSERT_TRUE(w.AddMetadata("k", GgufValue::U32(1)).ok());
  EXPECT_THAT(std::string(w.AddMetadata("k", GgufValue::U32(2)).message()), HasSubstr("'k'"));
  GgufValue bad = GgufValue::U32(1);
  bad.floats.push_back(1.0);
  EXPECT_FALSE(w.AddMetadata("bad", bad).ok());
  auto fill = [](absl::Span<uint8_t>) { return absl::OkStatus(); };
  ASSERT_TRUE(w.AddTensor("x", GgmlType::kF32, {2}, fill).ok());
  EXPECT_FALSE(w.AddTensor("x", GgmlType::kF32, {2}, fill).ok());
  EXPECT_FALSE(w.AddTensor("y", GgmlType::kF32, {0}, fill).ok());
  EXPECT_FALSE(w.AddTensor("z", GgmlType::kF32, {1, 1, 1, 1, 1}, fill).ok());
}

TEST(Gguf, AFailedFillAbortsTheWriteNamingTheTensor) {
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("broken", GgmlType::kF32, {4}, [](absl::Span<uint8_t>) {
                 return absl::InvalidArgumentError("no data");
               }).ok());
  const std::string path = TempPath("failed.gguf");
  const absl::Status s = w.Write(path);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'broken'"));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

std::string SampleBytes() {
  const std::string path = TempPath("sample.gguf");
  EXPECT_TRUE(Sample().Write(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> f = ReadGgufFile(path);
  std::filesystem::remove(path);
  return (*f)->bytes;
}

void ExpectError(const std::string& bytes, const std::string& what) {
  absl::StatusOr<GgufContents> c = ParseGguf(bytes);
  ASSERT_FALSE(c.ok()) << what;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(what));
}

TEST(Gguf, MalformedInputIsANamedError) {
  const std::string good = SampleBytes();
  ASSERT_TRUE(ParseGguf(good).ok());
  // Every truncation is an error, never a read past the end (the last 22
  // bytes are the padding after the last tensor's 10 bytes, not needed).
  for (size_t n = 0; n < good.size() - 22; n += 3) {
    EXPECT_FALSE(ParseGguf(good.substr(0, n)).ok()) << n;
  }
  std::string b = good;
  b[0] = 'X';
  ExpectError(b, "magic");
  b = good;
  b[4] = 9;
  ExpectError(b, "version 9");
  // A tensor count no input could hold.
  b = good;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(b.data() + 8, &huge, 8);
  ExpectError(b, "exceed the limits");
  // A string whose length runs past the end.
  b = good;
  const uint64_t long_len = b.size();
  std::memcpy(b.data() + 24, &long_len, 8);  // the first key's length
  ExpectError(b, "metadata #0 key");
  // An unknown value type.
  b = good;
  const size_t type_at = 24 + 8 + std::strlen("general.architecture");
  b[type_at] = 99;
  ExpectError(b, "unknown value type 99");
}

TEST(Gguf, OutOfRangeTensorDataIsRejected) {
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("t", GgmlType::kF32, {8}, [](absl::Span<uint8_t>) {
                 return absl::OkStatus();
               }).ok());
  const std::string path = TempPath("range.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  std::string bytes = (*ReadGgufFile(path))->bytes;
  std::filesystem::remove(path);
  // The data section holds 32 bytes; cut it to 16.
  ExpectError(bytes.substr(0, bytes.size() - 16), "runs past the data section");
  // Point the offset at an unaligned place.
  const size_t offset_at = 24 + 8 + 1 + 4 + 8 + 4;
  ASSERT_LT(offset_at + 8, bytes.size());
  const uint64_t off = 4;
  std::memcpy(bytes.data() + offset_at, &off, 8);
  ExpectError(bytes, "unaligned");
}

}  // namespace
}  // namespace swaserve::model
