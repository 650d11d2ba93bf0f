// One sequence against a LogitSource (generate.h): the Sequence state machine (sequence.h) asks for the
// rows of each step, this loop runs the pass it names. Also the settings' checks and the answer rules.
#include "model/generate.h"

#include <algorithm>
#include <chrono>

#include "model/error.h"
#include "model/model.h"
#include "model/sequence.h"
#include "model/thread_pool.h"

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

void validate(const GenerateConfig& c, int64_t prompt_length) {
  const std::string L = std::to_string(c.max_tokens), B = std::to_string(c.block_length),
                    N = std::to_string(c.effective_steps());
  if (c.max_tokens < 1) throw usage_error("flag --max-tokens must be at least 1, got " + L);
  if (c.effective_steps() < 1) throw usage_error("flag --steps must be at least 1, got " + N);
  if (!remasking_valid_for(c.arch, c.remasking)) {
    throw usage_error("--remasking " + std::string(remasking_name(c.remasking)) + " is not available for " +
                      arch_spec(c.arch).label + " models (use " + remasking_choices(c.arch) + ")");
  }
  if (c.dual_cache && c.full_logits) throw usage_error("flags --dual-cache and --full-logits cannot be combined");
  if (arch_spec(c.arch).sampler == SamplerKind::Blocks) {
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
    const std::string label = arch_spec(c.arch).label;
    if (c.threshold > 0) throw usage_error("--threshold is for LLaDA models only (this model is " + label + ")");
    if (c.dual_cache) throw usage_error("--dual-cache is for LLaDA models only (this model is " + label + ")");
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
  Sequence seq(cfg, prompt, src.n_vocab(), hooks);
  std::vector<float> logits;
  while (const StepNeed* need = seq.next()) {
    logits.resize(need->rows.size() * static_cast<size_t>(src.n_vocab()));
    switch (need->pass) {
      case Pass::Exact: src.forward(seq.canvas(), need->rows, logits.data()); break;
      case Pass::Refresh: src.forward_refresh(seq.canvas(), need->rows, logits.data()); break;
      case Pass::Cached: src.forward_cached(seq.canvas(), need->begin, need->end, need->rows, logits.data()); break;
    }
    seq.commit(logits.data());
  }
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
