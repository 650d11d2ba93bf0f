// dllm run --prompts-file: every request of a JSON Lines file through the engine's batch (engine.h). The
// whole file is read and checked first, then every request against the model's architecture and
// tokenizer (errors name the line and the key: usage errors, before the weights are prepared and before
// any forward pass); then up to --batch-size requests generate at once, and the answers are printed in
// input order as soon as every earlier one is out: one --json object a line (run --json's fields plus
// "index" and "id"), or the texts separated by blank lines. Ctrl-C stops the batch: the answers finished
// by then are printed and the exit status is 130.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <utility>

#include "cli/args.h"
#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/prompts_file.h"
#include "cli/run_config.h"
#include "cli/run_output.h"
#include "cli/sigint.h"
#include "engine/engine.h"

namespace dllm::cli {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double ms_since(Clock::time_point a) { return std::chrono::duration<double, std::milli>(Clock::now() - a).count(); }

// Canvas rows a GPU workspace must hold: the longest --batch-size canvases together.
int64_t batch_rows(const std::vector<engine::Prepared>& prepared, int64_t batch_size) {
  std::vector<int64_t> rows;
  for (const auto& p : prepared) rows.push_back(static_cast<int64_t>(p.prompt.size()) + p.config.max_tokens);
  std::sort(rows.begin(), rows.end(), std::greater<>());
  int64_t sum = 0;
  for (size_t i = 0; i < rows.size() && static_cast<int64_t>(i) < batch_size; ++i) sum += rows[i];
  return sum;
}

// "requests 3/10, 412 tokens/s" on a terminal's stderr, redrawn at most every 100 ms.
class BatchProgress {
 public:
  BatchProgress(bool enabled, int64_t total) : enabled_(enabled), total_(total), start_(Clock::now()) {}
  void add_tokens(int64_t n) { tokens_ += n; }
  void update(int64_t done) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (drawn_ && now - last_ < std::chrono::milliseconds(100) && done < total_) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r\x1b[Krequests %lld/%lld, %.1f tokens/s", static_cast<long long>(done),
                 static_cast<long long>(total_), s > 0 ? static_cast<double>(tokens_) / s : 0.0);
    std::fflush(stderr);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fputs("\r\x1b[K", stderr), std::fflush(stderr);
    drawn_ = false;
  }

 private:
  bool enabled_, drawn_ = false;
  int64_t total_, tokens_ = 0;
  Clock::time_point start_, last_;
};

}  // namespace

