// Helpers shared by the test executables: fixture paths and running the dllm binary.
#pragma once
#include <string>
#include <vector>

namespace dllm::test {

// Path of a file under tests/data (the fixtures the repository ships).
std::string data_path(const std::string& rel);
// Path under ../shared (present on developer machines and CI, not on every clone); "" when absent.
std::string shared_path(const std::string& rel);

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the built dllm binary with the given arguments (no shell), capturing both streams.
RunResult run_dllm(const std::vector<std::string>& args);

std::string read_file(const std::string& path);

}  // namespace dllm::test
