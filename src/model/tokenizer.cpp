// BPE tokenizer (see tokenizer.h). Behaviour follows llama.cpp's llama-vocab.cpp for tokenizer.ggml.model =
// gpt2 (byte-level: special-token partition, pre-tokenizer, BPE by merge rank with the leftmost pair first,
// ignore_merges, detokenizer with clean_up_tokenization_spaces) and gemma4 (the same partition and merges over
// raw UTF-8 characters of `▁`-escaped text split into newline runs and the rest, <0xXX> byte fallback).
#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "model/pretokenizer.h"
#include "common/printable.h"
#include "common/utf8.h"

namespace dllm::model {

namespace {

// ---- GPT-2's byte <-> character alphabet (bytes_to_unicode) -----------------------------------

struct ByteAlphabet {
  std::array<uint32_t, 256> byte_to_cpt{};
  std::array<int16_t, 324> cpt_to_byte{};  // code points 0..323 cover the whole alphabet
  std::array<std::string, 256> byte_to_utf8;

  ByteAlphabet() {
    cpt_to_byte.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) byte_to_cpt[b] = printable(b) ? uint32_t(b) : next++;
    for (int b = 0; b < 256; ++b) {
      cpt_to_byte[byte_to_cpt[b]] = static_cast<int16_t>(b);
      append_utf8(byte_to_cpt[b], &byte_to_utf8[b]);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

std::string byte_encode(std::string_view bytes) {
  const ByteAlphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += a.byte_to_utf8[static_cast<unsigned char>(c)];
  return out;
}

// llama_decode_text: vocabulary string (byte-level alphabet) -> bytes. A character outside the
// alphabet is written as "[UNK_BYTE_0x<hex>" + the whole token text + "]", as llama.cpp does.
std::string byte_decode(const std::string& text) {
  const ByteAlphabet& a = alphabet();
  std::string out;
  for (uint32_t c : decode_utf8_lenient(text)) {
    if (c < a.cpt_to_byte.size() && a.cpt_to_byte[c] >= 0) {
      out.push_back(static_cast<char>(a.cpt_to_byte[c]));
      continue;
    }
    std::string utf8;
    append_utf8(c, &utf8);
    static const char* hex = "0123456789abcdef";
    out += "[UNK_BYTE_0x";
    for (unsigned char u : utf8) {
      out.push_back(hex[u >> 4]);
      out.push_back(hex[u & 15]);
    }
    out += text + "]";
  }
  return out;
}

// U+2581 LOWER ONE EIGHTH BLOCK: gemma4 vocabularies write a space as this character.
constexpr std::string_view kEscapedSpace = "\xe2\x96\x81";

// gemma4: every space as U+2581 (llama_escape_whitespace).
std::string escape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  for (char c : text) {
    if (c == ' ') out += kEscapedSpace;
    else out.push_back(c);
  }
  return out;
}

// gemma4: every U+2581 back to a space (llama_unescape_whitespace), for the pieces of normal tokens.
std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kEscapedSpace.size(), kEscapedSpace) == 0) {
      out.push_back(' ');
      i += kEscapedSpace.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

// The vocabulary text of a byte token: "<0x0A>" (upper-case hex, as the SentencePiece-style vocabularies write it).
std::string byte_token_text(int b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

// gemma4's end-of-generation tokens, found by their text as llama.cpp's loader finds them (its EOG list), besides
// tokenizer.ggml.eos_token_id: the end of a turn and the start of a tool's answer (the model stops to wait for it).
constexpr std::string_view kGemma4EogTexts[] = {"<eos>", "<turn|>", "<|tool_response>"};

// Texts llama.cpp's loader turns into control tokens whatever their stored type (its end-of-generation
// and fill-in-the-middle lists), so that matching and detokenisation treat them the same way.
constexpr std::string_view kForcedControlTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[",
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "<|code_middle|>", "<|middle|>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
};

uint32_t attr_from_type(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;  // 0 = undefined, and anything llama.cpp does not know
  }
}

// Token text -> id, open addressing. A probe reads one slot (a hash and an id) and compares text only
// when the hashes agree, so loading 150k merges costs about one cache miss per lookup.
class TextIndex {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Slot{});
    texts_.reserve(n);
  }
  // Adds text -> id; returns the id already holding that text, or -1.
  int32_t insert(std::string_view text, int32_t id) {
    const uint32_t h = hash(text);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = {h, id};
        if (texts_.size() <= size_t(id)) texts_.resize(size_t(id) + 1);
        texts_[id] = text;
        return -1;
      }
      if (s.hash == h && texts_[s.id] == text) return s.id;
    }
  }
  int32_t find(std::string_view text) const {
    const uint32_t h = hash(text);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.hash == h && texts_[s.id] == text) return s.id;
    }
  }

 private:
  struct Slot {
    uint32_t hash = 0;
    int32_t id = -1;
  };
  static uint32_t hash(std::string_view t) {
    const size_t h = std::hash<std::string_view>{}(t);
    return static_cast<uint32_t>(h ^ (h >> 32));
  }
  std::vector<Slot> slots_;
  std::vector<std::string_view> texts_;  // views into the tokens' texts
};

