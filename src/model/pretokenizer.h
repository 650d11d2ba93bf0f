// Pre-tokenisation for byte-level BPE vocabularies: splits a text fragment into the pieces that BPE
// merges never cross, with the same splitting as llama.cpp's regular expressions for each
// `tokenizer.ggml.pre` name. The Unicode work (general categories \p{L} \p{N}) is done by PCRE2
// (UTF + UCP, JIT); pretokenizer.cpp adapts llama.cpp's patterns to it.
#pragma once
#include "common/utf8.h"
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dllm::model {

enum class PreTokenizerKind {
  Gpt2,        // gpt-2: 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Llama3,      // llama-bpe: digits in groups of 1-3, contractions in any case, ignore_merges
  Qwen2,       // qwen2: as llama3 but every digit alone
  BailingMoe,  // bailingmoe (LLaDA): as qwen2 but a single newline per piece (\s*[\r\n])
};

// What a tokenizer.ggml.pre name implies, as llama.cpp's vocabulary loader sets it.
struct PreTokenizerInfo {
  PreTokenizerKind kind = PreTokenizerKind::Gpt2;
  bool ignore_merges = false;    // a piece found whole in the vocabulary is emitted as that token
  bool add_bos_default = false;  // add BOS when tokenizer.ggml.add_bos_token is absent
  bool clean_spaces = false;     // detokenizer's clean_up_tokenization_spaces
};

// Looks up a tokenizer.ggml.pre value. Throws dllm::Error for a name dllm does not implement:
// "unknown pre-tokenizer 'x' (tokenizer.ggml.pre); supported: gpt-2, llama-bpe, qwen2, bailingmoe".
PreTokenizerInfo pre_tokenizer_info(std::string_view name);

// The names accepted by pre_tokenizer_info, for messages.
const char* supported_pre_tokenizers();

// The UTF-8 helpers the tokenizers use, from common/utf8.h (llama.cpp's lenient decoder, the encoder, validity).
using dllm::append_utf8;
using dllm::decode_utf8_lenient;
using dllm::is_valid_utf8;

class PreTokenizer {
 public:
  explicit PreTokenizer(PreTokenizerKind kind);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  PreTokenizerKind kind() const { return kind_; }

  // Splits one text fragment (special tokens already taken out) into pieces, appended to *pieces.
  // Well-formed UTF-8 is split in place (the pieces view `text`). Otherwise the text is first
  // decoded as llama.cpp does and re-encoded into *storage, and the pieces view *storage; so
  // *storage must outlive the pieces. Thread-safe.
  void split(std::string_view text, std::string* storage, std::vector<std::string_view>* pieces) const;

 private:
  void split_valid(std::string_view subject, std::string_view source, std::vector<std::string_view>* pieces) const;

  PreTokenizerKind kind_;
  struct Regex;
  std::unique_ptr<Regex> re_;
};

}  // namespace dllm::model
