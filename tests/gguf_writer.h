// A small GGUF v3 writer for tests (header-only): metadata of the common value types and tensors of any
// type given as raw bytes, so tests can build model files with exactly one thing wrong. Plus a tiny
// llada/dream/llada-moe/rnd1 model in that writer (random F32 weights) that the loader accepts as it is.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/ggml_types.h"

namespace dllm::test {

class GgufWriter {
 public:
  void add_u32(const std::string& key, uint32_t v) { set(key, 4, pod(v)); }
  void add_f32(const std::string& key, float v) { set(key, 6, pod(v)); }
  void add_bool(const std::string& key, bool v) { set(key, 7, {static_cast<uint8_t>(v ? 1 : 0)}); }
  void add_string(const std::string& key, const std::string& v) { set(key, 8, str(v)); }
  void add_string_array(const std::string& key, const std::vector<std::string>& v) {
    std::vector<uint8_t> b = pod(uint32_t{8});
    append(b, pod(static_cast<uint64_t>(v.size())));
    for (const auto& s : v) append(b, str(s));
    set(key, 9, b);
  }
  void remove_key(const std::string& key) { std::erase_if(kvs_, [&](const Kv& kv) { return kv.key == key; }); }

  // ne[0] is the row length. The bytes must match what the type needs for that shape.
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, std::vector<uint8_t> bytes) {
    remove_tensor(name);
    tensors_.push_back(Tensor{name, static_cast<uint32_t>(type), std::move(ne), std::move(bytes)});
  }
  void add_f32_tensor(const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    add_tensor(name, GgmlType::F32, std::move(ne), std::move(b));
  }
  void remove_tensor(const std::string& name) {
    std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
  }

  void write(const std::string& path) const {
    constexpr uint64_t kAlign = 32;
    std::vector<uint8_t> out;
    append(out, {'G', 'G', 'U', 'F'});
    append(out, pod(uint32_t{3}));
    append(out, pod(static_cast<uint64_t>(tensors_.size())));
    append(out, pod(static_cast<uint64_t>(kvs_.size())));
    for (const Kv& kv : kvs_) {
      append(out, str(kv.key));
      append(out, pod(kv.type));
      append(out, kv.value);
    }
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      append(out, str(t.name));
      append(out, pod(static_cast<uint32_t>(t.ne.size())));
      for (int64_t d : t.ne) append(out, pod(static_cast<uint64_t>(d)));
      append(out, pod(t.type));
      append(out, pod(offset));
      offsets.push_back(offset);
      offset += (t.bytes.size() + kAlign - 1) / kAlign * kAlign;
    }
    out.resize((out.size() + kAlign - 1) / kAlign * kAlign, 0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data_start + offsets[i], 0);
      append(out, tensors_[i].bytes);
    }
    out.resize(data_start + offset, 0);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
  }

 private:
  struct Kv {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> value;
  };
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };

  template <class T>
  static std::vector<uint8_t> pod(T v) {
    std::vector<uint8_t> b(sizeof v);
    std::memcpy(b.data(), &v, sizeof v);
    return b;
  }
  static std::vector<uint8_t> str(const std::string& s) {
    const uint64_t n = s.size();
    std::vector<uint8_t> b(sizeof n + s.size());
    std::memcpy(b.data(), &n, sizeof n);
    if (n) std::memcpy(b.data() + sizeof n, s.data(), s.size());
    return b;
  }
  static void append(std::vector<uint8_t>& dst, const std::vector<uint8_t>& src) {
    dst.insert(dst.end(), src.begin(), src.end());
  }
  void set(const std::string& key, uint32_t type, std::vector<uint8_t> value) {
    remove_key(key);
    kvs_.push_back(Kv{key, type, std::move(value)});
  }

  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

// Shape of a tiny test model. D must be a multiple of 256 for tests that store a K-quant/IQ tensor.
struct TinyModelSpec {
  std::string arch = "llada";  // "llada", "dream", "llada-moe" or "rnd1"
  int64_t n_layer = 1, n_embd = 256, n_head = 4, n_head_kv = 4, n_ff = 64, n_vocab = 48;
  int64_t n_expert = 4, n_expert_used = 2;  // llada-moe and rnd1: n_ff is each expert's width
  uint32_t mask_token_id = 47;
  uint32_t seed = 7;
};