constexpr size_t kCacheLimit = size_t(1) << 17;  // pieces kept in the BPE cache before it is cleared
constexpr size_t kCacheMaxPiece = 256;             // longer pieces (rare, long runs) are not cached

struct Merge {
  int32_t rank;
  int32_t result;
};

}  // namespace

// ---- state that is not part of the public shape ----------------------------------------------

// The longest special token (control, user-defined, unknown) a vocabulary may hold: each is looked for at every
// byte of a prompt. Real ones are under 100 bytes.
constexpr size_t kMaxSpecialTokenBytes = 1024;

struct Tokenizer::Impl {
  std::unique_ptr<PreTokenizer> pretok;
  TextIndex text_to_id;  // views into tokens_[i].text
  std::unordered_map<uint64_t, Merge> merges;                // (left id << 32 | right id) -> merge
  std::array<int32_t, 256> byte_token{};                     // token of each raw byte, -1 if none

  // Tokens matched in the text before pre-tokenisation (control, user-defined, unknown), in
  // llama.cpp's priority order: longer text first (ties: lower id). They are found in the text through their
  // ids sorted by text (4 bytes per token, nothing per byte: a trie node per byte took 100 bytes per byte), by
  // narrowing the range of texts that share the prefix read so far.
  std::vector<int32_t> special_by_text;
  std::vector<int32_t> special_priority;  // token id -> rank in the priority order (-1: not special)
  std::vector<int32_t> specials;          // rank -> token id
  std::array<bool, 256> special_first{};  // bytes that start some special token

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
};

// ---- loading ---------------------------------------------------------------------------------

