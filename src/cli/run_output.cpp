// `dllm run` output (run_output.h): --visual frames, --dump-step-stats lines, the terminal progress line,
// the answer (escaped on a terminal), and the --json / --verbose reports.
#include "cli/run_output.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "model/sampler.h"

namespace dllm::cli {

namespace {

using json = nlohmann::ordered_json;

constexpr const char* kReset = "\x1b[0m";
constexpr const char* kTeal = "\x1b[38;5;30m";          // masked positions
constexpr const char* kBoldOrange = "\x1b[1;38;5;208m";  // committed in this step
constexpr const char* kDim = "\x1b[2m";                  // control tokens
constexpr const char* kBlock = "\xe2\x96\x88";           // U+2588 FULL BLOCK
constexpr const char* kNoiseColour = "\x1b[2;38;5;30m";  // DiffusionGemma: re-noised positions (dim teal)
constexpr const char* kShade = "\xe2\x96\x91";           // U+2591 LIGHT SHADE: a re-noised position in plain text

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string arch_label(model::Arch a) { return model::arch_spec(a).name; }
bool block_sampler(model::Arch a) { return model::arch_spec(a).sampler == model::SamplerKind::Blocks; }

// Newlines, tabs and other C0 controls as visible escapes, so a plain frame stays on one line.
std::string escape_controls(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    }
    else out += static_cast<char>(c);
  }
  return out;
}

int terminal_columns(FILE* f) {
  struct winsize ws {};
  if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

// Terminal rows a frame occupies: each line's code points (ANSI sequences skipped) wrapped at `cols`.
int frame_rows(const std::string& frame, int cols) {
  int rows = 0, width = 0;
  bool esc = false;
  auto end_line = [&] { rows += std::max(1, (width + cols - 1) / cols); width = 0; };
  for (unsigned char c : frame) {
    if (esc) {
      if (c >= 0x40 && c <= 0x7e && c != '[') esc = false;
      continue;
    }
    if (c == 0x1b) esc = true;
    else if (c == '\n') end_line();
    else if ((c & 0xC0) != 0x80) ++width;
  }
  if (width > 0) end_line();
  return rows;
}

}  // namespace

double step_mean_ms(const model::GenerateResult& r) {
  return r.forward_passes > 0 ? r.forward_ms / static_cast<double>(r.forward_passes) : 0.0;
}

double tokens_per_second(const model::GenerateResult& r) {
  return r.total_ms > 0 ? static_cast<double>(r.committed) / (r.total_ms / 1000.0) : 0.0;
}

std::string step_stats_line(const model::StepEvent& ev) {
  std::string s = "step=" + std::to_string(ev.step) + " steps=" + std::to_string(ev.total_steps) +
                  " block=" + std::to_string(ev.block) + " scheduled=" + std::to_string(ev.scheduled) +
                  " committed=" + std::to_string(ev.committed.size()) + " masked=" + std::to_string(ev.masked_left) +
                  " ms=" + fmt("%.3f", ev.ms);
  if (ev.skipped) s += " skipped";
  if (ev.cached) s += " cached";
  if (ev.temperature >= 0)  // DiffusionGemma: committed = accepted, masked = re-noised
    s += " temperature=" + fmt("%.4f", ev.temperature) + " mean_entropy=" + fmt("%.6f", ev.mean_entropy) +
         (ev.open_begin < 0 ? " block_done" : "");
  return s;
}

std::optional<StepRecord> step_record(const model::StepEvent& ev) {
  if (ev.temperature < 0) return std::nullopt;
  StepRecord r;
  r.step = ev.step, r.block = ev.block;
  r.accepted = static_cast<int64_t>(ev.committed.size()), r.renoised = ev.masked_left;
  r.temperature = ev.temperature, r.mean_entropy = ev.mean_entropy, r.ms = ev.ms;
  r.block_done = ev.open_begin < 0;
  return r;
}

