// The generation loop (generate.h): canvas, LLaDA's blocks (with threshold and dual cache) and Dream's
// timestep schedule, the rows each step asks the model for (algorithms.md section 6), the exact early
// stop (5.3), cancellation between steps, and one StepEvent per step for the caller's renderers.
#include "model/generate.h"

#include <algorithm>
#include <chrono>

#include "model/error.h"
#include "model/model.h"
#include "model/thread_pool.h"

namespace dllm::model {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool is_stop(int32_t t, std::span<const int32_t> stop_ids) {
  return std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end();
}

// State shared by both architectures' loops.
class Loop {
 public:
  Loop(LogitSource& src, const GenerateConfig& cfg, std::span<const int32_t> prompt, const GenerateHooks& hooks)
      : src_(src), cfg_(cfg), hooks_(hooks), V_(src.n_vocab()) {
    res_.prompt_length = static_cast<int64_t>(prompt.size());
    res_.canvas.assign(prompt.begin(), prompt.end());
    res_.canvas.resize(prompt.size() + static_cast<size_t>(cfg.max_tokens), cfg.mask_id);
    res_.total_steps = cfg.effective_steps();
  }

  GenerateResult run() {
    const auto t0 = Clock::now();
    if (cfg_.arch == Arch::LLaDA) run_llada();
    else run_dream();
    res_.total_ms = ms_since(t0);
    return std::move(res_);
  }

 private:
  int64_t P() const { return res_.prompt_length; }
  int64_t n() const { return static_cast<int64_t>(res_.canvas.size()); }

  std::vector<int64_t> masked_in(int64_t lo, int64_t hi) const {
    std::vector<int64_t> out;
    for (int64_t j = lo; j < hi; ++j)
      if (res_.canvas[static_cast<size_t>(j)] == cfg_.mask_id) out.push_back(j);
    return out;
  }
  int64_t masked_left() const {
    return std::count(res_.canvas.begin() + P(), res_.canvas.end(), cfg_.mask_id);
  }
  bool cancelled() {
    if (hooks_.cancel && hooks_.cancel->load()) res_.cancelled = true;
    return res_.cancelled;
  }

  enum class Pass { Exact, Refresh, Cached };

  // One forward pass for the candidate positions C and their proposals. `row_of(j)` is the raw row that
  // position j is sampled from (j for LLaDA, j-1 for Dream).
  template <class RowOf, class Propose>
  std::vector<Candidate> score(const std::vector<int64_t>& C, Pass pass, int64_t begin, int64_t end, RowOf row_of,
                               Propose propose) {
    std::vector<int64_t> rows;
    if (cfg_.full_logits) {
      rows.resize(static_cast<size_t>(n()));
      for (int64_t r = 0; r < n(); ++r) rows[static_cast<size_t>(r)] = r;
    } else {
      for (int64_t j : C) rows.push_back(row_of(j));
    }
    logits_.resize(rows.size() * static_cast<size_t>(V_));
    switch (pass) {
      case Pass::Exact: src_.forward(res_.canvas, rows, logits_.data()); break;
      case Pass::Refresh: src_.forward_refresh(res_.canvas, rows, logits_.data()); break;
      case Pass::Cached: src_.forward_cached(res_.canvas, begin, end, rows, logits_.data()); break;
    }
    ++res_.forward_passes;
    std::vector<Candidate> cand(C.size());
    auto one = [&](int64_t c, int) {
      const int64_t j = C[static_cast<size_t>(c)];
      const int64_t r = cfg_.full_logits ? row_of(j) : c;
      cand[static_cast<size_t>(c)] = Candidate{j, propose(logits_.data() + r * V_, j)};
    };
    if (hooks_.pool && C.size() > 1) {
      hooks_.pool->parallel_for(static_cast<int64_t>(C.size()), one);
    } else {
      for (size_t c = 0; c < C.size(); ++c) one(static_cast<int64_t>(c), 0);
    }
    return cand;
  }

