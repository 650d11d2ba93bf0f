// Shared part of the architecture descriptions: the common hyperparameter keys of every architecture, their
// value checks, the mixture-of-experts keys, and the tensor table check (presence, type, shape) run before
// the first forward step.
#include "model/arch.h"

#include <sstream>

#include "common/error.h"
#include "model/quant.h"
#include "common/printable.h"

namespace dllm::model {

namespace {
const ArchSpec* const kArchitectures[] = {&detail::kLLaDASpec, &detail::kDreamSpec, &detail::kLLaDAMoESpec,
                                          &detail::kRND1Spec, &detail::kDiffusionGemmaSpec};
}  // namespace

const ArchSpec& arch_spec(Arch arch) {
  for (const ArchSpec* s : kArchitectures)
    if (s->arch == arch) return *s;
  throw Error("internal error: an architecture without a table entry");
}

std::span<const ArchSpec* const> arch_specs() { return kArchitectures; }

const ArchSpec* find_arch_spec(std::string_view name) {
  for (const ArchSpec* s : kArchitectures)
    if (name == s->name) return s;
  return nullptr;
}

const char* supported_architectures() {
  static const std::string names = [] {
    std::string n;
    for (const ArchSpec* s : kArchitectures) n += (n.empty() ? "" : ", ") + std::string(s->name);
    return n;
  }();
  return names.c_str();
}

namespace {

// More layers than any released model has (LLaDA-8B: 32, the largest LLMs: under 200).
constexpr int64_t kMaxLayers = 4096;

[[noreturn]] void invalid(const std::string& what) { throw Error("invalid metadata: " + what); }
using detail::positive_key;

int64_t optional_positive_key(const gguf::File& f, const std::string& key, int64_t fallback) {
  return f.find(key) ? positive_key(f, key) : fallback;
}

std::string shape_string(const int64_t* ne, uint32_t n_dims) {
  std::ostringstream s;
  s << '[';
  for (uint32_t i = 0; i < n_dims; ++i) s << (i ? ", " : "") << ne[i];
  s << ']';
  return s.str();
}

// The vocabulary size the file declares: {a}.vocab_size, else the tokenizer's token count, else the rows
// of token_embd. check_tensors then confirms token_embd and output have exactly this many rows.
int64_t declared_vocab(const gguf::File& f, const std::string& a) {
  if (f.find(a + ".vocab_size")) return positive_key(f, a + ".vocab_size");
  if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens");
      toks && toks->type == gguf::ValueType::ARRAY && toks->size() > 0) {
    return static_cast<int64_t>(toks->size());
  }
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb) throw Error("required tensor missing: token_embd.weight");
  return emb->ne[1];
}

}  // namespace

