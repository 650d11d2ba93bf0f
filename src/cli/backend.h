// The flags' choice of executor (--device, --threads) for the engine's choose_backend
// (engine/backend.h: DLLM_ISA, DLLM_EXECUTOR=reference, the GPU's checks).
#pragma once
#include <cstdio>
#include <string>

#include "cli/settings.h"
#include "engine/backend.h"
#include "model/model.h"

namespace dllm::engine {
class Engine;
}

namespace dllm::cli {

using Backend = engine::Backend;

// --device and --threads, with the canvas rows a GPU workspace must hold: the logits command knows them;
// run gets a prompt allowance.
engine::BackendRequest backend_request(const Settings& s);

// Prints the backend's warning (if any) to stderr as "dllm: warning: ...".
void print_backend_warning(const Backend& b);
// After load: the executor's load_warning() (matrices without kernels on the slow path), the same way.
void print_load_warning(const model::Executor& executor);
// The engine's chat_template_note, when prompts are chat-formatted (chat: not --no-chat).
void print_chat_template_note(const engine::Engine& e, bool chat);

}  // namespace dllm::cli
