// Fuzz test of the tokenizer: random Unicode text (every plane, white space of all kinds, combining
// marks, emoji sequences, digits, fragments of special tokens) and random bytes, on every fixture
// vocabulary. Never throws, every id is in range, valid UTF-8 round-trips exactly, and invalid input
// comes back as llama.cpp reads it (each undecodable byte as U+FFFD).
// DLLM_FUZZ_ITERS (default 1500 per vocabulary and kind) and DLLM_FUZZ_SEED make longer runs possible.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "support.h"

using dllm::model::Tokenizer;

namespace {

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : def;
}

class TextGen {
 public:
  explicit TextGen(uint32_t seed) : rng_(seed) {}

  std::string unicode(size_t max_cpts) {
    std::string s;
    const size_t n = pick(max_cpts + 1);
    for (size_t i = 0; i < n; ++i) {
      if (pick(12) == 0) {
        static const char* frags[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|", "|>", "<think>",
                                      "<|eot_id|>", "<|start_header_id|>", "<|mdm_mask|>", "<|im_start",
                                      "'s", "'LL", " '", "\r\n", "\n\n", "    ", "\t\t", "123456"};
        s += frags[pick(sizeof(frags) / sizeof(frags[0]))];
        continue;
      }
      dllm::model::append_utf8(cpt(), &s);
    }
    return s;
  }

  std::string bytes(size_t max_len) {
    std::string s(pick(max_len + 1), '\0');
    for (char& c : s) c = static_cast<char>(pick(256));
    // Often start from valid text and damage it, so that invalid bytes sit next to real sequences.
    if (pick(2) == 0) {
      s = unicode(max_len / 2);
      for (int k = 0, m = int(pick(4)); k < m && !s.empty(); ++k) s[pick(s.size())] = static_cast<char>(pick(256));
      if (pick(3) == 0 && !s.empty()) s.resize(pick(s.size()));
    }
    return s;
  }

 private:
  size_t pick(size_t n) { return n ? std::uniform_int_distribution<size_t>(0, n - 1)(rng_) : 0; }

  uint32_t cpt() {
    static const uint32_t spaces[] = {' ', '\t', '\n', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x1680, 0x2000, 0x2007,
                                      0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0x200B, 0x1C};
    static const uint32_t marks[] = {0x0301, 0x0308, 0x0327, 0x036F, 0x0483, 0x05B0, 0x064B, 0x093F, 0x094D,
                                     0x0E31, 0x1AB0, 0x20D7, 0xFE0F, 0x200D, 0x1F3FB};
    switch (pick(10)) {
      case 0: case 1: case 2: return static_cast<uint32_t>(0x20 + pick(0x5F));    // printable ASCII
      case 3: return spaces[pick(sizeof(spaces) / sizeof(spaces[0]))];
      case 4: return marks[pick(sizeof(marks) / sizeof(marks[0]))];
      case 5: return static_cast<uint32_t>(0x80 + pick(0x780));                    // Latin..Arabic
      case 6: return static_cast<uint32_t>(0x4E00 + pick(0x5200));                 // CJK
      case 7: return static_cast<uint32_t>(0x1F300 + pick(0x700));                 // emoji
      case 8: return static_cast<uint32_t>('0' + pick(10));
      default: {                                                                  // any scalar value
        uint32_t c;
        do c = static_cast<uint32_t>(pick(0x110000)); while (c >= 0xD800 && c <= 0xDFFF);
        return c;
      }
    }
  }

  std::mt19937 rng_;
};

// What llama.cpp makes of arbitrary bytes: decoded leniently and re-encoded.
std::string as_llama_cpp_reads(const std::string& bytes) {
  std::string out;
  for (uint32_t c : dllm::model::decode_utf8_lenient(bytes)) dllm::model::append_utf8(c, &out);
  return out;
}

void fuzz(const std::string& path) {
  ASSERT_FALSE(path.empty());
  const auto file = dllm::gguf::File::open(path);
  const Tokenizer tok(*file);
  const int iters = env_int("DLLM_FUZZ_ITERS", 1500);
  TextGen gen(static_cast<uint32_t>(env_int("DLLM_FUZZ_SEED", 20240611)));
  const dllm::model::DetokenizeOptions raw{false, true, false};
  auto check_ids = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.n_vocab()) << id;
  };
  for (int i = 0; i < iters; ++i) {
    const std::string text = gen.unicode(i % 10 == 0 ? 400 : 40);
    ASSERT_TRUE(dllm::model::is_valid_utf8(text));
    for (bool parse_special : {true, false}) {
      std::vector<int32_t> ids;
      ASSERT_NO_THROW(ids = tok.encode(text, parse_special, false));
      check_ids(ids);
      ASSERT_EQ(tok.detokenize(ids, raw), text) << "parse_special " << parse_special;
    }
    const std::string bytes = gen.bytes(60);
    std::vector<int32_t> ids;
    ASSERT_NO_THROW(ids = tok.encode(bytes, true, false));
    check_ids(ids);
    ASSERT_EQ(tok.detokenize(ids, raw), as_llama_cpp_reads(bytes));
    ASSERT_NO_THROW(tok.decode(ids));
  }
}

}  // namespace

TEST(TokenizerFuzz, Qwen2) { fuzz(dllm::test::data_path("tokenizer/vocab-qwen.gguf")); }
TEST(TokenizerFuzz, Gpt2) { fuzz(dllm::test::data_path("tokenizer/ggml-vocab-gpt-2.gguf")); }
TEST(TokenizerFuzz, BailingMoeTinyLlada) { fuzz(dllm::test::data_path("models/tiny-llada-Q8_0.gguf")); }
TEST(TokenizerFuzz, Llama3) {
  const std::string path = dllm::test::shared_path("fixtures/tokenizer/vocab-llama3.gguf");
  if (path.empty()) GTEST_SKIP() << "skipped: ../shared/fixtures/tokenizer/vocab-llama3.gguf is absent";
  fuzz(path);
}

TEST(TokenizerFuzz, RandomIdsDecode) {
  const auto file = dllm::gguf::File::open(dllm::test::data_path("tokenizer/vocab-qwen.gguf"));
  const Tokenizer tok(*file);
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::vector<int32_t> ids(rng() % 20);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % uint32_t(tok.n_vocab()));
    std::string s;
    ASSERT_NO_THROW(s = tok.decode(ids));
    const size_t k = dllm::model::utf8_complete_prefix(s);
    ASSERT_LE(k, s.size());
    ASSERT_GE(k + 3, s.size());
  }
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), dllm::Error);
}
