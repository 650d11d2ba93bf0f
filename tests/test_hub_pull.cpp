// Downloads against a fake hub: tests/hub_server.py, started here on a free port of 127.0.0.1 (nothing leaves
// the machine). Covers first download, resume, retries, checksum mismatch, 401/403/404, HTML pages, quant
// choice, offline use, a full disk, concurrent pulls (threads and processes), and that no failure ever leaves a
// file under the final name. `dllm pull` runs in forked children (cmd_pull, as the binary runs it).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands_hub.h"
#include "hub/hub.h"
#include "hub/internal.h"
#include "hub/sha256.h"
#include "common/error.h"
#include "support.h"

extern char** environ;

namespace fs = std::filesystem;
using dllm::hub::ModelId;
using dllm::hub::Options;
using dllm::hub::PullStatus;
using nlohmann::json;

namespace {

const char* kRepo = "test/tiny-llada-GGUF";

std::string find_python() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  for (size_t a = 0; a <= p.size();) {
    size_t b = p.find(':', a);
    if (b == std::string::npos) b = p.size();
    std::string cand = p.substr(a, b - a) + "/python3";
    if (b > a && ::access(cand.c_str(), X_OK) == 0) return cand;
    a = b + 1;
  }
  return "";
}

// The fake hub process. Its stdin is a pipe from us: when this process ends, the server does too.
class FakeHub {
 public:
  bool start() {
    std::string python = find_python();
    if (python.empty()) return false;
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::string script = std::string(DLLM_TEST_DATA) + "/../hub_server.py";
    std::string models = dllm::test::data_path("models");
    std::vector<std::string> argv_s = {python, script, "--models", models};
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid_, python.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    if (rc != 0) return false;
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(out[0]);
    if (line.rfind("PORT ", 0) != 0) return false;
    port_ = std::stoi(line.substr(5));
    return true;
  }
  void stop() {
    if (stdin_ >= 0) ::close(stdin_);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  json control(const std::string& what) {
    auto r = dllm::hub::http_get(Options{}, url() + "/_control/" + what);
    EXPECT_EQ(r.status, 200) << what;
    return json::parse(r.body);
  }
  void reset() { control("reset"); }
  void set(const std::string& query) { control("set?" + query); }
  json log() { return control("log"); }
  // Requests for the bytes of a file (the CDN after the resolve redirect).
  std::vector<json> downloads() {
    std::vector<json> out;
    for (const auto& e : log())
      if (e["path"].get<std::string>().rfind("/_cdn/", 0) == 0) out.push_back(e);
    return out;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int port_ = 0;
};

// A `dllm pull` in a forked child: cmd_pull with the binary's error printing, its own environment and limits.
class PullProcess {
 public:
  // file_size_limit > 0: writes past it fail. tty_fd >= 0: the child's stderr is that terminal.
  // stdin_fd >= 0: the child's stdin (else /dev/null).
  PullProcess(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env,
              long file_size_limit = 0, int tty_fd = -1, int stdin_fd = -1) {
    char out_tpl[] = "/tmp/dllm-pull-out-XXXXXX", err_tpl[] = "/tmp/dllm-pull-err-XXXXXX";
    int out_fd = mkstemp(out_tpl), err_fd = mkstemp(err_tpl);
    out_path_ = out_tpl, err_path_ = err_tpl;
    if (tty_fd >= 0) ::dup2(tty_fd, err_fd);
    std::cout.flush();
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      ::dup2(stdin_fd >= 0 ? stdin_fd : ::open("/dev/null", O_RDONLY), 0);
      ::dup2(out_fd, 1);
      ::dup2(err_fd, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      if (file_size_limit > 0) {
        ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG, as on a full disk
        rlimit rl{static_cast<rlim_t>(file_size_limit), static_cast<rlim_t>(file_size_limit)};
        ::setrlimit(RLIMIT_FSIZE, &rl);
      }
      int rc;
      try {
        rc = dllm::cli::cmd_pull(args);
      } catch (const dllm::Error& e) {
        std::fprintf(stderr, "ERROR: %s\n", e.what());
        if (!e.hint().empty()) std::fprintf(stderr, "%s\n", e.hint().c_str());
        rc = e.exit_code();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ERROR: %s\n", e.what());
        rc = 1;
      }
      std::cout.flush();
      std::fflush(nullptr);
      ::_exit(rc);
    }
    ::close(out_fd);
    ::close(err_fd);
  }
  pid_t pid() const { return pid_; }
  dllm::test::RunResult wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    dllm::test::RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = dllm::test::read_file(out_path_);
    r.err = dllm::test::read_file(err_path_);
    ::unlink(out_path_.c_str());
    ::unlink(err_path_.c_str());
    return r;
  }

 private:
  pid_t pid_ = -1;
  std::string out_path_, err_path_;
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A port on 127.0.0.1 that nothing listens on.
int closed_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

class HubPull : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    ::setenv("no_proxy", "127.0.0.1,localhost", 1);
    hub_ = new FakeHub;
    if (!hub_->start()) {
      delete hub_;
      hub_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    if (hub_) hub_->stop();
    delete hub_;
    hub_ = nullptr;
  }

  void SetUp() override {
    if (!hub_) GTEST_SKIP() << "python3 is missing: the fake hub (tests/hub_server.py) cannot run";
    hub_->reset();
    char dir[] = "/tmp/dllm-hub-cache-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    cache_ = dir;
    opts_.endpoint = hub_->url();
    opts_.cache_dir = cache_;
    opts_.retries = 0;
    opts_.retry_delay_ms = 10;
    opts_.note = [this](const std::string& line) {
      std::lock_guard<std::mutex> g(notes_mu_);
      notes_ += line + "\n";
    };
  }
  void TearDown() override {
    if (!cache_.empty()) fs::remove_all(cache_);
  }

  // Every file under the cache (relative paths), folders left out.
  std::vector<std::string> cache_files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(cache_))
      if (!e.is_directory()) out.push_back(fs::relative(e.path(), cache_).string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string dest(const std::string& file, const std::string& repo = kRepo) const {
    return cache_ + "/models/" + repo + "/" + file;
  }
  std::string notes() {
    std::lock_guard<std::mutex> g(notes_mu_);
    return notes_;
  }
  std::string pull_error(const std::string& id) {
    try {
      auto parsed = dllm::hub::parse_model_id(id);
      EXPECT_TRUE(parsed) << id;
      dllm::hub::pull(*parsed, opts_);
    } catch (const dllm::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error pulling " << id;
    return "";
  }
  dllm::hub::PullResult pull(const std::string& id) { return dllm::hub::pull(*dllm::hub::parse_model_id(id), opts_); }
  std::vector<std::pair<std::string, std::string>> env() const {
    return {{"HF_ENDPOINT", hub_->url()}, {"DLLM_CACHE", cache_}, {"HF_TOKEN", ""}, {"HF_HUB_OFFLINE", "0"}};
  }
  static std::string fixture(const std::string& name) { return dllm::test::read_file(dllm::test::data_path("models/" + name)); }

  static FakeHub* hub_;
  std::string cache_;
  Options opts_;
  std::mutex notes_mu_;
  std::string notes_;
};
FakeHub* HubPull::hub_ = nullptr;

const std::vector<std::string> kNoFiles;

TEST_F(HubPull, FirstDownloadThenUpToDate) {
  auto r = pull(std::string(kRepo) + ":Q8_0");
  EXPECT_EQ(r.status, PullStatus::kDownloaded);
  EXPECT_EQ(r.path, dest("tiny-llada-Q8_0.gguf"));
  EXPECT_EQ(dllm::test::read_file(r.path), fixture("tiny-llada-Q8_0.gguf"));
  // The digest recorded beside it is the one the hub publishes (computed by Python's hashlib).
  EXPECT_EQ(dllm::test::read_file(r.path + ".sha256"), r.file.sha256 + "\n");
  EXPECT_EQ(r.file.sha256, dllm::hub::sha256_file(dllm::test::data_path("models/tiny-llada-Q8_0.gguf")));
  EXPECT_EQ(cache_files(), (std::vector<std::string>{"models/test/tiny-llada-GGUF/tiny-llada-Q8_0.gguf",
                                                     "models/test/tiny-llada-GGUF/tiny-llada-Q8_0.gguf.sha256"}));
  auto downloads = hub_->downloads();
  ASSERT_EQ(downloads.size(), 1u);
  EXPECT_EQ(downloads[0]["range"], "");
  EXPECT_TRUE(contains(notes(), "downloaded tiny-llada-Q8_0.gguf")) << notes();
  EXPECT_TRUE(contains(notes(), "sha256 verified")) << notes();

  auto again = pull(std::string(kRepo) + ":q8_0");
  EXPECT_EQ(again.status, PullStatus::kUpToDate);
  EXPECT_EQ(again.path, r.path);
  EXPECT_EQ(hub_->downloads().size(), 1u);  // nothing fetched the second time
}

TEST_F(HubPull, QuantSelection) {
  EXPECT_EQ(pull(std::string(kRepo) + ":q4_k_m").path, dest("tiny-llada-Q4_K_M.gguf"));
  EXPECT_EQ(pull(kRepo).path, dest("tiny-llada-Q4_K_M.gguf"));  // no quant: Q4_K_M
  EXPECT_EQ(pull("test/single-GGUF").path, dest("only.gguf", "test/single-GGUF"));
  auto r = pull("test/ambiguous-GGUF:b/model-Q4_K_M.gguf");
  EXPECT_EQ(r.path, dest("b/model-Q4_K_M.gguf", "test/ambiguous-GGUF"));
  EXPECT_EQ(dllm::test::read_file(r.path), fixture("tiny-dream-Q4_K_M.gguf"));
}

TEST_F(HubPull, QuantErrorsListTheChoicesAndFetchNothing) {
  std::string e = pull_error(std::string(kRepo) + ":Q5_K_M");
  EXPECT_TRUE(contains(e, "no GGUF file of test/tiny-llada-GGUF matches the quant 'Q5_K_M'")) << e;
  for (const char* c : {"Q4_K_M (tiny-llada-Q4_K_M.gguf, 1.42 MB)", "Q8_0 (tiny-llada-Q8_0.gguf, 2.40 MB)",
                        "F16 (tiny-llada-F16.gguf, 4.49 MB)"})
    EXPECT_TRUE(contains(e, c)) << c << " in " << e;
  EXPECT_FALSE(contains(e, "README")) << e;
  e = pull_error("test/ambiguous-GGUF:Q4_K_M");
  EXPECT_TRUE(contains(e, "ambiguous")) << e;
  EXPECT_TRUE(contains(e, "a/model-Q4_K_M.gguf") && contains(e, "b/model-Q4_K_M.gguf")) << e;
  e = pull_error("test/no-default-GGUF");
  EXPECT_TRUE(contains(e, "several GGUF files and none is Q4_K_M")) << e;
  EXPECT_TRUE(contains(e, "Q8_0 (model-Q8_0.gguf") && contains(e, "F16 (model-F16.gguf")) << e;
  EXPECT_TRUE(hub_->downloads().empty());
  EXPECT_EQ(cache_files(), kNoFiles);
}

TEST_F(HubPull, ResumeAfterAnInterruptedTransfer) {
  hub_->set("cut=500000");
  std::string e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "kept in")) << e;
  const std::string part = dest("tiny-llada-Q4_K_M.gguf.part");
  ASSERT_TRUE(fs::exists(part));
  EXPECT_EQ(fs::file_size(part), 500000u);
  EXPECT_FALSE(fs::exists(dest("tiny-llada-Q4_K_M.gguf")));
  EXPECT_FALSE(fs::exists(dest("tiny-llada-Q4_K_M.gguf.lock")));