  // Commits the chosen candidates, reports the step, and applies the early stop. Returns true to stop.
  bool finish_step(StepEvent ev, const std::vector<Candidate>& cand, const std::vector<size_t>& chosen,
                   Clock::time_point t0, bool last_step) {
    committed_.clear();
    for (size_t i : chosen) {
      const Candidate& c = cand[i];
      res_.canvas[static_cast<size_t>(c.position)] = c.proposal.token;
      committed_.push_back(c.position);
    }
    res_.committed += static_cast<int64_t>(committed_.size());
    ev.committed = committed_;
    ev.total_steps = res_.total_steps;
    ev.masked_left = masked_left();
    ev.canvas = res_.canvas;
    ev.prompt_length = P();
    ev.ms = ms_since(t0);
    ++res_.steps_run;
    res_.step_ms.push_back(ev.ms);
    if (!ev.skipped) res_.forward_ms += ev.ms;
    if (hooks_.on_step) hooks_.on_step(ev);
    if (ev.skipped || !cfg_.early_stop) return false;
    if (!answer_is_final(res_.canvas, P(), cfg_.mask_id, cfg_.stop_ids)) return false;
    res_.stopped_early = ev.masked_left > 0 && !last_step;
    return true;
  }

  void run_llada() {
    const int64_t L = cfg_.max_tokens, B = cfg_.block_length, N = cfg_.effective_steps();
    const int64_t nb = L / B, S = N / nb;
    const Remasking rm = cfg_.remasking;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t s = P() + b * B, e = s + B;
      const int64_t block_masked = static_cast<int64_t>(masked_in(s, e).size());
      bool refreshed = false;
      for (int64_t i = 0; i < S; ++i) {
        if (cancelled()) return;
        const auto t0 = Clock::now();
        const int64_t step = b * S + i;
        // Candidates: masked positions up to the block's end (3.3); with the dual cache only the block's
        // rows are recomputed, so only they can be candidates.
        const std::vector<int64_t> C = masked_in(cfg_.dual_cache ? s : P(), e);
        if (C.empty()) break;  // the block is complete: its remaining steps have nothing to do
        StepEvent ev;
        ev.step = step;
        ev.block = b;
        ev.scheduled = llada_step_count(block_masked, S, i);
        const bool last = b == nb - 1 && i == S - 1;
        if (ev.scheduled == 0 && cfg_.threshold <= 0) {  // commits nothing: skipped exactly (6.3)
          ev.skipped = true;
          finish_step(ev, {}, {}, t0, last);
          continue;
        }
        Pass pass = Pass::Exact;
        if (cfg_.dual_cache) pass = refreshed ? Pass::Cached : Pass::Refresh;
        ev.cached = pass == Pass::Cached;
        const uint64_t ustep = static_cast<uint64_t>(step);
        auto cand = score(
            C, pass, s, e, [](int64_t j) { return j; },
            [&](const float* row, int64_t j) {
              return llada_propose(row, V_, cfg_.temperature, rm, cfg_.seed, ustep, j);
            });
        refreshed = true;
        const auto chosen = select_candidates(cand, ev.scheduled, cfg_.threshold);
        if (finish_step(ev, cand, chosen, t0, last)) return;
      }
    }
  }

  void run_dream() {
    const int64_t N = cfg_.effective_steps();
    const DreamSchedule sched(N);
    for (int64_t i = 0; i < N; ++i) {
      if (cancelled()) return;
      const auto t0 = Clock::now();
      const std::vector<int64_t> C = masked_in(P(), n());
      if (C.empty()) break;
      StepEvent ev;
      ev.step = i;
      ev.scheduled = sched.count(i, static_cast<int64_t>(C.size()));
      const bool last = i == N - 1;
      if (ev.scheduled == 0) {
        ev.skipped = true;
        finish_step(ev, {}, {}, t0, last);
        continue;
      }
      const uint64_t ustep = static_cast<uint64_t>(i);
      auto cand = score(
          C, Pass::Exact, 0, 0, [](int64_t j) { return j - 1; },  // the shift (4.6)
          [&](const float* row, int64_t j) {
            return dream_propose(row, V_, cfg_.temperature, cfg_.remasking, cfg_.seed, ustep, j);
          });
      const auto chosen = select_candidates(cand, ev.scheduled);
      if (finish_step(ev, cand, chosen, t0, last)) return;
    }
  }

  LogitSource& src_;
  const GenerateConfig& cfg_;
  const GenerateHooks& hooks_;
  const int64_t V_;
  GenerateResult res_;
  std::vector<float> logits_;
  std::vector<int64_t> committed_;
};

std::string arch_label(Arch a) { return a == Arch::LLaDA ? "LLaDA" : "Dream"; }

}  // namespace

void LogitSource::forward_refresh(std::span<const int32_t>, std::span<const int64_t>, float*) {
  throw Error("internal error: this logit source has no dual cache");
}

void LogitSource::forward_cached(std::span<const int32_t>, int64_t, int64_t, std::span<const int64_t>, float*) {
  throw Error("internal error: this logit source has no dual cache");
}