std::string render_canvas(const model::StepEvent& ev, const model::Tokenizer& tok, int32_t mask_id, bool ansi) {
  enum Style { Plain, New, Mask, Noise, Control };
  std::string out, run;
  Style run_style = Plain;
  auto flush = [&] {
    if (run.empty()) return;
    // On a terminal the pieces' own control characters are escaped too: only the frame's colours act.
    std::string text = sanitize_utf8(run);
    text = ansi ? escape_terminal_controls(text) : escape_controls(text);
    if (ansi && run_style != Plain) {
      out += run_style == New ? kBoldOrange : run_style == Mask ? kTeal : run_style == Noise ? kNoiseColour : kDim;
      out += text;
      out += kReset;
    } else {
      out += text;
    }
    run.clear();
  };
  for (size_t j = static_cast<size_t>(ev.prompt_length); j < ev.canvas.size(); ++j) {
    const int32_t t = ev.canvas[j];
    const bool committed = std::binary_search(ev.committed.begin(), ev.committed.end(), static_cast<int64_t>(j));
    Style st = Plain;
    if (t == mask_id) st = Mask;
    else if (committed) st = New;
    // DiffusionGemma's open block: what was not accepted is fresh noise, redrawn every step.
    else if (ev.open_begin >= 0 && static_cast<int64_t>(j) >= ev.open_begin) st = Noise;
    else if (t >= 0 && t < tok.n_vocab() && tok.is_control(t)) st = Control;
    if (st != run_style) flush(), run_style = st;
    if (st == Mask || (st == Noise && !ansi)) run += st == Mask ? kBlock : kShade;
    else if (t >= 0 && t < tok.n_vocab()) run += tok.token_piece(t);
  }
  flush();
  return out;
}

// --- StepPrinter ---

StepPrinter::StepPrinter(const Settings& s, const model::Tokenizer& tok, int32_t mask_id, FILE* visual_out)
    : s_(s), tok_(tok), mask_id_(mask_id), visual_out_(visual_out), start_(std::chrono::steady_clock::now()) {
  visual_ansi_ = s.visual && isatty(fileno(visual_out));
  // The progress line needs stderr to itself: no step lines there, and no frames on a terminal.
  const bool frames_on_terminal = s.visual && (visual_out == stderr || visual_ansi_);
  progress_ = isatty(fileno(stderr)) && !s.dump_step_stats && !frames_on_terminal;
}

void StepPrinter::on_step(const model::StepEvent& ev) {
  if (auto rec = step_record(ev)) records_.push_back(*rec);
  if (s_.dump_step_stats) std::fprintf(stderr, "%s\n", step_stats_line(ev).c_str());
  if (s_.visual) {
    const std::string head =
        ev.temperature >= 0  // DiffusionGemma: accepted under the entropy bound, the rest re-noised
            ? "step " + std::to_string(ev.step + 1) + " (block " + std::to_string(ev.block) + "), temperature " +
                  fmt("%.2f", ev.temperature) + ", " + std::to_string(ev.committed.size()) + " accepted, " +
                  std::to_string(ev.masked_left) + " re-noised" + (ev.open_begin < 0 ? ", block done" : "")
            : "step " + std::to_string(ev.step + 1) + "/" + std::to_string(ev.total_steps) +
                  (ev.skipped ? " (skipped)" : "") + ", " + std::to_string(ev.committed.size()) + " committed, " +
                  std::to_string(ev.masked_left) + " masked";
    const std::string canvas = render_canvas(ev, tok_, mask_id_, visual_ansi_);
    if (visual_ansi_) {
      std::string frame = head + "\n" + canvas + "\n";
      if (visual_lines_ > 0) std::fprintf(visual_out_, "\x1b[%dF\x1b[J", visual_lines_);
      std::fputs(frame.c_str(), visual_out_);
      visual_lines_ = frame_rows(frame, terminal_columns(visual_out_));
    } else {
      std::fprintf(visual_out_, "%s: %s\n", head.c_str(), canvas.c_str());
    }
    std::fflush(visual_out_);
  }
  if (progress_) draw_progress(ev);
}

void StepPrinter::draw_progress(const model::StepEvent& ev) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (elapsed < 1.0) return;  // short runs get no progress line
  const double per_step = elapsed / static_cast<double>(ev.step + 1);
  const double eta = per_step * static_cast<double>(ev.total_steps - ev.step - 1);
  std::fprintf(stderr, "\r\x1b[Kstep %lld/%lld, %lld masked, %.0f ms/step, about %.0f s left",
               static_cast<long long>(ev.step + 1), static_cast<long long>(ev.total_steps),
               static_cast<long long>(ev.masked_left), per_step * 1000.0, eta);
  std::fflush(stderr);
  progress_drawn_ = true;
}