  hub_->reset();
  auto r = pull(std::string(kRepo) + ":Q4_K_M");
  EXPECT_EQ(r.status, PullStatus::kDownloaded);
  auto downloads = hub_->downloads();
  ASSERT_EQ(downloads.size(), 1u);
  EXPECT_EQ(downloads[0]["range"], "bytes=500000-");  // only the missing bytes were asked for
  EXPECT_EQ(dllm::test::read_file(r.path), fixture("tiny-llada-Q4_K_M.gguf"));
  EXPECT_FALSE(fs::exists(part));
  EXPECT_TRUE(contains(notes(), "resuming tiny-llada-Q4_K_M.gguf at 500 kB of 1.42 MB")) << notes();
}

TEST_F(HubPull, AnInterruptedTransferIsRetriedFromWhereItStopped) {
  hub_->set("cut=300000&cut_times=2");
  opts_.retries = 2;
  auto r = pull(std::string(kRepo) + ":Q4_K_M");
  EXPECT_EQ(r.status, PullStatus::kDownloaded);
  auto downloads = hub_->downloads();
  ASSERT_EQ(downloads.size(), 3u);
  EXPECT_EQ(downloads[0]["range"], "");
  EXPECT_EQ(downloads[1]["range"], "bytes=300000-");
  EXPECT_EQ(downloads[2]["range"], "bytes=600000-");
  EXPECT_EQ(dllm::test::read_file(r.path), fixture("tiny-llada-Q4_K_M.gguf"));
  EXPECT_TRUE(contains(notes(), "trying again")) << notes();
}

