// Test helpers: fixture paths and a subprocess runner for the dllm binary.
#include "support.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace dllm::test {

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

RunResult run_dllm(const std::vector<std::string>& args) {
  char out_tpl[] = "/tmp/dllm-test-out-XXXXXX";
  char err_tpl[] = "/tmp/dllm-test-err-XXXXXX";
  int out_fd = mkstemp(out_tpl);
  int err_fd = mkstemp(err_tpl);
  if (out_fd < 0 || err_fd < 0) throw std::runtime_error("mkstemp failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> argv_s;
  argv_s.push_back(DLLM_BINARY);
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, DLLM_BINARY, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn failed");
  int status = 0;
  waitpid(pid, &status, 0);
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  close(out_fd);
  close(err_fd);
  r.out = read_file(out_tpl);
  r.err = read_file(err_tpl);
  unlink(out_tpl);
  unlink(err_tpl);
  return r;
}

}  // namespace dllm::test
