// Pre-tokenisation (see pretokenizer.h): llama.cpp's split patterns, run by PCRE2 with UTF + UCP + JIT.
//
// How the patterns relate to llama.cpp's:
// - llama.cpp runs gpt-2 and llama-bpe through hand-written splitters that follow the regexes, and
//   qwen2 / bailingmoe through std::regex over a "collapsed" text (each non-ASCII code point replaced by
//   one byte standing for its category; non-ASCII white space by \v). All four reduce to ordinary
//   backtracking-regex semantics over Unicode general categories, which PCRE2 provides.
// - White space: llama.cpp's set is the Unicode White_Space property. PCRE2's \s with UCP (checked over
//   every code point with 10.42) is that set plus U+180E MONGOLIAN VOWEL SEPARATOR, which stopped being
//   white space in Unicode 6.3 and is "other" for llama.cpp. So white space is spelt out below as the
//   25 White_Space code points instead of \s.
// - Case-insensitive contractions are spelt out ('[sS] ...), as llama.cpp's adapted patterns do.
// - gpt-2's pattern has no final `|\s+`; llama.cpp's splitter emits a lone white space that no
//   alternative matches as its own piece, which is what the added `|\s+` does here.
// - Text between two matches (never more than one white-space character) becomes a piece of its own,
//   as in llama.cpp's unicode_regex_split_stl.
// - Category tables: llama.cpp's generated table follows Unicode 15.1; PCRE2 10.42 (Debian 12) knows
//   Unicode 14. Compared over every code point (PCRE2's \p{L} \p{N} against Python's unicodedata2
//   15.1.0), they differ in exactly the letters and numbers assigned in 15.0 and 15.1: 17 ranges,
//   5010 code points, all outside the BMP (CJK Extensions H and I, Kawi, Nag Mundari, Kaktovik
//   numerals, ...). Adding the ranges to every class cost a third of the matching speed, so instead
//   the subject PCRE2 sees has each such character replaced by a 4-byte letter (U+20000) or digit
//   (U+1D7CE) that every PCRE2 classifies alike; byte offsets do not move, and the pieces are cut from
//   the original text. With a newer PCRE2 the substitution changes nothing (while letters of Unicode 16
//   and later then count as letters here but not in llama.cpp's 15.1 table).
#include "model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "common/error.h"
#include "common/printable.h"

namespace dllm::model {

namespace {

// Building blocks: W = llama.cpp's white space (Unicode White_Space) inside a class.
#define DLLM_W "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define DLLM_WS "[" DLLM_W "]"
#define DLLM_NOT_WS "[^" DLLM_W "]"
#define DLLM_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define DLLM_TAIL DLLM_WS "+(?!" DLLM_NOT_WS ")|" DLLM_WS "+"

const char* pattern_for(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::Gpt2:
      return "'s|'t|'re|'ve|'m|'ll|'d"
             "| ?\\p{L}+| ?\\p{N}+| ?[^" DLLM_W "\\p{L}\\p{N}]+|" DLLM_TAIL;
    case PreTokenizerKind::Llama3:
      return DLLM_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
             "| ?[^" DLLM_W "\\p{L}\\p{N}]+[\\r\\n]*|" DLLM_WS "*[\\r\\n]+|" DLLM_TAIL;
    case PreTokenizerKind::Qwen2:
      return DLLM_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
             "| ?[^" DLLM_W "\\p{L}\\p{N}]+[\\r\\n]*|" DLLM_WS "*[\\r\\n]+|" DLLM_TAIL;
    case PreTokenizerKind::BailingMoe:
      return "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
             "| ?[^" DLLM_W "\\p{L}\\p{N}]+[\\r\\n]*|" DLLM_WS "*[\\r\\n]|" DLLM_TAIL;
  }
  return "";
}

#undef DLLM_W
#undef DLLM_WS
#undef DLLM_NOT_WS
#undef DLLM_CONTRACTIONS
#undef DLLM_TAIL

// Letters and numbers assigned in Unicode 15.0 and 15.1, which PCRE2 10.42 does not know (see the top
// of the file), and the Unicode 3.1 characters PCRE2 classifies in their place. All are 4 bytes long.
struct Unicode15Range {
  uint32_t lo, hi;
  bool number;
};
constexpr Unicode15Range kUnicode15[] = {
    {0x1123F, 0x11240, false}, {0x11F02, 0x11F02, false}, {0x11F04, 0x11F10, false}, {0x11F12, 0x11F33, false},
    {0x11F50, 0x11F59, true},  {0x1342F, 0x1342F, false}, {0x13441, 0x13446, false}, {0x1B132, 0x1B132, false},
    {0x1B155, 0x1B155, false}, {0x1D2C0, 0x1D2D3, true},  {0x1DF25, 0x1DF2A, false}, {0x1E030, 0x1E06D, false},
    {0x1E4D0, 0x1E4EB, false}, {0x1E4F0, 0x1E4F9, true},  {0x2B739, 0x2B739, false}, {0x2EBF0, 0x2EE5D, false},
    {0x31350, 0x323AF, false},
};
constexpr uint32_t kStandInLetter = 0x20000;  // CJK Extension B's first ideograph (Lo)
constexpr uint32_t kStandInDigit = 0x1D7CE;   // MATHEMATICAL BOLD DIGIT ZERO (Nd)

// The code point PCRE2 is shown in place of c.
uint32_t stand_in(uint32_t c) {
  if (c >= 0xD800 && c <= 0xDFFF) return 0xFFFD;  // surrogates (only from invalid input)
  if (c < kUnicode15[0].lo) return c;
  for (const Unicode15Range& r : kUnicode15)
    if (c >= r.lo && c <= r.hi) return r.number ? kStandInDigit : kStandInLetter;
  return c;
}

struct NameEntry {
  const char* name;
  PreTokenizerInfo info;
};

// llama.cpp's llama_vocab::impl::load: pre name -> regex, ignore_merges, add_bos default, clean_spaces.
constexpr NameEntry kNames[] = {
    {"gpt-2", {PreTokenizerKind::Gpt2, false, false, true}},
    {"gpt2", {PreTokenizerKind::Gpt2, false, false, true}},
    {"phi-2", {PreTokenizerKind::Gpt2, false, false, true}},
    {"mpt", {PreTokenizerKind::Gpt2, false, false, true}},
    {"olmo", {PreTokenizerKind::Gpt2, false, false, true}},
    {"llama-bpe", {PreTokenizerKind::Llama3, true, true, true}},
    {"llama3", {PreTokenizerKind::Llama3, true, true, true}},
    {"llama-v3", {PreTokenizerKind::Llama3, true, true, true}},
    {"qwen2", {PreTokenizerKind::Qwen2, false, false, false}},
    {"deepseek-r1-qwen", {PreTokenizerKind::Qwen2, false, false, false}},
    {"bailingmoe", {PreTokenizerKind::BailingMoe, false, false, false}},
    {"bailingmoe2", {PreTokenizerKind::BailingMoe, false, false, false}},
    {"llada-moe", {PreTokenizerKind::BailingMoe, false, false, false}},
};

}  // namespace