TEST_F(HubPull, AServerThatIgnoresRangeRestartsTheFile) {
  hub_->set("cut=400000");
  pull_error(std::string(kRepo) + ":Q4_K_M");
  hub_->reset();
  hub_->set("norange=1");
  auto r = pull(std::string(kRepo) + ":Q4_K_M");
  EXPECT_EQ(dllm::test::read_file(r.path), fixture("tiny-llada-Q4_K_M.gguf"));
  EXPECT_EQ(hub_->downloads().at(0)["range"], "bytes=400000-");
}

TEST_F(HubPull, ChecksumMismatchLeavesTheCacheAsItWas) {
  hub_->set("bad_sha=1");
  std::string e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "checksum mismatch for tiny-llada-Q4_K_M.gguf")) << e;
  EXPECT_TRUE(contains(e, "8c69ea94cc30d050f0d5134fc49e843b59a4328dde2d287b08af346efbb252dd")) << e;  // what came
  EXPECT_EQ(hub_->downloads().size(), 1u);
  EXPECT_EQ(cache_files(), kNoFiles);
}

TEST_F(HubPull, NotFoundAndRefusedAnswersAreClearAndFetchNothing) {
  hub_->set("file_status=404");
  std::string e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "tiny-llada-Q4_K_M.gguf")) << e;
  EXPECT_TRUE(contains(e, "was not found on " + hub_->url() + " (404)")) << e;
  hub_->reset();
  e = pull_error("test/no-such-repo");
  EXPECT_TRUE(contains(e, "test/no-such-repo was not found")) << e;
  EXPECT_TRUE(contains(e, "Repository not found")) << e;  // the hub's own words
  hub_->set("file_status=403");
  e = pull_error(std::string(kRepo) + ":Q8_0");
  EXPECT_TRUE(contains(e, "is forbidden (403)")) << e;
  hub_->reset();
  hub_->set("gated=1");
  e = pull_error(std::string(kRepo) + ":Q8_0");
  EXPECT_TRUE(contains(e, "test/tiny-llada-GGUF is gated (403): accept its terms")) << e;
  hub_->reset();
  hub_->set("api_status=500");
  e = pull_error(std::string(kRepo) + ":Q8_0");
  EXPECT_TRUE(contains(e, "failed to serve test/tiny-llada-GGUF (500)")) << e;
  EXPECT_EQ(cache_files(), kNoFiles);
}

