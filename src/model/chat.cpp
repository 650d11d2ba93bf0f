// Chat templates and prompt ids (see chat.h).
#include "model/chat.h"

#include "common/error.h"
#include "common/printable.h"
#include "common/utf8.h"
#include "model/arch.h"

namespace dllm::model {

std::string python_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    uint32_t c = 0;
    const size_t len = utf8_len_at(text, begin, &c);
    if (len == 0 || !python_isspace(c)) break;
    begin += len;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;  // back up to the lead byte of the last sequence
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    uint32_t c = 0;
    const size_t len = utf8_len_at(text, start, &c);
    if (len != end - start || !python_isspace(c)) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

namespace {

// Each architecture's template, for files without a tokenizer.chat_template: llada-moe's are LLaDA's Llama-3
// style template, rnd1's ChatML with the default system turn, as the fixture files declare; diffusion-gemma's the
// Gemma-4 turns. Architectures enter here when their text side works (tokenize), which may be before the
// forward does (arch.cpp's kArchitectures, which `run` needs).
struct ArchTemplate {
  std::string_view arch;
  ChatTemplate tmpl;
};
constexpr ArchTemplate kArchTemplates[] = {
    {"llada", ChatTemplate::LLaDA},   {"llada-moe", ChatTemplate::LLaDA},         {"dream", ChatTemplate::Dream},
    {"rnd1", ChatTemplate::Dream},    {"diffusion-gemma", ChatTemplate::Gemma4},
};

}  // namespace

ChatTemplate chat_template_for_arch(std::string_view arch) {
  for (const ArchTemplate& a : kArchTemplates)
    if (a.arch == arch) return a.tmpl;
  throw Error("unsupported model architecture: " + shown(arch) + " (supported: " + supported_architectures() + ")");
}

namespace {

// The literal default system turn of a ChatML template: the text after "<|im_start|>system" and a newline
// (the character, or Jinja's \n escape inside a string literal) up to the next "<|im_end|>", when it
// begins with text rather than the string literal's end (a template that renders the caller's system
// message has '<|im_start|>system\n' + message... there). Empty when there is none.
std::string default_system_turn(std::string_view t) {
  const std::string_view head = "<|im_start|>system";
  for (size_t at = t.find(head); at != std::string_view::npos; at = t.find(head, at + 1)) {
    size_t p = at + head.size();
    if (t.compare(p, 1, "\n") == 0) p += 1;
    else if (t.compare(p, 2, "\\n") == 0) p += 2;
    else continue;
    if (p >= t.size() || t[p] == '\'' || t[p] == '"') continue;
    const size_t end = t.find("<|im_end|>", p);
    if (end == std::string_view::npos) continue;
    return std::string(t.substr(p, end - p));
  }
  return {};
}

}  // namespace

ChatTemplate chat_template_of(std::string_view arch, std::string_view file_template, std::string* note) {
  const ChatTemplate by_arch = chat_template_for_arch(arch);
  if (note) note->clear();
  if (file_template.empty()) return by_arch;
  if (file_template.find("<|start_header_id|>") != std::string_view::npos &&
      file_template.find("<|end_header_id|>") != std::string_view::npos)
    return ChatTemplate::LLaDA;
  if (file_template.find("<|turn>") != std::string_view::npos && file_template.find("<turn|>") != std::string_view::npos)
    return ChatTemplate::Gemma4;
  if (file_template.find("<|im_start|>") != std::string_view::npos) {
    const std::string sys = default_system_turn(file_template);
    if (sys.empty()) return ChatTemplate::ChatML;
    if (sys == "You are a helpful assistant.") return ChatTemplate::Dream;
  }
  if (note) {
    *note = "the file's tokenizer.chat_template is not one dllm renders (Llama-3 headers as LLaDA's, ChatML with "
            "or without Dream's default system turn, Gemma-4 turns): prompts use the " + std::string(chat_template_name(by_arch)) +
            " template of architecture " + std::string(arch) + "; --no-chat sends the prompt as it is";
  }
  return by_arch;
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::LLaDA: return "LLaDA";
    case ChatTemplate::Dream: return "Dream (ChatML)";
    case ChatTemplate::ChatML: return "ChatML";
    case ChatTemplate::Gemma4: return "Gemma-4";
  }
  throw Error("internal error: unknown chat template");
}

std::string render_chat_messages(ChatTemplate tmpl, const std::vector<ChatMessage>& messages,
                                 std::string_view bos_text, bool add_generation_prompt) {
  std::string out;
  switch (tmpl) {
    case ChatTemplate::LLaDA:
      out.append(bos_text);
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        out += python_strip(m.content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatTemplate::Dream:
      if (messages.empty() || messages.front().role != "system")
        out += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
      [[fallthrough]];
    case ChatTemplate::ChatML:
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatTemplate::Gemma4: {
      // The fixture's and Google's templates: {{ bos_token }}, a leading system/developer message as the system
      // turn, every message trimmed, the assistant's role written "model".
      out.append(bos_text);
      size_t first = 0;
      if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
        out += "<|turn>system\n" + python_strip(messages[0].content) + "<turn|>\n";
        first = 1;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        out += "<|turn>" + (m.role == "assistant" ? std::string("model") : m.role) + "\n";
        out += python_strip(m.content) + "<turn|>\n";
      }
      if (add_generation_prompt) out += "<|turn>model\n";
      break;
    }
  }
  return out;
}

namespace {

std::vector<ChatMessage> one_turn(std::string_view user, std::optional<std::string_view> system) {
  std::vector<ChatMessage> m;
  if (system) m.push_back({"system", std::string(*system)});
  m.push_back({"user", std::string(user)});
  return m;
}

}  // namespace

std::string render_chat(ChatTemplate tmpl, std::string_view user, std::string_view bos_text,
                        std::optional<std::string_view> system) {
  return render_chat_messages(tmpl, one_turn(user, system), bos_text);
}

std::vector<int32_t> chat_messages_ids(const Tokenizer& tok, ChatTemplate tmpl, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt) {
  const std::string bos_text = tok.bos() >= 0 ? tok.token_text(tok.bos()) : std::string();
  std::string text = render_chat_messages(tmpl, messages, bos_text, add_generation_prompt);
  // llama.cpp (common/chat.cpp) drops the template's BOS text when the tokenizer adds BOS anyway,
  // so the prompt starts with exactly one BOS either way.
  if (tok.add_bos() && !bos_text.empty() && text.compare(0, bos_text.size(), bos_text) == 0)
    text.erase(0, bos_text.size());
  return tok.encode(text, /*parse_special=*/true, /*add_special=*/true);
}

std::vector<int32_t> chat_prompt_ids(const Tokenizer& tok, ChatTemplate tmpl, std::string_view user,
                                     std::optional<std::string_view> system) {
  return chat_messages_ids(tok, tmpl, one_turn(user, system));
}

std::vector<int32_t> raw_prompt_ids(const Tokenizer& tok, std::string_view text) {
  // As llama.cpp's diffusion CLI tokenizes a prompt it does not template: BOS/EOS as the vocabulary's
  // add_bos_token / add_eos_token say (real LLaDA files set add_bos_token; Dream's files do not).
  return tok.encode(text, /*parse_special=*/true, /*add_special=*/true);
}

std::vector<int32_t> prompt_ids(const Tokenizer& tok, std::string_view arch, std::string_view prompt, bool no_chat) {
  if (no_chat) return raw_prompt_ids(tok, prompt);
  return chat_prompt_ids(tok, chat_template_of(arch, tok.chat_template()), prompt);
}

}  // namespace dllm::model
