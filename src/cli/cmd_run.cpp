// dllm run: reads the model's architecture and tokenizer, builds the prompt ids, checks every setting the
// architecture constrains (usage errors, before the weights are prepared and before any forward pass),
// loads the model, runs the generation loop with the step renderers of run_output.h attached, and prints
// the answer (or one --json object) on stdout, diagnostics on stderr. Ctrl-C stops between steps: the
// partial canvas is reported (--json, --verbose) and the exit status is 130. On the GPU executor the
// report carries its description and, with DLLM_GPU_PROFILE=1, the per-step split (executor_report()).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <utility>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/run_config.h"
#include "cli/run_output.h"
#include "jit/cuda/gpu_executor.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/model.h"

namespace dllm::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kInterruptedStatus = 130;

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  // The first Ctrl-C asks the loop to stop after the current step; a second one ends the process.
  if (g_interrupted.exchange(true)) _exit(kInterruptedStatus);
}

// Installs the SIGINT handler for the duration of the generation loop.
class SigintScope {
 public:
  SigintScope() {
    g_interrupted = false;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~SigintScope() { sigaction(SIGINT, &old_, nullptr); }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  struct sigaction old_ {};
};

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

int cmd_run(const Settings& s) {
  const auto t_start = Clock::now();
  model::LoadOptions opt;
  const Backend backend = choose_backend(s, opt);  // --device gpu without a GPU fails here
  return cmd_run_with(s, backend, std::move(opt), t_start);
}

int cmd_run_with(const Settings& s, const Backend& backend, model::LoadOptions opt,
                 std::chrono::steady_clock::time_point t_start) {
  // --- architecture, tokenizer, prompt, and every check that needs them ---
  const std::unique_ptr<gguf::File> file = gguf::File::open(s.model);
  const model::HParams hp = model::read_hparams(*file);
  const model::Tokenizer tok(*file);
  const model::GenerateConfig cfg = generation_config(s, hp, stop_ids(tok));
  const auto t_prompt = Clock::now();
  const std::vector<int32_t> prompt = prompt_ids(s, hp, tok);
  const double prompt_ms = ms_between(t_prompt, Clock::now());
  model::validate(cfg, static_cast<int64_t>(prompt.size()));

  // --- weights ---
  const std::unique_ptr<model::Model> m = model::Model::load(s.model, opt);
  const double load_ms = ms_between(t_start, Clock::now()) - prompt_ms;

  // --- generation ---
  StepPrinter printer(s, tok, hp.mask_token_id, s.json ? stderr : stdout);
  model::GenerateHooks hooks;
  hooks.on_step = [&](const model::StepEvent& ev) { printer.on_step(ev); };
  hooks.cancel = &g_interrupted;
  hooks.pool = &m->pool();
  const std::unique_ptr<model::LogitSource> src = model::make_model_logit_source(*m);
  RunSummary r;
  {
    SigintScope sigint;
    r.result = model::generate(*src, cfg, prompt, hooks);
  }
  printer.finish();

  // --- report ---
  const std::vector<int32_t> answer = model::answer_tokens(r.result.canvas, r.result.prompt_length, cfg.stop_ids);
  model::DetokenizeOptions dopt;
  dopt.unparse_special = false;  // control tokens (and masks of an interrupted run) are not rendered
  r.text = tok.detokenize(answer, dopt);
  r.answer_tokens = static_cast<int64_t>(answer.size());
  r.model_path = s.model;
  r.hp = hp;
  if (const gguf::Value* name = file->find("general.name"); name && name->type == gguf::ValueType::STRING)
    r.model_name = std::string(name->s);
  r.executor = m->executor().name();
  r.threads = m->pool().size();
  r.device = backend.device;
  r.device_reason = backend.reason;
  r.executor_report = jit::cuda::executor_report(m->executor());
  r.config = cfg;
  r.prompt = prompt;
  r.load_ms = load_ms;
  r.prompt_ms = prompt_ms;
  r.peak_rss_bytes = peak_rss_bytes();
  r.total_ms = ms_between(t_start, Clock::now());

  if (s.json) {
    std::string out = run_json(r, s).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  } else if (!r.result.cancelled) {
    if (s.visual) std::fputc('\n', stdout);
    std::fwrite(r.text.data(), 1, r.text.size(), stdout);
    std::fputc('\n', stdout);
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

}  // namespace dllm::cli