TEST_F(HubPull, PrivateRepoNeedsTheTokenAndTheTokenStaysOnTheHubsHost) {
  std::string e = pull_error("test/private-GGUF");
  EXPECT_TRUE(contains(e, "(401 Unauthorized)")) << e;
  EXPECT_TRUE(contains(e, "set HF_TOKEN")) << e;
  EXPECT_EQ(cache_files(), kNoFiles);

  opts_.token = "hf_wrong";
  e = pull_error("test/private-GGUF");
  EXPECT_TRUE(contains(e, "the token in HF_TOKEN is not accepted")) << e;

  hub_->reset();
  opts_.token = "hf_test_token";
  hub_->set("cdn_host=localhost");  // the redirect goes to another host name, as the hub's CDN does
  auto r = pull("test/private-GGUF");
  EXPECT_EQ(dllm::test::read_file(r.path), fixture("tiny-llada-Q4_K_M.gguf"));
  for (const auto& entry : hub_->log()) {
    std::string path = entry["path"];
    if (path.rfind("/_cdn/", 0) == 0) {
      EXPECT_EQ(entry["auth"], "") << "the token went to " << entry["host"];
      EXPECT_TRUE(contains(entry["host"], "localhost"));
    } else {
      EXPECT_EQ(entry["auth"], "Bearer hf_test_token") << path;
    }
  }
}

TEST_F(HubPull, AnHtmlPageInsteadOfAGgufIsAnErrorAndNothingIsKept) {
  hub_->set("html=1");
  std::string e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "sent an HTML page instead of tiny-llada-Q4_K_M.gguf")) << e;
  hub_->reset();
  hub_->set("html_octet=1");  // labelled as binary: recognised by its first bytes
  e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "sent an HTML page instead of tiny-llada-Q4_K_M.gguf")) << e;
  hub_->reset();
  hub_->set("api_html=1");
  e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "answered with an HTML page instead of the file list")) << e;
  EXPECT_EQ(cache_files(), kNoFiles);
}

TEST_F(HubPull, ListingPagesAreFollowed) {
  hub_->set("page_size=1");
  auto files = dllm::hub::list_files(opts_, kRepo);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0].path, "README.md");
  EXPECT_EQ(files[0].sha256, "");
  EXPECT_EQ(files[3].path, "tiny-llada-Q8_0.gguf");
  EXPECT_EQ(files[3].size, 2401600u);
  EXPECT_EQ(hub_->log().size(), 4u);
}

TEST_F(HubPull, TheTokenNeverLeavesTheEndpointsOrigin) {
  // A next-page link to another origin (same port, other host name) is refused, and nothing is sent there.
  opts_.token = "hf_test_token";
  hub_->set("page_size=1&next_host=localhost");
  std::string e = pull_error(kRepo);
  EXPECT_TRUE(contains(e, "points its next page at another address (http://localhost:" + std::to_string(hub_->port())))
      << e;
  EXPECT_TRUE(contains(e, ": refused")) << e;
  for (const auto& entry : hub_->log()) EXPECT_NE(entry["host"], "localhost:" + std::to_string(hub_->port()));
  // A request that starts anywhere but the endpoint carries no token, even when asked for directly.
  hub_->reset();
  std::string other = "http://localhost:" + std::to_string(hub_->port());
  dllm::hub::http_get(opts_, other + "/api/models/test/private-GGUF/tree/main");
  dllm::hub::http_get(opts_, hub_->url() + "/api/models/test/private-GGUF/tree/main");
  auto log = hub_->log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0]["auth"], "");
  EXPECT_EQ(log[1]["auth"], "Bearer hf_test_token");
  EXPECT_EQ(dllm::hub::origin_of("HTTPS://Hub.example/x"), "https://hub.example:443");
  EXPECT_EQ(dllm::hub::origin_of("http://hub.example:80/x"), dllm::hub::origin_of("http://hub.example/y"));
  EXPECT_NE(dllm::hub::origin_of("http://hub.example/x"), dllm::hub::origin_of("https://hub.example/x"));
  EXPECT_EQ(dllm::hub::origin_of("file:///etc/passwd"), "file://");  // an https -> http downgrade differs too
}

TEST_F(HubPull, AFileWithNeitherSizeNorSha256IsRefusedAndOneWithoutSha256GetsNoSidecar) {
  hub_->set("nosize=1");
  std::string e = pull_error(std::string(kRepo) + ":Q8_0");
  EXPECT_TRUE(contains(e, "the hub lists neither a size nor a sha256 for tiny-llada-Q8_0.gguf")) << e;
  EXPECT_TRUE(contains(e, "it cannot be verified, so it is not downloaded")) << e;
  EXPECT_TRUE(hub_->downloads().empty());
  EXPECT_EQ(cache_files(), kNoFiles);

  hub_->reset();
  hub_->set("nosha=1");
  auto r = pull(std::string(kRepo) + ":Q8_0");
  EXPECT_EQ(dllm::test::read_file(r.path), fixture("tiny-llada-Q8_0.gguf"));
  EXPECT_TRUE(contains(notes(), "warning: the hub publishes no sha256 for tiny-llada-Q8_0.gguf: only its size "
                                "(2.40 MB) was checked")) << notes();
  EXPECT_FALSE(contains(notes(), "sha256 verified")) << notes();
  // No digest is recorded for a file nobody verified, so a later pull never takes it as checked.
  EXPECT_EQ(cache_files(), (std::vector<std::string>{"models/test/tiny-llada-GGUF/tiny-llada-Q8_0.gguf"}));
}

