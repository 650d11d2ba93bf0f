// Ctrl-C during `dllm run`: the first SIGINT sets a flag the generation checks between steps (the run
// stops, reports what it has and exits 130); a second one ends the process at once.
#pragma once
#include <atomic>
#include <signal.h>

#include <cstdint>

namespace dllm::cli {

inline constexpr int kInterruptedStatus = 130;

// The flag the generation hooks read (GenerateHooks::cancel).
std::atomic<bool>& run_interrupted();

// Installs the SIGINT handler for the duration of the generation loop (clearing the flag).
class SigintScope {
 public:
  SigintScope();
  ~SigintScope();
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  struct sigaction old_ {};
};

// Peak resident memory of this process, in bytes.
uint64_t peak_rss_bytes();

}  // namespace dllm::cli
