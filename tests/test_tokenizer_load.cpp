// Tokenizer on small synthetic GGUF vocabularies written by the test: BPE against a naive reference
// (random merge tables, long pieces), special-token matching order, ignore_merges, BOS/EOS flags,
// and every load-time validation error with the key it names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <malloc.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <unordered_map>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"

using dllm::model::Tokenizer;

namespace {

// ---- a minimal GGUF v3 writer (metadata only) ------------------------------------------------

class GgufWriter {
 public:
  void str(const std::string& key, const std::string& v) { begin(key, 8), put_str(v); }
  void u32(const std::string& key, uint32_t v) { begin(key, 4), put(v); }
  void boolean(const std::string& key, bool v) { begin(key, 7), body_.push_back(v ? 1 : 0); }
  void strs(const std::string& key, const std::vector<std::string>& v) {
    begin(key, 9), put(uint32_t(8)), put(uint64_t(v.size()));
    for (const auto& s : v) put_str(s);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    begin(key, 9), put(uint32_t(5)), put(uint64_t(v.size()));
    for (int32_t x : v) put(x);
  }
  // Writes the file and returns its path (removed when the writer goes away).
  std::string write() {
    std::string out = "GGUF";
    auto app = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    app(uint32_t(3)), app(uint64_t(0)), app(uint64_t(n_kv_));
    out += body_;
    while (out.size() % 32) out.push_back('\0');
    char tpl[] = "/tmp/dllm-tok-test-XXXXXX";
    const int fd = mkstemp(tpl);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, out.data(), out.size()), ssize_t(out.size()));
    ::close(fd);
    path_ = tpl;
    return path_;
  }
  ~GgufWriter() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

 private:
  template <class T>
  void put(T v) { body_.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
  void put_str(const std::string& s) { put(uint64_t(s.size())), body_ += s; }
  void begin(const std::string& key, uint32_t type) { ++n_kv_, put_str(key), put(type); }
  std::string body_;
  uint64_t n_kv_ = 0;
  std::string path_;
};

// GPT-2's byte -> character alphabet, as a vocabulary writes its byte tokens.
std::string byte_char(int b) {
  static std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
      dllm::model::append_utf8(printable ? uint32_t(i) : uint32_t(next++), &t[i]);
    }
    return t;
  }();
  return table[b];
}

// A vocabulary: the 256 byte tokens, then merge results, then specials.
struct VocabSpec {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "gpt-2";

  VocabSpec() {
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_char(b)), types.push_back(1);
  }
  int32_t add(const std::string& text, int32_t type = 1) {
    tokens.push_back(text), types.push_back(type);
    return int32_t(tokens.size() - 1);
  }
  int32_t id(const std::string& text) const {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == text) return int32_t(i);
    return -1;
  }
  // Adds the merge "l r" and, when new, the token l+r (ASCII texts only).
  void merge(const std::string& l, const std::string& r) {
    merges.push_back(l + " " + r);
    if (id(l + r) < 0) add(l + r);
  }
  void write_to(GgufWriter& w) const {
    w.str("general.architecture", "test");
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", pre);
    w.strs("tokenizer.ggml.tokens", tokens);
    w.i32s("tokenizer.ggml.token_type", types);
    w.strs("tokenizer.ggml.merges", merges);
  }
};

struct Loaded {
  GgufWriter w;
  std::unique_ptr<dllm::gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
};

// Writes spec (+ extra keys) and loads it.
template <class Extra>
std::unique_ptr<Loaded> load(const VocabSpec& spec, Extra extra) {
  auto l = std::make_unique<Loaded>();
  spec.write_to(l->w);
  extra(l->w);
  l->file = dllm::gguf::File::open(l->w.write());
  l->tok = std::make_unique<Tokenizer>(*l->file);
  return l;
}
std::unique_ptr<Loaded> load(const VocabSpec& spec) {
  return load(spec, [](GgufWriter&) {});
}

// The error message of loading spec (+ extra keys); "" when it loads.
template <class Extra>
std::string load_error(const VocabSpec& spec, Extra extra) {
  try {
    load(spec, extra);
  } catch (const dllm::Error& e) {
    return e.what();
  }
  return "";
}