TEST_F(HubPull, AStalledTransferFailsAfterTheStallTimeout) {
  hub_->set("trickle=1");  // two bytes a second: alive, but far below the 1 kB/s a transfer must keep up
  opts_.stall_seconds = 2;
  const double t0 = dllm::hub::monotonic_seconds();
  std::string e = pull_error(std::string(kRepo) + ":Q8_0");
  const double secs = dllm::hub::monotonic_seconds() - t0;
  EXPECT_TRUE(contains(e, "the transfer from 127.0.0.1:" + std::to_string(hub_->port()) +
                              " stalled: less than 1024 bytes/s for 2 s (DLLM_STALL_TIMEOUT sets how long)"))
      << e;
  EXPECT_TRUE(contains(e, "kept in")) << e;  // what arrived is resumable
  EXPECT_LT(secs, 15.0);
  EXPECT_FALSE(fs::exists(dest("tiny-llada-Q8_0.gguf")));
  EXPECT_FALSE(fs::exists(dest("tiny-llada-Q8_0.gguf.lock")));
}

TEST_F(HubPull, CtrlCStopsAPullKeepingThePartAndRemovingTheLock) {
  hub_->set("slow=200000");  // about 7 s for the 1.4 MB file: time to interrupt it
  const std::string part = dest("tiny-llada-Q4_K_M.gguf.part");
  PullProcess p({std::string(kRepo) + ":Q4_K_M"}, env());
  const double t0 = dllm::hub::monotonic_seconds();
  std::error_code ec;
  while (dllm::hub::monotonic_seconds() - t0 < 20 && !(fs::exists(part, ec) && fs::file_size(part, ec) > 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(::kill(p.pid(), SIGINT), 0);
  auto r = p.wait();
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_TRUE(contains(r.err, "ERROR: interrupted (Ctrl-C): ")) << r.err;
  EXPECT_TRUE(contains(r.err, "of tiny-llada-Q4_K_M.gguf are kept in " + part + " and the next pull resumes")) << r.err;
  EXPECT_LT(dllm::hub::monotonic_seconds() - t0, 6.0) << "the transfer was not stopped";
  ASSERT_TRUE(fs::exists(part));
  const uint64_t kept = fs::file_size(part);
  EXPECT_GT(kept, 0u);
  EXPECT_FALSE(fs::exists(dest("tiny-llada-Q4_K_M.gguf.lock")));
  EXPECT_FALSE(fs::exists(dest("tiny-llada-Q4_K_M.gguf")));
  // The next pull resumes where the interrupted one stopped.
  hub_->reset();
  auto again = pull(std::string(kRepo) + ":Q4_K_M");
  EXPECT_EQ(dllm::test::read_file(again.path), fixture("tiny-llada-Q4_K_M.gguf"));
  EXPECT_EQ(hub_->downloads().at(0)["range"], "bytes=" + std::to_string(kept) + "-");
}

TEST_F(HubPull, FileUrlsAndRedirectLoopsAreReportedOnceAndNotRetried) {
  opts_.retries = 3;  // a network error would be tried four times
  auto resolves = [&] {
    size_t n = 0;
    for (const auto& e : hub_->log()) n += contains(e["path"], "/resolve/main/");
    return n;
  };
  hub_->set("redirect=file");
  std::string e = pull_error(std::string(kRepo) + ":Q8_0");
  EXPECT_TRUE(contains(e, "refused to fetch " + hub_->url() + "/test/tiny-llada-GGUF/resolve/main/tiny-llada-Q8_0.gguf: "
                          "it is, or redirects to, a URL that is not http or https")) << e;
  EXPECT_EQ(resolves(), 1u);
  EXPECT_FALSE(contains(notes(), "trying again")) << notes();
  hub_->reset();
  hub_->set("redirect=loop");
  e = pull_error(std::string(kRepo) + ":Q8_0");
  EXPECT_TRUE(contains(e, "too many redirects fetching " + hub_->url())) << e;
  EXPECT_TRUE(contains(e, "(a redirect loop?)")) << e;
  EXPECT_LE(resolves(), 11u);  // one attempt: the first request and at most 10 redirects
  EXPECT_FALSE(contains(notes(), "trying again")) << notes();
  // A next-page link to a file: URL is refused by name, not reported as a transfer "from" an empty host.
  hub_->reset();
  hub_->set("page_size=1&next_url=file:///etc/passwd");
  e = pull_error(kRepo);
  EXPECT_TRUE(contains(e, "points its next page at another address (file:///etc/passwd)")) << e;
  EXPECT_FALSE(contains(e, "the transfer from  failed")) << e;
  EXPECT_EQ(cache_files(), kNoFiles);
}

TEST_F(HubPull, AFileNameWithABidiOverrideIsEscapedInEveryMessage) {
  hub_->set("cut=1000");  // the transfer breaks: the message names the kept .part, whose name holds U+202E
  std::string e = pull_error("test/bidi-GGUF");
  const std::string rlo = "\xe2\x80\xae";
  EXPECT_EQ(e.find(rlo), std::string::npos) << e;
  EXPECT_EQ(notes().find(rlo), std::string::npos) << notes();
  EXPECT_TRUE(contains(e, "kept in " + cache_ + "/models/test/bidi-GGUF/evil\\u202eggu.Q8_0.gguf.part")) << e;
  EXPECT_TRUE(contains(notes(), "downloading evil\\u202eggu.Q8_0.gguf")) << notes();
}

TEST_F(HubPull, NotEnoughDiskSpaceFailsBeforeDownloading) {
  hub_->set("huge=1");
  std::string e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "not enough free disk space for tiny-llada-Q4_K_M.gguf")) << e;
  EXPECT_TRUE(contains(e, "it needs 1000 TB more")) << e;
  EXPECT_TRUE(hub_->downloads().empty());
  EXPECT_EQ(cache_files(), kNoFiles);
}

