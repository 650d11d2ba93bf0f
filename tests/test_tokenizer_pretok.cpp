// Pre-tokenizer splits for each supported tokenizer.ggml.pre, on inputs where llama.cpp's rules are
// easy to get wrong: white-space runs before a word (\s+(?!\S)), U+0085 as white space, newlines,
// U+180E as not white space, digit grouping, contractions, combining marks, emoji, and invalid UTF-8
// (read as U+FFFD).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "model/pretokenizer.h"

using dllm::model::PreTokenizer;
using dllm::model::PreTokenizerKind;
using V = std::vector<std::string>;

namespace {

V split(PreTokenizerKind kind, const std::string& text) {
  PreTokenizer pt(kind);
  std::string storage;
  std::vector<std::string_view> pieces;
  pt.split(text, &storage, &pieces);
  return V(pieces.begin(), pieces.end());
}

constexpr PreTokenizerKind kAll[] = {PreTokenizerKind::Gpt2, PreTokenizerKind::Llama3, PreTokenizerKind::Qwen2,
                                     PreTokenizerKind::BailingMoe};
constexpr PreTokenizerKind kModern[] = {PreTokenizerKind::Llama3, PreTokenizerKind::Qwen2, PreTokenizerKind::BailingMoe};

}  // namespace

TEST(PreTokenizer, WordsAndSpaceRuns) {
  for (auto k : kAll) {
    EXPECT_EQ(split(k, "Hello world"), (V{"Hello", " world"}));
    EXPECT_EQ(split(k, "   a"), (V{"  ", " a"}));  // the last space stays with the word
    EXPECT_EQ(split(k, "a   "), (V{"a", "   "}));
    EXPECT_EQ(split(k, ""), V{});
  }
}

TEST(PreTokenizer, LoneWhiteSpaceBeforeAWord) {
  EXPECT_EQ(split(PreTokenizerKind::Gpt2, "a\tb"), (V{"a", "\t", "b"}));
  // Modern patterns take one non-newline, non-letter character in front of a word.
  for (auto k : kModern) EXPECT_EQ(split(k, "a\tb"), (V{"a", "\tb"}));
}

TEST(PreTokenizer, NextLineIsWhiteSpaceAsInLlamaCpp) {
  // U+0085 is White_Space for llama.cpp: two of them before a word split as white space, one piece
  // each, not as a run of symbols.
  for (auto k : kModern) EXPECT_EQ(split(k, "a\u0085\u0085b"), (V{"a", "\u0085", "\u0085b"}));
  for (auto k : kModern) EXPECT_EQ(split(k, "a\u00a0\u00a0b"), (V{"a", "\u00a0", "\u00a0b"}));
  for (auto k : kModern) EXPECT_EQ(split(k, "a\u3000\u3000\u3000"), (V{"a", "\u3000\u3000\u3000"}));
  // U+FEFF (BOM) is not white space: a symbol in front of a word.
  for (auto k : kModern) EXPECT_EQ(split(k, "\ufeffHi"), (V{"\ufeffHi"}));
  // Nor is U+180E (PCRE2's \s matches it, llama.cpp's white space does not): a run of symbols.
  for (auto k : kModern) EXPECT_EQ(split(k, "a\u180e\u180eb"), (V{"a", "\u180e\u180e", "b"}));
  EXPECT_EQ(split(PreTokenizerKind::Gpt2, "a \u180e\u180e"), (V{"a", " \u180e\u180e"}));
}

TEST(PreTokenizer, Newlines) {
  EXPECT_EQ(split(PreTokenizerKind::Gpt2, "x.\n\ny"), (V{"x", ".", "\n", "\n", "y"}));
  for (auto k : kModern) {
    EXPECT_EQ(split(k, "x.\n\ny"), (V{"x", ".\n\n", "y"}));
    EXPECT_EQ(split(k, "a\r\n\r\nb"), (V{"a", "\r\n\r\n", "b"}));
    EXPECT_EQ(split(k, "a \n  b"), (V{"a", " \n", " ", " b"}));
  }
}

TEST(PreTokenizer, Digits) {
  EXPECT_EQ(split(PreTokenizerKind::Gpt2, "x 1234567"), (V{"x", " 1234567"}));
  EXPECT_EQ(split(PreTokenizerKind::Llama3, "x 1234567"), (V{"x", " ", "123", "456", "7"}));
  EXPECT_EQ(split(PreTokenizerKind::Qwen2, "12"), (V{"1", "2"}));
  EXPECT_EQ(split(PreTokenizerKind::BailingMoe, "\uff11\uff12"), (V{"\uff11", "\uff12"}));  // fullwidth digits are \p{N}
}

