// `dllm run`: the parsed settings as the engine's request (one function, so a test can check that every
// run flag reaches the generation loop), and the engine's request checks with the flags' names.
#pragma once
#include <cstdint>
#include <vector>

#include "cli/settings.h"
#include "engine/engine.h"
#include "model/arch.h"
#include "model/generate.h"
#include "model/tokenizer.h"

namespace dllm::cli {

// The sampler's flags (--max-tokens ... --no-early-stop) as the engine's settings.
engine::Sampling sampling_of(const Settings& s);
// The whole request of the flags: --prompt (chat template unless --no-chat) or --prompt-tokens, and sampling_of.
engine::Request request_of(const Settings& s);

// The stop set (algorithms.md 5.1): the vocabulary's end-of-text and end-of-turn ids.
std::vector<int32_t> stop_ids(const model::Tokenizer& tok);

// Every generation setting from the flags, with the defaults resolved (--steps = --max-tokens, the
// architecture's --remasking). Throws dllm::usage_error for a --remasking the architecture lacks; the
// other architecture checks are model::validate's, which needs the prompt length.
model::GenerateConfig generation_config(const Settings& s, const model::HParams& hp, std::vector<int32_t> stops);

// --prompt (chat template unless --no-chat) or --prompt-tokens (verbatim; ids checked against the
// vocabulary, dllm::Error naming the first bad one).
std::vector<int32_t> prompt_ids(const Settings& s, const model::HParams& hp, const model::Tokenizer& tok);

// engine.prepare(request_of(s)) with errors naming the flags (--max-tokens).
engine::Prepared prepare_with_flags(const engine::Engine& engine, const Settings& s);

}  // namespace dllm::cli
