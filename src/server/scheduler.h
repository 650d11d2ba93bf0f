// The one thread that owns the engine's Session: it takes the requests the HTTP handlers submit, adds
// their sequences to the batch (model::Batch through engine::Session, the same path as `run
// --prompts-file`), steps the batch, and pushes each request's step and answer events to its Stream. A
// cancel flag set by a handler (client gone, stop string) ends that sequence at the next step.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/stream.h"

namespace dllm::server {

class Scheduler {
 public:
  // batch_size: sequences in flight at once; max_queue: sequences waiting at most (submit refuses more).
  // prefix_cache_bytes: the DiffusionGemma prefix cache's bound (engine::Session), 0 for none.
  Scheduler(engine::Engine& engine, int64_t batch_size, int64_t max_queue, Metrics& metrics,
            uint64_t prefix_cache_bytes = 0);
  ~Scheduler();  // stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues one request's sequences (one Prepared a choice). False when the queue has no room for them all
  // (the request is then not queued) or the scheduler is stopping.
  bool submit(std::vector<engine::Prepared> choices, std::shared_ptr<Stream> stream);
  // Refuses new requests, lets the ones in flight and queued run for up to `grace`, then cancels what is
  // left and waits until every sequence has finished (its stream got its Done event).
  void drain(std::chrono::milliseconds grace);
  // Ends the thread (after drain: at once).
  void stop();

  int64_t queued() const;

 private:
  struct Job {
    std::vector<engine::Prepared> choices;
    std::shared_ptr<Stream> stream;
  };
  struct Running {
    std::shared_ptr<Stream> stream;
    int choice = 0;
    int64_t prompt_length = 0;
    int32_t mask_id = 0;
    std::vector<int32_t> stops;
    size_t committed = 0;  // committed ids last reported
    std::vector<bool> settled;  // include_canvas: positions of the generated part committed so far
  };
  void loop();
  void admit(Job job);  // scheduler thread
  void on_step(Running& r, const model::StepEvent& ev);

  engine::Engine& engine_;
  int64_t batch_size_, max_queue_;
  Metrics& metrics_;
  engine::Session session_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Job> pending_;
  int64_t pending_sequences_ = 0, session_waiting_ = 0, in_flight_ = 0;
  int64_t sequences_ = 0;  // submitted and not finished yet (queued, waiting or in the batch)
  bool accepting_ = true, quit_ = false, cancel_all_ = false;
  std::unordered_map<int64_t, std::unique_ptr<Running>> running_;  // scheduler thread only
  std::thread thread_;
};

}  // namespace dllm::server
