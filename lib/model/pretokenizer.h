// Pre-tokenizer splitters for the byte-level BPE tokenizer (internal to
// swaserve::model_text): the HF `Split` pre-tokenizer with behavior
// "Isolated", i.e. the text is cut into the regex's matches and the gaps
// between them, in order, each kept as a piece.
//
// Two implementations:
//   - ScannerSplitter: a hand-written scanner, exact for the Qwen2/Qwen3
//     pattern (kQwenPattern) and for the Llama-3 pattern, which differs only in
//     \p{N}{1,3}. About 10x faster than a regex engine and independent of
//     regex-engine differences.
//   - Pcre2Splitter: any other pattern, through PCRE2 (UTF + UCP, JIT when
//     available). PCRE2's \s in UCP mode does not match U+0085, unlike
//     Oniguruma (HF's engine); everything else of the common patterns agrees.
// Character classes follow lib/model/unicode.h (Oniguruma's definitions).
//
// Splitters are immutable after creation and safe to use from many threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace swaserve::model {

// The pre-tokenizer regex of Qwen2/Qwen2.5/Qwen3 (and MiMo) tokenizer.json.
inline constexpr absl::string_view kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama-3's pattern: the same with \p{N}{1,3}.
inline constexpr absl::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// The GPT-2 pattern that ByteLevel(use_regex = true) applies.
inline constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Splitter {
 public:
  virtual ~Splitter() = default;

  // Calls `piece` with consecutive non-empty pieces that together cover
  // `text` (valid UTF-8). Errors only when the regex engine fails (e.g. a
  // PCRE2 resource limit); the scanner never fails.
  virtual absl::Status Split(
      absl::string_view text,
      absl::FunctionRef<void(absl::string_view)> piece) const = 0;
};

// The hand-written scanner for kQwenPattern (max_digits = 1) or
// kLlama3Pattern (max_digits = 3).
std::unique_ptr<Splitter> NewScannerSplitter(int max_digits);

// A PCRE2 splitter for `pattern` (HF/Oniguruma syntax; compiled with
// PCRE2_UTF | PCRE2_UCP), or for the literal string `pattern` when
// `literal` is true. InvalidArgument when the pattern does not compile.
absl::StatusOr<std::unique_ptr<Splitter>> NewPcre2Splitter(
    absl::string_view pattern, bool literal);

// The fastest exact splitter for `pattern`: the scanner for kQwenPattern and
// kLlama3Pattern, PCRE2 otherwise.
absl::StatusOr<std::unique_ptr<Splitter>> NewRegexSplitter(
    absl::string_view pattern);

}  // namespace swaserve::model
