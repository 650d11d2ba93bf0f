// Per-request event queues and the streamed text (stream.h).
#include "server/stream.h"

#include <algorithm>

#include "common/printable.h"

namespace dllm::server {

Stream::Stream(int n, bool want_steps, bool want_canvas) : want_steps_(want_steps), want_canvas_(want_canvas) {
  for (int i = 0; i < n; ++i) cancel_.push_back(std::make_unique<std::atomic<bool>>(false));
}

void Stream::cancel_all() {
  for (auto& c : cancel_) c->store(true);
}

void Stream::push(StreamEvent ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ev.kind == StreamEvent::Kind::Step && q_.size() >= kMaxQueued) {
      // A reader that falls behind: the choice's last waiting step takes this one's place (the committed
      // prefix and the canvas are the newest; the fresh positions of both are kept). Never a Done event.
      for (auto it = q_.rbegin(); it != q_.rend(); ++it) {
        if (it->kind != StreamEvent::Kind::Step || it->choice != ev.choice) continue;
        // (A uniform-state canvas is redrawn whole each step: the newest step's accepted positions alone.)
        std::vector<int64_t> fresh = std::move(it->fresh);
        fresh.insert(fresh.end(), ev.fresh.begin(), ev.fresh.end());
        const bool uniform = ev.uniform;
        *it = std::move(ev);
        if (!uniform) it->fresh = std::move(fresh);
        return;
      }
    }
    q_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

size_t Stream::queued() {
  std::lock_guard<std::mutex> lock(mu_);
  return q_.size();
}

std::optional<StreamEvent> Stream::pop(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, wait, [&] { return !q_.empty(); })) return std::nullopt;
  StreamEvent ev = std::move(q_.front());
  q_.pop_front();
  return ev;
}

std::span<const int32_t> committed_answer(std::span<const int32_t> generated, int32_t mask_id,
                                          std::span<const int32_t> stops, bool* ended) {
  *ended = false;
  size_t i = 0;
  for (; i < generated.size() && generated[i] != mask_id; ++i) {
    if (std::find(stops.begin(), stops.end(), generated[i]) != stops.end()) {
      *ended = true;
      break;
    }
  }
  return generated.subspan(0, i);
}

std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stops, bool* hit) {
  size_t cut = std::string::npos;
  for (const std::string& s : stops) cut = std::min(cut, text.find(s));
  *hit = cut != std::string::npos;
  return *hit ? text.substr(0, cut) : text;
}

std::string TextStream::emit(const std::string& text, bool final) {
  if (stopped_) return "";
  bool hit = false;
  std::string t = cut_at_stop(text, stops_, &hit);
  size_t end = t.size();
  if (hit) {
    stopped_ = true;
  } else if (!final) {
    // Hold back what a stop string could still begin with, and a character cut short.
    size_t hold = 0;
    for (const std::string& s : stops_)
      for (size_t k = std::min(s.size() - 1, t.size()); k > hold; --k)
        if (t.compare(t.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
    end = utf8_complete_prefix(std::string_view(t).substr(0, t.size() - hold));
  }
  if (end <= sent_) return "";
  std::string delta = sanitize_utf8(std::string_view(t).substr(sent_, end - sent_));
  sent_ = end;
  shown_ += delta;
  return delta;
}

std::string TextStream::feed(const std::string& committed_text) { return emit(committed_text, false); }

std::string TextStream::finish(const std::string& final_text) { return emit(final_text, true); }

}  // namespace dllm::server
