// The commands that get models: `dllm pull`. It parses its own arguments (everything after the word "pull").
// Other commands turn --model into a path with dllm::hub::resolve_model (hub/hub.h).
#pragma once
#include <string>
#include <vector>

namespace dllm::cli {

// dllm pull [ID] [--quant Q] [--check] [--ask]
// Prints the local path of the model file on stdout; notes and the progress bar go to stderr.
// Exit status: 0 done (or declined with --ask), 1 failed, or with --check: not in the cache; 2 usage error.
int cmd_pull(const std::vector<std::string>& args);

// The usage text of `dllm pull` (for `dllm pull --help` and the global usage).
std::string pull_usage();

}  // namespace dllm::cli