TEST_F(HubPull, OfflineUsesOnlyTheCacheAndSaysSo) {
  opts_.offline = true;
  std::string e = pull_error(std::string(kRepo) + ":Q8_0");
  EXPECT_TRUE(contains(e, "offline mode (HF_HUB_OFFLINE is set)")) << e;
  EXPECT_TRUE(contains(e, "not in the cache")) << e;
  e.clear();
  try {
    dllm::hub::resolve_model(std::string(kRepo) + ":Q8_0", opts_);
  } catch (const dllm::Error& err) {
    e = err.what();
  }
  EXPECT_TRUE(contains(e, "offline mode") && contains(e, "dllm pull test/tiny-llada-GGUF:Q8_0")) << e;
  EXPECT_TRUE(hub_->log().empty());  // offline means no request at all

  opts_.offline = false;
  std::string path = pull(std::string(kRepo) + ":Q8_0").path;
  hub_->reset();
  opts_.offline = true;
  auto r = pull(std::string(kRepo) + ":Q8_0");
  EXPECT_EQ(r.status, PullStatus::kCachedOnly);
  EXPECT_EQ(r.path, path);
  EXPECT_EQ(dllm::hub::resolve_model(std::string(kRepo) + ":q8_0", opts_), path);
  EXPECT_TRUE(contains(notes(), "offline mode (HF_HUB_OFFLINE is set): using the cached")) << notes();
  EXPECT_TRUE(hub_->log().empty());
}

TEST_F(HubPull, NoNetworkFallsBackToTheCacheAndSaysSo) {
  std::string path = pull(std::string(kRepo) + ":Q8_0").path;
  opts_.endpoint = "http://127.0.0.1:" + std::to_string(closed_port());
  auto r = pull(std::string(kRepo) + ":Q8_0");
  EXPECT_EQ(r.status, PullStatus::kCachedOnly);
  EXPECT_EQ(r.path, path);
  EXPECT_TRUE(contains(notes(), "no network: cannot reach 127.0.0.1")) << notes();
  std::string e = pull_error(std::string(kRepo) + ":Q4_K_M");
  EXPECT_TRUE(contains(e, "no network") && contains(e, "is not in the cache")) << e;
}

TEST_F(HubPull, ResolveModelDownloadsOnceThenUsesTheCacheWithoutAsking) {
  std::string path = dllm::hub::resolve_model(std::string(kRepo) + ":Q4_K_M", opts_);
  EXPECT_EQ(path, dest("tiny-llada-Q4_K_M.gguf"));
  EXPECT_TRUE(contains(notes(), "is not in the cache yet")) << notes();
  size_t requests = hub_->log().size();
  EXPECT_EQ(dllm::hub::resolve_model(std::string(kRepo) + ":Q4_K_M", opts_), path);
  EXPECT_EQ(dllm::hub::resolve_model(kRepo, opts_), path);
  EXPECT_EQ(hub_->log().size(), requests);  // found in the cache: the hub was not asked
  EXPECT_EQ(dllm::hub::resolve_model(dllm::test::data_path("models/tiny-dream-Q8_0.gguf"), opts_),
            dllm::test::data_path("models/tiny-dream-Q8_0.gguf"));
  std::string e;
  try {
    dllm::hub::resolve_model("test/no-such-repo", opts_);
  } catch (const dllm::Error& err) {
    e = err.what();
  }
  EXPECT_TRUE(contains(e, "no file named test/no-such-repo exists either")) << e;
}