Tokenizer::Tokenizer(const gguf::File& file) : impl_(std::make_unique<Impl>()) {
  const std::string_view model = file.get_string("tokenizer.ggml.model");
  if (model == "gpt2") {
    model_ = TokenizerModel::Gpt2;
    pre_name_ = std::string(file.get_string("tokenizer.ggml.pre"));
    const PreTokenizerInfo info = pre_tokenizer_info(pre_name_);
    ignore_merges_ = info.ignore_merges;
    add_bos_ = info.add_bos_default;
    clean_spaces_ = info.clean_spaces;
    impl_->pretok = std::make_unique<PreTokenizer>(info.kind);
  } else if (model == "gemma4") {
    // llama.cpp sets the pre-tokenizer of this model itself, whatever tokenizer.ggml.pre says (real files have
    // none): pieces are newline runs and the rest, no regex.
    model_ = TokenizerModel::Gemma4;
    pre_name_ = "gemma4";
    add_bos_ = true;
    clean_spaces_ = true;
  } else {
    throw Error("unsupported tokenizer model '" + shown(model) +
                "' (tokenizer.ggml.model); dllm supports gpt2 (byte-level BPE) and gemma4 (BPE over UTF-8 with "
                "byte fallback)");
  }

  load_tokens(file);
  load_merges(file);
  load_specials(file);
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::load_tokens(const gguf::File& file) {
  const std::vector<std::string_view> texts = file.get_string_array("tokenizer.ggml.tokens");
  if (texts.empty()) throw Error("tokenizer.ggml.tokens is empty");
  if (texts.size() > size_t(INT32_MAX)) throw Error("tokenizer.ggml.tokens has too many entries");
  const size_t n = texts.size();

  std::vector<int64_t> types;
  if (file.find("tokenizer.ggml.token_type")) {
    types = file.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n)
      throw Error("tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                  " entries, but tokenizer.ggml.tokens has " + std::to_string(n));
  }

  tokens_.resize(n);  // never resized again: text_to_id holds views into the texts
  impl_->text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Token& t = tokens_[i];
    t.text = texts[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : std::string(texts[i]);
    t.attr = types.empty() ? kAttrNormal : attr_from_type(types[i]);
    const int32_t other = impl_->text_to_id.insert(t.text, static_cast<int32_t>(i));
    if (other >= 0)
      throw Error("duplicate token in tokenizer.ggml.tokens: '" + shown(t.text) + "' has ids " +
                  std::to_string(other) + " and " + std::to_string(i));
  }
  for (std::string_view text : kForcedControlTexts) {
    const int32_t id = impl_->text_to_id.find(text);
    if (id >= 0) tokens_[id].attr |= kAttrControl;
  }
  for (Token& t : tokens_)
    if ((t.attr & kAttrControl) && t.text.find("unused") != std::string::npos) t.attr |= kAttrUnused;

  // Pieces: what llama_token_to_piece(special = true) returns.
  for (Token& t : tokens_) {
    if (t.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      t.piece = t.text;
    } else if (t.attr & kAttrNormal) {
      t.piece = model_ == TokenizerModel::Gemma4 ? unescape_spaces(t.text) : byte_decode(t.text);
    } else if (t.attr & kAttrByte) {  // "<0xXX>"
      if (t.text.size() >= 5) t.piece.assign(1, static_cast<char>(std::strtol(t.text.substr(3, 2).c_str(), nullptr, 16)));
    }
  }

  // The token of each byte: gpt2's byte alphabet character, gemma4's "<0xXX>" fallback token.
  const ByteAlphabet& a = alphabet();
  for (int b = 0; b < 256; ++b) {
    impl_->byte_token[b] = impl_->text_to_id.find(model_ == TokenizerModel::Gemma4 ? byte_token_text(b)
                                                                                   : a.byte_to_utf8[b]);
  }

  // Special-token matcher.
  std::vector<int32_t> specials;
  for (size_t i = 0; i < n; ++i)
    if (tokens_[i].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) specials.push_back(static_cast<int32_t>(i));
  std::stable_sort(specials.begin(), specials.end(),
                   [&](int32_t x, int32_t y) { return tokens_[x].text.size() > tokens_[y].text.size(); });
  impl_->special_priority.assign(n, -1);
  impl_->specials = specials;
  for (size_t r = 0; r < specials.size(); ++r) {
    const int32_t id = specials[r];
    const std::string& text = tokens_[id].text;
    // Matching costs up to a special token's length at every byte of a prompt: the length is bounded.
    if (text.size() > kMaxSpecialTokenBytes)
      throw Error("special token " + std::to_string(id) + " in tokenizer.ggml.tokens is " +
                  std::to_string(text.size()) + " bytes long (at most " + std::to_string(kMaxSpecialTokenBytes) +
                  "): '" + shown(text, 40) + "'");
    impl_->special_priority[id] = static_cast<int32_t>(r);
    impl_->special_first[static_cast<unsigned char>(text[0])] = true;
  }
  impl_->special_by_text = specials;
  std::sort(impl_->special_by_text.begin(), impl_->special_by_text.end(),
            [&](int32_t x, int32_t y) { return tokens_[x].text < tokens_[y].text; });
}

void Tokenizer::load_merges(const gguf::File& file) {
  const std::vector<std::string_view> merges = file.get_string_array("tokenizer.ggml.merges");
  impl_->merges.reserve(merges.size());
  auto find = [&](std::string_view s) { return impl_->text_to_id.find(s); };
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string_view m = merges[r];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    auto fail = [&](const std::string& why) {
      return Error("merge " + std::to_string(r) + " '" + shown(m) + "' in tokenizer.ggml.merges " + why);
    };
    if (sp == std::string_view::npos || sp + 1 >= m.size()) throw fail("is not two tokens separated by a space");
    const std::string_view left = m.substr(0, sp), right = m.substr(sp + 1);
    const int32_t l = find(left), rt = find(right);
    if (l < 0) throw fail("names unknown token '" + shown(left) + "'");
    if (rt < 0) throw fail("names unknown token '" + shown(right) + "'");
    joined.assign(left).append(right);
    const int32_t res = find(joined);
    if (res < 0) throw fail("makes '" + shown(joined) + "', which is not in tokenizer.ggml.tokens");
    impl_->merges.emplace(Impl::key(l, rt), Merge{static_cast<int32_t>(r), res});  // first rank wins
  }
}

