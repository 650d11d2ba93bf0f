// Settings -> the engine's request for `dllm run` (run_config.h).
#include "cli/run_config.h"

namespace dllm::cli {

engine::Sampling sampling_of(const Settings& s) {
  engine::Sampling g;
  g.max_tokens = s.max_tokens;
  g.steps = s.steps;
  g.block_length = s.block_length;
  g.has_block_length = s.has_block_length;
  g.temperature = s.temperature;
  g.remasking = s.remasking;
  g.threshold = s.threshold;
  g.dual_cache = s.dual_cache;
  g.seed = s.seed;
  g.full_logits = s.full_logits;
  g.early_stop = !s.no_early_stop;
  g.top_logprobs = static_cast<int>(s.top_logprobs);  // -1 to 20 (args.cpp)
  g.eb.max_steps = s.eb_max_steps;
  g.eb.t_min = s.eb_t_min;
  g.eb.t_max = s.eb_t_max;
  g.eb.entropy_bound = s.eb_entropy_bound;
  g.eb.stability = s.eb_stability;
  g.eb.confidence = s.eb_confidence;
  g.eb.self_cond_top_k = s.self_cond_top_k;
  return g;
}

engine::Request request_of(const Settings& s) {
  engine::Request r;
  r.prompt = s.prompt;
  if (s.has_prompt_tokens) r.prompt_tokens = s.prompt_tokens;
  r.chat = !s.no_chat;
  r.sampling = sampling_of(s);
  return r;
}

std::vector<int32_t> stop_ids(const model::Tokenizer& tok) { return engine::stop_ids(tok); }

model::GenerateConfig generation_config(const Settings& s, const model::HParams& hp, std::vector<int32_t> stops) {
  try {
    return engine::make_config(sampling_of(s), hp, std::move(stops));
  } catch (const engine::RequestError& e) {
    throw e.as_flags();
  }
}

std::vector<int32_t> prompt_ids(const Settings& s, const model::HParams& hp, const model::Tokenizer& tok) {
  try {
    return engine::prompt_ids(request_of(s), hp, tok);
  } catch (const engine::RequestError& e) {
    throw e.as_flags();
  }
}

engine::Prepared prepare_with_flags(const engine::Engine& engine, const Settings& s) {
  try {
    return engine.prepare(request_of(s));
  } catch (const engine::RequestError& e) {
    throw e.as_flags();
  }
}

}  // namespace dllm::cli
