#pragma once
// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (the Qwen2/Qwen3
// family): NFC normalizer, Split pre-tokenizer regex (PCRE2, Unicode properties),
// ByteLevel mapping, BPE merge ranks, added tokens matched before pre-tokenization.
// Produces the ids transformers produces; any tokenizer.json feature not implemented
// here is an error at load time, never an approximation.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;  // matched after normalization instead of on the raw text
};

// The tokenizer file `path` names as Tokenizer::load takes it: a folder's tokenizer.json, or the
// file itself.
std::filesystem::path tokenizer_json(const std::filesystem::path& path);

// transformers' file of the chat template beside tokenizer.json (read before tokenizer_config.json's
// chat_template where both are).
inline constexpr const char* kChatTemplateFile = "chat_template.jinja";

// The files of the tokenizer at `path` (as Tokenizer::load takes it: a folder, or its tokenizer.json):
// the tokenizer file and the tokenizer_config.json and chat_template.jinja beside it, those that
// exist. What an export ships and what the ranks of a job compare.
std::vector<std::filesystem::path> tokenizer_files(const std::filesystem::path& path);

class Tokenizer {
 public:
  // `path`: a folder holding tokenizer.json (and optionally tokenizer_config.json, which
  // supplies eos/pad/bos and add_bos_token/add_eos_token), or the tokenizer.json file.
  static Tokenizer load(const std::filesystem::path& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Thread-safe. Invalid UTF-8 is replaced by U+FFFD first. `add_special_tokens` adds
  // bos/eos as tokenizer_config.json asks (nothing for Qwen3); special tokens written
  // in the text are recognised either way, as transformers does.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Appends to `out` instead of returning a new vector.
  void encode_into(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens = false) const;

  // The bytes `id` stands for, as they are (a token may hold part of a multi-byte character):
  // encode(text)'s tokens' bytes, concatenated, are normalize(text).
  std::string_view token_bytes(int32_t id) const;
  // `text` as encode() tokenizes it: invalid UTF-8 replaced by U+FFFD, and the text between added
  // tokens through tokenizer.json's normalizer (NFC for Qwen3; unchanged without one).
  std::string normalize(std::string_view text) const;
  // Bytes of the tokens, invalid UTF-8 (a cut multi-byte character) replaced by U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // How much of `decoded` (the decode of some ids) the decode of more ids keeps as it is: what a
  // stream may print. All of it, but a character cut between tokens (a trailing U+FFFD, which the
  // next id may complete: then 0 more) and, where decode applies transformers' clean_up_tokenization
  // (tokenizer_config.json's clean_up_tokenization_spaces: " ." -> ".", " n't" -> "n't", ...), the
  // tail from the last space on, which the next ids may rewrite.
  size_t settled_length(std::string_view decoded) const;

  int32_t eos_id() const;  // tokenizer_config.json eos_token; -1 when none
  int32_t bos_id() const;  // -1 when none
  int32_t pad_id() const;  // -1 when none
  // The id that separates documents when packing: <|endoftext|> when the vocabulary has
  // it (the Qwen pre-training convention), else eos.
  int32_t document_separator_id() const;
  bool add_bos_token() const;
  bool add_eos_token() const;
  // The tokenizer_config.json read beside tokenizer.json; empty when there was none.
  const std::filesystem::path& config_path() const;
  // The tokenizer.json this was loaded from.
  const std::filesystem::path& source() const;

  int32_t vocab_size() const;  // largest id + 1, added tokens included
  bool has_id(int32_t id) const;  // an id decode() accepts (a vocabulary or added token)
  std::optional<int32_t> token_to_id(std::string_view token) const;  // vocab (byte-level form) or added
  std::string id_to_token(int32_t id) const;                         // byte-level form, as in tokenizer.json

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
