// The generation loop: builds the canvas (prompt + masks), runs the architecture's sampler step by step
// (LLaDA: blocks, schedule, optional threshold and dual cache; Dream: timestep schedule, shifted rows),
// stops early once the answer can no longer change (algorithms.md 5.3), and reports every step through a
// callback. It knows nothing of terminals: progress, --visual and step statistics are the caller's.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/arch.h"
#include "model/sampler.h"

namespace dllm {
class ThreadPool;
}

namespace dllm::model {

class Model;
struct StepNeed;

// What a step asks of the model. forward() is one exact pass; the two cache calls implement LLaDA's
// dual cache (algorithms.md 3.12) and are needed only when GenerateConfig::dual_cache is set.
class LogitSource {
 public:
  virtual ~LogitSource() = default;
  virtual int64_t n_vocab() const = 0;
  // Raw logits of canvas positions `rows` (in that order) to out [rows.size(), n_vocab].
  virtual void forward(std::span<const int32_t> canvas, std::span<const int64_t> rows, float* out) = 0;
  // An exact pass that also keeps every position's keys and values in every layer.
  virtual void forward_refresh(std::span<const int32_t> canvas, std::span<const int64_t> rows, float* out);
  // Recomputes only positions [begin, end) against the kept keys/values of the others (overwriting the
  // kept keys/values of [begin, end)); rows must lie in [begin, end).
  virtual void forward_cached(std::span<const int32_t> canvas, int64_t begin, int64_t end,
                              std::span<const int64_t> rows, float* out);
  // DiffusionGemma's passes against the source's cached prefix (sequence.h, Pass::Encode and Pass::Canvas):
  // Encode appends the keys and values of tokens [need.begin, need.end) (causal; out unused), Canvas computes
  // the rows of tokens [need.begin, need.end) against the prefix [0, need.begin) with the need's
  // self-conditioning.
  virtual void forward_prefixed(std::span<const int32_t> tokens, const StepNeed& need, float* out);
};

// The LogitSource of a loaded model (dual cache included).
std::unique_ptr<LogitSource> make_model_logit_source(Model& model);

struct GenerateConfig {
  Arch arch = Arch::LLaDA;
  int32_t mask_id = 0;
  std::vector<int32_t> stop_ids;  // end-of-text and end-of-turn (algorithms.md 5.1)
  int64_t max_tokens = 128;       // L
  int64_t steps = 0;              // N; 0 = max_tokens
  int64_t block_length = 32;      // B (LLaDA)
  double temperature = 0;
  Remasking remasking = Remasking::LowConfidence;
  double threshold = 0;           // LLaDA; 0 = off
  bool dual_cache = false;        // LLaDA
  bool full_logits = false;       // ask the model for every row (benchmarking the generic approach)
  bool early_stop = true;
  uint64_t seed = 42;
  int64_t context_length = 0;     // the model's; 0 = unchecked
  // Log-probabilities of the generated positions (GenerateResult::logprobs): -1 = off; 0..kMaxTopLogprobs
  // (20) = on, with that many most probable alternatives per position. They never change the tokens.
  int top_logprobs = -1;
  // DiffusionGemma (the entropy-bound sampler): its settings (the file's diffusion.eb_* keys unless the user
  // gives others) and the canvas length C of the file; max_tokens runs ceil(max_tokens / C) blocks of
  // eb.max_steps steps at most.
  EntropyBoundDefaults eb;
  int64_t canvas_length = 0;