int cmd_run_file(const Settings& s, Clock::time_point t_start) {
  // --- every request, checked before the model is touched ---
  const std::string label = prompts_file_label(s.prompts_file);
  const std::vector<FileRequest> requests =
      parse_prompts_file(read_prompt_file(s.prompts_file, "--prompts-file"), s, label);
  engine::Engine e(s.model);  // the file, opened once
  std::vector<engine::Prepared> prepared;
  prepared.reserve(requests.size());
  for (const FileRequest& fr : requests) {
    try {
      prepared.push_back(e.prepare(fr.request));
    } catch (const engine::RequestError& err) {
      throw line_error(label, fr.line, err);
    }
  }
  if (requests.empty()) return 0;

  // --- backend and weights ---
  model::LoadOptions opt;
  engine::BackendRequest br = backend_request(s);
  br.max_rows = batch_rows(prepared, s.batch_size);
  const Backend backend = e.choose_backend(br, opt);
  print_backend_warning(backend);
  e.load(opt);
  print_load_warning(e.model().executor());
  print_chat_template_note(e, !s.no_chat);
  const double load_ms = ms_since(t_start);

  // --- generation: every request queued, --batch-size of them in flight ---
  const int64_t n = static_cast<int64_t>(requests.size());
  BatchProgress progress(isatty(STDERR_FILENO) && !s.dump_step_stats, n);
  engine::Session session(e, model::BatchLimits{s.batch_size, 0});
  std::vector<std::vector<StepRecord>> records(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    model::GenerateHooks hooks;
    hooks.cancel = &run_interrupted();
    hooks.on_step = [&progress, &s, &records, i](const model::StepEvent& ev) {
      progress.add_tokens(static_cast<int64_t>(ev.committed.size()));
      if (auto rec = step_record(ev)) records[static_cast<size_t>(i)].push_back(*rec);
      if (s.dump_step_stats)
        std::fprintf(stderr, "request=%lld %s\n", static_cast<long long>(i), step_stats_line(ev).c_str());
    };
    session.add(prepared[static_cast<size_t>(i)], std::move(hooks));  // ids 0..n-1: the request's index
  }

  const RunSummary base = engine_summary(e, s, backend);
  std::vector<std::optional<engine::Answer>> answers(static_cast<size_t>(n));
  int64_t next_out = 0, done = 0, printed = 0, tokens = 0;
  auto print = [&](int64_t i) {
    engine::Answer& a = *answers[static_cast<size_t>(i)];
    if (a.result.cancelled) return;  // stopped by Ctrl-C: not an answer
    if (!a.result.error.empty()) throw Error("request " + std::to_string(i) + ": " + a.result.error);
    tokens += a.result.committed;
    if (s.json) {
      const FileRequest& fr = requests[static_cast<size_t>(i)];
      RunSummary r = base;
      r.config = prepared[static_cast<size_t>(i)].config;
      r.prompt = prepared[static_cast<size_t>(i)].prompt;
      r.prompt_ms = prepared[static_cast<size_t>(i)].prompt_ms;
      r.load_ms = load_ms;
      r.executor_report = jit::cuda::executor_report(e.model().executor());  // as of now
      set_answer(r, std::move(a));
      r.peak_rss_bytes = peak_rss_bytes();
      r.total_ms = ms_since(t_start);
      r.steps = std::move(records[static_cast<size_t>(i)]);
      json j = {{"index", i}, {"id", fr.id}};
      json report = run_json(r, fr.settings);
      for (auto& [k, v] : report.items()) j[k] = std::move(v);
      j["settings"]["system"] = fr.request.system ? json(*fr.request.system) : json(nullptr);
      print_json_line(j);
    } else {
      if (printed > 0) std::fputc('\n', stdout);
      print_answer(a.text);
    }
    ++printed;
    std::fflush(stdout);
  };
  {
    SigintScope sigint;
    while (session.step()) {
      for (auto& [id, answer] : session.take_finished()) {
        answers[static_cast<size_t>(id)] = std::move(answer);
        ++done;
      }
      progress.update(done);
      for (; next_out < n && answers[static_cast<size_t>(next_out)]; ++next_out) {
        progress.finish();
        print(next_out);
      }
    }
    for (auto& [id, answer] : session.take_finished()) answers[static_cast<size_t>(id)] = std::move(answer), ++done;
  }
  progress.finish();
  // What finished after an unfinished one (Ctrl-C), still in input order.
  for (; next_out < n; ++next_out)
    if (answers[static_cast<size_t>(next_out)]) print(next_out);
  const bool interrupted = run_interrupted().load();
  if (interrupted)
    std::fprintf(stderr, "interrupted: %lld of %lld requests finished\n", static_cast<long long>(printed),
                 static_cast<long long>(n));
  if (s.verbose) {
    const double total_ms = ms_since(t_start);
    std::fprintf(stderr,
                 "model: %s (%s), executor %s, %d threads, device %s (%s)\n"
                 "requests: %lld, %lld answered, batch size %lld\n"
                 "timings: load %.1f ms, total %.1f ms, %.1f tokens/s over the batch\n",
                 s.model.c_str(), base.hp.arch_name.c_str(), base.executor.c_str(), base.threads,
                 base.device.c_str(), base.device_reason.c_str(), static_cast<long long>(n),
                 static_cast<long long>(printed), static_cast<long long>(s.batch_size), load_ms, total_ms,
                 total_ms > load_ms ? static_cast<double>(tokens) / ((total_ms - load_ms) / 1000.0) : 0.0);
    for (const std::string& line : base.executor_report.lines) std::fprintf(stderr, "%s\n", line.c_str());
    std::fprintf(stderr, "peak resident memory: %.1f MiB\n", static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0));
  }
  return interrupted ? kInterruptedStatus : 0;
}

}  // namespace dllm::cli
