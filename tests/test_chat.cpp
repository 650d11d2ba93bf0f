// Chat templates and prompt ids: the ids llama.cpp's diffusion runs fed the tiny LLaDA (bailingmoe
// pre-tokenizer, one BOS) and Dream (qwen2, ChatML with the default system turn) models, the exact
// Dream-7B sequence of algorithms.md 2.2 on the Qwen vocabulary, trimming, and --no-chat ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/chat.h"
#include "common/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "support.h"

using dllm::model::ChatTemplate;
using dllm::model::Tokenizer;
using json = nlohmann::json;

namespace {

std::string model_path(const std::string& name) {
  const std::string local = dllm::test::data_path("models/" + name);
  if (std::filesystem::exists(local)) return local;
  return dllm::test::shared_path("fixtures/models/gguf/" + name);
}

struct Loaded {
  std::unique_ptr<dllm::gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
  explicit Loaded(const std::string& path) : file(dllm::gguf::File::open(path)), tok(std::make_unique<Tokenizer>(*file)) {}
};

const Loaded& tiny(const std::string& arch) {
  static Loaded llada(model_path("tiny-llada-F32.gguf"));
  static Loaded dream(model_path("tiny-dream-F32.gguf"));
  return arch == "llada" ? llada : dream;
}

const Loaded& qwen() {
  static Loaded q(dllm::test::data_path("tokenizer/vocab-qwen.gguf"));
  return q;
}

}  // namespace

TEST(Chat, PromptIdsMatchLlamaCppDiffusionRuns) {
  std::istringstream in(dllm::test::read_file(dllm::test::data_path("tokenizer/chat-prompts.jsonl")));
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json p = json::parse(line);
    const std::string arch = p["arch"], prompt = p["prompt"];
    const Tokenizer& tok = *tiny(arch).tok;
    const ChatTemplate tmpl = dllm::model::chat_template_for_arch(arch);
    EXPECT_EQ(dllm::model::chat_prompt_ids(tok, tmpl, prompt), p["prompt_ids"].get<std::vector<int32_t>>())
        << arch << ": " << prompt;
    // llama.cpp's formatted prompt has the BOS text stripped (the tokenizer adds BOS back).
    EXPECT_EQ(dllm::model::render_chat(tmpl, prompt, ""), p["formatted_prompt"].get<std::string>()) << prompt;
    ++n;
  }
  EXPECT_EQ(n, 21);
}

TEST(Chat, LladaHasExactlyOneBosAndDreamNone) {
  const Tokenizer& l = *tiny("llada").tok;
  ASSERT_EQ(l.bos(), 1012);
  ASSERT_TRUE(l.add_bos());
  const std::vector<int32_t> ids = dllm::model::chat_prompt_ids(l, ChatTemplate::LLaDA, "Hi");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1012);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1012), 1);
  // The same prompt rendered with the BOS text and tokenized without automatic BOS gives the same ids.
  EXPECT_EQ(l.encode(dllm::model::render_chat(ChatTemplate::LLaDA, "Hi", "<|startoftext|>"), true, false), ids);

  const Tokenizer& d = *tiny("dream").tok;
  ASSERT_FALSE(d.add_bos());
  const std::vector<int32_t> dids = dllm::model::chat_prompt_ids(d, ChatTemplate::Dream, "Hi");
  EXPECT_EQ(std::count(dids.begin(), dids.end(), d.bos()), 0);
  EXPECT_EQ(dids.front(), d.token_id("<|im_start|>"));
}

TEST(Chat, DreamSequenceOnTheQwenVocabulary) {
  // algorithms.md 2.2, U = "Hello".
  const std::vector<int32_t> expected = {151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198,
                                         151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198};
  EXPECT_EQ(dllm::model::chat_prompt_ids(*qwen().tok, ChatTemplate::Dream, "Hello"), expected);
}

TEST(Chat, LladaTrimsTheMessageDreamDoesNot) {
  const Tokenizer& l = *tiny("llada").tok;
  const auto plain = dllm::model::chat_prompt_ids(l, ChatTemplate::LLaDA, "Hi");
  EXPECT_EQ(dllm::model::chat_prompt_ids(l, ChatTemplate::LLaDA, " \t\nHi \u3000\n"), plain);
  const Tokenizer& d = *tiny("dream").tok;
  EXPECT_NE(dllm::model::chat_prompt_ids(d, ChatTemplate::Dream, " Hi"),
            dllm::model::chat_prompt_ids(d, ChatTemplate::Dream, "Hi"));
}

TEST(Chat, PythonStrip) {
  using dllm::model::python_strip;
  EXPECT_EQ(python_strip(""), "");
  EXPECT_EQ(python_strip("   "), "");
  EXPECT_EQ(python_strip(" a b "), "a b");
  EXPECT_EQ(python_strip("\x1c\x1f\v\fa\r\n"), "a");                       // Python's isspace includes 0x1C-0x1F
  EXPECT_EQ(python_strip("\u3000\u00a0\u0085a\u2028\u2029\u202f"), "a");  // Unicode spaces
  EXPECT_EQ(python_strip("\u200bA\ufeff"), "\u200bA\ufeff");              // ZWSP and BOM are not spaces
  EXPECT_EQ(python_strip("\xff a \xc3"), "\xff a \xc3");                  // invalid bytes stop the scan
  EXPECT_EQ(python_strip("\u00e9 "), "\u00e9");
}

TEST(Chat, NoChatAddsBosAndEosAsTheVocabularySays) {
  // As llama.cpp's diffusion CLI: no template, but BOS / EOS as add_bos_token / add_eos_token say. The
  // tiny LLaDA vocabulary sets add_bos_token (as the real LLaDA files do), the tiny Dream one neither.
  const Tokenizer& l = *tiny("llada").tok;
  ASSERT_TRUE(l.add_bos());
  ASSERT_FALSE(l.add_eos());
  const auto ids = dllm::model::raw_prompt_ids(l, "Hi");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), l.bos());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), l.bos()), 1);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), l.encode("Hi", true, false));
  // Special tokens written in the text are still parsed; an empty prompt is the BOS alone.
  EXPECT_EQ(dllm::model::raw_prompt_ids(l, "<|mdm_mask|>"), (std::vector<int32_t>{l.bos(), 1014}));
  EXPECT_EQ(dllm::model::raw_prompt_ids(l, ""), (std::vector<int32_t>{l.bos()}));
  const Tokenizer& d = *tiny("dream").tok;
  ASSERT_FALSE(d.add_bos());
  ASSERT_FALSE(d.add_eos());
  EXPECT_EQ(dllm::model::raw_prompt_ids(d, "Hi"), d.encode("Hi", true, false));
}

TEST(Chat, PromptIdsByArchitectureName) {
  const Tokenizer& l = *tiny("llada").tok;
  EXPECT_EQ(dllm::model::prompt_ids(l, "llada", "Hi", false), dllm::model::chat_prompt_ids(l, ChatTemplate::LLaDA, "Hi"));
  EXPECT_EQ(dllm::model::prompt_ids(l, "anything", "Hi", true), dllm::model::raw_prompt_ids(l, "Hi"));
  EXPECT_THROW(dllm::model::prompt_ids(l, "qwen2", "Hi", false), dllm::Error);
}

TEST(Chat, UnknownArchitectureIsAnError) {
  try {
    dllm::model::chat_template_for_arch("qwen2");
    FAIL() << "no error";
  } catch (const dllm::Error& e) {
    EXPECT_STREQ(e.what(), "unsupported model architecture: qwen2 (supported: llada, dream, llada-moe, rnd1)");
  }
}