  int64_t effective_steps() const { return steps > 0 ? steps : max_tokens; }
};

// A setting the architecture or the prompt forbids, in the terms of GenerateConfig: key is the field at
// fault (max_tokens, steps, block_length, remasking, threshold, dual_cache, prompt), and text names every
// setting it mentions as a placeholder, {max_tokens}, and the word for a setting as {setting} /
// {settings}, for the caller to render in its own terms (name_settings): the CLI says "flag --max-tokens",
// a request file "key \"max_tokens\"".
// Why an architecture cannot generate yet ("" when it can): DiffusionGemma's sampler is not in the engine.
std::string generation_unavailable(Arch arch);

struct SettingProblem {
  std::string key;
  std::string text;
};

// The architecture's own checks: max_tokens and steps at least 1, top_logprobs from -1 to 20, block_length at least 1 and steps at
// least the block count (LLaDA; any max_tokens and steps make blocks: llada_block), remasking valid for the
// architecture, threshold and
// dual_cache LLaDA only, dual_cache without full_logits, a prompt for Dream, and prompt + max_tokens
// within the context length. The first problem found, or none.
std::optional<SettingProblem> check_settings(const GenerateConfig& config, int64_t prompt_length);

// text with every {name} replaced by name_of(name) (names are [a-z_]+; other braces are kept).
std::string name_settings(std::string_view text, const std::function<std::string(std::string_view)>& name_of);
// The CLI's names: {setting} -> "flag", {settings} -> "flags", {max_tokens} -> "--max-tokens".
std::string flag_name(std::string_view name);

// check_settings with the CLI's names (as the user typed the flags), thrown as dllm::usage_error.
void validate(const GenerateConfig& config, int64_t prompt_length);

// One step as the callback sees it. Spans point into the loop's state and are valid during the call.
struct StepEvent {
  int64_t step = 0;            // global step index (LLaDA: the block's first_step + step in block)
  int64_t total_steps = 0;     // N
  int64_t block = 0;           // LLaDA block; 0 for Dream
  int64_t scheduled = 0;       // the schedule's count for this step
  std::span<const int64_t> committed;  // positions committed in this step, ascending
  int64_t masked_left = 0;     // masked positions in the generated part after the step
  bool skipped = false;        // nothing could be committed: no forward pass ran (6.3)
  bool cached = false;         // dual cache: only the block's rows were recomputed
  double ms = 0;               // wall time of the step
  std::span<const int32_t> canvas;  // after the step
  int64_t prompt_length = 0;
  // DiffusionGemma: the first position of the block still being denoised (canvas[open_begin..] is noise, not
  // answer yet; the finished blocks before it are); -1 when no block is open (its last step: the block's
  // tokens are in the canvas). Mask-based models: -1 (their masks say what is not answer yet).
  int64_t open_begin = -1;
  // DiffusionGemma: the step's temperature and the mean entropy of its canvas (-1: another sampler).
  double temperature = -1, mean_entropy = -1;
  // With GenerateConfig::top_logprobs >= 0: GenerateResult::logprobs after the step (one entry per generated
  // position; those committed so far filled), for streaming them; empty when off.
  std::span<const PositionLogprobs> logprobs;
};

struct GenerateHooks {
  std::function<void(const StepEvent&)> on_step;
  const std::atomic<bool>* cancel = nullptr;  // checked between steps (Ctrl-C)
  ThreadPool* pool = nullptr;                 // scores the rows of a step in parallel when set
};

struct GenerateResult {
  std::vector<int32_t> canvas;   // prompt + generated part
  int64_t prompt_length = 0;
  int64_t steps_run = 0;         // steps processed (forward passes + exactly skipped no-op steps)
  int64_t forward_passes = 0;
  int64_t total_steps = 0;       // N
  bool stopped_early = false;    // the early stop ended the run while masks were left
  bool cancelled = false;        // the cancel flag ended the run
  // Set when the model gave a position no finite logit to commit (NaN or infinity: weights or activations
  // that overflowed, a corrupt file): the run ended there, and this says where. generate() and engine::run
  // throw it as a dllm::Error; the batch and the server hand it to the request.
  std::string error;
  int64_t committed = 0;         // positions filled during the run
  int64_t cached_prompt_tokens = 0;  // DiffusionGemma: prompt positions taken from a prefix cache, not encoded
  double total_ms = 0;           // the whole loop
  double forward_ms = 0;         // sum over steps that ran a forward pass
  std::vector<double> step_ms;   // per processed step
  // With config.top_logprobs >= 0: one entry per generated position (max_tokens of them, in canvas order),
  // filled when the position is committed (sampler.h: the distribution it was committed from); empty when off.
  std::vector<PositionLogprobs> logprobs;

  std::span<const int32_t> generated() const {
    return std::span<const int32_t>(canvas).subspan(static_cast<size_t>(prompt_length));
  }
};

GenerateResult generate(LogitSource& model, const GenerateConfig& config, std::span<const int32_t> prompt,
                        const GenerateHooks& hooks = {});

// The answer (algorithms.md 5.2): generated positions up to the first stop token (exclusive).
std::vector<int32_t> answer_tokens(std::span<const int32_t> canvas, int64_t prompt_length,
                                   std::span<const int32_t> stop_ids);
// The early-stop test (5.3): the first generated position that is masked or holds a stop token holds
// a stop token.
bool answer_is_final(std::span<const int32_t> canvas, int64_t prompt_length, int32_t mask_id,
                     std::span<const int32_t> stop_ids);

}  // namespace dllm::model
