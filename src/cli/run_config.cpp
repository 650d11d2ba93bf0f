// Settings -> GenerateConfig and prompt ids for `dllm run` (run_config.h).
#include "cli/run_config.h"

#include <algorithm>

#include "model/chat.h"
#include "model/error.h"

namespace dllm::cli {

std::vector<int32_t> stop_ids(const model::Tokenizer& tok) {
  std::vector<int32_t> out;
  for (int32_t id : {tok.eos(), tok.eot()})
    if (id >= 0 && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  return out;
}

model::GenerateConfig generation_config(const Settings& s, const model::HParams& hp, std::vector<int32_t> stops) {
  model::GenerateConfig c;
  c.arch = hp.arch;
  c.mask_id = hp.mask_token_id;
  c.stop_ids = std::move(stops);
  c.max_tokens = s.max_tokens;
  c.steps = s.steps > 0 ? s.steps : s.max_tokens;
  c.block_length = s.block_length;
  c.temperature = s.temperature;
  if (s.remasking.empty()) {
    c.remasking = model::default_remasking(hp.arch);
  } else {
    auto r = model::parse_remasking(s.remasking);
    if (!r) throw usage_error("flag --remasking: unknown strategy '" + s.remasking + "'");
    c.remasking = *r;
  }
  c.threshold = s.threshold;
  c.dual_cache = s.dual_cache;
  c.full_logits = s.full_logits;
  c.early_stop = !s.no_early_stop;
  c.seed = s.seed;
  c.context_length = hp.n_ctx;
  return c;
}

std::vector<int32_t> prompt_ids(const Settings& s, const model::HParams& hp, const model::Tokenizer& tok) {
  if (s.has_prompt_tokens) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < s.prompt_tokens.size(); ++i) {
      const int64_t id = s.prompt_tokens[i];
      if (id < 0 || id >= hp.n_vocab) {
        throw Error("--prompt-tokens: id " + std::to_string(id) + " at position " + std::to_string(i) +
                    " is out of range: the model's vocabulary has " + std::to_string(hp.n_vocab) + " tokens (ids 0.." +
                    std::to_string(hp.n_vocab - 1) + ")");
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  }
  if (s.no_chat) return model::raw_prompt_ids(tok, s.prompt);
  return model::chat_prompt_ids(tok, model::chat_template_for_arch(hp.arch_name), s.prompt);
}

}  // namespace dllm::cli
