// The one error type of dllm: a message for the user and the process exit status it maps to.
// Usage errors (bad flags, bad values) exit 2 and are raised before anything is opened; every other
// error (files, models, devices) exits 1. Messages name the thing at fault; the CLI prints "ERROR: " + what().
#pragma once
#include <stdexcept>
#include <string>

namespace dllm {

class Error : public std::runtime_error {
 public:
  enum Kind { kUsage = 2, kRuntime = 1, kInterrupted = 130 };  // 130: stopped by Ctrl-C (common/interrupt.h)
  explicit Error(const std::string& msg, Kind kind = kRuntime, std::string hint = {})
      : std::runtime_error(msg), kind_(kind), hint_(std::move(hint)) {}
  int exit_code() const { return static_cast<int>(kind_); }
  Kind kind() const { return kind_; }
  // An optional next line printed after the message (e.g. "see: dllm run --help").
  const std::string& hint() const { return hint_; }

 private:
  Kind kind_;
  std::string hint_;
};

// Thrown for usage errors: exit status 2.
inline Error usage_error(const std::string& msg, std::string hint = {}) {
  return Error(msg, Error::kUsage, std::move(hint));
}

}  // namespace dllm
