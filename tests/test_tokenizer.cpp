// Tokenizer parity with llama.cpp on the fixture vocabularies (tests/data/tokenizer, see its README in
// ../shared/fixtures/tokenizer): every case set id for id, llama.cpp's own .inp/.out vocab tests,
// detokenisation, round trips and the special ids. The Llama-3 vocabulary is not in the repository
// (licence): its tests read ../shared and skip when it is absent.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "support.h"

using dllm::model::DetokenizeOptions;
using dllm::model::Tokenizer;
using json = nlohmann::json;

namespace {

struct Vocab {
  std::unique_ptr<dllm::gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
};

// Vocabularies are loaded once per test binary (the Qwen one has 152k tokens and 151k merges).
const Vocab& vocab(const std::string& path) {
  static std::map<std::string, Vocab> cache;
  auto it = cache.find(path);
  if (it == cache.end()) {
    Vocab v;
    v.file = dllm::gguf::File::open(path);
    v.tok = std::make_unique<Tokenizer>(*v.file);
    it = cache.emplace(path, std::move(v)).first;
  }
  return it->second;
}

std::string qwen_path() { return dllm::test::data_path("tokenizer/vocab-qwen.gguf"); }
std::string gpt2_path() { return dllm::test::data_path("tokenizer/ggml-vocab-gpt-2.gguf"); }
std::string llama3_path() { return dllm::test::shared_path("fixtures/tokenizer/vocab-llama3.gguf"); }

#define SKIP_WITHOUT_LLAMA3()                                                                          \
  if (llama3_path().empty())                                                                           \
  GTEST_SKIP() << "skipped: ../shared/fixtures/tokenizer/vocab-llama3.gguf is absent (the Llama 3 "     \
                  "vocabulary is not redistributed in this repository)"

std::vector<json> read_jsonl(const std::string& rel) {
  std::istringstream in(dllm::test::read_file(dllm::test::data_path(rel)));
  std::vector<json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

DetokenizeOptions raw_concat() { return DetokenizeOptions{false, true, false}; }

// cases-*.jsonl: llama-tokenize ids (special parsing on, no BOS) and, for category "special", the
// ids without special parsing; and the round trip through the detokenizer.
void check_cases(const Tokenizer& tok, const std::string& rel) {
  const std::vector<json> cases = read_jsonl(rel);
  ASSERT_EQ(cases.size(), 90u);
  int checked_no_parse = 0;
  for (const json& c : cases) {
    const std::string text = c["text"];
    const std::vector<int32_t> ids = tok.encode(text, /*parse_special=*/true, /*add_special=*/false);
    EXPECT_EQ(show(ids), show(ids_of(c["ids"]))) << "case " << c["id"];
    if (c.contains("ids_no_parse_special")) {
      ++checked_no_parse;
      EXPECT_EQ(show(tok.encode(text, false, false)), show(ids_of(c["ids_no_parse_special"]))) << "case " << c["id"];
    }
    EXPECT_EQ(tok.detokenize(ids, raw_concat()), text) << "round trip of case " << c["id"];
  }
  EXPECT_GT(checked_no_parse, 0);
}

// llama.cpp's tests/test-tokenizer-0 files: texts separated by "\n__ggml_vocab_test__\n", one line of
// ids per text, tokenized without BOS and without special parsing.
void check_inp_out(const Tokenizer& tok, const std::string& inp_path, const std::string& out_path) {
  const std::string inp = dllm::test::read_file(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t at = 0; at < inp.size();) {
    size_t next = inp.find(sep, at);
    if (next == std::string::npos) next = inp.size();
    texts.push_back(inp.substr(at, next - at));
    at = next + sep.size();
  }
  std::vector<std::string> lines;
  std::istringstream out(dllm::test::read_file(out_path));
  for (std::string line; std::getline(out, line);) lines.push_back(line);
  ASSERT_EQ(texts.size(), lines.size());
  ASSERT_EQ(texts.size(), 46u);
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> expected;
    std::istringstream ls(lines[i]);
    for (int32_t id; ls >> id;) expected.push_back(id);
    EXPECT_EQ(show(tok.encode(texts[i], false, false)), show(expected)) << "text " << i << ": '" << texts[i] << "'";
  }
}

// detok-*.jsonl: llama_detokenize with (remove_special, unparse_special) = (false, true), (false, false)
// and (true, false); exact bytes in the hex fields.
void check_detok(const Tokenizer& tok, const std::string& rel) {
  const std::vector<json> items = read_jsonl(rel);
  ASSERT_EQ(items.size(), 15u);
  for (const json& d : items) {
    const std::vector<int32_t> ids = ids_of(d["ids"]);
    EXPECT_EQ(tok.decode(ids), from_hex(d["hex"])) << d["id"];
    EXPECT_EQ(tok.detokenize(ids, {false, false, true}), from_hex(d["hex_no_special"])) << d["id"];
    EXPECT_EQ(tok.detokenize(ids, {true, false, true}), from_hex(d["hex_remove_special"])) << d["id"];
  }
}

}  // namespace

