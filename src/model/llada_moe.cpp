// The `llada-moe` architecture (LLaDA-MoE-7B-A1B): what sets it apart as the GGUF file presents it. A
// LLaDA whose layers are Qwen3-MoE-like: q and k RMS-normed per head (attn_q_norm, attn_k_norm) before
// NEOX (half-split) RoPE, no biases, bidirectional attention, and a mixture-of-experts FFN: a softmax
// router over expert_count experts picks expert_used_count per token, whose top-k probabilities weight the
// experts' SwiGLU outputs as they are (not renormalised; llama.cpp's build_moe_ffn with norm_w = false).
// The LM head is output.weight (required, as llama.cpp). Logits are not shifted; LLaDA's block sampler.
#include "model/arch.h"
#include "model/forward.h"

namespace dllm::model::detail {

namespace {

void finish_llada_moe_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_style = RopeStyle::Neox;
  hp.qkv_bias = false;
  hp.qk_norm = true;
  read_moe_hparams(f, hp);
  hp.expert_weights_norm = false;
  // The converter writes diffusion.shift_logits = false (as for llada); a file that says otherwise is honoured.
  hp.shift_logits = f.find("diffusion.shift_logits") ? f.get_bool("diffusion.shift_logits") : false;
}

}  // namespace

// Pre-norm bidirectional attention (per-head q/k norms), pre-norm mixture-of-experts SwiGLU (rnd1 too).
void build_moe_layer(LayerProgram& p, int64_t layer) {
  p.self_attention(layer);
  p.moe_ffn(layer);
}

const ArchSpec kLLaDAMoESpec{Arch::LLaDAMoE, "llada-moe", "LLaDA-MoE", SamplerKind::Blocks, finish_llada_moe_hparams,
                             build_moe_layer, /*head_dim_from_key_length=*/true, /*tied_output=*/false};

}  // namespace dllm::model::detail