void validate(const GenerateConfig& c, int64_t prompt_length) {
  const std::string L = std::to_string(c.max_tokens), B = std::to_string(c.block_length),
                    N = std::to_string(c.effective_steps());
  if (c.max_tokens < 1) throw usage_error("flag --max-tokens must be at least 1, got " + L);
  if (c.effective_steps() < 1) throw usage_error("flag --steps must be at least 1, got " + N);
  if (!remasking_valid_for(c.arch, c.remasking)) {
    throw usage_error("--remasking " + std::string(remasking_name(c.remasking)) + " is not available for " +
                      arch_label(c.arch) + " models (use " + remasking_choices(c.arch) + ")");
  }
  if (c.dual_cache && c.full_logits) throw usage_error("flags --dual-cache and --full-logits cannot be combined");
  if (c.arch == Arch::LLaDA) {
    if (c.block_length < 1) throw usage_error("flag --block-length must be at least 1, got " + B);
    if (c.max_tokens % c.block_length != 0) {
      throw usage_error("--block-length " + B + " must divide --max-tokens " + L);
    }
    const int64_t nb = c.max_tokens / c.block_length;
    if (c.effective_steps() % nb != 0) {
      throw usage_error("--steps " + N + " must be a multiple of the block count " + std::to_string(nb) +
                        " (--max-tokens " + L + " / --block-length " + B + ")");
    }
  } else {
    if (c.threshold > 0) throw usage_error("--threshold is for LLaDA models only (this model is Dream)");
    if (c.dual_cache) throw usage_error("--dual-cache is for LLaDA models only (this model is Dream)");
    if (prompt_length < 1) throw usage_error("the prompt is empty: Dream needs at least one prompt token");
  }
  if (c.context_length > 0 && c.max_tokens > c.context_length - prompt_length) {  // no overflow, whatever the sizes
    throw usage_error("the canvas of " + std::to_string(prompt_length) + " prompt tokens + --max-tokens " + L +
                      " is longer than the model's context length " + std::to_string(c.context_length));
  }
}

namespace {

// A loaded model as a LogitSource, holding the key/value cache of the dual cache.
class ModelLogitSource : public LogitSource {
 public:
  explicit ModelLogitSource(Model& m) : m_(m) {}
  int64_t n_vocab() const override { return m_.n_vocab(); }
  void forward(std::span<const int32_t> canvas, std::span<const int64_t> rows, float* out) override {
    m_.forward(canvas, rows, out);
  }
  void forward_refresh(std::span<const int32_t> canvas, std::span<const int64_t> rows, float* out) override {
    ForwardRequest req{canvas, rows, out};
    req.cache = &cache_;
    req.cache_mode = CacheMode::Fill;
    m_.forward(req);
  }
  void forward_cached(std::span<const int32_t> canvas, int64_t begin, int64_t end, std::span<const int64_t> rows,
                      float* out) override {
    ForwardRequest req{canvas, rows, out};
    req.cache = &cache_;
    req.cache_mode = CacheMode::Reuse;
    req.row_begin = begin;
    req.row_end = end;
    m_.forward(req);
  }

 private:
  Model& m_;
  KVCache cache_;
};

}  // namespace

std::unique_ptr<LogitSource> make_model_logit_source(Model& model) {
  return std::make_unique<ModelLogitSource>(model);
}

GenerateResult generate(LogitSource& src, const GenerateConfig& cfg, std::span<const int32_t> prompt,
                        const GenerateHooks& hooks) {
  validate(cfg, static_cast<int64_t>(prompt.size()));
  return Loop(src, cfg, prompt, hooks).run();
}

std::vector<int32_t> answer_tokens(std::span<const int32_t> canvas, int64_t prompt_length,
                                   std::span<const int32_t> stop_ids) {
  std::vector<int32_t> out;
  for (size_t j = static_cast<size_t>(prompt_length); j < canvas.size(); ++j) {
    if (is_stop(canvas[j], stop_ids)) break;
    out.push_back(canvas[j]);
  }
  return out;
}

bool answer_is_final(std::span<const int32_t> canvas, int64_t prompt_length, int32_t mask_id,
                     std::span<const int32_t> stop_ids) {
  for (size_t j = static_cast<size_t>(prompt_length); j < canvas.size(); ++j) {
    if (canvas[j] == mask_id) return false;
    if (is_stop(canvas[j], stop_ids)) return true;
  }
  return false;
}

}  // namespace dllm::model