// ---- Qwen (Dream's vocabulary) -----------------------------------------------------------------

TEST(TokenizerQwen, LoadsVocabularyAndSpecialIds) {
  const Tokenizer& tok = *vocab(qwen_path()).tok;
  EXPECT_EQ(tok.n_vocab(), 152064);
  EXPECT_EQ(tok.n_merges(), 151387u);
  EXPECT_EQ(tok.pre(), "qwen2");
  EXPECT_EQ(tok.bos(), 151643);
  EXPECT_EQ(tok.eos(), 151645);
  EXPECT_EQ(tok.pad(), 151643);
  EXPECT_EQ(tok.eot(), 151645);  // no eot key: found by its text <|im_end|>
  EXPECT_EQ(tok.mask(), -1);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_FALSE(tok.ignore_merges());
  EXPECT_FALSE(tok.clean_spaces());
  EXPECT_TRUE(tok.is_control(151644));
  EXPECT_TRUE(tok.is_user_defined(151657));  // <tool_call>
  EXPECT_TRUE(tok.is_unused(151669));        // [PAD151669]
  EXPECT_EQ(tok.token_text(151644), "<|im_start|>");
  EXPECT_EQ(tok.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.token_piece(220), " ");
  EXPECT_EQ(tok.token_piece(151669), "");
  EXPECT_THROW(tok.token_piece(152064), dllm::Error);
}

TEST(TokenizerQwen, CasesMatchLlamaCpp) { check_cases(*vocab(qwen_path()).tok, "tokenizer/cases-qwen.jsonl"); }

TEST(TokenizerQwen, LlamaCppVocabTestFile) {
  check_inp_out(*vocab(qwen_path()).tok, dllm::test::data_path("tokenizer/vocab-qwen.gguf.inp"),
                dllm::test::data_path("tokenizer/vocab-qwen.gguf.out"));
}

TEST(TokenizerQwen, DetokenizeMatchesLlamaCpp) { check_detok(*vocab(qwen_path()).tok, "tokenizer/detok-qwen.jsonl"); }

// No Unicode normalisation, like llama.cpp: where the HF tokenizer (NFC normalizer) disagrees, dllm
// gives llama.cpp's ids for the text and the HF ids for its NFC form.
TEST(TokenizerQwen, NoNormalizationTheNfcCases) {
  const Tokenizer& tok = *vocab(qwen_path()).tok;
  const std::vector<json> cases = read_jsonl("tokenizer/nfc-qwen.jsonl");
  ASSERT_EQ(cases.size(), 4u);
  for (const json& c : cases) {
    EXPECT_EQ(tok.encode(c["text"].get<std::string>()), ids_of(c["ids"])) << c["id"];
    EXPECT_NE(ids_of(c["ids"]), ids_of(c["hf_ids"])) << c["id"];
    EXPECT_EQ(tok.encode(c["nfc_text"].get<std::string>()), ids_of(c["hf_ids"])) << c["id"];
  }
}

TEST(TokenizerQwen, AddSpecialAddsNothingWithoutTheFlags) {
  const Tokenizer& tok = *vocab(qwen_path()).tok;
  EXPECT_EQ(tok.encode("Hello", true, true), (std::vector<int32_t>{9707}));
  EXPECT_TRUE(tok.encode("", true, true).empty());
}

// ---- GPT-2 (llama.cpp's own vocab file, pre = gpt-2) -------------------------------------------

