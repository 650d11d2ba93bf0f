// The `diffusion-gemma` architecture (Google's DiffusionGemma-26B-A4B): what sets it apart as the GGUF file
// presents it (../shared/fixtures/diffusion-gemma/README.md has every key and tensor). A Gemma-4 mixture of
// experts under uniform-state block diffusion: one forward over [prompt | canvas] (the canvas = the last
// diffusion.canvas_length positions) in which prompt positions attend causally and canvas positions attend to
// the whole canvas and the prompt; sliding layers (a window, their own head dim, KV heads and RoPE base) and
// global layers (proportional RoPE through rope_freqs, values = the raw key projection when attn_v is absent);
// unscaled attention with q, k and weightless v norms; post-norms; a shared GeGLU MLP beside the routed
// experts (router input scale, per-expert output scales, fused gate_up); per-layer scalars by region; the
// canvas input RMS-normed and optionally self-conditioned; the tied head softcapped. The prompt can be encoded
// once into a cache of keys and values (CacheMode::Extend) and each canvas step run against it (Prefix).
#include <cmath>
#include <string>

#include "common/error.h"
#include "model/arch.h"
#include "model/forward.h"

namespace dllm::model::detail {

namespace {

// A per-layer key: an array of n_layer integers, or one value for every layer.
std::vector<int64_t> per_layer_ints(const gguf::File& f, const std::string& key, int64_t n_layer) {
  const gguf::Value* v = f.find(key);
  if (!v) throw Error("required metadata key missing: " + key);
  std::vector<int64_t> out;
  if (v->type == gguf::ValueType::ARRAY) {
    out = f.get_int_array(key);
    if (static_cast<int64_t>(out.size()) != n_layer)
      invalid_metadata(key + " has " + std::to_string(out.size()) + " values for " + std::to_string(n_layer) + " layers");
  } else {
    out.assign(static_cast<size_t>(n_layer), positive_key(f, key));
  }
  for (int64_t x : out)
    if (x < 1 || x > 4096) invalid_metadata(key + " holds " + std::to_string(x));
  return out;
}

// The sliding-window pattern: an array of n_layer bools (true = sliding).
std::vector<bool> sliding_pattern(const gguf::File& f, const std::string& key, int64_t n_layer) {
  const gguf::Value* v = f.find(key);
  if (!v) throw Error("required metadata key missing: " + key);
  if (v->type != gguf::ValueType::ARRAY || v->elem_type != gguf::ValueType::BOOL)
    invalid_metadata(key + " is not an array of booleans");
  if (static_cast<int64_t>(v->size()) != n_layer)
    invalid_metadata(key + " has " + std::to_string(v->size()) + " values for " + std::to_string(n_layer) + " layers");
  std::vector<bool> out;
  for (size_t i = 0; i < v->size(); ++i) out.push_back(v->at(i).u != 0);
  return out;
}

int64_t head_dim_key(const gguf::File& f, const std::string& a, const std::string& suffix) {
  const int64_t k = positive_key(f, a + "attention.key_length" + suffix);
  const int64_t vl = f.find(a + "attention.value_length" + suffix) ? positive_key(f, a + "attention.value_length" + suffix) : k;
  if (vl != k)
    invalid_metadata(a + "attention.value_length" + suffix + " = " + std::to_string(vl) + " differs from " + a +
                     "attention.key_length" + suffix + " = " + std::to_string(k));
  if (k > 4096 || k % 2) invalid_metadata(a + "attention.key_length" + suffix + " = " + std::to_string(k));
  return k;
}

float positive_float(const gguf::File& f, const std::string& key, double fallback) {
  const double v = f.find(key) ? f.get_float(key) : fallback;
  if (!(v > 0 && v < 1e30)) invalid_metadata(key + " = " + std::to_string(v));
  return static_cast<float>(v);
}

void finish_hparams(const gguf::File& f, HParams& hp) {
  const std::string a = hp.arch_name + ".";
  hp.rope_style = RopeStyle::Neox;
  hp.qkv_bias = false;
  hp.qk_norm = true;
  hp.shift_logits = false;
  hp.prompt_regions = true;
  hp.attn_scale = 1.0f;  // Gemma-4 attention is unscaled (the q/k norms set the scale)
  hp.embd_scale = static_cast<float>(std::sqrt(static_cast<double>(hp.n_embd)));
  read_moe_hparams(f, hp);
  hp.expert_weights_norm = true;  // top-k renormalised, then the per-expert scales

  const int64_t L = hp.n_layer;
  const std::vector<bool> sliding = sliding_pattern(f, a + "attention.sliding_window_pattern", L);
  const std::vector<int64_t> kv = per_layer_ints(f, a + "attention.head_count_kv", L);
  const int64_t hd = head_dim_key(f, a, ""), hd_swa = head_dim_key(f, a, "_swa");
  const float base = positive_float(f, a + "rope.freq_base", 10000.0);
  const float base_swa = positive_float(f, a + "rope.freq_base_swa", base);
  const int64_t rot = f.find(a + "rope.dimension_count") ? positive_key(f, a + "rope.dimension_count") : hd;
  const int64_t rot_swa = f.find(a + "rope.dimension_count_swa") ? positive_key(f, a + "rope.dimension_count_swa") : hd_swa;
  if (rot > hd || rot % 2) invalid_metadata(a + "rope.dimension_count = " + std::to_string(rot) + " (head dimension " + std::to_string(hd) + ")");
  if (rot_swa > hd_swa || rot_swa % 2)
    invalid_metadata(a + "rope.dimension_count_swa = " + std::to_string(rot_swa) + " (head dimension " + std::to_string(hd_swa) + ")");
  hp.layer_attn.resize(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const size_t i = static_cast<size_t>(l);
    if (hp.n_head % kv[i] != 0)
      invalid_metadata(a + "attention.head_count_kv = " + std::to_string(kv[i]) + " (layer " + std::to_string(l) +
                       ") does not divide " + a + "attention.head_count = " + std::to_string(hp.n_head));
    hp.layer_attn[i] = sliding[i] ? LayerAttention{kv[i], hd_swa, rot_swa, base_swa, true, false}
                                  : LayerAttention{kv[i], hd, rot, base, false, true};
  }
  // The scalars describe the global layers (the widest; messages and the other backends read them).
  hp.head_dim = hd, hp.n_rot = rot, hp.rope_base = base;
  hp.n_head_kv = kv.back();
  hp.n_swa = positive_key(f, a + "attention.sliding_window");
  hp.final_softcap = f.find(a + "final_logit_softcapping") ? positive_float(f, a + "final_logit_softcapping", 0) : 0.0f;
  hp.canvas_length = positive_key(f, "diffusion.canvas_length");
  if (hp.canvas_length > hp.n_ctx)
    invalid_metadata("diffusion.canvas_length = " + std::to_string(hp.canvas_length) + " is more than " + a +
                     "context_length = " + std::to_string(hp.n_ctx));
  EntropyBoundDefaults& eb = hp.eb;
  if (f.find("diffusion.eb_max_steps")) eb.max_steps = positive_key(f, "diffusion.eb_max_steps");
  if (f.find("diffusion.eb_t_min")) eb.t_min = positive_float(f, "diffusion.eb_t_min", 0);
  if (f.find("diffusion.eb_t_max")) eb.t_max = positive_float(f, "diffusion.eb_t_max", 0);
  if (f.find("diffusion.eb_entropy_bound")) eb.entropy_bound = positive_float(f, "diffusion.eb_entropy_bound", 0);
  if (f.find("diffusion.eb_stability_threshold")) eb.stability = static_cast<double>(positive_key(f, "diffusion.eb_stability_threshold"));
  if (f.find("diffusion.eb_confidence_threshold")) eb.confidence = positive_float(f, "diffusion.eb_confidence_threshold", 0);
  if (eb.t_min > eb.t_max)
    invalid_metadata("diffusion.eb_t_min = " + std::to_string(eb.t_min) + " is more than diffusion.eb_t_max = " +
                     std::to_string(eb.t_max));
}

const gguf::TensorInfo* optional(const gguf::File& f, const std::string& name, std::vector<int64_t> shape) {
  return f.find_tensor(name) ? require_tensor(f, name, std::move(shape)) : nullptr;
}

ModelTensors check(const gguf::File& f, const HParams& hp) {
  const int64_t D = hp.n_embd, V = hp.n_vocab, H = hp.n_head, F = hp.n_ff, E = hp.n_expert, Fe = hp.n_ff_exp;
  // block_count sizes the layer list: checked against the tensors the file holds first.
  constexpr int64_t kPerLayer = 20;
  const int64_t present = static_cast<int64_t>(f.tensors().size());
  if (hp.n_layer > present / kPerLayer)
    invalid_metadata(hp.arch_name + ".block_count = " + std::to_string(hp.n_layer) + ", but the file holds only " +
                     std::to_string(present) + " tensors (" + std::to_string(hp.n_layer) + " layers need " +
                     std::to_string(kPerLayer) + " each)");
  ModelTensors m;
  m.token_embd = require_tensor(f, "token_embd.weight", {D, V});
  m.output_norm = require_tensor(f, "output_norm.weight", {D});
  m.output = f.find_tensor("output.weight") ? require_tensor(f, "output.weight", {D, V}) : m.token_embd;
  m.rope_freqs = optional(f, "rope_freqs.weight", {hp.n_rot / 2});
  if ((m.self_cond_gate = optional(f, "self_cond_gate.weight", {D, F}))) {
    m.self_cond_pre_norm = require_tensor(f, "self_cond_pre_norm.weight", {D});
    m.self_cond_up = require_tensor(f, "self_cond_up.weight", {D, F});
    m.self_cond_down = require_tensor(f, "self_cond_down.weight", {F, D});
  }
  m.layers.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const LayerAttention g = hp.attn(i);
    const int64_t Q = H * g.head_dim, KV = g.n_head_kv * g.head_dim;
    LayerTensors& l = m.layers[static_cast<size_t>(i)];
    l.attn_norm = require_tensor(f, p + "attn_norm.weight", {D});
    l.wq = require_tensor(f, p + "attn_q.weight", {D, Q});
    l.wk = require_tensor(f, p + "attn_k.weight", {D, KV});
    l.wv = optional(f, p + "attn_v.weight", {D, KV});  // absent on global layers: V = the raw K projection
    l.attn_q_norm = require_tensor(f, p + "attn_q_norm.weight", {g.head_dim});
    l.attn_k_norm = require_tensor(f, p + "attn_k_norm.weight", {g.head_dim});
    l.wo = require_tensor(f, p + "attn_output.weight", {Q, D});
    l.post_attention_norm = require_tensor(f, p + "post_attention_norm.weight", {D});
    l.ffn_norm = require_tensor(f, p + "ffn_norm.weight", {D});
    l.ffn_gate = require_tensor(f, p + "ffn_gate.weight", {D, F});
    l.ffn_up = require_tensor(f, p + "ffn_up.weight", {D, F});
    l.ffn_down = require_tensor(f, p + "ffn_down.weight", {F, D});
    l.post_ffw_norm_1 = require_tensor(f, p + "post_ffw_norm_1.weight", {D});
    l.ffn_gate_inp = require_tensor(f, p + "ffn_gate_inp.weight", {D, E});
    l.ffn_gate_inp_scale = require_tensor(f, p + "ffn_gate_inp.scale", {D});
    l.pre_ffw_norm_2 = require_tensor(f, p + "pre_ffw_norm_2.weight", {D});
    if (f.find_tensor(p + "ffn_gate_up_exps.weight")) {
      l.ffn_gate_up_exps = require_tensor(f, p + "ffn_gate_up_exps.weight", {D, 2 * Fe, E});
    } else {  // the loader's other layout: separate gate and up experts
      l.ffn_gate_exps = require_tensor(f, p + "ffn_gate_exps.weight", {D, Fe, E});
      l.ffn_up_exps = require_tensor(f, p + "ffn_up_exps.weight", {D, Fe, E});
    }
    l.ffn_down_exps = require_tensor(f, p + "ffn_down_exps.weight", {Fe, D, E});
    l.ffn_down_exps_scale = optional(f, p + "ffn_down_exps.scale", {E});
    l.post_ffw_norm_2 = require_tensor(f, p + "post_ffw_norm_2.weight", {D});
    l.post_ffw_norm = require_tensor(f, p + "post_ffw_norm.weight", {D});
    l.layer_output_scale = optional(f, p + "layer_output_scale.weight", {1});
    l.enc_layer_output_scale = optional(f, p + "enc_layer_output_scale.weight", {1});
  }
  return m;
}

// Attention (post-normed), the shared MLP and the experts side by side, the region's scalar.
void build_layer(LayerProgram& p, int64_t layer) {
  p.self_attention(layer);
  p.parallel_ffn(layer);
  p.region_scale(layer);
}

}  // namespace

const ArchSpec kDiffusionGemmaSpec{Arch::DiffusionGemma, "diffusion-gemma", "DiffusionGemma", SamplerKind::EntropyBound,
                                   finish_hparams, build_layer, /*head_dim_from_key_length=*/true,
                                   /*tied_output=*/true, check};

}  // namespace dllm::model::detail