void StepPrinter::finish() {
  if (progress_drawn_) {
    std::fputs("\r\x1b[K", stderr);
    std::fflush(stderr);
    progress_drawn_ = false;
  }
}

// --- reports ---

namespace {

// DLLM_GPU_PROFILE's split, per whole-model pass (null when the run was not profiled).
json gpu_profile_json(const jit::cuda::ExecutorReport& e) {
  if (!e.profiled) return nullptr;
  const jit::cuda::GpuProfile& p = e.profile;
  return json{{"steps", p.steps},
              {"gemm_ms_per_step", p.per_step_ms(p.gemm_s)},
              {"attention_ms_per_step", p.per_step_ms(p.attention_s)},
              {"lm_head_ms_per_step", p.per_step_ms(p.lm_head_s)},
              {"transfer_ms_per_step", p.per_step_ms(p.transfer_s)},
              {"synchronised", !p.timers}};
}

// --top-logprobs: one object per answer token, {"id", "logprob", "top_logprobs": [{"id", "logprob"}]} (null
// without the flag); a position an interrupted run left masked, and a logprob of -inf, which JSON lacks, give
// null.
json logprobs_json(const RunSummary& r, const Settings& s) {
  if (s.top_logprobs < 0) return nullptr;
  auto value = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  json out = json::array();
  for (const model::PositionLogprobs& p : r.logprobs) {
    json top = json::array();
    for (const model::TokenLogprob& t : p.top) top.push_back(json{{"id", t.token}, {"logprob", value(t.logprob)}});
    out.push_back(json{{"id", p.chosen.token},
                       {"logprob", p.step < 0 ? json(nullptr) : value(p.chosen.logprob)},
                       {"top_logprobs", top}});
  }
  return out;
}

}  // namespace

// DiffusionGemma's blocks, each with its step count and time, and its steps; null for the other samplers.
json blocks_json(const std::vector<StepRecord>& steps) {
  if (steps.empty()) return nullptr;
  json out = json::array();
  for (const StepRecord& st : steps) {
    if (out.empty() || out.back()["block"] != st.block) out.push_back({{"block", st.block}, {"steps", 0}, {"ms", 0.0}, {"done", false}});
    json& b = out.back();
    b["steps"] = b["steps"].get<int64_t>() + 1;
    b["ms"] = b["ms"].get<double>() + st.ms;
    b["done"] = st.block_done;
  }
  return out;
}

json step_stats_json(const std::vector<StepRecord>& steps) {
  if (steps.empty()) return nullptr;
  json out = json::array();
  for (const StepRecord& st : steps)
    out.push_back({{"step", st.step},         {"block", st.block},         {"temperature", st.temperature},
                   {"accepted", st.accepted}, {"renoised", st.renoised},   {"mean_entropy", st.mean_entropy},
                   {"ms", st.ms},             {"block_done", st.block_done}});
  return out;
}

// Mean ms per forward pass with logits of each part of the forward, and the rest of a step (the sampler);
// null when the split was not measured.
json step_split_json(const RunSummary& r) {
  const model::PassTimes& t = r.pass_times;
  if (t.passes == 0) return nullptr;
  const double n = static_cast<double>(t.passes);
  const double sampler = step_mean_ms(r.result) - t.total_ms() / n;
  return json{{"passes", t.passes},
              {"embed_ms", t.embed_ms / n},
              {"self_conditioning_ms", t.self_cond_ms / n},
              {"attention_ms", t.attention_ms / n},
              {"mlp_ms", t.mlp_ms / n},
              {"experts_ms", t.experts_ms / n},
              {"other_ms", t.other_ms / n},
              {"lm_head_ms", t.lm_head_ms / n},
              {"sampler_ms", std::max(0.0, sampler)},
              {"encode_ms_total", t.encode_ms}};
}

