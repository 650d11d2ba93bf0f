// BPE tokenizer read from a GGUF vocabulary, producing the ids llama.cpp's llama_tokenize produces for the
// same file: special tokens matched in the text first, then per tokenizer.ggml.model
//   gpt2:   byte-level BPE; pre-tokenisation per tokenizer.ggml.pre (pretokenizer.h), rank-ordered merges per piece;
//   gemma4: spaces written as U+2581, the text split into newline runs and the rest, rank-ordered merges of
//           UTF-8 characters per piece, characters without a token as <0xXX> byte tokens, BOS always added.
// Also the detokenizer (ids -> bytes, as llama_detokenize) and the special ids the samplers need.
// No Unicode normalisation is applied (llama.cpp applies none; the Qwen tokenizer.json's NFC is not
// reproduced, so non-NFC text can get other ids than in training: tests/data/tokenizer/README.md).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/printable.h"
#include "model/gguf.h"

namespace dllm::model {

// Token attributes, a bit set as llama.cpp derives it from tokenizer.ggml.token_type.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
};

struct DetokenizeOptions {
  bool remove_special = false;   // drop a leading BOS / trailing EOS when the vocabulary adds them
  bool unparse_special = true;   // render control tokens as their text (false: as nothing)
  bool clean_spaces = true;      // apply the vocabulary's clean_up_tokenization_spaces, if it has it
};

// tokenizer.ggml.model values dllm reads.
enum class TokenizerModel {
  Gpt2,    // byte-level BPE (LLaDA, Dream, LLaDA-MoE, RND1)
  Gemma4,  // BPE over `▁`-escaped UTF-8 with byte fallback (DiffusionGemma)
};

class Tokenizer {
 public:
  // Reads and validates tokens (tokenizer.ggml.model gpt2 or gemma4), token types, merges, pre-tokenizer and special ids. Throws dllm::Error
  // naming the key at fault (unknown model or pre-tokenizer, duplicate token, merge naming an unknown
  // token, special id out of range, ...).
  explicit Tokenizer(const gguf::File& file);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> ids, as llama_tokenize(text, add_special, parse_special). parse_special: control tokens
  // written in the text become their ids (user-defined tokens are matched either way). add_special:
  // BOS / EOS as the vocabulary's add_bos_token / add_eos_token say. Invalid UTF-8 is read the way
  // llama.cpp reads it (each bad byte as U+FFFD). Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true, bool add_special = false) const;

  // Ids -> bytes with control tokens rendered as text: llama_detokenize(remove_special=false,
  // unparse_special=true). The bytes may end inside a UTF-8 sequence (see utf8_complete_prefix).
  std::string decode(std::span<const int32_t> ids) const;
  std::string detokenize(std::span<const int32_t> ids, const DetokenizeOptions& opt) const;

  // The bytes one token stands for (control tokens as their text, unused tokens as nothing).
  const std::string& token_piece(int32_t id) const;
  // The vocabulary string of a token (byte-level alphabet, e.g. "Ġthe").
  const std::string& token_text(int32_t id) const;
  // Id of a vocabulary string; -1 when absent.
  int32_t token_id(std::string_view text) const;
  uint32_t token_attr(int32_t id) const;
  bool is_control(int32_t id) const { return (token_attr(id) & kAttrControl) != 0; }
  bool is_user_defined(int32_t id) const { return (token_attr(id) & kAttrUserDefined) != 0; }
  bool is_unused(int32_t id) const { return (token_attr(id) & kAttrUnused) != 0; }

  TokenizerModel model() const { return model_; }
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  size_t n_merges() const;

  // Special ids, -1 when the vocabulary has none. eot: tokenizer.ggml.eot_token_id, else the token
  // "<|eot_id|>", else "<|im_end|>", else (gemma4) "<turn|>" (a fixed order, unlike llama.cpp's hash-order guess).
  int32_t bos() const { return bos_; }
  // The tokens that end generation: eos, eot, and for gemma4 the tokens "<eos>", "<turn|>" and "<|tool_response>"
  // found by their text, as llama.cpp's loader finds them (no duplicates; eos first).
  const std::vector<int32_t>& eog() const { return eog_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t mask() const { return mask_; }
  int32_t pad() const { return pad_; }
  int32_t unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool ignore_merges() const { return ignore_merges_; }
  bool clean_spaces() const { return clean_spaces_; }
  const std::string& pre() const { return pre_name_; }
  // The file's tokenizer.chat_template (a Jinja template; empty when the file has none).
  const std::string& chat_template() const { return chat_template_; }

 private:
  struct Token {
    std::string text;   // vocabulary string
    std::string piece;  // bytes (llama_token_to_piece with special = true)
    uint32_t attr = kAttrNormal;
  };
  struct Impl;

  void load_tokens(const gguf::File& file);
  void load_merges(const gguf::File& file);
  void load_specials(const gguf::File& file);
  void encode_fragment(std::string_view text, std::vector<int32_t>* out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;
  void check_id(int32_t id) const;

  TokenizerModel model_ = TokenizerModel::Gpt2;
  std::vector<Token> tokens_;
  std::vector<int32_t> eog_;
  std::string pre_name_;
  std::string chat_template_;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, mask_ = -1, pad_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false, ignore_merges_ = false, clean_spaces_ = false;
  std::unique_ptr<Impl> impl_;
};

using dllm::utf8_complete_prefix;  // common/utf8.h: what of a growing text can be shown now

}  // namespace dllm::model
