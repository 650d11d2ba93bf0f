// Prometheus text for GET /metrics (metrics.h).
#include "server/metrics.h"

#include <cstdio>

namespace dllm::server {

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(int64_t prompt, int64_t completion) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
}

void Metrics::step(double seconds, int64_t sequences, int64_t rows) {
  std::lock_guard<std::mutex> l(mu_);
  ++steps_;
  rows_ += rows;
  step_sequences_ += sequences;
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (seconds <= kBuckets[i]) ++bucket_counts_[i];
  ++step_count_;
  step_sum_ += seconds;
}

void Metrics::gauges(int64_t queued, int64_t in_flight, int64_t capacity) {
  std::lock_guard<std::mutex> l(mu_);
  queued_ = queued, in_flight_ = in_flight, capacity_ = capacity > 0 ? capacity : 1;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  char buf[256];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  auto head = [&](const char* name, const char* type, const char* help) {
    line("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  };
  auto scalar = [&](const char* name, const char* type, const char* help, int64_t value) {
    head(name, type, help);
    line("%s %lld\n", name, static_cast<long long>(value));
  };
  head("dllm_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
  for (const auto& [k, v] : requests_)
    line("dllm_requests_total{endpoint=\"%s\",code=\"%d\"} %lld\n", k.first.c_str(), k.second, static_cast<long long>(v));
  scalar("dllm_prompt_tokens_total", "counter", "Prompt tokens of finished sequences.", prompt_tokens_);
  scalar("dllm_completion_tokens_total", "counter", "Answer tokens of finished sequences.", completion_tokens_);
  scalar("dllm_steps_total", "counter", "Batched denoising steps (one forward pass over every sequence in flight).", steps_);
  scalar("dllm_step_rows_total", "counter", "Canvas rows computed over all steps.", rows_);
  scalar("dllm_step_sequences_total", "counter", "Sequences stepped, summed over steps (divide by steps: mean batch).", step_sequences_);
  scalar("dllm_sequences_cancelled_total", "counter", "Sequences cancelled (client gone, stop string, shutdown).", cancelled_);
  scalar("dllm_queue_length", "gauge", "Sequences waiting for a place in the batch.", queued_);
  scalar("dllm_batch_sequences", "gauge", "Sequences in flight.", in_flight_);
  head("dllm_batch_occupancy", "gauge", "Sequences in flight over the batch size.");
  line("dllm_batch_occupancy %g\n", static_cast<double>(in_flight_) / static_cast<double>(capacity_));
  head("dllm_step_seconds", "histogram", "Wall time of one batched step.");
  for (size_t i = 0; i < kBuckets.size(); ++i)
    line("dllm_step_seconds_bucket{le=\"%g\"} %lld\n", kBuckets[i], static_cast<long long>(bucket_counts_[i]));
  line("dllm_step_seconds_bucket{le=\"+Inf\"} %lld\n", static_cast<long long>(step_count_));
  line("dllm_step_seconds_sum %.6f\n", step_sum_);
  line("dllm_step_seconds_count %lld\n", static_cast<long long>(step_count_));
  return out;
}

}  // namespace dllm::server
