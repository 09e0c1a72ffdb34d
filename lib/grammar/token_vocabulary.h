// TokenVocabulary: a model's vocabulary as the grammar engine sees it — the
// bytes each token id stands for, which ids end generation (EOS), and a byte
// trie of every token the grammar may choose.
//
// Built from a model::Tokenizer (byte-level BPE): an ordinary token's bytes
// are its decoded bytes (possibly a fragment of a UTF-8 character); a
// non-special added token (Qwen3's <tool_call>, <think>) stands for its
// content, so a grammar that spells "<tool_call>" lets the model write it as
// one token or as pieces; special tokens (`"special": true`: <|im_start|>,
// <|im_end|>, <|endoftext|>, vision pads) are never allowed as text. The EOS
// ids (Tokenizer::eos_ids(), or the ones given) are allowed only where the
// grammar accepts. Ids with no bytes (gaps in the id space, empty tokens) are
// never allowed.
//
// The trie is stored in preorder (TokenTrie below): a mask walk visits a
// node, and skips its whole subtree in one step when the grammar rejects the
// node's byte — the walk costs the number of trie nodes whose prefix the
// grammar allows, not the vocabulary size times the token length.
//
// Thread-safety: immutable after construction; share it between grammars and
// threads through std::shared_ptr<const TokenVocabulary>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace swaserve::model {
class Tokenizer;
}  // namespace swaserve::model

namespace swaserve::grammar {

// The vocabulary's tokens in a byte trie, preorder. Node i (0-based; the root
// is implicit) has `byte[i]`, `depth[i]` (1 for the first byte of a token),
// `subtree_end[i]` (one past its last descendant: the next node to visit
// when node i is rejected) and the token ids whose bytes end at it:
// `token_ids[token_begin[i] .. token_begin[i + 1])`.
struct TokenTrie {
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<uint32_t> subtree_end;
  std::vector<uint32_t> token_begin;  // size nodes + 1
  std::vector<uint32_t> token_ids;
  // Per node: when every token below it (the node included), read from the
  // node's byte on, is a well-formed UTF-8 prefix of characters that a JSON
  // string holds unescaped (U+0020..U+10FFFF but '"', '\\', DEL and
  // surrogates; a token may end inside a character), the most characters
  // any of them spans from the node (a partial one counts; at most 255);
  // else 0. The tokens of node i's subtree are
  // token_ids[token_begin[i] .. token_begin[subtree_end[i]]).
  std::vector<uint8_t> plain_chars;
  int max_depth = 0;

  size_t num_nodes() const { return byte.size(); }
};

struct TokenVocabularyOptions {
  // Ids that end generation; allowed only where the grammar accepts. Empty:
  // the tokenizer's eos_ids() (<|im_end|> and <|endoftext|> for the Qwen
  // family).
  std::vector<uint32_t> eos_ids;
  // Let non-special added tokens (e.g. <tool_call>, <think>) stand for their
  // content. Default true: the model writes "<tool_call>" as that token.
  bool allow_added_tokens = true;
};

class TokenVocabulary {
 public:
  // From a tokenizer (see the file comment for which ids are text).
  static absl::StatusOr<std::shared_ptr<const TokenVocabulary>> FromTokenizer(
      const model::Tokenizer& tokenizer,
      const TokenVocabularyOptions& options = {});
  // From explicit bytes per id (tests, fuzzing): token i stands for
  // `token_bytes[i]`; an empty string is an id the grammar never allows.
  // InvalidArgument when an EOS id is out of range or the vocabulary is empty.
  static absl::StatusOr<std::shared_ptr<const TokenVocabulary>> FromBytes(
      std::vector<std::string> token_bytes, std::vector<uint32_t> eos_ids);

  // Number of ids (masks have one bit per id: BitmaskWords() words).
  int size() const { return static_cast<int>(bytes_.size()); }
  // 32-bit words in a token bitmask: ceil(size() / 32).
  int BitmaskWords() const { return (size() + 31) / 32; }
  // The bytes id stands for; empty for ids never allowed as text (special,
  // EOS, unknown).
  absl::string_view TokenBytes(uint32_t id) const;
  bool IsEos(uint32_t id) const;
  const std::vector<uint32_t>& eos_ids() const { return eos_ids_; }
  const TokenTrie& trie() const { return trie_; }
  // A digest of the ids' bytes and the EOS ids: grammar caches key on it.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  TokenVocabulary() = default;
  void BuildTrie();
  void ComputePlainChars();

  std::vector<std::string> bytes_;
  std::vector<uint32_t> eos_ids_;
  std::vector<bool> is_eos_;
  TokenTrie trie_;
  uint64_t fingerprint_ = 0;
};

}  // namespace swaserve::grammar
