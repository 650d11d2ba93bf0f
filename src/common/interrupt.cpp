#include "common/interrupt.h"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace dllm {

namespace {

volatile sig_atomic_t g_signal = 0;
std::mutex g_mu;
int g_depth = 0;
struct sigaction g_old_int, g_old_term;

void on_signal(int sig) { g_signal = sig; }

}  // namespace

InterruptScope::InterruptScope() {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_depth++ > 0) return;
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking call (flock, sleep) returns EINTR and the caller looks at the flag
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptScope::~InterruptScope() {
  std::lock_guard<std::mutex> g(g_mu);
  if (--g_depth > 0) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

bool interrupted() { return g_signal != 0; }

void throw_if_interrupted(const std::string& what) {
  if (!interrupted()) return;
  throw Interrupted(std::string("interrupted (") + (g_signal == SIGTERM ? "SIGTERM" : "Ctrl-C") + ")" + what);
}

void reset_interrupt() { g_signal = 0; }

}  // namespace dllm
