// Generation as a state machine per sequence (algorithms.md sections 3-6). A Sequence holds one canvas,
// its schedule and its sampler state, and never calls the model: each step it says which raw rows it needs
// and in which pass (next()), and given their logits it commits (commit()). Whoever owns the model drives
// it: generate() below one sequence against a LogitSource, the Batch (batch.h) many sequences through one
// forward pass per step. LLaDA's blocks (threshold, dual cache) and Dream's timestep schedule, the exact
// early stop (5.3), cancellation between steps and one StepEvent per step behave exactly as the loop did.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/forward.h"
#include "model/generate.h"
#include "model/sampler.h"

namespace dllm::model {

// Which forward pass a step needs (LLaDA's dual cache: algorithms.md 3.12).
enum class Pass {
  Exact,    // every position through every layer; no cache
  Refresh,  // an exact pass that also keeps every position's keys and values (the sequence's cache)
  Cached,   // only positions [begin, end) recomputed against the kept keys and values
  // DiffusionGemma (the sequence's cached prefix, CacheMode::Extend / Prefix):
  Encode,   // tokens [begin, end) encoded causally and appended to the prefix; no logits
  Canvas,   // the canvas [begin, end) against the prefix [0, begin), with self-conditioning
};

// What the next step asks of the model.
struct StepNeed {
  Pass pass = Pass::Exact;
  std::vector<int64_t> rows;   // raw rows whose logits the step reads, in this order
  int64_t begin = 0, end = 0;  // Cached, Encode, Canvas: the computed positions (rows lie inside)
  const float* self_cond = nullptr;  // Canvas: the previous step's raw canvas logits [end - begin, n_vocab]
  float self_cond_temperature = 1;   // and the temperature they are softmaxed at
  int64_t self_cond_top_k = 0;       // and the tokens per row it takes (0: all; EntropyBoundDefaults)
};

// The forward request of a step's need over the sequence's canvas (tokens) with the sequence's cache (the dual
// cache or DiffusionGemma's prefix; unused for Exact) and out for its rows' logits: every pass kind in one place,
// for the batch and the single-sequence loop alike.
ForwardRequest step_request(std::span<const int32_t> canvas, const StepNeed& need, KVCache* cache, float* out);

class Sequence {
 public:
  // Checks the settings against the prompt (validate(), dllm::usage_error) and lays out the canvas:
  // the prompt, then max_tokens masks. hooks.on_step sees every step; hooks.cancel is read between
  // steps; hooks.pool, when set, scores the rows of a step in parallel.
  Sequence(const GenerateConfig& config, std::span<const int32_t> prompt, int64_t n_vocab,
           GenerateHooks hooks = {});

  // The forward pass the next step needs. Steps that need none (a schedule count of 0, a completed
  // block) are processed here first, reporting their events. nullptr once the generation is over:
  // every step ran, the early stop ended it, or the cancel flag (or cancel()) stopped it.
  const StepNeed* next();
  // Commits the pending step from the logits of next()'s rows ([rows.size(), n_vocab] row-major). With owner (the
  // vector holding those logits, which the caller refills for the next step): a DiffusionGemma sequence keeps
  // them for the next step's self-conditioning by swapping buffers with owner instead of copying them.
  void commit(const float* logits, std::vector<float>* owner = nullptr);
  // Stops the generation before its next step (the result says cancelled).
  void cancel();

  // DiffusionGemma, before the first pass (the prompt's encoding may be planned): the first n prompt positions
  // are already in the sequence's cached prefix (a prefix cache's copy), so they are not encoded again. False
  // (nothing changed) for another kind, after a pass, or for n outside [1, prompt length].
  bool adopt_prefix(int64_t n);
  // DiffusionGemma: positions encoded into the cached prefix so far (the prompt, then finished blocks).
  int64_t encoded() const { return encoded_; }
  // DiffusionGemma: whether the sequence encodes a prefix to attend to (a uniform-state canvas).
  bool prefixed() const { return eb_; }

  bool finished() const { return done_; }
  std::span<const int32_t> canvas() const { return res_.canvas; }
  int64_t prompt_length() const { return res_.prompt_length; }
  const GenerateConfig& config() const { return cfg_; }
  const GenerateResult& result() const { return res_; }
  GenerateResult take_result() { return std::move(res_); }

 private:
  using Clock = std::chrono::steady_clock;
  int64_t P() const { return res_.prompt_length; }
  int64_t n() const { return static_cast<int64_t>(res_.canvas.size()); }
  std::vector<int64_t> masked_in(int64_t lo, int64_t hi) const;
  bool cancel_requested();
  // The logits row of candidate C_[c] in a step's logits (Dream: the raw row before the position).
  const float* row_logits(const float* logits, size_t c) const;
  // GenerateResult::logprobs of the chosen candidates, from the rows they were proposed from.
  void record_logprobs(const float* logits, const std::vector<Candidate>& cand, const std::vector<size_t>& chosen);
  void finish();
  // Reports a step and applies the early stop; returns true when the generation ends here.
  bool finish_step(StepEvent ev, const std::vector<Candidate>& cand, const std::vector<size_t>& chosen);
  const StepNeed* plan_llada();
  const StepNeed* plan_dream();
  const StepNeed* plan_entropy_bound();
  void commit_entropy_bound(const float* logits, std::vector<float>* owner);
  void end_block(const std::vector<int32_t>& argmax);
  const StepNeed* ask(Pass pass, int64_t begin, int64_t end);

  GenerateConfig cfg_;
  GenerateHooks hooks_;
  int64_t V_;
  bool blocks_;  // LLaDA's block sampler; else Dream's timestep sampler
  GenerateResult res_;
  Clock::time_point start_, t0_;
  bool done_ = false, pending_ = false, cancelled_ = false;
  // the step in flight
  std::vector<int64_t> C_;  // candidate positions
  StepEvent ev_;
  bool last_ = false;
  StepNeed need_;
  std::vector<int64_t> committed_;
  // LLaDA: block b_ (of nb_, laid out as block_), step i_ within it; Dream: step i_
  int64_t nb_ = 0, b_ = 0, i_ = 0, block_masked_ = 0;
  LladaBlock block_;
  bool block_open_ = false, refreshed_ = false;
  std::optional<DreamSchedule> dream_sched_;
  // DiffusionGemma: the canvas is [prefix | C block tokens]; encoded_ prefix tokens are in the model's cache;
  // step cur_ counts down from eb.max_steps; gstep_ numbers the sequence's steps (its random stream).
  bool eb_ = false;
  int64_t C_len_ = 0, encoded_ = 0, cur_ = 0, gstep_ = 0;
  double t_ = 0;                 // the pending step's temperature
  std::vector<float> sc_;        // the previous step's raw canvas logits (self-conditioning)
  double sc_t_ = 0;
  bool answer_ended_ = false;    // a block held a stop token
  std::optional<EntropyBoundStop> eb_stop_;
};

}  // namespace dllm::model
