// The flags' backend choice (backend.h).
#include "cli/backend.h"

#include <algorithm>

#include "engine/engine.h"

namespace dllm::cli {

engine::BackendRequest backend_request(const Settings& s) {
  engine::BackendRequest r;
  r.device = s.device;
  r.threads = s.threads;
  r.max_rows = s.command == "logits"
                   ? static_cast<int64_t>(s.tokens.size())
                   : s.max_tokens + std::max<int64_t>(static_cast<int64_t>(s.prompt_tokens.size()), 1024);
  return r;
}

void print_backend_warning(const Backend& b) {
  if (!b.warning.empty()) std::fprintf(stderr, "dllm: warning: %s\n", b.warning.c_str());
}

void print_chat_template_note(const engine::Engine& e, bool chat) {
  if (!chat) return;
  const std::string note = e.chat_template_note();
  if (!note.empty()) std::fprintf(stderr, "dllm: warning: %s\n", note.c_str());
}

void print_load_warning(const model::Executor& executor) {
  const std::string w = executor.load_warning();
  if (!w.empty()) std::fprintf(stderr, "dllm: warning: %s\n", w.c_str());
}

}  // namespace dllm::cli
