// The supported architectures (llada, dream, llada-moe, rnd1, diffusion-gemma) as the GGUF files present them:
// hyperparameters read from metadata and the table of tensors, each checked for presence, type and shape
// before any step. llada.cpp, dream.cpp, llada_moe.cpp, rnd1.cpp and diffusion_gemma.cpp each describe one
// architecture; arch.cpp holds what they share.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "model/gguf.h"

namespace dllm::model {

enum class Arch { LLaDA, Dream, LLaDAMoE, RND1, DiffusionGemma };

// How RoPE pairs the dimensions of a head (algorithms.md 1.4.4).
enum class RopeStyle {
  Norm,  // adjacent pairs (2p, 2p+1): llada (the converter permuted Q/K rows)
  Neox,  // half-split pairs (p, p + n_rot/2): dream
};

// One layer's attention geometry where layers differ (Gemma-4's sliding and global layers).
struct LayerAttention {
  int64_t n_head_kv = 0, head_dim = 0, n_rot = 0;
  float rope_base = 0;
  bool sliding = false;     // keys within the sliding window only (HParams::n_swa)
  bool rope_freqs = false;  // RoPE frequencies divided by the rope_freqs tensor when the file has it
};

// Sampler defaults a uniform-state (DiffusionGemma) file carries as diffusion.eb_* keys; these values when absent.
// The largest self_cond_top_k a request may give (beyond any vocabulary: 16 Mi tokens).
inline constexpr int64_t kMaxSelfCondTopK = int64_t{1} << 24;

struct EntropyBoundDefaults {
  int64_t max_steps = 48;
  double t_min = 0.4, t_max = 0.8, entropy_bound = 0.1, stability = 1, confidence = 0.005;
  // Not a file key: self-conditioning over each canvas row's self_cond_top_k most probable tokens only (an
  // opt-in approximation, Executor::soft_embed); 0 = every token, exact.
  int64_t self_cond_top_k = 0;
};

struct HParams {
  Arch arch = Arch::LLaDA;
  std::string arch_name;     // "llada" / "dream": the metadata key prefix
  int64_t n_layer = 0;       // block_count
  int64_t n_embd = 0;        // embedding_length (D)
  int64_t n_head = 0;        // attention.head_count (H)
  int64_t n_head_kv = 0;     // attention.head_count_kv (Hkv; H when absent)
  int64_t head_dim = 0;      // d = D / H
  int64_t n_ff = 0;          // feed_forward_length (F)
  int64_t n_ctx = 0;         // context_length: the longest canvas the model accepts
  int64_t n_vocab = 0;       // rows of token_embd / output (vocab_size when present must agree)
  int64_t n_rot = 0;         // rope.dimension_count (d when absent): leading dims of a head that rotate
  float rms_eps = 0;         // attention.layer_norm_rms_epsilon
  float rope_base = 0;       // rope.freq_base (10000 when absent)
  RopeStyle rope_style = RopeStyle::Norm;
  bool qkv_bias = false;     // Q/K/V projections carry biases (dream)
  int32_t mask_token_id = 0; // tokenizer.ggml.mask_token_id
  // Raw row i predicts the token at position i+1 (dream). The sampler for canvas position j then reads
  // raw row j-1; the forward pass and the logits command always produce raw rows (algorithms.md 1.4.9).
  bool shift_logits = false;
  // Mixture of experts (llada-moe, rnd1; 0 experts = a dense SwiGLU FFN): expert_count, expert_used_count,
  // expert_feed_forward_length; whether the top-k router weights are renormalised to sum 1 (rnd1).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  bool expert_weights_norm = false;
  // q and k are RMS-normed per head (attn_q_norm, attn_k_norm: head_dim weights) before RoPE.
  bool qk_norm = false;

  // --- diffusion-gemma (Gemma-4 backbone, uniform-state block diffusion) ---
  // Per-layer attention geometry; empty = every layer has n_head_kv, head_dim, n_rot, rope_base above.
  std::vector<LayerAttention> layer_attn;
  int64_t n_swa = 0;          // sliding window: a sliding layer's query at q sees keys k with q - k < n_swa
  float attn_scale = 0;       // applied to q.k; 0 = 1/sqrt(head_dim)
  float embd_scale = 1;       // the embedding rows are multiplied by it (sqrt(n_embd) for Gemma)
  float final_softcap = 0;    // logits = c * tanh(logits / c) when > 0
  // The canvas is the last canvas_length positions: prompt positions before it attend causally (and get the
  // encoder's per-layer scalar), canvas positions attend bidirectionally among themselves and to the prompt
  // (the decoder's scalar); the canvas input is RMS-normed and can carry self-conditioning.
  bool prompt_regions = false;
  int64_t canvas_length = 0;  // diffusion.canvas_length
  EntropyBoundDefaults eb;    // diffusion.eb_* (the sampler of part 2)

