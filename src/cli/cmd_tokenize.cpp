// dllm tokenize: prints the ids of the chat-formatted prompt (the ids `run` feeds the model), with --messages
// those of a whole conversation (an OpenAI-style JSON array of messages rendered with the generation prompt), or
// with --no-chat the ids of the text without a template (BOS/EOS as the vocabulary's add_bos_token and
// add_eos_token say). Plain output is the ids separated by spaces on one line; --json prints
// {"ids": [...], "pieces": [...]} where a piece that is not valid UTF-8 on its own (part of a multi-byte
// character) has its bad bytes replaced by U+FFFD.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/chat.h"
#include "common/error.h"
#include "common/printable.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace dllm::cli {

namespace {

// --messages FILE: a non-empty JSON array of {"role", "content"} objects; role system, user or assistant
// ("developer", OpenAI's newer name for system, is read as system, as the server does), content a string. Errors
// name the file and the message's index and field.
std::vector<model::ChatMessage> read_messages(const std::string& path) {
  const std::string text = read_prompt_file(path, "--messages");
  const std::string where = path == "-" ? "--messages - (standard input)" : "--messages " + path;
  auto fail = [&](const std::string& what) { return Error(where + ": " + what); };
  nlohmann::json v;
  try {
    v = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw fail(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!v.is_array() || v.empty())
    throw fail("needs a non-empty JSON array of messages [{\"role\": ..., \"content\": ...}, ...]");
  std::vector<model::ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string key = "messages[" + std::to_string(i) + "]";
    const nlohmann::json& m = v[i];
    if (!m.is_object()) throw fail(key + " is not an object {\"role\", \"content\"}");
    if (!m.contains("role")) throw fail(key + ".role is missing");
    if (!m["role"].is_string()) throw fail(key + ".role is not a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant")
      throw fail(key + ".role must be system, user or assistant, got '" + shown(role) + "'");
    if (!m.contains("content")) throw fail(key + ".content is missing");
    if (!m["content"].is_string()) throw fail(key + ".content is not a string");
    out.push_back({std::move(role), m["content"].get<std::string>()});
  }
  return out;
}

}  // namespace

int cmd_tokenize(const Settings& s) {
  const std::unique_ptr<gguf::File> file = gguf::File::open(s.model);
  // Check the architecture before loading the vocabulary: a file dllm cannot run gets the same
  // message as from `run`. --no-chat needs no architecture, so any gpt2-vocabulary GGUF works.
  std::string arch;
  if (!s.no_chat) {
    arch = std::string(file->get_string("general.architecture"));
    model::chat_template_for_arch(arch);
  }
  const model::Tokenizer tok(*file);
  if (!s.no_chat) {
    std::string note;
    model::chat_template_of(arch, tok.chat_template(), &note);
    if (!note.empty()) std::fprintf(stderr, "dllm: warning: %s\n", note.c_str());
  }
  const std::vector<int32_t> ids =
      s.has_messages
          ? model::chat_messages_ids(tok, model::chat_template_of(arch, tok.chat_template()), read_messages(s.messages_file))
          : model::prompt_ids(tok, arch, s.prompt, s.no_chat);

  if (s.json) {
    nlohmann::json out;
    out["ids"] = ids;
    nlohmann::json pieces = nlohmann::json::array();
    for (int32_t id : ids) pieces.push_back(tok.token_piece(id));
    out["pieces"] = std::move(pieces);
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += std::to_string(ids[i]);
    }
    std::cout << line << "\n";
  }
  return 0;
}

}  // namespace dllm::cli