TEST(TokenizerGpt2, LlamaCppVocabTestFile) {
  const Tokenizer& tok = *vocab(gpt2_path()).tok;
  EXPECT_EQ(tok.pre(), "gpt-2");
  check_inp_out(tok, dllm::test::data_path("tokenizer/ggml-vocab-gpt-2.gguf.inp"),
                dllm::test::data_path("tokenizer/ggml-vocab-gpt-2.gguf.out"));
}

// ---- Llama 3 (llama-bpe: digit groups, ignore_merges, BOS by default) -----------------------------

TEST(TokenizerLlama3, CasesMatchLlamaCpp) {
  SKIP_WITHOUT_LLAMA3();
  check_cases(*vocab(llama3_path()).tok, "tokenizer/cases-llama3.jsonl");
}

TEST(TokenizerLlama3, LlamaCppVocabTestFile) {
  SKIP_WITHOUT_LLAMA3();
  check_inp_out(*vocab(llama3_path()).tok, dllm::test::data_path("tokenizer/vocab-llama3.gguf.inp"),
                dllm::test::data_path("tokenizer/vocab-llama3.gguf.out"));
}

TEST(TokenizerLlama3, DetokenizeMatchesLlamaCpp) {
  SKIP_WITHOUT_LLAMA3();
  check_detok(*vocab(llama3_path()).tok, "tokenizer/detok-llama3.jsonl");
}

TEST(TokenizerLlama3, FlagsAndBos) {
  SKIP_WITHOUT_LLAMA3();
  const Tokenizer& tok = *vocab(llama3_path()).tok;
  EXPECT_EQ(tok.n_vocab(), 128256);
  EXPECT_TRUE(tok.ignore_merges());
  EXPECT_TRUE(tok.add_bos());  // key absent: llama-bpe's default
  EXPECT_TRUE(tok.clean_spaces());
  EXPECT_EQ(tok.bos(), 128000);
  EXPECT_EQ(tok.eos(), 128001);
  const std::vector<int32_t> ids = tok.encode("Hello", true, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(tok.detokenize(ids, {true, false, true}), "Hello");
}

// ---- streaming helper -------------------------------------------------------------------------

TEST(Utf8CompletePrefix, HoldsBackIncompleteSequences) {
  using dllm::model::utf8_complete_prefix;
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix(" \xf0\x9f"), 1u);          // first bytes of U+1F999
  EXPECT_EQ(utf8_complete_prefix(" \xf0\x9f\xa6"), 1u);
  EXPECT_EQ(utf8_complete_prefix(" \xf0\x9f\xa6\x99"), 5u);  // complete
  EXPECT_EQ(utf8_complete_prefix("\xc3"), 0u);
  EXPECT_EQ(utf8_complete_prefix("\xc3\xa9"), 2u);
  EXPECT_EQ(utf8_complete_prefix("a\xff"), 2u);              // invalid byte: nothing to wait for
}

// ---- gemma4 (DiffusionGemma's vocabulary) -----------------------------------------------------------
// tests/data/diffusion-gemma: the fixture's synthetic 1536-token vocabulary (the F32 model's metadata without its
// weights, make_vocab_gguf.py) and llama-tokenize's ids of the fork for 36 texts (../shared/fixtures/diffusion-gemma).

namespace {

std::string gemma4_path() { return dllm::test::data_path("diffusion-gemma/tiny-diffusion-gemma-A-vocab.gguf"); }

}  // namespace

TEST(TokenizerGemma4, LoadsVocabularyAndSpecialIds) {
  const Tokenizer& tok = *vocab(gemma4_path()).tok;
  EXPECT_EQ(tok.model(), dllm::model::TokenizerModel::Gemma4);
  EXPECT_EQ(tok.pre(), "gemma4");
  EXPECT_EQ(tok.n_vocab(), 1536);
  EXPECT_EQ(tok.n_merges(), 1061u);
  EXPECT_EQ(tok.bos(), 2);
  EXPECT_EQ(tok.eos(), 1);
  EXPECT_EQ(tok.unk(), 3);
  EXPECT_EQ(tok.pad(), 0);
  EXPECT_EQ(tok.mask(), 4);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_FALSE(tok.add_eos());
  // End of generation by text, as llama.cpp finds them: <eos>, <turn|> (also the eot), <|tool_response>.
  EXPECT_EQ(tok.eot(), 7);
  EXPECT_EQ(tok.eog(), (std::vector<int32_t>{1, 7, 13}));
  EXPECT_TRUE(tok.is_control(6));         // <|turn>
  EXPECT_TRUE(tok.is_user_defined(9));    // <|channel>
  EXPECT_EQ(tok.token_piece(36), "  ");   // ▁▁: the pieces have spaces again
  EXPECT_EQ(tok.token_piece(53), std::string(1, '\0'));  // <0x00>
  EXPECT_FALSE(tok.chat_template().empty());
}