json run_json(const RunSummary& r, const Settings& s) {
  const model::GenerateConfig& c = r.config;
  const auto gen = r.result.generated();
  json settings = {
      {"model", s.model},
      {"prompt", s.has_prompt ? json(s.prompt) : json(nullptr)},
      {"prompt_tokens", s.has_prompt_tokens ? json(s.prompt_tokens) : json(nullptr)},
      {"chat_template", !s.has_prompt_tokens && !s.no_chat},
      {"max_tokens", c.max_tokens},
      {"steps", c.effective_steps()},
      {"block_length", block_sampler(c.arch) ? json(c.block_length) : json(nullptr)},
      {"temperature", c.temperature},
      {"remasking", model::remasking_name(c.remasking)},
      {"threshold", c.threshold},
      {"dual_cache", c.dual_cache},
      {"seed", c.seed},
      {"threads", r.threads},
      {"device", r.device},
      {"full_logits", c.full_logits},
      {"early_stop", c.early_stop},
      {"visual", s.visual},
      {"verbose", s.verbose},
      {"dump_step_stats", s.dump_step_stats},
      {"top_logprobs", s.top_logprobs < 0 ? json(nullptr) : json(s.top_logprobs)},
  };
  if (model::arch_spec(c.arch).sampler == model::SamplerKind::EntropyBound) {  // its own sampler's settings
    for (const char* k : {"steps", "block_length", "temperature", "remasking", "threshold", "dual_cache", "full_logits"})
      settings.erase(k);
    settings["eb"] = {{"max_steps", c.eb.max_steps}, {"t_min", c.eb.t_min},           {"t_max", c.eb.t_max},
                      {"entropy_bound", c.eb.entropy_bound}, {"stability", c.eb.stability}, {"confidence", c.eb.confidence},
                      {"self_cond_top_k", c.eb.self_cond_top_k}, {"canvas_length", c.canvas_length}};
  } else if (!block_sampler(c.arch)) {
    settings["block_length_ignored"] = s.block_length;
  }
  return json{
      {"text", sanitize_utf8(r.text)},
      {"prompt_ids", r.prompt},
      {"output_ids", std::vector<int32_t>(gen.begin(), gen.end())},
      {"answer_length", r.answer_tokens},
      {"logprobs", logprobs_json(r, s)},
      {"steps_run", r.result.steps_run},
      {"steps_total", r.result.total_steps},
      {"forward_passes", r.result.forward_passes},
      {"stopped_early", r.result.stopped_early},
      {"blocks", blocks_json(r.steps)},
      {"step_stats", step_stats_json(r.steps)},
      {"interrupted", r.result.cancelled},
      {"timings",
       {{"load_ms", r.load_ms},
        {"prompt_ms", r.prompt_ms},
        {"generate_ms", r.result.total_ms},
        {"step_mean_ms", step_mean_ms(r.result)},
        {"total_ms", r.total_ms}}},
      {"step_split", step_split_json(r)},
      {"tokens_per_s", tokens_per_second(r.result)},
      {"peak_rss_bytes", r.peak_rss_bytes},
      {"settings", settings},
      {"model",
       {{"path", r.model_path},
        {"name", r.model_name},
        {"architecture", arch_label(r.hp.arch)},
        {"layers", r.hp.n_layer},
        {"embedding_length", r.hp.n_embd},
        {"vocab_size", r.hp.n_vocab},
        {"context_length", r.hp.n_ctx},
        {"mask_token_id", r.hp.mask_token_id},
        {"stop_token_ids", c.stop_ids}}},
      {"device",
       {{"name", r.device},
        {"executor", r.executor},
        {"threads", r.threads},
        {"reason", r.device_reason},
        {"description", r.executor_report.lines},
        {"gpu_weight_bytes", r.executor_report.gpu ? json(r.executor_report.weight_bytes) : json(nullptr)}}},
      {"gpu_profile", gpu_profile_json(r.executor_report)},
  };
}

RunSummary engine_summary(engine::Engine& e, const Settings& s, const Backend& backend) {
  RunSummary r;
  r.model_path = s.model;
  r.hp = e.hparams();
  r.model_name = e.model_name();
  model::Model& m = e.model();
  r.executor = m.executor().name();
  r.threads = m.pool().size();
  r.device = backend.device;
  r.device_reason = backend.reason;
  r.executor_report = jit::cuda::executor_report(m.executor());
  return r;
}

void set_answer(RunSummary& r, engine::Answer answer) {
  r.text = std::move(answer.text);
  r.answer_tokens = static_cast<int64_t>(answer.tokens.size());
  r.logprobs = std::move(answer.logprobs);
  r.result = std::move(answer.result);
}