void Tokenizer::load_specials(const gguf::File& file) {
  const int64_t n = n_vocab();
  auto read_id = [&](const char* key, int32_t* dst) {
    if (!file.find(key)) return;
    const uint64_t v = file.get_uint(key);
    if (v >= uint64_t(n))
      throw Error(std::string(key) + " = " + std::to_string(v) + " is out of range (the vocabulary has " +
                  std::to_string(n) + " tokens)");
    *dst = static_cast<int32_t>(v);
  };
  read_id("tokenizer.ggml.bos_token_id", &bos_);
  read_id("tokenizer.ggml.eos_token_id", &eos_);
  read_id("tokenizer.ggml.eot_token_id", &eot_);
  read_id("tokenizer.ggml.unknown_token_id", &unk_);
  read_id("tokenizer.ggml.padding_token_id", &pad_);
  read_id("tokenizer.ggml.mask_token_id", &mask_);
  if (eot_ < 0) eot_ = token_id("<|eot_id|>");
  if (eot_ < 0) eot_ = token_id("<|im_end|>");
  if (eot_ < 0 && model_ == TokenizerModel::Gemma4) eot_ = token_id("<turn|>");
  for (int32_t id : {eos_, eot_})
    if (id >= 0 && std::find(eog_.begin(), eog_.end(), id) == eog_.end()) eog_.push_back(id);
  if (model_ == TokenizerModel::Gemma4) {
    for (std::string_view text : kGemma4EogTexts) {
      const int32_t id = token_id(text);
      if (id >= 0 && std::find(eog_.begin(), eog_.end(), id) == eog_.end()) eog_.push_back(id);
    }
  }

  if (file.find("tokenizer.chat_template")) chat_template_ = std::string(file.get_string("tokenizer.chat_template"));
  if (file.find("tokenizer.ggml.add_bos_token")) add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token");
  if (file.find("tokenizer.ggml.add_eos_token")) add_eos_ = file.get_bool("tokenizer.ggml.add_eos_token");
  // llama.cpp adds BOS for gemma4 even where the file says add_bos_token = false (its "workaround for Gemma 4").
  if (model_ == TokenizerModel::Gemma4) add_bos_ = true;
  if (add_bos_ && bos_ < 0)
    throw Error("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
  if (add_eos_ && eos_ < 0)
    throw Error("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set");
}

// ---- lookups ---------------------------------------------------------------------------------

size_t Tokenizer::n_merges() const { return impl_->merges.size(); }

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    throw Error("token id " + std::to_string(id) + " is out of range (the vocabulary has " +
                std::to_string(n_vocab()) + " tokens)");
}

const std::string& Tokenizer::token_piece(int32_t id) const {
  check_id(id);
  return tokens_[id].piece;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return tokens_[id].text;
}

uint32_t Tokenizer::token_attr(int32_t id) const {
  check_id(id);
  return tokens_[id].attr;
}

int32_t Tokenizer::token_id(std::string_view text) const {
  return impl_->text_to_id.find(text);
}

