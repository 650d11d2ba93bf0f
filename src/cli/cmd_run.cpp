// dllm run: a thin caller of the engine (engine/engine.h). It opens the model once, picks the executor,
// lets the engine build and check the request (errors naming the flags: usage errors, before the weights
// are prepared and before any forward pass), loads, runs the request with the step renderers of
// run_output.h attached, and prints the answer (or one --json object) on stdout, diagnostics on stderr.
// Ctrl-C stops between steps: the partial canvas is reported (--json, --verbose) and the exit status is
// 130. On the GPU executor the report carries its description and, with DLLM_GPU_PROFILE=1, the per-step
// split (executor_report()). --prompts-file runs many requests at once: cmd_run_file.cpp.
#include <chrono>
#include <cstdio>
#include <utility>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/run_config.h"
#include "cli/run_output.h"
#include "cli/sigint.h"
#include "engine/engine.h"

namespace dllm::cli {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int run_one(engine::Engine& e, const Settings& s, const Backend& backend, const model::LoadOptions& opt,
            Clock::time_point t_start) {
  // --- the request, and every check that needs the architecture or the tokenizer ---
  const engine::Prepared p = prepare_with_flags(e, s);

  // --- weights ---
  e.load(opt);
  print_load_warning(e.model().executor());
  print_chat_template_note(e, !s.no_chat && !s.has_prompt_tokens);
  const double load_ms = ms_between(t_start, Clock::now()) - p.prompt_ms;

  // --- generation ---
  const model::HParams& hp = e.hparams();
  StepPrinter printer(s, e.tokenizer(), hp.mask_token_id, s.json ? stderr : stdout);
  model::GenerateHooks hooks;
  hooks.on_step = [&](const model::StepEvent& ev) { printer.on_step(ev); };
  hooks.cancel = &run_interrupted();
  engine::Answer answer;
  {
    SigintScope sigint;
    answer = engine::run(e, p, hooks);
  }
  printer.finish();

  // --- report ---
  RunSummary r = engine_summary(e, s, backend);
  r.config = p.config;
  r.prompt = p.prompt;
  r.prompt_ms = p.prompt_ms;
  r.load_ms = load_ms;
  set_answer(r, std::move(answer));
  r.peak_rss_bytes = peak_rss_bytes();
  r.total_ms = ms_between(t_start, Clock::now());
  r.steps = printer.records();
  if (!r.executor_report.gpu) r.pass_times = e.model().executor().pass_times();

  if (s.json) {
    print_json_line(run_json(r, s));
  } else if (!r.result.cancelled) {
    if (s.visual) std::fputc('\n', stdout);
    print_answer(r.text);
  }
  std::fflush(stdout);
  if (r.result.cancelled) {
    std::fprintf(stderr, "interrupted: stopped after %lld of %lld steps%s\n",
                 static_cast<long long>(r.result.steps_run), static_cast<long long>(r.result.total_steps),
                 s.json || s.verbose ? "" : " (--json or --verbose report the partial canvas)");
  }
  if (s.verbose) std::fputs(verbose_report(r, s).c_str(), stderr);
  return r.result.cancelled ? kInterruptedStatus : 0;
}

}  // namespace

int cmd_run(const Settings& s) {
  const auto t_start = Clock::now();
  if (s.has_prompts_file) return cmd_run_file(s, t_start);
  engine::Engine e(s.model);  // the file, opened once
  model::LoadOptions opt;
  const Backend backend = e.choose_backend(backend_request(s), opt);  // --device gpu without a GPU fails here
  print_backend_warning(backend);
  return run_one(e, s, backend, opt, t_start);
}

int cmd_run_with(const Settings& s, const Backend& backend, model::LoadOptions opt,
                 std::chrono::steady_clock::time_point t_start) {
  engine::Engine e(s.model);
  return run_one(e, s, backend, opt, t_start);
}

}  // namespace dllm::cli
