// The `rnd1` architecture (RND1-30B-A3B, a Qwen3-MoE layout made bidirectional): what sets it apart as the
// GGUF file presents it. q and k RMS-normed per head before NEOX RoPE; the head dimension is
// attention.key_length (Qwen3: H * d may differ from the width); no biases; a mixture-of-experts FFN whose
// top-k router probabilities are renormalised to sum 1 (llama.cpp's build_moe_ffn with norm_w = true); the
// LM head is token_embd when the file has no output.weight. Sampling follows llama.cpp's diffusion CLI for
// RND1: its files carry no diffusion.shift_logits, so logits are shifted (raw row j-1 for position j) and
// the documented command line uses the timestep schedule (--diffusion-eps): Dream's sampler.
#include "model/arch.h"
#include "model/forward.h"

namespace dllm::model::detail {

namespace {

void finish_rnd1_hparams(const gguf::File& f, HParams& hp) {
  hp.rope_style = RopeStyle::Neox;
  hp.qkv_bias = false;
  hp.qk_norm = true;
  read_moe_hparams(f, hp);
  hp.expert_weights_norm = true;
  // llama-diffusion-cli shifts unless the file says diffusion.shift_logits = false.
  hp.shift_logits = f.find("diffusion.shift_logits") ? f.get_bool("diffusion.shift_logits") : true;
}

}  // namespace

const ArchSpec kRND1Spec{Arch::RND1, "rnd1", "RND1", SamplerKind::Timesteps, finish_rnd1_hparams, build_moe_layer,
                         /*head_dim_from_key_length=*/true, /*tied_output=*/true};

}  // namespace dllm::model::detail