// ---- encoding --------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(bos_);

  // 1. Special tokens, as llama.cpp's tokenizer_st_partition: each token in priority order takes its
  //    leftmost non-overlapping occurrences inside the text that earlier tokens left free.
  struct Hit {
    int32_t priority;
    size_t pos;
  };
  std::vector<Hit> hits;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t p = 0; p < text.size(); ++p) {
    if (!impl_->special_first[s[p]]) continue;
    // [lo, hi): the special tokens (sorted by text) whose first d bytes are text[p, p + d). A text of exactly
    // d bytes sorts first in that range: it occurs at p.
    const std::vector<int32_t>& sorted = impl_->special_by_text;
    auto lo = sorted.begin(), hi = sorted.end();
    for (size_t d = 0; lo != hi; ++d) {
      if (tokens_[*lo].text.size() == d) {
        const int32_t id = *lo++;
        if (parse_special || !(tokens_[id].attr & (kAttrControl | kAttrUnknown)))
          hits.push_back({impl_->special_priority[id], p});
      }
      if (p + d >= text.size()) break;
      const unsigned char c = s[p + d];
      auto byte_at = [&](int32_t id) { return static_cast<unsigned char>(tokens_[id].text[d]); };
      lo = std::lower_bound(lo, hi, c, [&](int32_t id, unsigned char v) { return byte_at(id) < v; });
      hi = std::upper_bound(lo, hi, c, [&](unsigned char v, int32_t id) { return v < byte_at(id); });
    }
  }

  struct Taken {
    size_t pos, len;
    int32_t id;
  };
  std::vector<Taken> taken;
  if (!hits.empty()) {
    std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) {
      return a.priority != b.priority ? a.priority < b.priority : a.pos < b.pos;
    });
    std::vector<uint8_t> used(text.size(), 0);
    size_t i = 0;
    while (i < hits.size()) {
      const int32_t prio = hits[i].priority;
      const int32_t id = impl_->specials[prio];
      size_t free_from = 0;
      for (; i < hits.size() && hits[i].priority == prio; ++i) {
        const size_t pos = hits[i].pos, len = tokens_[id].text.size();
        if (pos < free_from) continue;
        if (std::any_of(used.begin() + pos, used.begin() + pos + len, [](uint8_t u) { return u != 0; })) continue;
        std::fill(used.begin() + pos, used.begin() + pos + len, uint8_t(1));
        taken.push_back({pos, len, id});
        free_from = pos + len;
      }
    }
    std::sort(taken.begin(), taken.end(), [](const Taken& a, const Taken& b) { return a.pos < b.pos; });
  }

  // 2. The text between special tokens: pre-tokenise and merge.
  size_t at = 0;
  for (const Taken& t : taken) {
    if (t.pos > at) encode_fragment(text.substr(at, t.pos - at), &out);
    out.push_back(t.id);
    at = t.pos + t.len;
  }
  if (at < text.size()) encode_fragment(text.substr(at), &out);

  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

