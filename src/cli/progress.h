// A one-line progress bar on stderr, drawn only when stderr is a terminal (never into logs or pipes).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace dllm::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  // Redraws at most every 100 ms (and always at done == total). Units are bytes.
  void update(uint64_t done, uint64_t total);
  void finish();
  bool enabled() const { return enabled_; }

 private:
  std::string label_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

std::string human_bytes(double bytes);

}  // namespace dllm::cli