// Naive BPE: repeatedly merge the adjacent pair of lowest rank, leftmost first, rescanning each time.
std::vector<int32_t> naive_bpe(const VocabSpec& spec, const std::string& word) {
  std::unordered_map<std::string, int> rank;  // "left right" -> rank
  for (size_t r = 0; r < spec.merges.size(); ++r) rank.emplace(spec.merges[r], int(r));
  std::vector<std::string> sym;
  for (unsigned char c : word) sym.push_back(byte_char(c));
  for (;;) {
    int best = -1, best_rank = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank.find(sym[i] + " " + sym[i + 1]);
      if (it != rank.end() && (best < 0 || it->second < best_rank)) best = int(i), best_rank = it->second;
    }
    if (best < 0) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& s : sym) ids.push_back(spec.id(s));
  return ids;
}

std::string error_of(const VocabSpec& spec) { return load_error(spec, [](GgufWriter&) {}); }

}  // namespace

TEST(TokenizerBpe, MatchesNaiveReferenceOnRandomMergeTables) {
  std::mt19937 rng(1234);
  for (int table = 0; table < 5; ++table) {
    VocabSpec spec;
    std::vector<std::string> pool = {"a", "b", "c", "d"};
    std::set<std::pair<std::string, std::string>> used;
    while (spec.merges.size() < 150) {
      const std::string l = pool[rng() % pool.size()], r = pool[rng() % pool.size()];
      if ((l + r).size() > 12 || !used.insert({l, r}).second) continue;
      spec.merge(l, r);
      if (spec.id(l + r) == int32_t(spec.tokens.size() - 1)) pool.push_back(l + r);
    }
    auto loaded = load(spec);
    for (int w = 0; w < 152; ++w) {
      std::string word(w < 150 ? 1 + rng() % 40 : 800, 'a');  // short pieces, then two long ones
      for (char& c : word) c = char('a' + rng() % 4);
      ASSERT_EQ(loaded->tok->encode(word, false, false), naive_bpe(spec, word)) << "table " << table << " word " << word;
    }
  }
}

TEST(TokenizerBpe, LeftmostPairWinsATie) {
  VocabSpec spec;
  spec.merge("a", "a");
  auto l = load(spec);
  const int32_t a = spec.id("a"), aa = spec.id("aa");
  EXPECT_EQ(l->tok->encode("aaa", false, false), (std::vector<int32_t>{aa, a}));
  EXPECT_EQ(l->tok->encode("aaaaa", false, false), (std::vector<int32_t>{aa, aa, a}));
}

TEST(TokenizerBpe, IgnoreMergesEmitsAWholePieceFoundInTheVocabulary) {
  VocabSpec spec;
  spec.merge("x", "y");
  const int32_t xyz = spec.add("xyz");  // no merge reaches it
  auto gpt2 = load(spec);
  EXPECT_EQ(gpt2->tok->encode("xyz", false, false), (std::vector<int32_t>{spec.id("xy"), spec.id("z")}));
  spec.pre = "llama-bpe";
  auto llama = load(spec, [](GgufWriter& w) { w.u32("tokenizer.ggml.bos_token_id", 0); });
  EXPECT_EQ(llama->tok->encode("xyz", false, false), (std::vector<int32_t>{xyz}));
  EXPECT_EQ(llama->tok->encode("xyz", false, true), (std::vector<int32_t>{0, xyz}));  // BOS by default
}

TEST(TokenizerSpecial, LongestFirstThenLowerIdAndUserDefinedAlwaysMatched) {
  VocabSpec spec;
  const int32_t ab = spec.add("ab", 4);     // user-defined
  const int32_t bc = spec.add("bc", 3);     // control, same length, higher id
  const int32_t abc = spec.add("<abc>", 3);  // control, longer
  auto l = load(spec);
  const Tokenizer& t = *l->tok;
  const int32_t a = spec.id("a"), c = spec.id("c"), lt = spec.id("<"), gt = spec.id(">");
  EXPECT_EQ(t.encode("abc", true, false), (std::vector<int32_t>{ab, c}));
  EXPECT_EQ(t.encode("<abc>", true, false), (std::vector<int32_t>{abc}));
  EXPECT_EQ(t.encode("xbc", true, false), (std::vector<int32_t>{spec.id("x"), bc}));
  // Without special parsing the control tokens are text; user-defined ones still match.
  EXPECT_EQ(t.encode("<abc>", false, false), (std::vector<int32_t>{lt, ab, c, gt}));
  EXPECT_EQ(t.encode("abab", false, false), (std::vector<int32_t>{ab, ab}));
  EXPECT_EQ(t.encode("aabcc", true, false), (std::vector<int32_t>{a, ab, c, c}));
  EXPECT_EQ(t.decode(t.encode("a<abc>bc", true, false)), "a<abc>bc");
  EXPECT_EQ(t.detokenize(t.encode("a<abc>ab", true, false), {false, false, true}), "aab");
}

