// `dllm run`: turning the parsed settings into the generation loop's configuration (one function, so a
// test can check that every run flag reaches the loop), and the prompt ids the model sees.
#pragma once
#include <cstdint>
#include <vector>

#include "cli/settings.h"
#include "model/arch.h"
#include "model/generate.h"
#include "model/tokenizer.h"

namespace dllm::cli {

// The stop set (algorithms.md 5.1): the vocabulary's end-of-text and end-of-turn ids.
std::vector<int32_t> stop_ids(const model::Tokenizer& tok);

// Every generation setting from the flags, with the defaults resolved (--steps = --max-tokens, the
// architecture's --remasking). Throws dllm::usage_error for a --remasking the architecture lacks; the
// other architecture checks are model::validate's, which needs the prompt length.
model::GenerateConfig generation_config(const Settings& s, const model::HParams& hp, std::vector<int32_t> stops);

// --prompt (chat template unless --no-chat) or --prompt-tokens (verbatim; ids checked against the
// vocabulary, dllm::Error naming the first bad one).
std::vector<int32_t> prompt_ids(const Settings& s, const model::HParams& hp, const model::Tokenizer& tok);

}  // namespace dllm::cli