TEST(TokenizerGemma4, CasesMatchLlamaCpp) {
  const Tokenizer& tok = *vocab(gemma4_path()).tok;
  const std::vector<json> cases = read_jsonl("diffusion-gemma/cases.jsonl");
  ASSERT_EQ(cases.size(), 36u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    const std::vector<int32_t> ids = tok.encode(text, /*parse_special=*/true, /*add_special=*/false);
    EXPECT_EQ(show(ids), show(ids_of(c["ids"]))) << "case " << c["id"];
    EXPECT_EQ(show(tok.encode(text, false, false)), show(ids_of(c["ids_no_parse_special"]))) << "case " << c["id"];
    EXPECT_EQ(show(tok.encode(text, true, true)), show(ids_of(c["ids_with_bos"]))) << "case " << c["id"];
    // Byte fallback makes every text come back byte for byte (no clean-up of spaces).
    EXPECT_EQ(tok.detokenize(ids, raw_concat()), text) << "round trip of case " << c["id"];
  }
}

TEST(TokenizerGemma4, ByteFallbackNewlineRunsAndSpecials) {
  const Tokenizer& tok = *vocab(gemma4_path()).tok;
  // A character the vocabulary lacks: its UTF-8 bytes as <0xXX> tokens (U+1F9A9 = F0 9F A6 A9; <0x00> is 53).
  ASSERT_EQ(tok.token_id("\xf0\x9f\xa6\xa9"), -1);
  EXPECT_EQ(tok.encode("\xf0\x9f\xa6\xa9"), (std::vector<int32_t>{53 + 0xF0, 53 + 0x9F, 53 + 0xA6, 53 + 0xA9}));
  // Newline runs are pieces of their own, looked up whole: \n = 32, \n\n = 33, \n\n\n\n = 35.
  EXPECT_EQ(tok.encode("\n"), (std::vector<int32_t>{32}));
  EXPECT_EQ(tok.encode("\n\n"), (std::vector<int32_t>{33}));
  EXPECT_EQ(tok.encode("\n\n\n\n"), (std::vector<int32_t>{35}));
  // User-defined tokens are matched without special parsing, control tokens only with it.
  EXPECT_EQ(tok.encode("<|channel>", false, false), (std::vector<int32_t>{9}));
  EXPECT_EQ(tok.encode("<|turn>", true, false), (std::vector<int32_t>{6}));
  EXPECT_NE(tok.encode("<|turn>", false, false), (std::vector<int32_t>{6}));
  // BOS comes first with add_special; no EOS (add_eos_token false).
  EXPECT_EQ(tok.encode("", true, true), (std::vector<int32_t>{2}));
  // Invalid UTF-8: each bad byte read as U+FFFD (EF BF BD), which this vocabulary writes as bytes.
  EXPECT_EQ(tok.encode("\xff"), (std::vector<int32_t>{53 + 0xEF, 53 + 0xBF, 53 + 0xBD}));
}

TEST(TokenizerGemma4, DetokenizeWritesSpaces) {
  const Tokenizer& tok = *vocab(gemma4_path()).tok;
  const std::vector<int32_t> ids = tok.encode("  Hello world\n", true, true);
  EXPECT_EQ(tok.decode(ids), "<bos>  Hello world\n");
  EXPECT_EQ(tok.detokenize(ids, {true, false, true}), "  Hello world\n");
  EXPECT_EQ(tok.decode(tok.encode("<|turn>user\nHi<turn|>")), "<|turn>user\nHi<turn|>");
}
