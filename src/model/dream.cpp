// The `dream` architecture (Dream-v0-7B, Qwen2.5 layout): what sets it apart from llada as the GGUF file
// presents it. NEOX (half-split) RoPE on unpermuted Q/K rows; Q, K and V carry biases (added before
// RoPE; the output projection has none); grouped-query attention; and logits are shifted by one:
// raw row i predicts the token at i+1, so the sampler reads raw row j-1 for canvas position j.
#include "model/arch.h"

#include "model/error.h"

namespace dllm::model::detail {

void finish_dream_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_style = RopeStyle::Neox;
  hp.qkv_bias = true;
  // The converter writes no diffusion.shift_logits for dream and llama-diffusion-cli then shifts;
  // a file that carries the key is honoured.
  hp.shift_logits = f.find("diffusion.shift_logits") ? f.get_bool("diffusion.shift_logits") : true;
}

}  // namespace dllm::model::detail
