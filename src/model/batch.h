// Many sequences through one forward pass per step (continuous batching). Each step the batch admits
// waiting sequences while there is room, asks every sequence in flight for the rows it needs (sequence.h),
// runs one forward pass over all of them (forward_batch: one GEMM per weight for the whole batch,
// attention per sequence), and hands each its logits. A sequence that finishes, stops early or is
// cancelled leaves at once and frees its state, its dual-cache keys and values included; what does not
// fit waits, it is never dropped. A sequence's tokens are bit-identical to its run alone.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "model/forward.h"
#include "model/generate.h"
#include "model/prefix_cache.h"
#include "model/sequence.h"

namespace dllm::model {

class Model;

struct BatchLimits {
  int64_t max_sequences = 8;  // sequences in flight at once (at least 1)
  int64_t max_rows = 0;       // canvas rows computed per step over all sequences; 0 = no limit. A sequence
                              // longer than the limit on its own still runs, alone.
};

class Batch {
 public:
  Batch(Model& model, BatchLimits limits = {});
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Queues a sequence; it joins at the next step with room. Checks the settings against the prompt
  // (dllm::usage_error) and the prompt's ids against the vocabulary (dllm::Error) now. Returns its id
  // (0, 1, 2, ... in the order added).
  int64_t add(const GenerateConfig& config, std::span<const int32_t> prompt, GenerateHooks hooks = {});
  // Cancels a waiting or running sequence: it finishes (cancelled) at the next step.
  void cancel(int64_t id);
  // DiffusionGemma sequences take what they can of their prompt from `cache` when admitted, and leave their
  // encoded prefix in it when they finish (prefix_cache.h). nullptr (the default): no prefix cache. The cache
  // outlives the batch's use of it.
  void set_prefix_cache(PrefixCache* cache) { prefix_cache_ = cache; }

  // One step: admit, one forward pass over every sequence in flight, commit. Returns false, doing
  // nothing, when no sequence is in flight or waiting.
  bool step();
  // Steps until every sequence added so far has finished.
  void run();

  // Sequences finished since the last call, in the order they finished, with their results.
  std::vector<std::pair<int64_t, GenerateResult>> take_finished();

  int64_t in_flight() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t forward_passes() const { return passes_; }  // batched passes run so far
  int64_t last_step_rows() const { return last_rows_; }  // computed rows in the last pass
  int64_t last_step_sequences() const { return last_sequences_; }

 private:
  struct Slot {
    int64_t id = 0;
    std::unique_ptr<Sequence> seq;
    KVCache cache;  // the dual cache's keys and values
    std::vector<float> logits;
    bool cancel = false;
  };
  int64_t rows_of(const Slot& s) const;
  void advance(Slot& s);  // next need, or finished
  void retire();          // moves finished slots out
  void adopt_prefix(Slot& s);  // from the prefix cache, when admitted

  Model& model_;
  BatchLimits limits_;
  int64_t next_id_ = 0, passes_ = 0, last_rows_ = 0, last_sequences_ = 0;
  std::deque<std::unique_ptr<Slot>> waiting_;
  std::vector<std::unique_ptr<Slot>> running_;
  std::vector<std::pair<int64_t, GenerateResult>> finished_;
  PrefixCache* prefix_cache_ = nullptr;
};

}  // namespace dllm::model
