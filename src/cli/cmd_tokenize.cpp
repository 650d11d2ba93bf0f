// dllm tokenize: prints the ids of the chat-formatted prompt (the ids `run` feeds the model), or with
// --no-chat the ids of the text without a template (BOS/EOS as the vocabulary's add_bos_token and
// add_eos_token say). Plain output is the ids separated by spaces on one line; --json prints
// {"ids": [...], "pieces": [...]} where a piece that is not valid UTF-8 on its own (part of a multi-byte
// character) has its bad bytes replaced by U+FFFD.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "model/chat.h"
#include "common/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace dllm::cli {

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
  const std::vector<int32_t> ids = model::prompt_ids(tok, arch, s.prompt, s.no_chat);

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