TEST(TokenizerSpecial, LongSpecialTokensAreRefusedAndMatchingStaysLinear) {
  {
    VocabSpec spec;  // an 8 MiB user-defined token: 823 MB of trie nodes before the bound
    spec.add("<" + std::string(8u << 20, 'u') + ">", 4);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of(spec);
    EXPECT_EQ(e, "special token 256 in tokenizer.ggml.tokens is 8388610 bytes long (at most 1024): '<" +
                     std::string(39, 'u') + "... (8388610 bytes)'");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  }
  // The longest allowed special token against a long prompt that repeats its prefix: every byte starts a
  // partial match of 1023 bytes. Also: many long specials cost memory in proportion to their text, not 100x it.
  VocabSpec spec;
  const std::string longest = std::string(1023, 'a') + "b";
  const int32_t id = spec.add(longest, 4);
  for (int k = 0; k < 2000; ++k) spec.add("<" + std::to_string(k) + std::string(1000, 'z') + ">", 4);
  const size_t before = mallinfo2().uordblks;
  auto l = load(spec);
  const size_t grew = mallinfo2().uordblks - before;
  EXPECT_LT(grew, 24u << 20) << "2 MB of special token text took " << grew << " bytes";  // 8 MB; the trie: 72 MB
  const std::string prompt = std::string(131072, 'a') + "b";
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = l->tok->encode(prompt, true, false);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), id);
  EXPECT_LT(secs, 20.0);
  EXPECT_EQ(l->tok->decode(ids), prompt);
}

TEST(TokenizerSpecial, AddBosAndEosFlags) {
  VocabSpec spec;
  spec.add("<s>", 3);
  spec.add("</s>", 3);
  auto l = load(spec, [](GgufWriter& w) {
    w.u32("tokenizer.ggml.bos_token_id", 256);
    w.u32("tokenizer.ggml.eos_token_id", 257);
    w.boolean("tokenizer.ggml.add_bos_token", true);
    w.boolean("tokenizer.ggml.add_eos_token", true);
  });
  const std::vector<int32_t> ids = l->tok->encode("a", true, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, spec.id("a"), 257}));
  EXPECT_EQ(l->tok->detokenize(ids, {true, false, true}), "a");
  EXPECT_EQ(l->tok->decode(ids), "<s>a</s>");
  EXPECT_EQ(l->tok->eot(), -1);  // no eot key and no <|eot_id|> or <|im_end|> token
}