  bool moe() const { return n_expert > 0; }
  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  // Layer l's geometry (the scalars when layers do not differ).
  LayerAttention attn(int64_t l) const {
    if (!layer_attn.empty()) return layer_attn[static_cast<size_t>(l)];
    return LayerAttention{n_head_kv, head_dim, n_rot, rope_base, false, false};
  }
  int64_t max_kv_dim() const {
    int64_t m = kv_dim();
    for (const LayerAttention& a : layer_attn) m = std::max(m, a.n_head_kv * a.head_dim);
    return m;
  }
};

struct LayerTensors {
  const gguf::TensorInfo* attn_norm = nullptr;
  const gguf::TensorInfo* wq = nullptr;
  const gguf::TensorInfo* wk = nullptr;
  const gguf::TensorInfo* wv = nullptr;
  const gguf::TensorInfo* bq = nullptr;  // null unless qkv_bias
  const gguf::TensorInfo* bk = nullptr;
  const gguf::TensorInfo* bv = nullptr;
  const gguf::TensorInfo* wo = nullptr;
  const gguf::TensorInfo* ffn_norm = nullptr;
  const gguf::TensorInfo* ffn_gate = nullptr;
  const gguf::TensorInfo* ffn_up = nullptr;
  const gguf::TensorInfo* ffn_down = nullptr;
  // qk_norm: per-head RMSNorm weights [head_dim]
  const gguf::TensorInfo* attn_q_norm = nullptr;
  const gguf::TensorInfo* attn_k_norm = nullptr;
  // moe (then ffn_gate/up/down are null): the router [D, E] and the experts' 3-D matrices
  // gate/up [D, F_exp, E], down [F_exp, D, E] (expert e is the e-th 2-D slice)
  const gguf::TensorInfo* ffn_gate_inp = nullptr;
  const gguf::TensorInfo* ffn_gate_exps = nullptr;
  const gguf::TensorInfo* ffn_up_exps = nullptr;
  const gguf::TensorInfo* ffn_down_exps = nullptr;
  // diffusion-gemma: post-norms, the shared MLP beside the experts (ffn_gate/up/down), the fused experts'
  // gate_up [D, 2*F_exp, E] (gate rows first), the router's input scale and per-expert scales, region scalars
  const gguf::TensorInfo* post_attention_norm = nullptr;
  const gguf::TensorInfo* post_ffw_norm_1 = nullptr;
  const gguf::TensorInfo* pre_ffw_norm_2 = nullptr;
  const gguf::TensorInfo* post_ffw_norm_2 = nullptr;
  const gguf::TensorInfo* post_ffw_norm = nullptr;
  const gguf::TensorInfo* ffn_gate_up_exps = nullptr;
  const gguf::TensorInfo* ffn_gate_inp_scale = nullptr;
  const gguf::TensorInfo* ffn_down_exps_scale = nullptr;
  const gguf::TensorInfo* layer_output_scale = nullptr;
  const gguf::TensorInfo* enc_layer_output_scale = nullptr;

