// Test helpers: fixture paths and a subprocess runner for the dllm binary.
#include "support.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <csignal>
#include <thread>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "model/gguf.h"

extern char** environ;

namespace dllm::test {

// Runs the binary with stdin_path open on its standard input; with a marker, presses Ctrl-C (SIGINT) once
// its stderr holds the marker (or after 60 s).
static RunResult run_from(const std::string& program, const std::vector<std::string>& args, const char* stdin_path,
                          const std::string& interrupt_marker = {});
static RunResult run_dllm_from(const std::vector<std::string>& args, const char* stdin_path,
                               const std::string& interrupt_marker = {}) {
  return run_from(DLLM_BINARY, args, stdin_path, interrupt_marker);
}

std::string data_path(const std::string& rel) { return std::string(DLLM_TEST_DATA) + "/" + rel; }

std::string shared_path(const std::string& rel) {
  std::string p = std::string(DLLM_SHARED_DIR) + "/" + rel;
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? p : std::string();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string poisoned_model_copy(const std::string& rel, const std::string& tensor, float value) {
  const auto file = gguf::File::open(data_path(rel));
  const gguf::TensorInfo* t = file->find_tensor(tensor);
  if (!t || t->type() != GgmlType::F32) throw std::runtime_error(rel + " has no F32 tensor " + tensor);
  std::string bytes = read_file(data_path(rel));
  const size_t at = static_cast<size_t>(file->data_offset() + t->offset);
  for (uint64_t i = 0; i < t->nbytes; i += sizeof(float)) std::memcpy(&bytes[at + i], &value, sizeof(float));
  char path[] = "/tmp/dllm-poisoned-XXXXXX.gguf";
  const int fd = mkstemps(path, 5);
  if (fd < 0) throw std::runtime_error("mkstemps failed");
  const bool ok = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  close(fd);
  if (!ok) throw std::runtime_error(std::string("cannot write ") + path);
  return path;
}

RunResult run_dllm(const std::vector<std::string>& args) { return run_dllm_from(args, "/dev/null"); }

RunResult run_dllm_interrupted(const std::vector<std::string>& args, const std::string& marker) {
  return run_dllm_from(args, "/dev/null", marker);
}

RunResult run_dllm(const std::vector<std::string>& args, const std::string& stdin_text) {
  char in_tpl[] = "/tmp/dllm-test-in-XXXXXX";
  const int in_fd = mkstemp(in_tpl);
  if (in_fd < 0) throw std::runtime_error("mkstemp failed");
  const bool written = ::write(in_fd, stdin_text.data(), stdin_text.size()) == static_cast<ssize_t>(stdin_text.size());
  close(in_fd);
  if (!written) {
    unlink(in_tpl);
    throw std::runtime_error("cannot write the standard input file");
  }
  RunResult r = run_dllm_from(args, in_tpl);
  unlink(in_tpl);
  return r;
}

RunResult run_program(const std::string& program, const std::vector<std::string>& args) {
  return run_from(program, args, "/dev/null");
}

static RunResult run_from(const std::string& program, const std::vector<std::string>& args, const char* stdin_path,
                          const std::string& interrupt_marker) {
  char out_tpl[] = "/tmp/dllm-test-out-XXXXXX";
  char err_tpl[] = "/tmp/dllm-test-err-XXXXXX";
  int out_fd = mkstemp(out_tpl);
  int err_fd = mkstemp(err_tpl);
  if (out_fd < 0 || err_fd < 0) throw std::runtime_error("mkstemp failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  posix_spawn_file_actions_addopen(&fa, 0, stdin_path, O_RDONLY, 0);
  std::vector<std::string> argv_s;
  argv_s.push_back(program);
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, program.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    close(out_fd), close(err_fd), unlink(out_tpl), unlink(err_tpl);
    throw std::runtime_error("cannot start " + program);
  }
  if (!interrupt_marker.empty()) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (read_file(err_tpl).find(interrupt_marker) == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kill(pid, SIGINT);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.signaled = WIFSIGNALED(status);
  close(out_fd);
  close(err_fd);
  r.out = read_file(out_tpl);
  r.err = read_file(err_tpl);
  unlink(out_tpl);
  unlink(err_tpl);
  return r;
}

ServeProcess::ServeProcess(const std::vector<std::string>& args) {
  char out_tpl[] = "/tmp/dllm-serve-out-XXXXXX";
  char err_tpl[] = "/tmp/dllm-serve-err-XXXXXX";
  const int out_fd = mkstemp(out_tpl), err_fd = mkstemp(err_tpl);
  if (out_fd < 0 || err_fd < 0) throw std::runtime_error("mkstemp failed");
  out_path_ = out_tpl, err_path_ = err_tpl;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> argv_s = {DLLM_BINARY, "serve"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  argv_s.insert(argv_s.end(), {"--port", "0"});
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, DLLM_BINARY, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out_fd);
  close(err_fd);
  if (rc != 0) throw std::runtime_error("posix_spawn failed");
  pid_ = pid;
  const std::string marker = "listening on http://127.0.0.1:";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string e = read_file(err_path_);
    if (const size_t p = e.find(marker); p != std::string::npos && e.find('\n', p) != std::string::npos) {
      port_ = std::atoi(e.c_str() + p + marker.size());
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("dllm serve exited before listening: " + e);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("dllm serve did not listen within 120 s: " + read_file(err_path_));
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  unlink(out_path_.c_str());
  unlink(err_path_.c_str());
}

std::string ServeProcess::err() const { return read_file(err_path_); }

RunResult ServeProcess::stop(int sig, double wait_s) {
  RunResult r;
  if (pid_ <= 0) return r;
  kill(pid_, sig);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  bool exited = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.signaled = !exited || WIFSIGNALED(status);
  r.out = read_file(out_path_);
  r.err = read_file(err_path_);
  return r;
}

int64_t ServeProcess::rss_bytes() const {
  std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) saved_ = old;
  if (value) setenv(name, value, 1);
  else unsetenv(name);
}

ScopedEnv::~ScopedEnv() {
  if (saved_) setenv(name_.c_str(), saved_->c_str(), 1);
  else unsetenv(name_.c_str());
}

ScopedIsa::ScopedIsa(jit::Isa isa) : env_("DLLM_ISA", jit::isa_name(isa)) {}

std::vector<std::string> generation_case_files() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(data_path("generations")))
    if (e.path().extension() == ".json") out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

GenerationCase load_generation_case(const std::string& file) {
  const auto ref = nlohmann::json::parse(read_file(data_path("generations/" + file)));
  if (!ref.at("matches_authors_algorithm").get<bool>()) throw std::runtime_error(file + ": not an authors' run");
  const auto& a = ref.at("authors_equivalent");
  if (a.at("temperature").get<double>() != 0.0) throw std::runtime_error(file + ": not greedy");
  GenerationCase c;
  c.file = file;
  c.model_file = ref.at("model_file").get<std::string>();
  c.mask_id = ref.at("mask_token_id").get<int32_t>();
  c.prompt = ref.at("prompt_ids").get<std::vector<int32_t>>();
  c.expected = ref.at("generated_ids").get<std::vector<int32_t>>();
  model::GenerateConfig& cfg = c.config;
  cfg.mask_id = c.mask_id;
  cfg.early_stop = false;
  cfg.steps = a.at("steps").get<int64_t>();
  if (ref.at("arch") == "llada") {
    cfg.arch = model::Arch::LLaDA;
    cfg.max_tokens = a.at("gen_length").get<int64_t>();
    cfg.block_length = a.at("block_length").get<int64_t>();
    if (a.at("remasking") != "low_confidence") throw std::runtime_error(file + ": unexpected remasking");
    cfg.remasking = model::Remasking::LowConfidence;
  } else {
    cfg.arch = model::Arch::Dream;
    cfg.max_tokens = a.at("max_new_tokens").get<int64_t>();
    const auto r = model::parse_remasking(a.at("alg").get<std::string>());
    if (!r) throw std::runtime_error(file + ": unknown alg");
    cfg.remasking = *r;
  }
  return c;
}

std::string test_label(std::string s) {
  if (s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0) s.resize(s.size() - 5);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::string family_label(jit::Isa isa) {
  std::string s = jit::isa_name(isa);
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

}  // namespace dllm::test