TEST(PreTokenizer, Contractions) {
  EXPECT_EQ(split(PreTokenizerKind::Gpt2, "I'M don't"), (V{"I", "'", "M", " don", "'t"}));
  for (auto k : kModern) {
    EXPECT_EQ(split(k, "I'M don't WE'RE"), (V{"I", "'M", " don", "'t", " WE", "'RE"}));
    EXPECT_EQ(split(k, "it\u2019s"), (V{"it", "\u2019s"}));  // only the ASCII apostrophe
  }
}

TEST(PreTokenizer, ScriptsMarksAndEmoji) {
  for (auto k : kModern) {
    EXPECT_EQ(split(k, "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440"),
              (V{"\u041f\u0440\u0438\u0432\u0435\u0442", " \u043c\u0438\u0440"}));
    EXPECT_EQ(split(k, "\u4f60\u597d\u4e16\u754c"), (V{"\u4f60\u597d\u4e16\u754c"}));
    // Devanagari: the virama (Mn) and the vowel sign (Mc) are not letters.
    EXPECT_EQ(split(k, "\u0928\u092e\u0938\u094d\u0924\u0947"),
              (V{"\u0928\u092e\u0938", "\u094d\u0924", "\u0947"}));
    EXPECT_EQ(split(k, "\U0001F999\U0001F999 x"), (V{"\U0001F999\U0001F999", " x"}));
  }
}

// Letters and numbers of Unicode 15.0/15.1 (llama.cpp's tables have them; PCRE2 10.42 alone does not).
TEST(PreTokenizer, Unicode15LettersAndNumbers) {
  const uint32_t letters[] = {0x1123F, 0x11F02, 0x11F04, 0x11F33, 0x1342F, 0x13441, 0x1B132, 0x1B155,
                              0x1DF25, 0x1E030, 0x1E06D, 0x1E4D0, 0x2B739, 0x2EBF0, 0x2EE5D, 0x31350, 0x323AF};
  const uint32_t numbers[] = {0x11F50, 0x11F59, 0x1D2C0, 0x1D2D3, 0x1E4F0, 0x1E4F9};
  for (auto k : kAll) {
    for (uint32_t c : letters) {
      std::string ch;
      dllm::model::append_utf8(c, &ch);
      EXPECT_EQ(split(k, "x " + ch + ch), (V{"x", " " + ch + ch})) << std::hex << c;
    }
    for (uint32_t c : numbers) {
      std::string ch;
      dllm::model::append_utf8(c, &ch);
      if (k == PreTokenizerKind::Gpt2) {
        EXPECT_EQ(split(k, "x " + ch + ch), (V{"x", " " + ch + ch})) << std::hex << c;
      } else if (k == PreTokenizerKind::Qwen2) {
        EXPECT_EQ(split(k, "x" + ch + ch), (V{"x", ch, ch})) << std::hex << c;
      }
    }
  }
}

TEST(PreTokenizer, InvalidUtf8IsReadAsReplacementCharacters) {
  for (auto k : kModern) {
    EXPECT_EQ(split(k, "a\xff" "b"), (V{"a", "\uFFFD" "b"}));
    EXPECT_EQ(split(k, "a\xe4\xbd"), (V{"a", "\uFFFD\uFFFD"}));  // truncated sequence: one U+FFFD per byte
    // A surrogate decodes (as in llama.cpp) and is kept as its three bytes; it is not a letter.
    EXPECT_EQ(split(k, "a\xed\xa0\x80" "b"), (V{"a", "\xed\xa0\x80" "b"}));
    // An overlong form decodes to its code point and is re-encoded.
    EXPECT_EQ(split(k, "\xc1\x81" "b"), (V{"Ab"}));
  }
}

TEST(PreTokenizer, PiecesCoverTheText) {
  const std::string text = "  Mixed: \u00e9t\u00e9 12,5% \u2014 \u0645\u0631\u062d\u0628\u0627\t\n\n  end  ";
  for (auto k : kAll) {
    std::string joined;
    for (const auto& p : split(k, text)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, text);
  }
}

TEST(PreTokenizer, NamesAndErrors) {
  EXPECT_EQ(dllm::model::pre_tokenizer_info("qwen2").kind, PreTokenizerKind::Qwen2);
  EXPECT_EQ(dllm::model::pre_tokenizer_info("bailingmoe").kind, PreTokenizerKind::BailingMoe);
  EXPECT_EQ(dllm::model::pre_tokenizer_info("gpt-2").kind, PreTokenizerKind::Gpt2);
  const auto l3 = dllm::model::pre_tokenizer_info("llama-bpe");
  EXPECT_EQ(l3.kind, PreTokenizerKind::Llama3);
  EXPECT_TRUE(l3.ignore_merges);
  EXPECT_TRUE(l3.add_bos_default);
  try {
    dllm::model::pre_tokenizer_info("falcon");
    FAIL() << "no error";
  } catch (const dllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown pre-tokenizer 'falcon' (tokenizer.ggml.pre)"), std::string::npos);
  }
}