HParams read_hparams(const gguf::File& f) {
  HParams hp;
  hp.arch_name = std::string(f.get_string("general.architecture"));
  const ArchSpec* spec = find_arch_spec(hp.arch_name);
  if (!spec) {
    throw Error("unsupported model architecture: " + shown(hp.arch_name) + " (supported: " +
                supported_architectures() + ")");
  }
  hp.arch = spec->arch;
  const std::string a = hp.arch_name + ".";

  // Keys every file must carry, in the order llama.cpp's loader reads them.
  hp.n_ctx = positive_key(f, a + "context_length");
  hp.n_embd = positive_key(f, a + "embedding_length");
  hp.n_ff = positive_key(f, a + "feed_forward_length");
  hp.n_layer = positive_key(f, a + "block_count");
  if (hp.n_layer > kMaxLayers)
    invalid(a + "block_count = " + std::to_string(hp.n_layer) + " is more than " + std::to_string(kMaxLayers) +
            " layers");
  hp.n_head = positive_key(f, a + "attention.head_count");
  // A per-layer array (diffusion-gemma) is the architecture's to read (finish_hparams).
  const gguf::Value* kv_key = f.find(a + "attention.head_count_kv");
  hp.n_head_kv = kv_key && kv_key->type == gguf::ValueType::ARRAY ? hp.n_head
                                                                  : optional_positive_key(f, a + "attention.head_count_kv", hp.n_head);
  const double eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
  if (!(eps > 0 && eps < 1)) invalid(a + "attention.layer_norm_rms_epsilon = " + std::to_string(eps));
  hp.rms_eps = static_cast<float>(eps);
  const double base = f.find(a + "rope.freq_base") ? f.get_float(a + "rope.freq_base") : 10000.0;
  if (!(base > 1 && base < 1e30)) invalid(a + "rope.freq_base = " + std::to_string(base));
  hp.rope_base = static_cast<float>(base);

  if (hp.n_embd % hp.n_head != 0) {
    invalid(a + "embedding_length = " + std::to_string(hp.n_embd) + " is not a multiple of " + a +
            "attention.head_count = " + std::to_string(hp.n_head));
  }
  hp.head_dim = hp.n_embd / hp.n_head;
  if (spec->head_dim_from_key_length && f.find(a + "attention.key_length")) {
    hp.head_dim = positive_key(f, a + "attention.key_length");
    if (hp.head_dim > 4096) invalid(a + "attention.key_length = " + std::to_string(hp.head_dim));
  }
  for (const char* k : {"attention.key_length", "attention.value_length"}) {
    if (f.find(a + k) && positive_key(f, a + k) != hp.head_dim) {
      invalid(a + k + " = " + std::to_string(f.get_uint(a + k)) + ", expected embedding_length / " +
              "head_count = " + std::to_string(hp.head_dim));
    }
  }
  if (hp.n_head % hp.n_head_kv != 0) {
    invalid(a + "attention.head_count_kv = " + std::to_string(hp.n_head_kv) + " does not divide " + a +
            "attention.head_count = " + std::to_string(hp.n_head));
  }
  hp.n_rot = optional_positive_key(f, a + "rope.dimension_count", hp.head_dim);
  if (hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0) {
    invalid(a + "rope.dimension_count = " + std::to_string(hp.n_rot) + " (head dimension " +
            std::to_string(hp.head_dim) + ")");
  }

  hp.n_vocab = declared_vocab(f, hp.arch_name);
  const uint64_t mask = f.get_uint("tokenizer.ggml.mask_token_id");
  if (mask >= static_cast<uint64_t>(hp.n_vocab)) {
    invalid("tokenizer.ggml.mask_token_id = " + std::to_string(mask) + " is not below the vocabulary size " +
            std::to_string(hp.n_vocab));
  }
  hp.mask_token_id = static_cast<int32_t>(mask);

  spec->finish_hparams(f, hp);
  return hp;
}

namespace detail {

void invalid_metadata(const std::string& what) { invalid(what); }

int64_t positive_key(const gguf::File& f, const std::string& key) {
  uint64_t v = f.get_uint(key);
  if (v == 0 || v > (uint64_t{1} << 40)) invalid(key + " = " + std::to_string(v));
  return static_cast<int64_t>(v);
}

void read_moe_hparams(const gguf::File& f, HParams& hp) {
  const std::string a = hp.arch_name + ".";
  hp.n_expert = positive_key(f, a + "expert_count");
  if (hp.n_expert > 4096) invalid(a + "expert_count = " + std::to_string(hp.n_expert) + " is more than 4096");
  hp.n_expert_used = positive_key(f, a + "expert_used_count");
  if (hp.n_expert_used > hp.n_expert) {
    invalid(a + "expert_used_count = " + std::to_string(hp.n_expert_used) + " is more than " + a +
            "expert_count = " + std::to_string(hp.n_expert));
  }
  // As llama.cpp: without the key, the FFN width shared by the experts in use.
  hp.n_ff_exp = f.find(a + "expert_feed_forward_length") ? positive_key(f, a + "expert_feed_forward_length")
                                                          : hp.n_ff / hp.n_expert_used;
  if (hp.n_ff_exp == 0) invalid(a + "feed_forward_length = " + std::to_string(hp.n_ff) + " (no expert width)");
}

}  // namespace detail

