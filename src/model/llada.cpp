// The `llada` architecture (LLaDA-8B): what sets it apart as the GGUF file presents it. NORM
// (adjacent-pair) RoPE, because llama.cpp's converter permuted the Q/K rows within each head (algorithms.md
// 1.4.4); no biases; logits are not shifted (raw row j is read for canvas position j); LLaDA's block sampler.
#include "model/arch.h"
#include "model/forward.h"

namespace dllm::model::detail {

namespace {

void finish_llada_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_style = RopeStyle::Norm;
  hp.qkv_bias = false;
  // The converter writes diffusion.shift_logits = false; honour the key when a file says otherwise.
  hp.shift_logits = f.find("diffusion.shift_logits") ? f.get_bool("diffusion.shift_logits") : false;
}

// A LLaMA layer without causal mask: pre-norm bidirectional attention (no biases), pre-norm SwiGLU.
void build_llada_layer(LayerProgram& p, int64_t layer) {
  p.self_attention(layer);
  p.swiglu_ffn(layer);
}

}  // namespace

const ArchSpec kLLaDASpec{Arch::LLaDA, "llada", "LLaDA", SamplerKind::Blocks, finish_llada_hparams,
                          build_llada_layer};

}  // namespace dllm::model::detail
