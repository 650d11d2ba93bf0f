// Host staging for asynchronous uploads (CudaDevice's pinned memory), kept apart from the driver so that its rules
// are tested without a GPU: chunks filled in order, a byte handed out never handed out again until the stream has
// idled (reset()), and while a graph is being captured never at all before then (its copies read the bytes when the
// graph runs, later). Outside a capture, a full arena waits for the stream (the wait_idle hook, which calls reset())
// and starts again at its first byte, so eager uploads stay within one chunk of at least kMinChunk; a capture that
// outgrows the arena gets a new chunk (double the last), and the next reset() merges them into one.
#pragma once
#include <algorithm>
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

namespace dllm::jit::cuda {

class StagingArena {
 public:
  struct Hooks {
    std::function<void*(size_t)> alloc;    // pinned memory of that many bytes (throws on failure)
    std::function<void(void*)> free;
    std::function<void()> wait_idle;       // wait until every copy issued so far has read its bytes, then reset()
  };
  static constexpr size_t kAlign = 256;
  static constexpr size_t kMinChunk = size_t{4} << 20;

  explicit StagingArena(Hooks hooks) : h_(std::move(hooks)) {}
  ~StagingArena() { clear(); }
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  // `bytes` of staging, kAlign-aligned within its chunk.
  void* stage(size_t bytes, bool capturing) {
    const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    if (void* p = take(need)) return p;
    if (!capturing && !chunks_.empty()) {
      h_.wait_idle();  // every earlier upload has been read
      if (void* p = take(need)) return p;
    }
    const size_t last = chunks_.empty() ? 0 : chunks_.back().bytes;
    Chunk c{nullptr, std::max({need, 2 * last, kMinChunk})};
    c.p = h_.alloc(c.bytes);
    chunks_.push_back(c);
    used_ = need;
    return c.p;
  }
  // The stream has idled: every byte may be handed out again, in one chunk as large as all of them.
  void reset() {
    if (chunks_.size() > 1) {
      size_t total = 0;
      for (const Chunk& c : chunks_) total += c.bytes, h_.free(c.p);
      chunks_.clear();
      Chunk c{nullptr, total};
      c.p = h_.alloc(total);
      chunks_.push_back(c);
    }
    used_ = 0;
  }
  // Frees every chunk (the owner's context is about to go).
  void clear() {
    for (const Chunk& c : chunks_) h_.free(c.p);
    chunks_.clear();
    used_ = 0;
  }
  size_t bytes_held() const {
    size_t n = 0;
    for (const Chunk& c : chunks_) n += c.bytes;
    return n;
  }
  size_t chunks() const { return chunks_.size(); }

 private:
  struct Chunk {
    void* p;
    size_t bytes;
  };
  void* take(size_t need) {
    if (chunks_.empty() || used_ + need > chunks_.back().bytes) return nullptr;
    void* p = static_cast<char*>(chunks_.back().p) + used_;
    used_ += need;
    return p;
  }
  Hooks h_;
  std::vector<Chunk> chunks_;
  size_t used_ = 0;  // bytes handed out of the last chunk
};

}  // namespace dllm::jit::cuda
