// The `llada` architecture (LLaDA-8B): what sets it apart from dream as the GGUF file presents it.
// NORM (adjacent-pair) RoPE, because llama.cpp's converter permuted the Q/K rows within each head
// (algorithms.md 1.4.4); no biases; logits are not shifted (raw row j is read for canvas position j).
#include "model/arch.h"

#include "model/error.h"

namespace dllm::model::detail {

void finish_llada_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_style = RopeStyle::Norm;
  hp.qkv_bias = false;
  // The converter writes diffusion.shift_logits = false; honour the key when a file says otherwise.
  hp.shift_logits = f.find("diffusion.shift_logits") ? f.get_bool("diffusion.shift_logits") : false;
}

}  // namespace dllm::model::detail
