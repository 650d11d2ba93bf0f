// libFuzzer target for the tokenizer (src/model/tokenizer.cpp, pretokenizer.cpp): arbitrary bytes as a prompt,
// encoded with the Qwen2 vocabulary of tests/data/tokenizer (byte-level BPE, special tokens, the Qwen2
// pre-tokenizer regex). The first byte picks parse_special / add_special; the rest is the text. A crash, a
// sanitizer report, a hang (special-token matching must stay linear in the prompt), an id outside the
// vocabulary, or a valid UTF-8 text that does not come back from decode(encode(text)) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/error.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"

namespace {

struct Vocab {
  std::unique_ptr<dllm::gguf::File> file;
  std::unique_ptr<dllm::model::Tokenizer> tok;
};

const Vocab& vocab() {
  static const Vocab v = [] {
    Vocab x;
    const char* path = std::getenv("DLLM_FUZZ_VOCAB");
    x.file = dllm::gguf::File::open(path && *path ? path : DLLM_FUZZ_DEFAULT_VOCAB);
    x.tok = std::make_unique<dllm::model::Tokenizer>(*x.file);
    return x;
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const dllm::model::Tokenizer& tok = *vocab().tok;
  const bool parse_special = data[0] & 1, add_special = data[0] & 2;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, parse_special, add_special);
  } catch (const dllm::Error&) {
    return 0;
  }
  for (int32_t id : ids)
    if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
  if (!add_special && dllm::model::is_valid_utf8(text) && tok.decode(ids) != text) __builtin_trap();
  return 0;
}
