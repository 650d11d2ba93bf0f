// The events a request's handler reads while the scheduler steps its sequences, and the text a stream may
// show at each step: the committed prefix of the answer (every position before the first mask, cut at the
// first end token), never a partial UTF-8 character, never text a stop string may still claim.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dllm::server {

struct StreamEvent {
  enum class Kind { Step, Done } kind = Kind::Step;
  int choice = 0;
  int64_t step = 0, total_steps = 0;
  std::vector<int32_t> committed;  // Step: the answer's committed ids so far (to the first mask / end token)
  bool ended = false;              // Step: an end token is among the committed ids (the answer is final)
  std::vector<int32_t> canvas;     // Step with include_canvas: the generated part, -1 where not committed yet
  std::vector<int64_t> fresh;      // Step with include_canvas: positions (in the generated part) committed now
  // DiffusionGemma (a uniform-state canvas, no masks): fresh = the positions accepted at this step, noise = the
  // open block's positions re-noised with random tokens; the step's block and temperature.
  bool uniform = false;
  std::vector<int64_t> noise;
  int64_t block = 0;
  double temperature = 0;
  std::optional<engine::Answer> answer;  // Done
};

// One HTTP request's sequences (its n choices) and the queue of their events. The scheduler pushes, the
// handler pops; cancel flags are read by the sequences between steps (GenerateHooks::cancel).
class Stream {
 public:
  Stream(int n, bool want_steps, bool want_canvas);
  int choices() const { return static_cast<int>(cancel_.size()); }
  bool want_steps() const { return want_steps_; }
  bool want_canvas() const { return want_canvas_; }
  const std::atomic<bool>* cancel_flag(int choice) const { return cancel_[static_cast<size_t>(choice)].get(); }
  void cancel(int choice) { cancel_[static_cast<size_t>(choice)]->store(true); }
  void cancel_all();

  // Step events beyond kMaxQueued waiting replace their choice's last waiting step (bounded memory for a
  // reader that falls behind); Done events always queue.
  static constexpr size_t kMaxQueued = 64;
  void push(StreamEvent ev);
  size_t queued();
  // The next event, or nullopt after `wait` without one.
  std::optional<StreamEvent> pop(std::chrono::milliseconds wait);

 private:
  bool want_steps_, want_canvas_;
  std::vector<std::unique_ptr<std::atomic<bool>>> cancel_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> q_;
};

// The answer's ids that are final in a canvas's generated part: those before the first mask, up to (not
// including) the first end token. *ended: an end token was reached.
std::span<const int32_t> committed_answer(std::span<const int32_t> generated, int32_t mask_id,
                                          std::span<const int32_t> stops, bool* ended);

// The text of one choice as it grows: feed() the detokenized committed prefix at each step and get the
// new text that is safe to show; finish() with the final answer's text gives the rest. Stop strings end
// the text at their first occurrence (stopped() then says so).
class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string feed(const std::string& committed_text);
  std::string finish(const std::string& final_text);
  bool stopped() const { return stopped_; }
  const std::string& shown() const { return shown_; }  // everything returned so far (sanitized)

 private:
  std::string emit(const std::string& text, bool final);
  std::vector<std::string> stops_;
  size_t sent_ = 0;  // raw bytes of the text already shown
  std::string shown_;
  bool stopped_ = false;
};

// text cut before the first occurrence of any stop string; *hit says whether one was found.
std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stops, bool* hit);

}  // namespace dllm::server
