// The `dream` architecture (Dream-v0-7B, Qwen2.5 layout): what sets it apart as the GGUF file presents it.
// NEOX (half-split) RoPE on unpermuted Q/K rows; Q, K and V carry biases (added before RoPE; the output
// projection has none); grouped-query attention; and logits are shifted by one: raw row i predicts the
// token at i+1, so the sampler reads raw row j-1 for canvas position j (Dream's timestep sampler).
#include "model/arch.h"
#include "model/forward.h"

namespace dllm::model::detail {

namespace {

void finish_dream_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_style = RopeStyle::Neox;
  hp.qkv_bias = true;
  // The converter writes no diffusion.shift_logits for dream and llama-diffusion-cli then shifts;
  // a file that carries the key is honoured.
  hp.shift_logits = f.find("diffusion.shift_logits") ? f.get_bool("diffusion.shift_logits") : true;
}

// A Qwen2 layer without causal mask: pre-norm bidirectional attention with Q/K/V biases, pre-norm SwiGLU.
void build_dream_layer(LayerProgram& p, int64_t layer) {
  p.self_attention(layer);
  p.swiglu_ffn(layer);
}

}  // namespace

const ArchSpec kDreamSpec{Arch::Dream, "dream", "Dream", SamplerKind::Timesteps, finish_dream_hparams,
                          build_dream_layer};

}  // namespace dllm::model::detail