TEST(TokenizerLoad, ValidationErrorsNameTheKey) {
  {
    VocabSpec s;
    s.tokens[65] = s.tokens[66];
    EXPECT_EQ(error_of(s), "duplicate token in tokenizer.ggml.tokens: 'B' has ids 65 and 66");
  }
  {
    VocabSpec s;
    s.merges.push_back("a zz");
    EXPECT_EQ(error_of(s), "merge 0 'a zz' in tokenizer.ggml.merges names unknown token 'zz'");
  }
  {
    VocabSpec s;
    s.merges.push_back("a b");
    EXPECT_EQ(error_of(s), "merge 0 'a b' in tokenizer.ggml.merges makes 'ab', which is not in tokenizer.ggml.tokens");
  }
  {
    VocabSpec s;
    s.merges.push_back("ab");
    EXPECT_EQ(error_of(s), "merge 0 'ab' in tokenizer.ggml.merges is not two tokens separated by a space");
  }
  {
    VocabSpec s;
    s.types.pop_back();
    EXPECT_EQ(error_of(s), "tokenizer.ggml.token_type has 255 entries, but tokenizer.ggml.tokens has 256");
  }
  {
    VocabSpec s;
    s.pre = "falcon";
    EXPECT_NE(error_of(s).find("unknown pre-tokenizer 'falcon' (tokenizer.ggml.pre)"), std::string::npos);
  }
  VocabSpec ok;
  EXPECT_EQ(load_error(ok, [](GgufWriter& w) { w.u32("tokenizer.ggml.eos_token_id", 256); }),
            "tokenizer.ggml.eos_token_id = 256 is out of range (the vocabulary has 256 tokens)");
  EXPECT_EQ(load_error(ok, [](GgufWriter& w) { w.boolean("tokenizer.ggml.add_bos_token", true); }),
            "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
  EXPECT_EQ(load_error(ok, [](GgufWriter& w) { w.str("tokenizer.ggml.bos_token_id", "1"); }),
            "metadata key tokenizer.ggml.bos_token_id has type str, expected an unsigned integer");
  EXPECT_EQ(load_error(ok, [](GgufWriter&) {}), "");
}

TEST(TokenizerLoad, HostileTextsInErrorsAreEscapedAndCut) {
  {
    VocabSpec s;  // a 100 KB pre-tokenizer name that retitles the terminal
    s.pre = "\x1b]0;pwned\x07" + std::string(100000, 'x');
    const std::string e = error_of(s);
    EXPECT_EQ(e.find('\x1b'), std::string::npos);
    EXPECT_EQ(e.rfind("unknown pre-tokenizer '\\x1b]0;pwned\\x07xxx", 0), 0u) << e.substr(0, 300);
    EXPECT_NE(e.find("... (100010 bytes)' (tokenizer.ggml.pre)"), std::string::npos) << e.substr(0, 300);
    EXPECT_LT(e.size(), 600u);
  }
  {
    VocabSpec s;  // token texts with a CSI (U+009B) and a right-to-left override (U+202E)
    s.add("\xc2\x9b" "31m\xe2\x80\xae" "evil");
    s.add("\xc2\x9b" "31m\xe2\x80\xae" "evil");
    EXPECT_EQ(error_of(s), "duplicate token in tokenizer.ggml.tokens: '\\u009b31m\\u202eevil' has ids 256 and 257");
  }
}

TEST(TokenizerLoad, UnsupportedModelAndMissingKeys) {
  GgufWriter w;
  w.str("tokenizer.ggml.model", "llama");
  auto f = dllm::gguf::File::open(w.write());
  try {
    Tokenizer t(*f);
    FAIL() << "no error";
  } catch (const dllm::Error& e) {
    EXPECT_STREQ(e.what(), "unsupported tokenizer model 'llama' (tokenizer.ggml.model); dllm supports gpt2 (byte-level "
                 "BPE) and gemma4 (BPE over UTF-8 with byte fallback)");
  }
  GgufWriter w2;
  w2.str("general.architecture", "llada");
  auto f2 = dllm::gguf::File::open(w2.write());
  try {
    Tokenizer t(*f2);
    FAIL() << "no error";
  } catch (const dllm::Error& e) {
    EXPECT_STREQ(e.what(), "required metadata key missing: tokenizer.ggml.model");
  }
}

// gemma4 on a hand-made vocabulary: whatever tokenizer.ggml.pre says and even with add_bos_token = false (llama.cpp's
// "workaround for Gemma 4"), BOS is added; spaces merge as U+2581; a newline run the vocabulary lacks is merged as
// characters; a character without a token becomes its <0xXX> bytes.
TEST(TokenizerGemma4Load, BosAlwaysEscapedSpacesAndByteFallback) {
  const std::string sp = "\xe2\x96\x81";  // U+2581
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "\n", sp, "a", "b", "ab", sp + "ab", "<turn|>"};
  std::vector<int32_t> types = {3, 3, 3, 1, 1, 1, 1, 1, 1, 3};
  const int32_t byte0 = int32_t(tokens.size());
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">"), types.push_back(6);
  GgufWriter w;
  w.str("general.architecture", "diffusion-gemma");
  w.str("tokenizer.ggml.model", "gemma4");
  w.str("tokenizer.ggml.pre", "not-a-pre-tokenizer-dllm-knows");
  w.strs("tokenizer.ggml.tokens", tokens);
  w.i32s("tokenizer.ggml.token_type", types);
  w.strs("tokenizer.ggml.merges", {"a b", sp + " ab"});
  w.u32("tokenizer.ggml.bos_token_id", 2);
  w.u32("tokenizer.ggml.eos_token_id", 1);
  w.boolean("tokenizer.ggml.add_bos_token", false);
  auto f = dllm::gguf::File::open(w.write());
  const Tokenizer tok(*f);
  EXPECT_EQ(tok.model(), dllm::model::TokenizerModel::Gemma4);
  EXPECT_EQ(tok.pre(), "gemma4");
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.eot(), 9);
  EXPECT_EQ(tok.eog(), (std::vector<int32_t>{1, 9}));
  const std::vector<int32_t> ids = tok.encode("ab ab\n\nx", true, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 7, 8, 3, 3, byte0 + 'x'}));
  EXPECT_EQ(tok.detokenize(ids, {true, false, true}), "ab ab\n\nx");
  EXPECT_EQ(tok.token_piece(8), " ab");
}
