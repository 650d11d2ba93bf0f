// Chat templates of the instruct models (algorithms.md section 2; Gemma-4's turns for DiffusionGemma) and the
// prompt ids the model sees: a conversation (system, user and assistant turns; `run` has one user message) plus the generation prompt, with BOS handled as llama.cpp's chat path does
// (LLaDA: exactly one BOS; Dream: none), or for --no-chat the text with BOS/EOS as the vocabulary says.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace dllm::model {

enum class ChatTemplate {
  LLaDA,   // Llama-3 style headers, BOS first, the message trimmed, no system turn
  Dream,   // ChatML with the default system turn "You are a helpful assistant."
  ChatML,  // ChatML with no default system turn (Qwen3's template)
  Gemma4,  // Gemma-4 turns: <|turn>role\n...<turn|>\n, "model" for the assistant, messages trimmed, BOS first
};

// One turn of a conversation: role is "system", "user" or "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

// The template of an architecture name (general.architecture). Throws dllm::Error
// "unsupported model architecture: X (supported: llada, dream, llada-moe, rnd1)" (the list: arch.h's
// supported_architectures()). The fallback for a file without a recognised tokenizer.chat_template
// (chat_template_of): llada and llada-moe render as LLaDA, dream and rnd1 as Dream (ChatML), diffusion-gemma as
// Gemma4, as the real files' templates do. diffusion-gemma is known here before `run` can run it, so that
// `tokenize` works on its files.
ChatTemplate chat_template_for_arch(std::string_view arch);

// The template a model file declares: its tokenizer.chat_template recognised as one of the above
// (Llama-3 style headers: LLaDA; ChatML whose default system turn is "You are a helpful assistant.":
// Dream; ChatML without a default system turn: ChatML; "<|turn>" turns: Gemma4). A file without one gets its architecture's. A
// template that is none of these also gets its architecture's, and `note` (when given) receives a line
// saying so; otherwise `note` is cleared. Throws for an unsupported architecture, as chat_template_for_arch.
ChatTemplate chat_template_of(std::string_view arch, std::string_view file_template, std::string* note = nullptr);

// The template's name as the notes and --verbose show it: "LLaDA", "Dream (ChatML)", "ChatML", "Gemma-4".
const char* chat_template_name(ChatTemplate t);

// The exact text the tokenizer sees for one user message with the generation prompt. bos_text is the
// BOS token's text (LLaDA's template starts with it; Dream's ignores it). system, when given, is a
// system turn before the user's (LLaDA: a "system" header, trimmed as every message; Dream: in place of
// the default system turn), as the models' own Jinja templates render a system message.
std::string render_chat(ChatTemplate tmpl, std::string_view user, std::string_view bos_text,
                        std::optional<std::string_view> system = std::nullopt);

// The exact text of a whole conversation with the generation prompt (unless add_generation_prompt is false),
// as the models' own Jinja templates render it (the files' tokenizer.chat_template; tests/data/chat_templates):
// LLaDA: BOS text, then each turn as a header and its content trimmed; Dream: the default system turn unless the
// first turn is a system turn, then each turn in ChatML; Gemma4: BOS text, a first "system" (or "developer")
// turn as "system", then each turn as <|turn>role\n + content trimmed + <turn|>\n with "assistant" written
// "model", and <|turn>model\n as the generation prompt.
std::string render_chat_messages(ChatTemplate tmpl, const std::vector<ChatMessage>& messages,
                                 std::string_view bos_text, bool add_generation_prompt = true);

// Ids of the chat-formatted prompt, as llama.cpp's chat path computes them: render, remove a leading
// BOS text when the vocabulary adds BOS itself, then tokenize with special tokens parsed and BOS/EOS
// added as the vocabulary says.
std::vector<int32_t> chat_prompt_ids(const Tokenizer& tok, ChatTemplate tmpl, std::string_view user,
                                     std::optional<std::string_view> system = std::nullopt);

// The same for a whole conversation (render_chat_messages).
std::vector<int32_t> chat_messages_ids(const Tokenizer& tok, ChatTemplate tmpl, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt = true);

// Ids for --no-chat: the text with special tokens parsed, BOS / EOS added as the vocabulary's
// add_bos_token / add_eos_token say (as llama.cpp's diffusion CLI does), no template.
std::vector<int32_t> raw_prompt_ids(const Tokenizer& tok, std::string_view text);

// The ids `run` feeds the model for a prompt: chat_prompt_ids with the template the file declares
// (chat_template_of(arch, tok.chat_template())), or raw_prompt_ids when no_chat (arch is then not looked at).
std::vector<int32_t> prompt_ids(const Tokenizer& tok, std::string_view arch, std::string_view prompt, bool no_chat);

// Python's str.strip(): removes leading and trailing characters for which str.isspace() is true
// (ASCII \t \n \v \f \r, U+001C..U+001F, space, U+0085, U+00A0 and the Unicode space separators).
// Jinja's `trim`, which LLaDA's template applies to the message, is this function.
std::string python_strip(std::string_view text);

}  // namespace dllm::model