std::string answer_for_output(std::string_view text, bool to_terminal) {
  return to_terminal ? escape_terminal_controls(text) : std::string(text);
}

void print_answer(std::string_view text) {
  const std::string out = answer_for_output(text, isatty(STDOUT_FILENO) == 1);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
}

void print_json_line(const json& j) {
  const std::string out = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
}

std::string verbose_report(const RunSummary& r, const Settings& s) {
  const model::GenerateResult& g = r.result;
  std::ostringstream o;
  // Only a --block-length the user gave is worth a note: the default one is nobody's mistake.
  if (!block_sampler(r.hp.arch) && s.has_block_length)
    o << "note: --block-length is ignored for " << model::arch_spec(r.hp.arch).label << " models\n";
  o << "model: " << r.model_path << " (" << arch_label(r.hp.arch) << ", " << r.hp.n_layer << " layers, vocab "
    << r.hp.n_vocab << "), executor " << r.executor << ", " << r.threads << " threads, device " << r.device << " (" << r.device_reason << ")\n";
  if (model::arch_spec(r.hp.arch).sampler == model::SamplerKind::EntropyBound) {
    const model::EntropyBoundDefaults& e = r.config.eb;
    o << "sampler: entropy-bound, " << r.config.max_tokens << " tokens in blocks of " << r.config.canvas_length
      << ", up to " << e.max_steps << " steps a block at temperatures " << e.t_max << " down to " << e.t_min
      << ", entropy bound " << e.entropy_bound << ", stop after " << e.stability << " stable step(s) with mean entropy below "
      << e.confidence;
    if (e.self_cond_top_k > 0) o << ", self-conditioning on each row's " << e.self_cond_top_k << " most probable tokens";
  } else {
    o << "sampler: " << model::remasking_name(r.config.remasking) << ", temperature " << r.config.temperature
      << ", " << r.config.max_tokens << " tokens in " << r.config.effective_steps() << " steps";
  }
  if (block_sampler(r.hp.arch)) o << ", block length " << r.config.block_length;
  if (r.config.threshold > 0) o << ", threshold " << r.config.threshold;
  if (r.config.dual_cache) o << ", dual cache";
  o << "\n";
  o << "prompt: " << r.prompt.size() << " tokens; answer: " << r.answer_tokens << " tokens\n";
  o << "steps: " << g.steps_run << " of " << g.total_steps << " run, " << g.forward_passes << " forward passes";
  if (g.stopped_early) o << ", stopped early (the answer was final)";
  o << "\n";
  if (g.cancelled) {
    o << "interrupted after " << g.steps_run << " steps; partial canvas (" << std::count(g.generated().begin(),
                                                                               g.generated().end(), r.hp.mask_token_id)
      << " masked):";
    for (int32_t t : g.generated()) o << ' ' << t;
    o << "\n";
  }
  o << "timings: load " << fmt("%.1f", r.load_ms) << " ms, prompt " << fmt("%.1f", r.prompt_ms) << " ms, "
    << fmt("%.1f", step_mean_ms(g)) << " ms/step, generation " << fmt("%.1f", g.total_ms) << " ms, total "
    << fmt("%.1f", r.total_ms) << " ms, " << fmt("%.1f", tokens_per_second(g)) << " tokens/s\n";
  if (const json split = step_split_json(r); !split.is_null()) {
    o << "step split (ms per step):";
    for (const char* k : {"attention_ms", "experts_ms", "mlp_ms", "lm_head_ms", "self_conditioning_ms", "embed_ms",
                          "other_ms", "sampler_ms"})
      o << " " << std::string(k, std::strlen(k) - 3) << " " << fmt("%.1f", split[k].get<double>());
    if (r.pass_times.encode_ms > 0) o << "; encoding prefixes " << fmt("%.1f", r.pass_times.encode_ms) << " ms in all";
    o << "\n";
  }
  for (const std::string& line : r.executor_report.lines) o << line << "\n";
  o << "peak resident memory: " << fmt("%.1f", static_cast<double>(r.peak_rss_bytes) / (1024.0 * 1024.0))
    << " MiB\n";
  return o.str();
}

}  // namespace dllm::cli
