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
    EXPECT_STREQ(e.what(), "unsupported model architecture: qwen2 (supported: llada, dream, llada-moe, rnd1, diffusion-gemma)");
  }
}

// The template a file declares (tokenizer.chat_template) decides the chat format, whatever the
// architecture: the real LLaDA and Dream templates (tests/data/chat_templates, also carried by the tiny
// llada-moe and rnd1 files), a ChatML template without a default system turn (Qwen3's kind), and the
// architecture's template, with a note, for one dllm does not render or none at all.
TEST(Chat, TheFilesTemplateDecides) {
  using dllm::model::chat_template_of;
  const std::string llada = dllm::test::read_file(dllm::test::data_path("chat_templates/llada.jinja"));
  const std::string dream = dllm::test::read_file(dllm::test::data_path("chat_templates/dream.jinja"));
  std::string note = "stale";
  EXPECT_EQ(chat_template_of("llada", llada, &note), ChatTemplate::LLaDA);
  EXPECT_EQ(note, "");
  EXPECT_EQ(chat_template_of("dream", dream, &note), ChatTemplate::Dream);
  EXPECT_EQ(chat_template_of("rnd1", llada, &note), ChatTemplate::LLaDA);  // the file, not the architecture
  EXPECT_EQ(chat_template_of("llada-moe", dream, &note), ChatTemplate::Dream);
  EXPECT_EQ(note, "");
  // The MoE fixture files carry the real templates.
  for (const auto& [file, want] : {std::pair{"tiny-llada-moe-Q8_0.gguf", ChatTemplate::LLaDA},
                                   std::pair{"tiny-rnd1-Q8_0.gguf", ChatTemplate::Dream}}) {
    const Loaded l(dllm::test::data_path(std::string("moe/gguf/") + file));
    ASSERT_FALSE(l.tok->chat_template().empty()) << file;
    EXPECT_EQ(chat_template_of(std::string(l.file->get_string("general.architecture")), l.tok->chat_template()), want)
        << file;
  }
  // ChatML without a default system turn: the caller's system message only.
  const std::string qwen3 =
      "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
      "{%- endif %}{%- for message in messages %}{%- if message.role != 'system' %}{{- '<|im_start|>' + "
      "message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  EXPECT_EQ(chat_template_of("rnd1", qwen3, &note), ChatTemplate::ChatML);
  EXPECT_EQ(note, "");
  EXPECT_EQ(dllm::model::render_chat(ChatTemplate::ChatML, "hi", ""), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(dllm::model::render_chat(ChatTemplate::ChatML, "hi", "", "Be brief."),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // A default system turn other than Dream's, and a template of another family: the architecture's, said.
  const std::string qwen25 =
      "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
      "You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
  EXPECT_EQ(chat_template_of("rnd1", qwen25, &note), ChatTemplate::Dream);
  EXPECT_NE(note.find("tokenizer.chat_template is not one dllm renders"), std::string::npos) << note;
  EXPECT_NE(note.find("Dream (ChatML) template of architecture rnd1"), std::string::npos) << note;
  EXPECT_EQ(chat_template_of("llada-moe", "{{ bos_token }}[INST] {{ messages[0]['content'] }} [/INST]", &note),
            ChatTemplate::LLaDA);
  EXPECT_NE(note.find("LLaDA template of architecture llada-moe"), std::string::npos) << note;
  EXPECT_EQ(chat_template_of("llada-moe", "", &note), ChatTemplate::LLaDA);  // no template: the architecture's
  EXPECT_EQ(note, "");
  EXPECT_THROW(chat_template_of("qwen2", llada), dllm::Error);
}

// ---- Gemma-4 turns (DiffusionGemma) ------------------------------------------------------------------
// tests/data/diffusion-gemma/chat.jsonl: four conversations rendered by the llama.cpp fork's chat-template code from
// the tiny model's tokenizer.chat_template (a short Gemma-4 template), with their ids; BOS comes from tokenization.

namespace {

const Loaded& gemma4() {
  static Loaded g(dllm::test::data_path("diffusion-gemma/tiny-diffusion-gemma-A-vocab.gguf"));
  return g;
}

std::vector<dllm::model::ChatMessage> messages_of(const json& v) {
  std::vector<dllm::model::ChatMessage> out;
  for (const json& m : v) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

}  // namespace

TEST(Chat, Gemma4TemplateIsRecognised) {
  using dllm::model::chat_template_of;
  const Loaded& g = gemma4();
  std::string note = "stale";
  EXPECT_EQ(chat_template_of("diffusion-gemma", g.tok->chat_template(), &note), ChatTemplate::Gemma4);
  EXPECT_EQ(note, "");
  EXPECT_EQ(dllm::model::chat_template_for_arch("diffusion-gemma"), ChatTemplate::Gemma4);  // no template: the same
  EXPECT_STREQ(dllm::model::chat_template_name(ChatTemplate::Gemma4), "Gemma-4");
}

TEST(Chat, Gemma4ConversationsMatchTheFork) {
  const Loaded& g = gemma4();
  std::istringstream in(dllm::test::read_file(dllm::test::data_path("diffusion-gemma/chat.jsonl")));
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json c = json::parse(line);
    const auto messages = messages_of(c["messages"]);
    const bool gen = c["add_generation_prompt"];
    // The fork drops the template's leading BOS text; with an empty bos_text the render is its text exactly.
    EXPECT_EQ(dllm::model::render_chat_messages(ChatTemplate::Gemma4, messages, "", gen), c["rendered"].get<std::string>())
        << c["id"];
    EXPECT_EQ(dllm::model::render_chat_messages(ChatTemplate::Gemma4, messages, "<bos>", gen),
              "<bos>" + c["rendered"].get<std::string>())
        << c["id"];
    EXPECT_EQ(dllm::model::chat_messages_ids(*g.tok, ChatTemplate::Gemma4, messages, gen),
              c["ids"].get<std::vector<int32_t>>())
        << c["id"];
    ++n;
  }
  EXPECT_EQ(n, 4);
  // One user message the way `run` builds it, with and without a system turn; "developer" is a system turn too.
  EXPECT_EQ(dllm::model::render_chat(ChatTemplate::Gemma4, " Hi ", "<bos>", "Be brief. "),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
  EXPECT_EQ(dllm::model::render_chat_messages(ChatTemplate::Gemma4, {{"developer", "x"}, {"user", "y"}}, ""),
            "<|turn>system\nx<turn|>\n<|turn>user\ny<turn|>\n<|turn>model\n");
  EXPECT_EQ(dllm::model::prompt_ids(*g.tok, "diffusion-gemma", "Hello", false),
            (std::vector<int32_t>{2, 6, 916, 600, 32, 366, 647, 637, 7, 32, 6, 321, 787, 32}));
}

TEST(Chat, WithoutTheGenerationPrompt) {
  using dllm::model::render_chat_messages;
  const std::vector<dllm::model::ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(render_chat_messages(ChatTemplate::ChatML, m, "", false), "<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(render_chat_messages(ChatTemplate::LLaDA, m, "<B>", false), "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
}
