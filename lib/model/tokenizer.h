// Hugging Face `tokenizer.json` byte-level BPE tokenizer (Qwen2/Qwen3, MiMo,
// GPT-2, Llama-3 style), what the router uses to turn prompts into token ids
// and the workers use to turn ids back into text.
//
// Encode runs the HF pipeline:
//   1. added tokens are cut out first (leftmost-longest match; honouring
//      lstrip/rstrip/single_word). Special ones (`"special": true`, e.g.
//      <|im_start|>) only when `parse_special` is true; non-special added
//      tokens (e.g. <think>, <tool_call>) are always matched, as HF does;
//   2. each remaining piece is normalized (NFC or none);
//   3. added tokens marked `"normalized": true` are cut out of it;
//   4. pre-tokenized: the `Split` regexes (behavior "Isolated") and/or
//      ByteLevel (its GPT-2 regex when use_regex, add_prefix_space), then each
//      pre-token's bytes are mapped through GPT-2's bytes_to_unicode;
//   5. BPE: the adjacent pair with the lowest merge rank (leftmost on ties) is
//      merged until none is left. A byte whose byte-level character has no
//      token becomes the byte token "<0xHH>" when `byte_fallback` (decoded
//      back to that byte), else `unk_token` (consecutive ones fused when
//      `fuse_unk`), else is dropped, as HF drops it. (HF's byte fallback
//      would emit the UTF-8 bytes of the byte-level character instead; no
//      byte-level model relies on that, and this way text round-trips.)
// Encode never adds BOS/EOS: the post-processor is ignored (for Qwen it adds
// nothing); chat prompts get their control tokens from the chat template.
//
// Supported tokenizer.json: model.type "BPE" with merges as "a b" strings or
// ["a", "b"] pairs; normalizer null, NFC (or a Sequence of those);
// pre_tokenizer ByteLevel, Split (Regex or String pattern, behavior
// "Isolated", invert false) or a Sequence of them that includes ByteLevel;
// decoder null, ByteLevel (or a Sequence of ByteLevel/ByteFallback/Fuse).
// Anything else is rejected at load with Unimplemented naming it, so a model
// is never silently tokenized wrongly. The Qwen and Llama-3 split regexes run
// on a hand-written scanner, other regexes on PCRE2.
//
// Unicode: character classes and NFC follow Oniguruma/HF semantics with
// utf8proc's Unicode tables (lib/model/unicode.h). Known differences from the
// JavaScript port (transformers.js): U+0085 is whitespace here and U+FEFF is
// not; "'ſ" matches the (?i:'s) contraction here.
//
// Decode concatenates the tokens' bytes (added tokens' content verbatim) and
// repairs ill-formed UTF-8 with U+FFFD, so its result is always valid UTF-8;
// ids outside the vocabulary are skipped. StreamingDecoder
// (streaming_decoder.h, included here) emits text incrementally without ever
// splitting a character.
//
// Thread-safety: a Tokenizer is immutable after creation except for per-thread
// (thread_local) caches of per-word BPE results; all const methods may be
// called concurrently from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/model/streaming_decoder.h"

namespace swaserve::model {

struct TokenizerOptions {
  // Entries in the cache of BPE results per pre-token (words up to 128
  // bytes). Each thread that encodes keeps its own cache (lock-free lookups),
  // so the memory bound is per thread: about 64 bytes per entry plus the
  // word. 0 disables caching. Default: 16384 (about 1.5 MB per thread).
  size_t word_cache_entries = 16384;
};

class Tokenizer {
 public:
  // Reads and parses a tokenizer.json file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(
      const std::string& tokenizer_json_path,
      const TokenizerOptions& options = {});
  // Parses tokenizer.json content.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view json, const TokenizerOptions& options = {});

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. InvalidArgument when `text` is not valid UTF-8.
  // With parse_special = false, special tokens' text (e.g. "<|im_end|>" typed
  // by a user) is tokenized as ordinary text.
  absl::StatusOr<std::vector<uint32_t>> Encode(absl::string_view text,
                                               bool parse_special = true) const;
  // The same, appending to `*ids` (left unchanged on error).
  absl::Status EncodeAppend(absl::string_view text, bool parse_special,
                            std::vector<uint32_t>* ids) const;
  // Encode(text, parse_special = true), except that a special token is
  // matched only where it overlaps none of the `literal` byte ranges of
  // `text` (sorted, disjoint, non-empty): there its text is ordinary text.
  // What the chat template encoder uses so that the template's control
  // tokens are special and message contents cannot inject any. Appends to
  // `*ids` (unchanged on error); InvalidArgument for bad ranges or text that
  // is not UTF-8.
  absl::Status EncodeAppendWithLiterals(
      absl::string_view text,
      absl::Span<const std::pair<size_t, size_t>> literal,
      std::vector<uint32_t>* ids) const;

  // Text of `ids`: valid UTF-8 (ill-formed byte sequences become U+FFFD);
  // unknown ids are skipped, special tokens skipped when asked.
  std::string Decode(absl::Span<const uint32_t> ids,
                     bool skip_special_tokens = false) const;

  // The raw bytes token `id` stands for (for byte-level tokens possibly a
  // fragment of a UTF-8 character); empty for unknown ids. Valid for the
  // tokenizer's lifetime.
  absl::string_view TokenBytes(uint32_t id) const;

  // One past the largest id (vocabulary and added tokens).
  int vocab_size() const;

  // The id of a token by its vocabulary spelling (byte-level form, e.g.
  // "Ġhello" for " hello") or an added token's content ("<|im_end|>").
  std::optional<uint32_t> TokenId(absl::string_view token) const;
  // The vocabulary spelling / added-token content of `id`.
  std::optional<std::string> TokenString(uint32_t id) const;

  bool IsSpecial(uint32_t id) const;  // an added token with special = true
  bool IsAddedToken(uint32_t id) const;
  // All special ids, ascending.
  std::vector<uint32_t> SpecialIds() const;

  // Named control tokens of the Qwen/MiMo ChatML family (nullopt when the
  // vocabulary lacks them).
  std::optional<uint32_t> im_start_id() const;   // <|im_start|>
  std::optional<uint32_t> im_end_id() const;     // <|im_end|>
  std::optional<uint32_t> endoftext_id() const;  // <|endoftext|>
  // Ids that end generation: <|im_end|> and <|endoftext|> where present (the
  // eos_token_id list of Qwen3's generation_config), ascending.
  const std::vector<uint32_t>& eos_ids() const;

 private:
  // Defined in tokenizer_rep.h (internal); the implementation is spread over
  // tokenizer.cc, tokenizer_json.cc, tokenizer_pipeline.cc, tokenizer_bpe.cc.
  struct Rep;
  explicit Tokenizer(std::unique_ptr<Rep> rep);

  friend class StreamingDecoder;
  std::unique_ptr<Rep> rep_;
};

}  // namespace swaserve::model