const char* supported_pre_tokenizers() {
  return "gpt-2, llama-bpe, qwen2, bailingmoe (aliases: gpt2, phi-2, mpt, olmo, llama3, llama-v3, "
         "deepseek-r1-qwen, bailingmoe2, llada-moe)";
}

PreTokenizerInfo pre_tokenizer_info(std::string_view name) {
  for (const NameEntry& e : kNames)
    if (name == e.name) return e.info;
  throw Error("unknown pre-tokenizer '" + shown(name) + "' (tokenizer.ggml.pre); supported: " +
              supported_pre_tokenizers());
}


// ---- the regex --------------------------------------------------------------------------------

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(PreTokenizerKind kind) : kind_(kind), re_(std::make_unique<Regex>()) {
  const char* pattern = pattern_for(kind);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  re_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_offset, nullptr);
  if (!re_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error("pre-tokenizer pattern does not compile at offset " + std::to_string(err_offset) + ": " +
                reinterpret_cast<const char*>(msg));
  }
  // JIT makes matching several times faster; where it is unavailable PCRE2's interpreter gives the
  // same matches, so a failure here only costs speed.
  pcre2_jit_compile(re_->code, PCRE2_JIT_COMPLETE);
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::string* storage, std::vector<std::string_view>* pieces) const {
  if (text.empty()) return;
  if (is_valid_utf8(text)) {
    // Code points from U+10000 to U+3FFFF start with byte F0; only then can a stand-in be needed.
    size_t at = text.find('\xF0');
    if (at == std::string_view::npos) {
      split_valid(text, text, pieces);
      return;
    }
    std::string subject(text);
    for (; at != std::string_view::npos; at = text.find('\xF0', at + 4)) {
      const uint32_t c = decode_utf8_lenient(text.substr(at, 4))[0];
      const uint32_t shown = stand_in(c);
      if (shown != c) {
        std::string enc;
        append_utf8(shown, &enc);
        subject.replace(at, 4, enc);
      }
    }
    split_valid(subject, text, pieces);
    return;
  }
  // Decode like llama.cpp and re-encode into *storage. PCRE2 needs well-formed UTF-8, so its subject
  // has each surrogate replaced by U+FFFD: both take 3 bytes and neither is a letter, digit or space,
  // so the piece boundaries found in the subject are the right ones for *storage.
  const std::vector<uint32_t> cpts = decode_utf8_lenient(text);
  storage->clear();
  std::string subject;
  for (uint32_t c : cpts) {
    append_utf8(c, storage);
    append_utf8(stand_in(c), &subject);
  }
  split_valid(subject, *storage, pieces);
}

void PreTokenizer::split_valid(std::string_view subject, std::string_view source,
                               std::vector<std::string_view>* pieces) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re_->code, nullptr);
  if (!md) throw Error("out of memory creating pre-tokenizer match data");
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  size_t prev = 0;
  size_t pos = 0;
  while (pos < n) {
    const int rc = pcre2_match(re_->code, subj, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw Error(std::string("pre-tokenizer match failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0];
    size_t e = ov[1];
    if (e == s) {  // no pattern here matches empty text; guard progress anyway (one code point)
      e = s + 1;
      while (e < n && (static_cast<unsigned char>(subject[e]) & 0xC0) == 0x80) ++e;
    }
    if (s > prev) pieces->push_back(source.substr(prev, s - prev));
    pieces->push_back(source.substr(s, e - s));
    prev = pos = e;
  }
  if (prev < n) pieces->push_back(source.substr(prev));
  pcre2_match_data_free(md);
}

}  // namespace dllm::model
