// Helpers shared by the test executables: fixture paths and running the dllm binary.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "jit/cpu_features.h"
#include "model/generate.h"

namespace dllm::test {

// Path of a file under tests/data (the fixtures the repository ships).
std::string data_path(const std::string& rel);
// Path under ../shared (present on developer machines and CI, not on every clone); "" when absent.
std::string shared_path(const std::string& rel);

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
  bool signaled = false;  // a signal ended it (exit_code is then 128 + the signal)
};
// Runs the built dllm binary with the given arguments (no shell), capturing both streams.
RunResult run_dllm(const std::vector<std::string>& args);
// The same with stdin_text on its standard input (otherwise /dev/null).
RunResult run_dllm(const std::vector<std::string>& args, const std::string& stdin_text);
// Runs another program (looked up on PATH), capturing both streams.
RunResult run_program(const std::string& program, const std::vector<std::string>& args);
// Runs it and presses Ctrl-C (SIGINT) once its stderr holds marker (at most 60 s later).
RunResult run_dllm_interrupted(const std::vector<std::string>& args, const std::string& marker);

std::string read_file(const std::string& path);

// A copy of the tests/data model rel in a new temporary file (the caller removes it) with every value of the
// F32 tensor `tensor` set to `value` (NaN, infinity): a file whose numbers overflow.
std::string poisoned_model_copy(const std::string& rel, const std::string& tensor, float value);

// A `dllm serve` running in the background: started with args (plus --port 0), ready once its stderr says
// "listening on http://HOST:PORT" (at most 120 s; throws otherwise). stop() sends a signal and waits for the
// exit (at most wait_s; then SIGKILL and signaled = true). The destructor kills a server still running.
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args);
  ~ServeProcess();
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  int port() const { return port_; }
  int pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string err() const;  // its stderr so far
  RunResult stop(int signal, double wait_s = 30);
  // Resident memory (VmRSS) in bytes.
  int64_t rss_bytes() const;

 private:
  int pid_ = -1, port_ = 0;
  std::string err_path_, out_path_;
};

// Sets an environment variable (value null: unsets it) for this process and the processes it starts, and restores
// the old value on destruction.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> saved_;
};

// Tests whose result depends on the kernel family run once per family (value-parameterised over
// jit::kAllIsas, skipping the families this CPU lacks), so that one machine covers every family it can.
// Sets DLLM_ISA for this process and the dllm processes it starts, and restores it on destruction.
class ScopedIsa {
 public:
  explicit ScopedIsa(jit::Isa isa);

 private:
  ScopedEnv env_;
};
// The greedy generations of tests/data/generations (the authors' samplers over llama.cpp's forward pass):
// the file names, sorted, and one case read into a generation config (early stop off, as the traces).
std::vector<std::string> generation_case_files();
struct GenerationCase {
  std::string file;                // under tests/data/generations
  std::string model_file;          // under tests/data/models
  int32_t mask_id = 0;             // the reference's mask token (the model must agree)
  std::vector<int32_t> prompt, expected;
  model::GenerateConfig config;    // config.mask_id = mask_id
};
GenerationCase load_generation_case(const std::string& file);
// A GoogleTest name: s with every character other than [A-Za-z0-9] as _ (".json" dropped at the end).
std::string test_label(std::string s);

// A test-name suffix for a family: "portable", "avx2", "avx_vnni", "avx512_vnni", "amx".
std::string family_label(jit::Isa isa);

}  // namespace dllm::test