// A complete, loadable model file with random F32 weights (biases for dream).
inline GgufWriter tiny_model(const TinyModelSpec& s) {
  GgufWriter w;
  const std::string a = s.arch + ".";
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", "tiny-test-" + s.arch);
  w.add_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w.add_u32(a + "context_length", 512);
  w.add_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.add_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  w.add_f32(a + "rope.freq_base", s.arch == "dream" ? 1000000.0f : 500000.0f);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", s.arch == "dream" ? 1e-6f : 1e-5f);
  w.add_bool(a + "attention.causal", false);
  const bool moe = s.arch == "llada-moe" || s.arch == "rnd1";
  if (moe) {
    w.add_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
    w.add_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
    w.add_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff));
  }
  w.add_string("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < s.n_vocab; ++i) tokens.push_back("t" + std::to_string(i));
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_u32("tokenizer.ggml.mask_token_id", s.mask_token_id);

  std::mt19937 rng(s.seed);
  auto random = [&](int64_t n, float mean, float std) {
    std::normal_distribution<float> dist(mean, std);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    return v;
  };
  const int64_t D = s.n_embd, d = D / s.n_head, KV = s.n_head_kv * d, F = s.n_ff, V = s.n_vocab;
  w.add_f32_tensor("token_embd.weight", {D, V}, random(D * V, 0, 1));
  for (int64_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    w.add_f32_tensor(p + "attn_norm.weight", {D}, random(D, 1, 0.1f));
    w.add_f32_tensor(p + "attn_q.weight", {D, D}, random(D * D, 0, 0.1f));
    w.add_f32_tensor(p + "attn_k.weight", {D, KV}, random(D * KV, 0, 0.1f));
    w.add_f32_tensor(p + "attn_v.weight", {D, KV}, random(D * KV, 0, 0.1f));
    if (s.arch == "dream") {
      w.add_f32_tensor(p + "attn_q.bias", {D}, random(D, 0, 0.2f));
      w.add_f32_tensor(p + "attn_k.bias", {KV}, random(KV, 0, 0.2f));
      w.add_f32_tensor(p + "attn_v.bias", {KV}, random(KV, 0, 0.2f));
    }
    w.add_f32_tensor(p + "attn_output.weight", {D, D}, random(D * D, 0, 0.1f));
    w.add_f32_tensor(p + "ffn_norm.weight", {D}, random(D, 1, 0.1f));
    if (moe) {
      const int64_t E = s.n_expert;
      w.add_f32_tensor(p + "attn_q_norm.weight", {d}, random(d, 1, 0.1f));
      w.add_f32_tensor(p + "attn_k_norm.weight", {d}, random(d, 1, 0.1f));
      w.add_f32_tensor(p + "ffn_gate_inp.weight", {D, E}, random(D * E, 0, 0.25f));
      w.add_f32_tensor(p + "ffn_gate_exps.weight", {D, F, E}, random(D * F * E, 0, 0.0625f));
      w.add_f32_tensor(p + "ffn_up_exps.weight", {D, F, E}, random(D * F * E, 0, 0.0625f));
      w.add_f32_tensor(p + "ffn_down_exps.weight", {F, D, E}, random(F * D * E, 0, 0.036f));
      continue;
    }
    w.add_f32_tensor(p + "ffn_gate.weight", {D, F}, random(D * F, 0, 0.0625f));
    w.add_f32_tensor(p + "ffn_up.weight", {D, F}, random(D * F, 0, 0.0625f));
    w.add_f32_tensor(p + "ffn_down.weight", {F, D}, random(F * D, 0, 0.036f));
  }
  w.add_f32_tensor("output_norm.weight", {D}, random(D, 1, 0.1f));
  w.add_f32_tensor("output.weight", {D, V}, random(D * V, 0, 0.6f));
  return w;
}

}  // namespace dllm::test
