// Ctrl-C (SIGINT) and SIGTERM as an orderly stop: while an InterruptScope lives, the signals set a flag instead of
// killing the process; long loops (a download, a tensor dump) poll it and throw Interrupted, so destructors remove
// temporary files and locks, and the CLI exits 130 (128 + SIGINT) after one clear message.
#pragma once
#include "common/error.h"

namespace dllm {

// The error a stop by signal becomes: exit status 130.
class Interrupted : public Error {
 public:
  explicit Interrupted(const std::string& msg) : Error(msg, Error::kInterrupted) {}
};

class InterruptScope {
 public:
  InterruptScope();   // installs the handlers (nested scopes share the outer one's)
  ~InterruptScope();  // restores the previous handlers
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// True once SIGINT or SIGTERM arrived inside a scope.
bool interrupted();
// Throws Interrupted("interrupted" + what) when interrupted().
void throw_if_interrupted(const std::string& what = "");
// Clears the flag (tests).
void reset_interrupt();

}  // namespace dllm
