// The scheduler thread (scheduler.h).
#include "server/scheduler.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>

namespace dllm::server {

using Clock = std::chrono::steady_clock;

Scheduler::Scheduler(engine::Engine& engine, int64_t batch_size, int64_t max_queue, Metrics& metrics,
                     uint64_t prefix_cache_bytes)
    : engine_(engine),
      batch_size_(batch_size),
      max_queue_(max_queue),
      metrics_(metrics),
      session_(engine, model::BatchLimits{batch_size, 0}, prefix_cache_bytes) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

bool Scheduler::submit(std::vector<engine::Prepared> choices, std::shared_ptr<Stream> stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t n = static_cast<int64_t>(choices.size());
    if (!accepting_) return false;
    // Room: the sequences that would wait for a place in the batch, this request's included, stay within
    // the queue's bound. Counted from every sequence not finished yet, which submit and the scheduler
    // both keep exact (the batch's own counts lag a step behind a burst).
    if (sequences_ + n - batch_size_ > max_queue_) return false;
    sequences_ += n;
    pending_sequences_ += n;
    pending_.push_back(Job{std::move(choices), std::move(stream)});
  }
  cv_.notify_one();
  return true;
}

int64_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return session_waiting_ + pending_sequences_;
}

void Scheduler::admit(Job job) {
  for (size_t c = 0; c < job.choices.size(); ++c) {
    auto r = std::make_unique<Running>();
    r->stream = job.stream;
    r->choice = static_cast<int>(c);
    r->prompt_length = static_cast<int64_t>(job.choices[c].prompt.size());
    r->mask_id = job.choices[c].config.mask_id;
    r->stops = job.choices[c].config.stop_ids;
    Running* rp = r.get();
    model::GenerateHooks hooks;
    hooks.cancel = job.stream->cancel_flag(static_cast<int>(c));
    if (job.stream->want_steps()) hooks.on_step = [this, rp](const model::StepEvent& ev) { on_step(*rp, ev); };
    const int64_t id = session_.add(job.choices[c], std::move(hooks));
    running_.emplace(id, std::move(r));
  }
}

// Runs inside session_.step() (this thread): reports the committed prefix when it grew, and with
// include_canvas the whole generated part.
void Scheduler::on_step(Running& r, const model::StepEvent& ev) {
  const auto generated = ev.canvas.subspan(static_cast<size_t>(ev.prompt_length));
  // A DiffusionGemma block still being denoised is noise, not answer: only the finished blocks count.
  const auto settled = ev.open_begin >= 0 ? ev.canvas.subspan(static_cast<size_t>(ev.prompt_length),
                                                              static_cast<size_t>(ev.open_begin - ev.prompt_length))
                                          : generated;
  bool ended = false;
  const auto committed = committed_answer(settled, r.mask_id, r.stops, &ended);
  const bool grew = committed.size() > r.committed || ended;
  if (!grew && !r.stream->want_canvas()) return;
  StreamEvent e;
  e.kind = StreamEvent::Kind::Step;
  e.choice = r.choice;
  e.step = ev.step;
  e.total_steps = ev.total_steps;
  e.committed.assign(committed.begin(), committed.end());
  e.ended = ended;
  if (r.stream->want_canvas() && ev.temperature >= 0) {
    // DiffusionGemma: every position holds a token; the open block's accepted and re-noised positions.
    e.uniform = true;
    e.block = ev.block;
    e.temperature = ev.temperature;
    e.canvas.assign(generated.begin(), generated.end());
    for (int64_t p : ev.committed)  // (the answer's last block may be cut at max_tokens)
      if (p < static_cast<int64_t>(ev.canvas.size())) e.fresh.push_back(p - ev.prompt_length);
    if (ev.open_begin >= 0)
      for (int64_t p = ev.open_begin; p < static_cast<int64_t>(ev.canvas.size()); ++p)
        if (!std::binary_search(ev.committed.begin(), ev.committed.end(), p)) e.noise.push_back(p - ev.prompt_length);
  } else if (r.stream->want_canvas()) {
    if (r.settled.size() != generated.size()) r.settled.assign(generated.size(), false);
    for (int64_t p : ev.committed) {
      e.fresh.push_back(p - ev.prompt_length);
      const size_t i = static_cast<size_t>(p - ev.prompt_length);
      if (i < r.settled.size()) r.settled[i] = true;
    }
    // Positions not committed yet are -1: a committed token that happens to be the mask id is a token.
    e.canvas.resize(generated.size());
    for (size_t i = 0; i < generated.size(); ++i)
      e.canvas[i] = r.settled[i] || generated[i] != r.mask_id ? generated[i] : -1;
  }
  r.committed = committed.size();
  r.stream->push(std::move(e));
}

void Scheduler::loop() {
  for (;;) {
    std::deque<Job> jobs;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return quit_ || !pending_.empty() || session_.in_flight() + session_.waiting() > 0; });
      if (quit_ && pending_.empty() && session_.in_flight() + session_.waiting() == 0) break;
      jobs.swap(pending_);
      pending_sequences_ = 0;
      if (cancel_all_)
        for (auto& j : jobs) j.stream->cancel_all();
    }
    for (Job& j : jobs) admit(std::move(j));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancel_all_)
        for (auto& [id, r] : running_) r->stream->cancel(r->choice);
    }
    const auto t0 = Clock::now();
    const bool stepped = session_.step();
    if (stepped) {
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      metrics_.step(s, session_.last_step_sequences(), session_.last_step_rows());
    }
    for (auto& [id, answer] : session_.take_finished()) {
      auto it = running_.find(id);
      if (it == running_.end()) continue;
      Running& r = *it->second;
      if (answer.result.cancelled) metrics_.cancelled(1);
      const bool answered = !answer.result.cancelled && answer.result.error.empty();
      metrics_.tokens(r.prompt_length, answered ? static_cast<int64_t>(answer.tokens.size()) : 0);
      StreamEvent e;
      e.kind = StreamEvent::Kind::Done;
      e.choice = r.choice;
      e.answer = std::move(answer);
      r.stream->push(std::move(e));
      running_.erase(it);
      std::lock_guard<std::mutex> lock(mu_);
      --sequences_;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      session_waiting_ = session_.waiting();
      in_flight_ = session_.in_flight();
      metrics_.gauges(session_waiting_ + pending_sequences_, in_flight_, batch_size_);
    }
    if (stepped && session_.in_flight() + session_.waiting() == 0) {
      // Idle again: hand the freed canvases, logits and caches back to the system, so that the resident
      // memory returns to its idle level (glibc keeps freed memory in its arenas otherwise).
      malloc_trim(0);
    }
    idle_cv_.notify_all();
  }
}

void Scheduler::drain(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  accepting_ = false;
  auto busy = [&] { return !pending_.empty() || in_flight_ + session_waiting_ > 0; };
  if (!idle_cv_.wait_for(lock, grace, [&] { return !busy(); })) {
    cancel_all_ = true;
    cv_.notify_one();
    idle_cv_.wait(lock, [&] { return !busy(); });
  }
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    quit_ = true;
    cancel_all_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dllm::server