void Tokenizer::encode_fragment(std::string_view text, std::vector<int32_t>* out) const {
  if (model_ == TokenizerModel::Gemma4) {
    // Invalid UTF-8 is read as llama.cpp reads it (each bad byte as U+FFFD), then spaces become U+2581 and the
    // text splits into newline runs and the rest ([^\n]+|[\n]+).
    std::string valid;
    if (!is_valid_utf8(text)) {
      for (uint32_t c : decode_utf8_lenient(text)) append_utf8(c, &valid);
      text = valid;
    }
    const std::string escaped = escape_spaces(text);
    const std::string_view e = escaped;
    for (size_t at = 0; at < e.size();) {
      const bool newline = e[at] == '\n';
      size_t end = at;
      while (end < e.size() && (e[end] == '\n') == newline) ++end;
      encode_piece(e.substr(at, end - at), out);
      at = end;
    }
    return;
  }
  std::string storage;
  std::vector<std::string_view> pieces;
  impl_->pretok->split(text, &storage, &pieces);
  for (std::string_view piece : pieces) encode_piece(piece, out);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  const auto* bytes = reinterpret_cast<const unsigned char*>(piece.data());
  const size_t n = piece.size();
  const bool gemma4 = model_ == TokenizerModel::Gemma4;
  if (n == 1 && !gemma4) {
    if (impl_->byte_token[bytes[0]] >= 0) out->push_back(impl_->byte_token[bytes[0]]);
    return;
  }
  const bool cacheable = n <= kCacheMaxPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(impl_->cache_mu);
    auto it = impl_->cache.find(std::string(piece));
    if (it != impl_->cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }

  std::vector<int32_t> result;
  int32_t whole = -1;
  if (ignore_merges_) whole = token_id(byte_encode(piece));
  // gemma4: a run of newlines is one token when the vocabulary has it (llama.cpp looks such a piece up whole).
  if (gemma4 && piece.find_first_not_of('\n') == std::string_view::npos) whole = token_id(piece);
  if (whole >= 0) {
    result.push_back(whole);
  } else {
    // BPE: one symbol per byte (gpt2: bytes are the alphabet) or per UTF-8 character (gemma4; a character the
    // vocabulary lacks is a symbol no merge names); repeatedly merge the adjacent pair with the lowest merge
    // rank (ties: the leftmost), using a priority queue of candidate pairs that are re-checked when popped.
    std::vector<int32_t> id, prev, next;
    std::vector<size_t> begin, len;  // each symbol's bytes in piece
    for (size_t i = 0; i < n;) {
      size_t l = 1;
      if (gemma4) {
        // As llama.cpp's unicode_len_utf8: the lead byte's length, cut at the end of the piece (the piece is
        // valid UTF-8 here, so this is the character).
        const unsigned char b = bytes[i];
        l = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
        l = std::min(l, n - i);
      }
      const int32_t k = static_cast<int32_t>(id.size());
      id.push_back(gemma4 ? token_id(piece.substr(i, l)) : impl_->byte_token[bytes[i]]);
      prev.push_back(k - 1);
      next.push_back(i + l < n ? k + 1 : -1);
      begin.push_back(i);
      len.push_back(l);
      i += l;
    }
    struct Cand {
      int32_t rank, left, right, left_id, right_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
    auto consider = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0 || id[l] < 0 || id[r] < 0) return;
      auto it = impl_->merges.find(Impl::key(id[l], id[r]));
      if (it != impl_->merges.end()) queue.push({it->second.rank, l, r, id[l], id[r]});
    };
    for (size_t i = 0; i + 1 < id.size(); ++i) consider(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      if (id[c.left] != c.left_id || next[c.left] != c.right || id[c.right] != c.right_id) continue;  // stale
      id[c.left] = impl_->merges.at(Impl::key(c.left_id, c.right_id)).result;
      id[c.right] = -2;  // gone
      len[c.left] += len[c.right];
      next[c.left] = next[c.right];
      if (next[c.left] >= 0) prev[next[c.left]] = c.left;
      consider(prev[c.left], c.left);
      consider(c.left, next[c.left]);
    }
    // A symbol the vocabulary has no token for: gemma4 writes its bytes as <0xXX> tokens; gpt2 drops the byte,
    // as llama.cpp does.
    for (int32_t i = 0; i >= 0; i = next[i]) {
      if (id[i] >= 0) {
        result.push_back(id[i]);
      } else if (gemma4) {
        for (size_t k = begin[i]; k < begin[i] + len[i]; ++k)
          if (impl_->byte_token[bytes[k]] >= 0) result.push_back(impl_->byte_token[bytes[k]]);
      }
    }
  }
  out->insert(out->end(), result.begin(), result.end());
  if (!cacheable) return;

  std::lock_guard<std::mutex> lock(impl_->cache_mu);
  if (impl_->cache.size() >= kCacheLimit) impl_->cache.clear();
  impl_->cache.emplace(std::string(piece), std::move(result));
}

// ---- decoding --------------------------------------------------------------------------------

std::string Tokenizer::decode(std::span<const int32_t> ids) const { return detokenize(ids, DetokenizeOptions{}); }

std::string Tokenizer::detokenize(std::span<const int32_t> ids, const DetokenizeOptions& opt) const {
  size_t begin = 0, end = ids.size();
  if (opt.remove_special && add_bos_ && end > 0 && ids[0] == bos_) begin = 1;
  if (opt.remove_special && add_eos_ && end > begin && ids[end - 1] == eos_) --end;

  std::string t;
  for (size_t i = begin; i < end; ++i) {
    check_id(ids[i]);
    const Token& tok = tokens_[ids[i]];
    if (!opt.unparse_special && (tok.attr & (kAttrControl | kAttrUnknown))) continue;
    t += tok.piece;
  }
  if (!(opt.clean_spaces && clean_spaces_) || t.empty()) return t;

  // clean_up_tokenization_spaces, three in-place passes over the bytes as llama.cpp runs them.
  // 1: drop the space in " ?", " !", " .", " ,".
  size_t total = 1;
  for (size_t i = 1, n = t.size(); i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    t[total++] = x;
  }
  // 2: " ' " -> "'" (both spaces go; the erased next byte is left as NUL in the buffer, as there).
  const size_t n2 = total;
  total = 1;
  for (size_t i = 1; i < n2; ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < n2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --total;
      t[++i] = '\0';
    }
    t[total++] = x;
  }
  // 3: drop the space before "'s", "'m", "'re", "'ve" (not before "'t", "'d", "'ll").
  const size_t n3 = total;
  total = 1;
  for (size_t i = 1; i < n3; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < n3) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < n3) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    t[total++] = x;
  }
  t.resize(total);
  return t;
}

}  // namespace dllm::model
