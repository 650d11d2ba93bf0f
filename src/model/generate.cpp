// One sequence against a LogitSource (generate.h): the Sequence state machine (sequence.h) asks for the
// rows of each step, this loop runs the pass it names. Also the settings' checks and the answer rules.
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <chrono>

#include "common/error.h"
#include "model/model.h"
#include "model/sequence.h"
#include "common/thread_pool.h"

namespace dllm::model {

namespace {

bool is_stop(int32_t t, std::span<const int32_t> stop_ids) {
  return std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end();
}


}  // namespace

void LogitSource::forward_refresh(std::span<const int32_t>, std::span<const int64_t>, float*) {
  throw Error("internal error: this logit source has no dual cache");
}

void LogitSource::forward_cached(std::span<const int32_t>, int64_t, int64_t, std::span<const int64_t>, float*) {
  throw Error("internal error: this logit source has no dual cache");
}

void LogitSource::forward_prefixed(std::span<const int32_t>, const StepNeed&, float*) {
  throw Error("internal error: this logit source has no cached prefix");
}

std::string generation_unavailable(Arch) { return {}; }

std::optional<SettingProblem> check_settings(const GenerateConfig& c, int64_t prompt_length) {
  const std::string L = std::to_string(c.max_tokens), B = std::to_string(c.block_length),
                    N = std::to_string(c.effective_steps());
  auto problem = [](std::string key, std::string text) { return SettingProblem{std::move(key), std::move(text)}; };
  if (std::string why = generation_unavailable(c.arch); !why.empty()) return problem("model", why);
  if (c.max_tokens < 1) return problem("max_tokens", "{setting} {max_tokens} must be at least 1, got " + L);
  if (arch_spec(c.arch).sampler == SamplerKind::EntropyBound) {  // its own settings; the others' do not apply
    const EntropyBoundDefaults& e = c.eb;
    const auto num = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%g", v);
      return std::string(b);
    };
    if (c.canvas_length < 1) return problem("model", "the model file has no canvas length (diffusion.canvas_length)");
    if (e.max_steps < 1 || e.max_steps > 1000000)
      return problem("eb_max_steps", "{setting} {eb_max_steps} must be between 1 and 1000000, got " + std::to_string(e.max_steps));
    if (!(e.t_min > 0) || !(e.t_max >= e.t_min) || !std::isfinite(e.t_max))
      return problem("eb_t_min", "{settings} {eb_t_min} and {eb_t_max} must satisfy 0 < t_min <= t_max, got " +
                                     num(e.t_min) + " and " + num(e.t_max));
    if (!(e.entropy_bound >= 0) || !std::isfinite(e.entropy_bound))
      return problem("eb_entropy_bound", "{setting} {eb_entropy_bound} must be at least 0, got " + num(e.entropy_bound));
    if (!(e.stability >= 0) || e.stability > 1e6 || e.stability != std::floor(e.stability))
      return problem("eb_stability", "{setting} {eb_stability} must be a whole number of steps, at least 0, got " + num(e.stability));
    if (!(e.confidence >= 0) || !std::isfinite(e.confidence))
      return problem("eb_confidence", "{setting} {eb_confidence} must be at least 0, got " + num(e.confidence));
    if (e.self_cond_top_k < 0 || e.self_cond_top_k > kMaxSelfCondTopK)
      return problem("self_cond_top_k", "{setting} {self_cond_top_k} must be between 0 (every token) and " +
                                            std::to_string(kMaxSelfCondTopK) + ", got " + std::to_string(e.self_cond_top_k));
    if (c.top_logprobs >= 0)
      return problem("top_logprobs", "{top_logprobs} is not available for " + std::string(arch_spec(c.arch).label) + " models yet");
    if (prompt_length < 1) return problem("prompt", "the prompt is empty: " + std::string(arch_spec(c.arch).label) + " needs at least one prompt token");
    const int64_t blocks = (c.max_tokens + c.canvas_length - 1) / c.canvas_length;
    if (c.context_length > 0 && blocks > (c.context_length - prompt_length) / c.canvas_length) {
      return problem("max_tokens", std::to_string(prompt_length) + " prompt tokens and {max_tokens} " + L + " (" +
                                       std::to_string(blocks) + " canvas of " + std::to_string(c.canvas_length) +
                                       ") do not fit the model's context length " + std::to_string(c.context_length));
    }
    return std::nullopt;
  }
  if (c.effective_steps() < 1) return problem("steps", "{setting} {steps} must be at least 1, got " + N);
  if (c.top_logprobs < -1 || c.top_logprobs > kMaxTopLogprobs) {
    return problem("top_logprobs", "{setting} {top_logprobs} must be between 0 and " +
                                       std::to_string(kMaxTopLogprobs) + " (-1: off), got " +
                                       std::to_string(c.top_logprobs));
  }
  if (!remasking_valid_for(c.arch, c.remasking)) {
    return problem("remasking", "{remasking} " + std::string(remasking_name(c.remasking)) +
                                    " is not available for " + std::string(arch_spec(c.arch).label) + " models (use " +
                                    remasking_choices(c.arch) + ")");
  }
  if (c.dual_cache && c.full_logits)
    return problem("dual_cache", "{settings} {dual_cache} and {full_logits} cannot be combined");
  if (arch_spec(c.arch).sampler == SamplerKind::Blocks) {
    if (c.block_length < 1) return problem("block_length", "{setting} {block_length} must be at least 1, got " + B);
    // Any max_tokens and steps make blocks (llada_block); each block needs one step at least.
    const int64_t nb = llada_block_count(c.max_tokens, c.block_length);
    if (c.effective_steps() < nb) {
      return problem("steps", "{steps} " + N + " is fewer than the block count " + std::to_string(nb) +
                                  " ({max_tokens} " + L + " / {block_length} " + B +
                                  ", rounded up): every block needs at least one step");
    }
  } else {
    const std::string label = arch_spec(c.arch).label;
    if (c.threshold > 0) return problem("threshold", "{threshold} is for LLaDA models only (this model is " + label + ")");
    if (c.dual_cache) return problem("dual_cache", "{dual_cache} is for LLaDA models only (this model is " + label + ")");
    if (prompt_length < 1) return problem("prompt", "the prompt is empty: Dream needs at least one prompt token");
  }
  if (c.context_length > 0 && c.max_tokens > c.context_length - prompt_length) {  // no overflow, whatever the sizes
    return problem("max_tokens", "the canvas of " + std::to_string(prompt_length) + " prompt tokens + {max_tokens} " +
                                     L + " is longer than the model's context length " +
                                     std::to_string(c.context_length));
  }
  return std::nullopt;
}

