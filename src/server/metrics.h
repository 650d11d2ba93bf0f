// The server's counters for GET /metrics, in Prometheus's text exposition format: requests by endpoint and
// status, prompt and completion tokens, steps, cancelled sequences, the queue's length, the batch's
// occupancy and a histogram of step times. Thread-safe.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace dllm::server {

class Metrics {
 public:
  void request(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t completion);
  void step(double seconds, int64_t sequences, int64_t rows);
  void cancelled(int64_t n) { std::lock_guard<std::mutex> l(mu_); cancelled_ += n; }
  // Gauges, set by the scheduler after every step.
  void gauges(int64_t queued, int64_t in_flight, int64_t capacity);
  // The exposition text.
  std::string render() const;

 private:
  static constexpr std::array<double, 12> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1,    2.5,   5,    10,  30};
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, steps_ = 0, rows_ = 0, step_sequences_ = 0, cancelled_ = 0;
  int64_t queued_ = 0, in_flight_ = 0, capacity_ = 1;
  std::array<int64_t, kBuckets.size()> bucket_counts_{};
  int64_t step_count_ = 0;
  double step_sum_ = 0;
};

}  // namespace dllm::server