namespace {

const gguf::TensorInfo* require(const gguf::File& f, const std::string& name, std::vector<int64_t> shape) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw Error("required tensor missing: " + name);
  if (!quant::can_dequantize(t->type())) {
    throw Error("unsupported GGUF tensor type: " + ggml_type_name(t->type_id) + " (tensor " + name + ")");
  }
  bool same = t->n_dims == shape.size();
  for (size_t i = 0; same && i < shape.size(); ++i) same = t->ne[i] == shape[i];
  if (!same) {
    throw Error("tensor shape mismatch for " + name + ": " + shape_string(t->ne, t->n_dims) + ", expected " +
                shape_string(shape.data(), static_cast<uint32_t>(shape.size())));
  }
  if (t->ne[0] % t->type_info.block_size != 0) {
    throw Error("tensor " + name + " has rows of " + std::to_string(t->ne[0]) + " values, not a multiple of the " +
                ggml_type_name(t->type_id) + " block size " + std::to_string(t->type_info.block_size));
  }
  return t;
}

}  // namespace

std::vector<const gguf::TensorInfo*> LayerTensors::matrices() const {
  std::vector<const gguf::TensorInfo*> out;
  for (const gguf::TensorInfo* t :
       {wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down, ffn_gate_exps, ffn_up_exps, ffn_gate_up_exps, ffn_down_exps})
    if (t) out.push_back(t);
  return out;
}

const gguf::TensorInfo* detail::require_tensor(const gguf::File& f, const std::string& name, std::vector<int64_t> shape) {
  return require(f, name, std::move(shape));
}

ModelTensors check_tensors(const gguf::File& f, const HParams& hp) {
  if (const auto own = arch_spec(hp.arch).check_tensors) return own(f, hp);
  const int64_t D = hp.n_embd, Q = hp.q_dim(), KV = hp.kv_dim(), F = hp.n_ff, V = hp.n_vocab;
  const int64_t E = hp.n_expert, Fe = hp.n_ff_exp, d = hp.head_dim;
  ModelTensors m;
  // block_count sizes the layer list: checked against the tensors the file holds before anything is sized by it.
  const int64_t per_layer = (hp.qkv_bias ? 12 : 9) + (hp.qk_norm ? 2 : 0) + (hp.moe() ? 1 : 0), present = static_cast<int64_t>(f.tensors().size());
  if (hp.n_layer > present / per_layer) {
    invalid(hp.arch_name + ".block_count = " + std::to_string(hp.n_layer) + ", but the file holds only " +
            std::to_string(present) + " tensors (" + std::to_string(hp.n_layer) + " layers need " +
            std::to_string(per_layer) + " each)");
  }
  m.token_embd = require(f, "token_embd.weight", {D, V});
  m.layers.resize(static_cast<size_t>(hp.n_layer));
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerTensors& l = m.layers[static_cast<size_t>(i)];
    l.attn_norm = require(f, p + "attn_norm.weight", {D});
    l.wq = require(f, p + "attn_q.weight", {D, Q});
    l.wk = require(f, p + "attn_k.weight", {D, KV});
    l.wv = require(f, p + "attn_v.weight", {D, KV});
    if (hp.qkv_bias) {
      l.bq = require(f, p + "attn_q.bias", {Q});
      l.bk = require(f, p + "attn_k.bias", {KV});
      l.bv = require(f, p + "attn_v.bias", {KV});
    }
    if (hp.qk_norm) {
      l.attn_q_norm = require(f, p + "attn_q_norm.weight", {d});
      l.attn_k_norm = require(f, p + "attn_k_norm.weight", {d});
    }
    l.wo = require(f, p + "attn_output.weight", {Q, D});
    l.ffn_norm = require(f, p + "ffn_norm.weight", {D});
    if (hp.moe()) {
      l.ffn_gate_inp = require(f, p + "ffn_gate_inp.weight", {D, E});
      l.ffn_gate_exps = require(f, p + "ffn_gate_exps.weight", {D, Fe, E});
      l.ffn_up_exps = require(f, p + "ffn_up_exps.weight", {D, Fe, E});
      l.ffn_down_exps = require(f, p + "ffn_down_exps.weight", {Fe, D, E});
    } else {
      l.ffn_gate = require(f, p + "ffn_gate.weight", {D, F});
      l.ffn_up = require(f, p + "ffn_up.weight", {D, F});
      l.ffn_down = require(f, p + "ffn_down.weight", {F, D});
    }
  }
  m.output_norm = require(f, "output_norm.weight", {D});
  const bool tied = arch_spec(hp.arch).tied_output && !f.find_tensor("output.weight");
  m.output = tied ? m.token_embd : require(f, "output.weight", {D, V});
  return m;
}

}  // namespace dllm::model