std::string name_settings(std::string_view text, const std::function<std::string(std::string_view)>& name_of) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find('{', i);
    const size_t close = open == std::string_view::npos ? open : text.find('}', open);
    if (close == std::string_view::npos) break;
    const std::string_view name = text.substr(open + 1, close - open - 1);
    const bool is_name = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || ch == '_';
    });
    out.append(text.substr(i, open - i));
    if (is_name) {
      out += name_of(name);
    } else {
      out.append(text.substr(open, close + 1 - open));
    }
    i = close + 1;
  }
  out.append(text.substr(std::min(i, text.size())));
  return out;
}

std::string flag_name(std::string_view name) {
  if (name == "setting") return "flag";
  if (name == "settings") return "flags";
  std::string f = "--";
  for (char ch : name) f += ch == '_' ? '-' : ch;
  return f;
}

void validate(const GenerateConfig& c, int64_t prompt_length) {
  if (auto p = check_settings(c, prompt_length)) throw usage_error(name_settings(p->text, flag_name));
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
  void forward_prefixed(std::span<const int32_t> tokens, const StepNeed& need, float* out) override {
    m_.forward(step_request(tokens, need, &cache_, out));
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
  Sequence seq(cfg, prompt, src.n_vocab(), hooks);
  std::vector<float> logits;
  while (const StepNeed* need = seq.next()) {
    logits.resize(need->rows.size() * static_cast<size_t>(src.n_vocab()));
    switch (need->pass) {
      case Pass::Exact: src.forward(seq.canvas(), need->rows, logits.data()); break;
      case Pass::Refresh: src.forward_refresh(seq.canvas(), need->rows, logits.data()); break;
      case Pass::Cached: src.forward_cached(seq.canvas(), need->begin, need->end, need->rows, logits.data()); break;
      case Pass::Encode:
      case Pass::Canvas: src.forward_prefixed(seq.canvas(), *need, logits.data()); break;
    }
    seq.commit(logits.data(), &logits);
  }
  if (!seq.result().error.empty()) throw Error(seq.result().error);
  return seq.take_result();
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