  // The weight matrices of the layer that the executors multiply by (dense FFN or experts, whichever
  // the layer has; the 3-D expert tensors stand for their per-expert slices of the same shape).
  std::vector<const gguf::TensorInfo*> matrices() const;
};

// Every tensor the forward pass reads, pointing into the file's tensor table (weights stay in the mapping).
struct ModelTensors {
  const gguf::TensorInfo* token_embd = nullptr;
  const gguf::TensorInfo* output_norm = nullptr;
  const gguf::TensorInfo* output = nullptr;  // token_embd itself when the file ties them (no output.weight)
  std::vector<LayerTensors> layers;
  // diffusion-gemma: the proportional RoPE factors of the global layers and the self-conditioning MLP
  const gguf::TensorInfo* rope_freqs = nullptr;
  const gguf::TensorInfo* self_cond_pre_norm = nullptr;
  const gguf::TensorInfo* self_cond_gate = nullptr;
  const gguf::TensorInfo* self_cond_up = nullptr;
  const gguf::TensorInfo* self_cond_down = nullptr;
};

class LayerProgram;  // forward.h: the forward program as an architecture's layer builder sees it

// How an architecture's generations are sampled.
enum class SamplerKind {
  Blocks,     // LLaDA's generate.py: blocks, low_confidence/random, threshold, dual cache; raw row j for position j
  Timesteps,  // Dream's diffusion_generate: the timestep schedule over the whole canvas, row j-1 for position j
  EntropyBound,  // DiffusionGemma's uniform-state entropy-bound sampler (blocks of noise over a cached prefix)
};

// What one architecture is, in one place (llada.cpp, dream.cpp): every other part of the program asks
// this table instead of testing the Arch value.
struct ArchSpec {
  Arch arch;
  const char* name;    // general.architecture, and the prefix of its metadata keys
  const char* label;   // for messages: "LLaDA"
  SamplerKind sampler;
  // Fills the architecture-specific fields of hp after the common keys were read (RoPE style, biases,
  // logit shift, defaults).
  void (*finish_hparams)(const gguf::File& file, HParams& hp);
  // One transformer layer of the forward program, built from its operations.
  void (*build_layer)(LayerProgram& program, int64_t layer);
  // The file's attention.key_length sets the head dimension (Qwen3 layouts: H * d need not be D);
  // otherwise the key must equal embedding_length / head_count.
  bool head_dim_from_key_length = false;
  // output.weight may be absent: the LM head is then token_embd (tied embeddings).
  bool tied_output = false;
  // The architecture's own tensor table (diffusion-gemma); null = the common one of check_tensors.
  ModelTensors (*check_tensors)(const gguf::File& file, const HParams& hp) = nullptr;
};

const ArchSpec& arch_spec(Arch arch);
// Every supported architecture's entry, in the order messages list them (llada, dream, llada-moe, rnd1,
// diffusion-gemma).
std::span<const ArchSpec* const> arch_specs();
// nullptr for a name no supported architecture has.
const ArchSpec* find_arch_spec(std::string_view name);
// Names of the supported architectures, for messages: "llada, dream, llada-moe, rnd1".
const char* supported_architectures();

// Reads general.architecture and the hyperparameters of that architecture, checking every key's
// presence, type and value. Throws dllm::Error:
//   "unsupported model architecture: qwen2 (supported: llada, dream, llada-moe, rnd1)"
//   "required metadata key missing: llada.block_count"
//   "invalid metadata: llada.attention.head_count_kv = 3 does not divide llada.attention.head_count = 4"
// n_vocab comes from token_embd's rows (the tensor checks confirm the rest agrees).
HParams read_hparams(const gguf::File& file);

// Finds every tensor the architecture needs and checks presence, type and shape:
//   "required tensor missing: blk.0.attn_q.weight"
//   "tensor shape mismatch for blk.0.attn_q.weight: [256, 128], expected [256, 256]"
//   "unsupported GGUF tensor type: IQ2_XXS (tensor blk.0.attn_q.weight)"
ModelTensors check_tensors(const gguf::File& file, const HParams& hp);

namespace detail {
// The architectures' entries (llada.cpp, dream.cpp, llada_moe.cpp, rnd1.cpp).
extern const ArchSpec kLLaDASpec;
extern const ArchSpec kDreamSpec;
extern const ArchSpec kLLaDAMoESpec;
extern const ArchSpec kRND1Spec;
extern const ArchSpec kDiffusionGemmaSpec;
// Looks up one tensor and checks its type (decodable, row length a whole number of blocks) and shape
// (arch.cpp's messages).
const gguf::TensorInfo* require_tensor(const gguf::File& f, const std::string& name, std::vector<int64_t> shape);
// A required unsigned metadata key that must be at least 1 (invalid metadata otherwise).
int64_t positive_key(const gguf::File& f, const std::string& key);
[[noreturn]] void invalid_metadata(const std::string& what);
// Reads the mixture-of-experts keys {arch}.expert_count, expert_used_count, expert_feed_forward_length
// (checked: 1 <= used <= count) into hp (shared by llada-moe and rnd1).
void read_moe_hparams(const gguf::File& file, HParams& hp);
// The layer of both mixture-of-experts architectures: attention, then the expert FFN (llada_moe.cpp).
void build_moe_layer(LayerProgram& program, int64_t layer);
}  // namespace detail

}  // namespace dllm::model