TEST_F(HubPull, ConcurrentPullsInThreadsDownloadOnceAndNeverShowAHalfFile) {
  hub_->set("slow=1500000");  // about a second for the 1.4 MB file
  const std::string final_path = dest("tiny-llada-Q4_K_M.gguf");
  const uint64_t full = fixture("tiny-llada-Q4_K_M.gguf").size();
  std::atomic<bool> done{false}, half_seen{false};
  std::thread watcher([&] {  // whenever the final name exists, it holds the whole file
    while (!done) {
      std::error_code ec;
      auto size = fs::file_size(final_path, ec);
      if (!ec && size != full) half_seen = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::mutex mu;
  std::condition_variable cv;
  bool first_started = false;
  Options first = opts_, second = opts_;
  first.note = [&](const std::string& line) {
    opts_.note("first: " + line);
    if (contains(line, "downloading")) {
      std::lock_guard<std::mutex> g(mu);
      first_started = true;
      cv.notify_all();
    }
  };
  second.note = [&](const std::string& line) { opts_.note("second: " + line); };
  dllm::hub::PullResult r1, r2;
  ModelId id{kRepo, "Q4_K_M"};
  auto pull_in_thread = [&](dllm::hub::PullResult& r, const Options& o) {
    try {
      r = dllm::hub::pull(id, o);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      std::lock_guard<std::mutex> g(mu);
      first_started = true;  // never leave the main thread waiting
      cv.notify_all();
    }
  };
  std::thread t1([&] { pull_in_thread(r1, first); });
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return first_started; });
  }
  std::thread t2([&] { pull_in_thread(r2, second); });
  t1.join();
  t2.join();
  done = true;
  watcher.join();
  EXPECT_FALSE(half_seen);
  EXPECT_EQ(r1.path, final_path);
  EXPECT_EQ(r2.path, final_path);
  EXPECT_EQ(hub_->downloads().size(), 1u);
  EXPECT_TRUE(contains(notes(), "second: another dllm process")) << notes();
  EXPECT_TRUE(contains(notes(), "waiting for it to finish")) << notes();
  EXPECT_TRUE(contains(notes(), "second: tiny-llada-Q4_K_M.gguf was downloaded by another dllm process")) << notes();
  EXPECT_EQ(dllm::test::read_file(final_path), fixture("tiny-llada-Q4_K_M.gguf"));
}

TEST_F(HubPull, ConcurrentPullProcessesDownloadOnce) {
  hub_->set("slow=1500000");
  PullProcess a({std::string(kRepo) + ":Q4_K_M"}, env());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PullProcess b({kRepo, "--quant", "Q4_K_M"}, env());
  auto ra = a.wait(), rb = b.wait();
  EXPECT_EQ(ra.exit_code, 0) << ra.err;
  EXPECT_EQ(rb.exit_code, 0) << rb.err;
  EXPECT_EQ(ra.out, dest("tiny-llada-Q4_K_M.gguf") + "\n");
  EXPECT_EQ(rb.out, ra.out);
  EXPECT_TRUE(contains(rb.err, "is downloading tiny-llada-Q4_K_M.gguf; waiting for it to finish")) << rb.err;
  EXPECT_EQ(hub_->downloads().size(), 1u);
  EXPECT_EQ(dllm::test::read_file(dest("tiny-llada-Q4_K_M.gguf")), fixture("tiny-llada-Q4_K_M.gguf"));
}

TEST_F(HubPull, PullCommandPrintsThePathAndChecksTheCache) {
  auto check = PullProcess({std::string(kRepo) + ":Q8_0", "--check"}, env()).wait();
  EXPECT_EQ(check.exit_code, 1);
  EXPECT_TRUE(contains(check.err, "test/tiny-llada-GGUF:Q8_0 is not in the cache")) << check.err;
  EXPECT_TRUE(hub_->log().empty());

  auto r = PullProcess({kRepo, "--quant", "q8_0"}, env()).wait();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, dest("tiny-llada-Q8_0.gguf") + "\n");
  EXPECT_TRUE(contains(r.err, "downloading tiny-llada-Q8_0.gguf (2.40 MB) from " + hub_->url())) << r.err;
  EXPECT_FALSE(contains(r.err, "\r")) << "no progress bar when stderr is not a terminal";

  check = PullProcess({std::string(kRepo) + ":Q8_0", "--check"}, env()).wait();
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_EQ(check.out, dest("tiny-llada-Q8_0.gguf") + "\n");

  r = PullProcess({std::string(kRepo) + ":Q8_0"}, env()).wait();
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "test/tiny-llada-GGUF:Q8_0 is up to date")) << r.err;

  // --ask with no terminal to ask on downloads nothing.
  r = PullProcess({std::string(kRepo) + ":F16", "--ask"}, env()).wait();
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--ask needs a terminal")) << r.err;
  EXPECT_FALSE(fs::exists(dest("tiny-llada-F16.gguf")));
}

