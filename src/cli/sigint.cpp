// The SIGINT scope of `dllm run` (sigint.h).
#include "cli/sigint.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>

namespace dllm::cli {

namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  // The first Ctrl-C asks the loop to stop after the current step; a second one ends the process.
  if (g_interrupted.exchange(true)) _exit(kInterruptedStatus);
}

}  // namespace

std::atomic<bool>& run_interrupted() { return g_interrupted; }

SigintScope::SigintScope() {
  g_interrupted = false;
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_);
}

SigintScope::~SigintScope() { sigaction(SIGINT, &old_, nullptr); }

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace dllm::cli
