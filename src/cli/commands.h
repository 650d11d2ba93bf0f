// The commands' entry points. Each takes the parsed settings, prints results to stdout and
// diagnostics to stderr, and returns the exit status (errors are thrown as dllm::Error).
#pragma once
#include <chrono>

#include "cli/backend.h"
#include "cli/settings.h"
#include "model/model.h"

namespace dllm::cli {

int cmd_inspect(const Settings& s);   // cmd_inspect.cpp
int cmd_tokenize(const Settings& s);  // cmd_tokenize.cpp
int cmd_logits(const Settings& s);    // cmd_logits.cpp
int cmd_run(const Settings& s);       // cmd_run.cpp
// cmd_run once the backend is chosen (opt.make_executor set): tests run it on an executor of their
// own, such as the GPU executor on the CPU emulator. t_start: when the command started (load timing).
int cmd_run_with(const Settings& s, const Backend& backend, model::LoadOptions opt,
                 std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now());
// run --prompts-file: many requests through the engine's batch (cmd_run_file.cpp).
int cmd_run_file(const Settings& s, std::chrono::steady_clock::time_point t_start);
// serve: the OpenAI-compatible server over the engine (cmd_serve.cpp, src/server).
int cmd_serve(const Settings& s);
int cmd_synth(const Settings& s);     // cmd_synth.cpp
int cmd_doctor(const Settings& s);    // cmd_doctor.cpp

}  // namespace dllm::cli