TEST_F(HubPull, ProgressBarOnlyOnATerminal) {
  // stderr on a pseudo-terminal: the bar is redrawn in place with bytes, percentage, rate and ETA.
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(slave, 0);
  std::string screen;
  std::thread reader([&] {  // drain the terminal so the child never blocks on it
    char buf[4096];
    ssize_t n;
    while ((n = ::read(master, buf, sizeof buf)) > 0) screen.append(buf, static_cast<size_t>(n));
  });
  hub_->set("slow=2000000");
  auto r = PullProcess({std::string(kRepo) + ":Q4_K_M"}, env(), 0, slave).wait();
  ::close(slave);
  reader.join();
  ::close(master);
  EXPECT_EQ(r.exit_code, 0) << screen;
  EXPECT_TRUE(contains(screen, "\rtiny-llada-Q4_K_M.gguf [")) << screen;
  EXPECT_TRUE(contains(screen, "100% 1.42 MB / 1.42 MB")) << screen;
  EXPECT_TRUE(contains(screen, "MB/s  ETA ")) << screen;
  EXPECT_TRUE(contains(screen, "downloaded tiny-llada-Q4_K_M.gguf")) << screen;
}

TEST_F(HubPull, AskOnATerminalDownloadsOnlyAfterYes) {
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(slave, 0);
  const std::string id = std::string(kRepo) + ":Q8_0";
  ASSERT_EQ(::write(master, "n\n", 2), 2);
  auto no = PullProcess({id, "--ask"}, env(), 0, -1, slave).wait();
  EXPECT_EQ(no.exit_code, 0) << no.err;
  EXPECT_TRUE(contains(no.err, "Download tiny-llada-Q8_0.gguf (2.40 MB) into " + cache_ + "/models/" + kRepo + "? [y/N]"))
      << no.err;
  EXPECT_TRUE(contains(no.err, "nothing downloaded")) << no.err;
  EXPECT_EQ(no.out, "");
  EXPECT_EQ(cache_files(), kNoFiles);
  ASSERT_EQ(::write(master, "y\n", 2), 2);
  auto yes = PullProcess({id, "--ask"}, env(), 0, -1, slave).wait();
  EXPECT_EQ(yes.exit_code, 0) << yes.err;
  EXPECT_EQ(yes.out, dest("tiny-llada-Q8_0.gguf") + "\n");
  // Up to date: no question.
  auto again = PullProcess({id, "--ask"}, env(), 0, -1, slave).wait();
  EXPECT_FALSE(contains(again.err, "[y/N]")) << again.err;
  EXPECT_TRUE(contains(again.err, "is up to date")) << again.err;
  ::close(slave);
  ::close(master);
}

TEST_F(HubPull, TheBinaryRunsPull) {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const auto& [k, v] : env()) {
    const char* old = std::getenv(k.c_str());
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  auto r = dllm::test::run_dllm({"pull", std::string(kRepo) + ":Q8_0"});
  auto check = dllm::test::run_dllm({"pull", "--check", std::string(kRepo) + ":Q8_0"});
  auto help = dllm::test::run_dllm({"pull", "--help"});
  for (const auto& [k, v] : saved) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, dest("tiny-llada-Q8_0.gguf") + "\n");
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_EQ(check.out, r.out);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.out, "--quant Q")) << help.out;
}

TEST_F(HubPull, PullCommandUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const auto& c : std::vector<Case>{
           {{kRepo, "--quant"}, "ERROR: flag --quant needs a value"},
           {{"a/b", "c/d"}, "ERROR: unexpected argument 'c/d' for 'pull'"},
           {{"--qaunt", "Q8_0"}, "ERROR: unknown flag --qaunt for 'pull' (did you mean --quant?)\nsee: dllm pull --help"},
           {{"--quant=Q8_0"}, "ERROR: unknown flag --quant=Q8_0 for 'pull'\nflags take their value as the next"},
           {{"a/b:Q4_K_M", "--quant", "Q8_0"}, "ERROR: the quant is given twice: 'Q4_K_M' in the id and --quant Q8_0"},
           {{"model.gguf"}, "ERROR: 'model.gguf' is not a Hugging Face model id"},
           {{"--check", "--check"}, "ERROR: flag --check is given more than once"}}) {
    auto r = PullProcess(c.args, env()).wait();
    EXPECT_EQ(r.exit_code, 2) << c.message;
    EXPECT_TRUE(r.err.rfind(c.message, 0) == 0) << r.err;
  }
  auto help = PullProcess({"--quant", "--help"}, env()).wait();
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.out, "dllm pull [ID]")) << help.out;
  EXPECT_TRUE(contains(help.out, dllm::hub::kDefaultModel));
  EXPECT_TRUE(hub_->log().empty());
}

TEST_F(HubPull, PullCommandFailsCleanlyWhenTheDiskFillsUp) {
  // Writes past 200 kB fail (EFBIG, as ENOSPC would on a full disk) in the child that pulls.
  auto r = PullProcess({std::string(kRepo) + ":Q4_K_M"}, env(), 200000).wait();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "ERROR: cannot write " + dest("tiny-llada-Q4_K_M.gguf.part"))) << r.err;
  EXPECT_TRUE(contains(r.err, "(the disk is full); the cache is as it was")) << r.err;
  EXPECT_EQ(cache_files(), kNoFiles);
}

TEST_F(HubPull, PullCommandOffline) {
  auto e = env();
  e.emplace_back("HF_HUB_OFFLINE", "1");
  auto r = PullProcess({kRepo}, e).wait();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "ERROR: offline mode (HF_HUB_OFFLINE is set), and test/tiny-llada-GGUF is not in the cache"))
      << r.err;
  EXPECT_TRUE(hub_->log().empty());
}

}  // namespace
