// What `dllm run` shows: the per-step renderers the generation loop's callback drives (--visual frames,
// --dump-step-stats lines, the progress line on a terminal) and the final report (--json object,
// --verbose lines). Results go to stdout, diagnostics to stderr; the loop itself knows none of this.
#pragma once
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/printable.h"
#include "cli/backend.h"
#include "cli/settings.h"
#include "engine/engine.h"
#include "jit/cuda/gpu_executor.h"
#include "model/arch.h"
#include "model/generate.h"
#include "model/tokenizer.h"

namespace dllm::cli {

// Everything the final report of a run needs.
// One DiffusionGemma step as --json reports it (per-step statistics; the blocks' step counts come from them).
struct StepRecord {
  int64_t step = 0, block = 0;
  int64_t accepted = 0, renoised = 0;  // positions kept under the entropy bound, and re-noised
  double temperature = 0, mean_entropy = 0, ms = 0;
  bool block_done = false;  // the block's last step
};
// The record of a DiffusionGemma step; nullopt for another sampler's step.
std::optional<StepRecord> step_record(const model::StepEvent& ev);

struct RunSummary {
  std::string model_path;
  model::HParams hp;
  std::string model_name;      // general.name, "" when absent
  std::string executor;        // the executor's name
  int threads = 0;
  std::string device = "cpu";
  std::string device_reason;   // why that device and executor were chosen
  jit::cuda::ExecutorReport executor_report;  // the GPU executor's lines and DLLM_GPU_PROFILE split
  model::GenerateConfig config;
  std::vector<int32_t> prompt;
  model::GenerateResult result;
  std::string text;            // the answer (algorithms.md 5.2)
  int64_t answer_tokens = 0;
  std::vector<model::PositionLogprobs> logprobs;  // --top-logprobs: one per answer token (engine::Answer)
  double load_ms = 0;          // mapping, checking and preparing the model (tokenizer included)
  double prompt_ms = 0;        // chat template and tokenization
  double total_ms = 0;         // the whole command up to the report
  uint64_t peak_rss_bytes = 0;
  std::vector<StepRecord> steps;  // DiffusionGemma: every step (--json "blocks" and "step_stats")
  // The forward passes' time split (a CPU executor's; passes == 0 when not measured).
  model::PassTimes pass_times;
};

// The report's fields a loaded engine knows (model path, name, hyperparameters, executor, threads,
// device and why, the GPU executor's report).
RunSummary engine_summary(engine::Engine& e, const Settings& s, const Backend& backend);
// The report's fields of a finished request (result, answer text and length).
void set_answer(RunSummary& r, engine::Answer answer);
// One JSON value on one line of stdout (invalid UTF-8 replaced).
void print_json_line(const nlohmann::ordered_json& j);

// The --json object: text, prompt_ids, output_ids, logprobs (--top-logprobs), steps_run, stopped_early,
// DiffusionGemma's blocks (steps and ms of each) and step_stats (StepRecord per step), step_split (where a
// step's time went, on a CPU executor), timings, tokens_per_s, peak_rss_bytes, settings (every effective setting), model, device (with the executor's description
// lines) and gpu_profile (the per-step split with DLLM_GPU_PROFILE=1 on the GPU, else null).
nlohmann::ordered_json run_json(const RunSummary& r, const Settings& s);
// The --verbose lines (printed to stderr after the text), led by a note that the architecture's sampler
// ignores --block-length when the user gave it to a timestep (Dream-style) model.
std::string verbose_report(const RunSummary& r, const Settings& s);
// Mean time of the steps that ran a forward pass, and positions committed per second of generation.
double step_mean_ms(const model::GenerateResult& r);
double tokens_per_second(const model::GenerateResult& r);

// One --dump-step-stats line (no newline), key=value pairs: step (the global index, from 0), steps (N),
// block, scheduled (the schedule's count), committed, masked (still masked), ms; then "skipped" for a step
// that ran no forward pass and "cached" for a dual-cache block-only pass.
std::string step_stats_line(const model::StepEvent& ev);

// The generated part of the canvas after a step, for --visual. ansi: masked positions as teal blocks,
// tokens committed in this step in bold orange, control tokens dim, the pieces' own control characters
// escaped (escape_terminal_controls); otherwise plain text on one line
// (masks as blocks, newlines and other control characters escaped). Invalid UTF-8 shows as U+FFFD.
// DiffusionGemma's open block (a uniform-state canvas, no masks): positions accepted this step in bold orange,
// re-noised ones as their random tokens in dim teal (ansi: they change every step) or as light shades (plain).
std::string render_canvas(const model::StepEvent& ev, const model::Tokenizer& tok, int32_t mask_id, bool ansi);

// The answer as plain `dllm run` writes it: on a terminal (to_terminal) with its control characters escaped
// (escape_terminal_controls: newlines and tabs stay), so that a model cannot move the cursor, retitle the
// window or reprogram the keys of the user's terminal; into a pipe or a file byte for byte, unchanged.
std::string answer_for_output(std::string_view text, bool to_terminal);
// Writes the answer and a newline to stdout, escaped when stdout is a terminal (answer_for_output).
void print_answer(std::string_view text);

// Bytes as valid UTF-8: every byte that does not start a well-formed sequence becomes U+FFFD.
using dllm::sanitize_utf8;  // common/printable.h

// Drives the per-step output for one run.
class StepPrinter {
 public:
  // visual_out: where --visual frames go (stdout, or stderr when stdout carries --json).
  StepPrinter(const Settings& s, const model::Tokenizer& tok, int32_t mask_id, FILE* visual_out);
  void on_step(const model::StepEvent& ev);
  // Clears the progress line, if one is drawn.
  void finish();
  // DiffusionGemma: every step seen so far.
  const std::vector<StepRecord>& records() const { return records_; }

 private:
  void draw_progress(const model::StepEvent& ev);

  const Settings& s_;
  const model::Tokenizer& tok_;
  int32_t mask_id_;
  FILE* visual_out_;
  bool visual_ansi_ = false;
  bool progress_ = false;       // stderr is a terminal and nothing else writes there per step
  bool progress_drawn_ = false;
  int visual_lines_ = 0;        // terminal lines of the last frame (to redraw in place)
  std::chrono::steady_clock::time_point start_;
  std::vector<StepRecord> records_;
};

}  // namespace dllm::cli
