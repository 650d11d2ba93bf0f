// Synthetic model writer: metadata and vocabulary as the llama.cpp converters write them for LLaDA / Dream /
// LLaDA-MoE / RND1 / DiffusionGemma, and random quantized blocks (Q4_K, Q5_0, Q5_K, Q6_K, Q8_0) streamed tensor
// by tensor through gguf::Writer.
#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "common/error.h"
#include "model/gguf_writer.h"
#include "model/quant.h"

namespace dllm::synth {

namespace {

// xoshiro256** seeded through splitmix64: fast, good enough for random weights.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0], s_[3] ^= s_[1], s_[1] ^= s_[2], s_[0] ^= s_[3], s_[2] ^= t, s_[3] = rotl(s_[3], 45);
    return r;
  }
  void fill(uint8_t* p, size_t n) {
    while (n >= 8) {
      uint64_t v = next();
      std::memcpy(p, &v, 8);
      p += 8, n -= 8;
    }
    if (n) {
      uint64_t v = next();
      std::memcpy(p, &v, n);
    }
  }
  int uniform(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); }
  float uniform_f(float lo, float hi) { return lo + (hi - lo) * static_cast<float>((next() >> 40) * 0x1p-24); }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void put_half(uint8_t* p, float v) {
  uint16_t h = quant::f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// One Q4_K super-block (144 bytes) with weights d*S*(q - 7.5): sub-block scales S = mins, dmin = 7.5 d.
void q4_k_block(Rng& rng, float sigma, uint8_t* b) {
  const float d = sigma / (51.5f * 4.61f);  // mean S ~ 51.5, std of (q - 7.5) over 0..15 ~ 4.61
  put_half(b, d);
  put_half(b + 2, 7.5f * d);
  uint8_t sc[8];
  for (auto& s : sc) s = static_cast<uint8_t>(rng.uniform(40, 63));
  uint8_t* scales = b + 4;
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));  // mins = scales
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((sc[j + 4] & 0xF) << 4));
  }
  rng.fill(b + 16, 128);
}

// One Q5_K super-block (176 bytes) with weights d*S*(q - 15.5), q in 0..31: mins = scales, dmin = 15.5 d.
void q5_k_block(Rng& rng, float sigma, uint8_t* b) {
  q4_k_block(rng, sigma, b);  // d, dmin, the 12 scale bytes and 128 random bytes (rewritten below)
  const float d = sigma / (51.5f * 9.23f);  // std of (q - 15.5) over 0..31 ~ 9.23
  put_half(b, d);
  put_half(b + 2, 15.5f * d);
  rng.fill(b + 16, 32 + 128);  // qh, qs
}

// One Q6_K super-block (210 bytes): ql, qh random, 16 int8 scales, d.
void q6_k_block(Rng& rng, float sigma, uint8_t* b) {
  rng.fill(b, 128 + 64);
  int8_t* scales = reinterpret_cast<int8_t*>(b + 192);
  for (int j = 0; j < 16; ++j) scales[j] = static_cast<int8_t>(rng.uniform(8, 24));
  put_half(b + 208, sigma / (16.0f * 18.47f));
}

// One Q8_0 block (34 bytes).
void q8_0_block(Rng& rng, float sigma, uint8_t* b) {
  put_half(b, sigma / 73.9f);
  rng.fill(b + 2, 32);
}

// One Q5_0 block (22 bytes): weights d*(q - 16), q in 0..31 (std ~ 9.23).
void q5_0_block(Rng& rng, float sigma, uint8_t* b) {
  put_half(b, sigma / 9.23f);
  rng.fill(b + 2, 4 + 16);
}

bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// GPT-2's byte-to-unicode table: the text of byte token i, in the order the converters write them.
std::vector<std::string> byte_tokens() {
  std::vector<int> bs, cs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool found = false;
    for (int x : bs) found = found || x == b;
    if (!found) bs.push_back(b), cs.push_back(256 + n++);
  }
  std::vector<std::string> out;
  for (int c : cs) {
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    out.push_back(s);
  }
  return out;
}

const char* kLladaTemplate =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}";
const char* kDreamTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
};

// Byte tokens, then merge results (each the concatenation of two earlier tokens), then the special and
// padding rows at the ids the real models use.
Vocab make_vocab(const Shape& shape, uint64_t seed) {
  const SpecialIds sp = special_ids(shape);
  const int64_t V = shape.n_vocab;
  Vocab v;
  v.tokens.assign(V, "");
  v.types.assign(V, 1);
  std::vector<std::pair<int32_t, std::string>> specials;
  int32_t first_special = 0;
  if (shape.arch == "llada" || shape.arch == "llada-moe") {
    const bool real = V == 126464 && shape.arch == "llada";
    specials = {{sp.bos, "<|startoftext|>"}, {sp.eos, "<|endoftext|>"}, {sp.mask, "<|mdm_mask|>"},
                {sp.eot - 2, "<|start_header_id|>"}, {sp.eot - 1, "<|end_header_id|>"}, {sp.eot, "<|eot_id|>"}};
    first_special = real ? 126080 : sp.bos;
    for (int32_t id = first_special; id < sp.eot; ++id)
      if (real && id > sp.eos && id < sp.eot - 2 && id != sp.mask)
        specials.push_back({id, "<|reserved_token_" + std::to_string(id - 126084) + "|>"});
  } else {
    specials = {{sp.eos, "<|endoftext|>"}, {sp.eos + 1, "<|im_start|>"}, {sp.eot, "<|im_end|>"}, {sp.mask, "<|mask|>"}};
    first_special = sp.eos;
    for (int32_t id = sp.eot + 1; id < sp.mask; ++id) specials.push_back({id, "<|extra_" + std::to_string(id) + "|>"});
  }
  const int32_t last_special = sp.pad_begin - 1;
  for (auto& [id, text] : specials) v.tokens[id] = text, v.types[id] = 3;
  for (int64_t id = last_special + 1; id < V; ++id)
    v.tokens[id] = "[PAD" + std::to_string(id) + "]", v.types[id] = 5;

  auto bytes = byte_tokens();
  std::unordered_set<std::string> seen;
  for (int i = 0; i < 256; ++i) v.tokens[i] = bytes[i], seen.insert(bytes[i]);
  Rng rng(seed ^ 0x766f636162ull);
  for (int32_t id = 256; id < first_special; ++id) {
    for (;;) {
      int32_t a = rng.uniform(0, id - 1), b = rng.uniform(0, id - 1);
      if (v.tokens[a].size() + v.tokens[b].size() > 24) continue;
      std::string t = v.tokens[a] + v.tokens[b];
      if (!seen.insert(t).second) continue;
      v.tokens[id] = t;
      v.merges.push_back(v.tokens[a] + " " + v.tokens[b]);
      break;
    }
  }
  return v;
}

// gemma4 vocabulary as the DiffusionGemma converter writes it: the control tokens at Gemma's ids (<pad> <eos>
// <bos> <unk> <mask>, the turn markers), the seven user-defined "visible" tokens, newline, space (U+2581) and
// tab runs, the 256 <0xXX> byte-fallback tokens, single characters, then merge results over raw UTF-8.
Vocab make_gemma4_vocab(int64_t V, uint64_t seed) {
  Vocab v;
  auto add = [&](const std::string& text, int32_t type) { v.tokens.push_back(text), v.types.push_back(type); };
  for (const char* t : {"<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]", "<|turn>", "<turn|>"}) add(t, 3);
  for (const char* t : {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                        "<tool_response|>", "<|\"|>"})
    add(t, 4);
  for (const char* t : {"<|image>", "<image|>", "<|audio>", "<audio|>", "<|image_soft_token|>", "<|audio_soft_token|>"})
    add(t, 3);
  for (int i = 0; i < 16; ++i) add("<unused" + std::to_string(i) + ">", 3);
  const std::string space = "\xE2\x96\x81";  // U+2581
  std::string run;
  for (int i = 1; i <= 31; ++i) add(std::string(static_cast<size_t>(i), '\n'), 1);
  run = space;
  for (int i = 2; i <= 31; ++i) run += space, add(run, 1);
  for (int i = 1; i <= 8; ++i) add(std::string(static_cast<size_t>(i), '\t'), 1);
  static const char hex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) add(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 6);
  const size_t first_char = v.tokens.size();
  add(space, 1);
  for (int c = '!'; c <= '~'; ++c) add(std::string(1, static_cast<char>(c)), 1);
  for (int c = 0xA1; c <= 0x24F; ++c)  // Latin-1 and Latin Extended letters, as UTF-8
    add(std::string{static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))}, 1);
  if (static_cast<int64_t>(v.tokens.size()) > V) throw Error("synthetic gemma4 vocabulary needs at least 1024 tokens");
  std::unordered_set<std::string> seen(v.tokens.begin(), v.tokens.end());
  Rng rng(seed ^ 0x67656d6d6134ull);
  const int32_t lo = static_cast<int32_t>(first_char);
  while (static_cast<int64_t>(v.tokens.size()) < V) {
    const int32_t n = static_cast<int32_t>(v.tokens.size());
    const int32_t a = rng.uniform(lo, n - 1), b = rng.uniform(lo, n - 1);
    if (v.tokens[a].size() + v.tokens[b].size() > 24) continue;
    std::string t = v.tokens[a] + v.tokens[b];
    if (!seen.insert(t).second) continue;
    v.merges.push_back(v.tokens[a] + " " + v.tokens[b]);
    add(t, 1);
  }
  return v;
}

// A Gemma-4-style chat template: a system turn, `model` for the assistant, `<|turn>model\n` to generate.
const char* kGemma4Template =
    "{{- bos_token -}}"
    "{%- set loop_messages = messages -%}"
    "{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}"
    "{{- '<|turn>system\n' + (messages[0]['content'] | trim) + '<turn|>\n' -}}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\n' + (message['content'] | trim) + '<turn|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}{%- endif -%}";

// A tensor and how its values are made.
struct Spec {
  Spec(std::string n, GgmlType t, std::vector<int64_t> shape, float s, float f = 1.0f)
      : name(std::move(n)), type(t), ne(std::move(shape)), sigma(s), fill(f) {}
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  float sigma;                // quantized: the values' standard deviation; F32: 0 = every value `fill`,
  float fill;                 // < 0 = uniform(-|sigma|, |sigma|)
  std::vector<float> values;  // F32 given value by value (rope_freqs)
};

// llama-quantize's fallback for rows that are not whole 256-value super-blocks (Q4_K -> Q5_0, Q6_K -> Q8_0).
GgmlType fit_row(GgmlType t, int64_t ne0) {
  if (ne0 % 256 == 0) return t;
  if (t == GgmlType::Q4_K) return GgmlType::Q5_0;
  if (t == GgmlType::Q6_K) return GgmlType::Q8_0;
  return t;
}

bool known_arch(const std::string& a) {
  return a == "llada" || a == "dream" || a == "llada-moe" || a == "rnd1" || a == "diffusion-gemma";
}

const char* kArchFlagError = "flag --arch must be one of llada|dream|llada-moe|rnd1|diffusion-gemma, got '";

// LLaDA, Dream, LLaDA-MoE, RND1 (and a mixture of experts' dense twin): metadata and tensors.
void describe_classic(const Options& opt, gguf::Writer& w, std::vector<Spec>& specs) {
  Options o = opt;
  const bool moe_types = o.shape.n_expert > 0;  // attention types of a mixture of experts (also its twin's)
  if (o.dense) {
    if (!moe_types) throw usage_error("flag --dense needs a mixture-of-experts --arch (llada-moe or rnd1)");
    if (o.shape.head_dim != 0 && o.shape.head_dim * o.shape.n_head != o.shape.n_embd)
      throw usage_error("flag --dense: the twin is a llada, whose heads must span the width");
    o.shape.arch = "llada";
    o.shape.n_ff = o.shape.n_expert_used * o.shape.n_ff_exp;
    o.shape.n_expert = o.shape.n_expert_used = o.shape.n_ff_exp = 0;
  }
  const Shape& sh = o.shape;
  const bool moe = sh.n_expert > 0, llada_like = sh.arch == "llada" || sh.arch == "llada-moe";
  if (sh.n_layer < 1 || sh.n_head < 1 || sh.n_head_kv < 1 || sh.n_head % sh.n_head_kv || sh.n_embd % sh.n_head ||
      sh.n_embd % 256 || sh.n_ff % 256 || sh.n_vocab < 512)
    throw Error("synthetic model shape is not valid (widths must be multiples of 256, heads must divide evenly)");
  const bool q8 = o.quant == "Q8_0";
  const std::string a = sh.arch;
  const int64_t head_dim = sh.head_dim > 0 ? sh.head_dim : sh.n_embd / sh.n_head, kv_dim = head_dim * sh.n_head_kv;
  const int64_t q_dim = head_dim * sh.n_head;
  const SpecialIds sp = special_ids(sh);

  w.add_string("general.architecture", a);
  w.add_string("general.name", "synthetic-" + (o.dense ? opt.shape.arch + "-dense-twin" : a) +
                                   (sh.n_vocab == real_shape(opt.shape.arch).n_vocab ? "" : "-small"));
  w.add_string("general.description", "dllm synth: random weights with the real shapes (not a trained model)");
  w.add_u32("general.file_type", q8 ? 7 : 15);
  w.add_u32("general.quantization_version", 2);
  w.add_u32(a + ".block_count", static_cast<uint32_t>(sh.n_layer));
  w.add_u32(a + ".context_length", llada_like ? 4096 : 131072);
  w.add_u32(a + ".embedding_length", static_cast<uint32_t>(sh.n_embd));
  w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(sh.n_ff));
  w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(sh.n_head));
  w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(sh.n_head_kv));
  w.add_f32(a + ".rope.freq_base", a == "llada" ? 500000.0f : a == "llada-moe" ? 50000.0f : 1000000.0f);
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", llada_like ? 1e-5f : 1e-6f);
  w.add_bool(a + ".attention.causal", false);
  if (moe) {
    w.add_u32(a + ".expert_count", static_cast<uint32_t>(sh.n_expert));
    w.add_u32(a + ".expert_used_count", static_cast<uint32_t>(sh.n_expert_used));
    w.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(sh.n_ff_exp));
    w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(head_dim));
    w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(head_dim));
    w.add_u32(a + ".rope.dimension_count", static_cast<uint32_t>(head_dim));
  }
  if (a == "llada-moe") w.add_bool("diffusion.shift_logits", false);
  if (a == "llada") {
    w.add_u32("llada.vocab_size", static_cast<uint32_t>(sh.n_vocab));
    w.add_u32("llada.rope.dimension_count", static_cast<uint32_t>(head_dim));
    w.add_bool("diffusion.shift_logits", false);
  }
  {
    const Vocab vocab = make_vocab(sh, o.seed);
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", llada_like ? "bailingmoe" : "qwen2");
    w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
    w.add_i32_array("tokenizer.ggml.token_type", vocab.types);
    w.add_string_array("tokenizer.ggml.merges", vocab.merges);
  }  // written into the header; freed before the weights
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(sp.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(sp.eos));
  w.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(sp.pad));
  w.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(sp.eot));
  w.add_u32("tokenizer.ggml.mask_token_id", static_cast<uint32_t>(sp.mask));
  w.add_bool("tokenizer.ggml.add_bos_token", llada_like);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  w.add_string("tokenizer.chat_template", llada_like ? kLladaTemplate : kDreamTemplate);

  // Q4_K_M as llama-quantize chooses it: Q6_K for the "more bits" layers' down projections (and V of a
  // dense model), Q4_K elsewhere; a mixture of experts' attention keeps K/V in Q8_0 and its output in Q5_K.
  auto mat = [&](const std::string& name, int64_t k, int64_t n, bool more_bits, int64_t experts = 0,
                 GgmlType moe_type = GgmlType::Q4_K) {
    GgmlType t = q8 ? GgmlType::Q8_0 : (more_bits ? GgmlType::Q6_K : GgmlType::Q4_K);
    if (!q8 && moe_type != GgmlType::Q4_K) t = moe_type;
    std::vector<int64_t> ne{k, n};
    if (experts > 0) ne.push_back(experts);
    specs.push_back({name, t, ne, 1.0f / std::sqrt(static_cast<float>(k))});
  };
  specs.push_back({"token_embd.weight", q8 ? GgmlType::Q8_0 : GgmlType::Q4_K, {sh.n_embd, sh.n_vocab}, 1.0f});
  specs.push_back({"output_norm.weight", GgmlType::F32, {sh.n_embd}, 0.0f});
  mat("output.weight", sh.n_embd, sh.n_vocab, true);
  const GgmlType kv_type = moe_types ? GgmlType::Q8_0 : GgmlType::Q4_K;
  const GgmlType out_type = moe_types ? GgmlType::Q5_K : GgmlType::Q4_K;
  for (int64_t i = 0; i < sh.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool more = use_more_bits(i, sh.n_layer);
    specs.push_back({p + "attn_norm.weight", GgmlType::F32, {sh.n_embd}, 0.0f});
    mat(p + "attn_q.weight", sh.n_embd, q_dim, false);
    mat(p + "attn_k.weight", sh.n_embd, kv_dim, false, 0, kv_type);
    mat(p + "attn_v.weight", sh.n_embd, kv_dim, more, 0, kv_type);
    if (a == "dream") {
      specs.push_back({p + "attn_q.bias", GgmlType::F32, {sh.n_embd}, -0.1f});
      specs.push_back({p + "attn_k.bias", GgmlType::F32, {kv_dim}, -0.1f});
      specs.push_back({p + "attn_v.bias", GgmlType::F32, {kv_dim}, -0.1f});
    }
    mat(p + "attn_output.weight", q_dim, sh.n_embd, false, 0, out_type);
    if (moe) {
      specs.push_back({p + "attn_q_norm.weight", GgmlType::F32, {head_dim}, 0.0f});
      specs.push_back({p + "attn_k_norm.weight", GgmlType::F32, {head_dim}, 0.0f});
    }
    specs.push_back({p + "ffn_norm.weight", GgmlType::F32, {sh.n_embd}, 0.0f});
    if (!moe) {
      mat(p + "ffn_gate.weight", sh.n_embd, sh.n_ff, false);
      mat(p + "ffn_up.weight", sh.n_embd, sh.n_ff, false);
      mat(p + "ffn_down.weight", sh.n_ff, sh.n_embd, more);
      continue;
    }
    // The router (F32 in every file; wide enough that experts are chosen apart), then the experts.
    specs.push_back({p + "ffn_gate_inp.weight", GgmlType::F32, {sh.n_embd, sh.n_expert},
                     -4.0f / std::sqrt(static_cast<float>(sh.n_embd))});
    mat(p + "ffn_gate_exps.weight", sh.n_embd, sh.n_ff_exp, false, sh.n_expert);
    mat(p + "ffn_up_exps.weight", sh.n_embd, sh.n_ff_exp, false, sh.n_expert);
    mat(p + "ffn_down_exps.weight", sh.n_ff_exp, sh.n_embd, more, sh.n_expert);
  }
}

// DiffusionGemma (a Gemma-4 mixture of experts under uniform-state block diffusion): the keys and tensors the
// fork's converter writes for the published file (../shared/fixtures/diffusion-gemma/README.md), no
// diffusion.eb_* keys (the published file has none), and the Q4_K_M mix llama-quantize makes of it: Q6_K for
// the tied embedding / head, Q8_0 attention K/V, Q5_K attention output, Q4_K elsewhere, and 2112- or
// 704-wide down-projection rows falling back to Q5_0 (Q8_0 in the "more bits" layers).
void describe_diffusion_gemma(const Options& o, gguf::Writer& w, std::vector<Spec>& specs) {
  const Shape& sh = o.shape;
  if (o.dense) throw usage_error("flag --dense needs a mixture-of-experts --arch (llada-moe or rnd1)");
  const bool heads_ok = sh.n_head >= 1 && sh.n_head_kv >= 1 && sh.n_head_kv_swa >= 1 && sh.n_head % sh.n_head_kv == 0 &&
                        sh.n_head % sh.n_head_kv_swa == 0;
  const bool dims_ok = sh.head_dim >= 32 && sh.head_dim_swa >= 32 && sh.head_dim % 32 == 0 && sh.head_dim_swa % 32 == 0 &&
                       (sh.n_head * sh.head_dim_swa) % 256 == 0 && (sh.n_head * sh.head_dim) % 256 == 0;
  if (sh.n_layer < 1 || !heads_ok || !dims_ok || sh.n_embd % 256 || sh.n_ff < 32 || sh.n_ff % 32 || sh.n_ff_exp < 32 ||
      sh.n_ff_exp % 32 || sh.n_expert < 1 || sh.n_expert_used < 1 || sh.n_expert_used > sh.n_expert || sh.n_vocab < 1024 ||
      sh.n_swa < 1 || sh.canvas < 1)
    throw Error("synthetic diffusion-gemma shape is not valid (width a multiple of 256, FFN widths and head dims "
                "of 32, heads dividing evenly, at least 1024 tokens)");
  const bool q8 = o.quant == "Q8_0";
  const std::string a = "diffusion-gemma.";
  std::vector<bool> sliding;
  std::vector<int32_t> kv_heads;
  for (int64_t i = 0; i < sh.n_layer; ++i) {
    sliding.push_back(sliding_layer(i, sh.n_layer));
    kv_heads.push_back(static_cast<int32_t>(sliding.back() ? sh.n_head_kv_swa : sh.n_head_kv));
  }
  auto u32 = [](int64_t x) { return static_cast<uint32_t>(x); };
  w.add_string("general.architecture", "diffusion-gemma");
  w.add_string("general.type", "model");
  w.add_string("general.name", std::string("synthetic-diffusion-gemma") + (sh.n_vocab == 262144 ? "" : "-small"));
  w.add_string("general.description", "dllm synth: random weights with the real shapes (not a trained model)");
  w.add_u32(a + "block_count", u32(sh.n_layer));
  w.add_u32(a + "context_length", 262144);
  w.add_u32(a + "embedding_length", u32(sh.n_embd));
  w.add_u32(a + "feed_forward_length", u32(sh.n_ff));
  w.add_u32(a + "attention.head_count", u32(sh.n_head));
  w.add_f32(a + "rope.freq_base", 1000000.0f);
  w.add_f32(a + "rope.freq_base_swa", 10000.0f);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.add_u32(a + "expert_count", u32(sh.n_expert));
  w.add_u32(a + "expert_used_count", u32(sh.n_expert_used));
  w.add_f32(a + "final_logit_softcapping", 30.0f);
  w.add_u32(a + "attention.sliding_window", u32(sh.n_swa));
  w.add_u32(a + "attention.shared_kv_layers", 0);
  w.add_u32(a + "embedding_length_per_layer_input", 0);
  w.add_bool_array(a + "attention.sliding_window_pattern", sliding);
  w.add_u32(a + "attention.key_length", u32(sh.head_dim));
  w.add_u32(a + "attention.value_length", u32(sh.head_dim));
  w.add_u32(a + "attention.key_length_swa", u32(sh.head_dim_swa));
  w.add_u32(a + "attention.value_length_swa", u32(sh.head_dim_swa));
  w.add_u32(a + "expert_feed_forward_length", u32(sh.n_ff_exp));
  w.add_i32_array(a + "attention.head_count_kv", kv_heads);
  w.add_u32(a + "rope.dimension_count", u32(sh.head_dim));
  w.add_u32(a + "rope.dimension_count_swa", u32(sh.head_dim_swa));
  w.add_bool(a + "attention.causal", false);
  w.add_u32("diffusion.canvas_length", u32(sh.canvas));
  {
    const Vocab vocab = make_gemma4_vocab(sh.n_vocab, o.seed);
    w.add_string("tokenizer.ggml.model", "gemma4");
    w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
    w.add_f32_array("tokenizer.ggml.scores", std::vector<float>(vocab.tokens.size(), -1000.0f));
    w.add_i32_array("tokenizer.ggml.token_type", vocab.types);
    w.add_string_array("tokenizer.ggml.merges", vocab.merges);
  }
  const SpecialIds sp = special_ids(sh);
  w.add_u32("tokenizer.ggml.bos_token_id", u32(sp.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", u32(sp.eos));
  w.add_u32("tokenizer.ggml.unknown_token_id", 3);
  w.add_u32("tokenizer.ggml.padding_token_id", u32(sp.pad));
  w.add_u32("tokenizer.ggml.mask_token_id", u32(sp.mask));
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  w.add_string("tokenizer.chat_template", kGemma4Template);
  w.add_bool("tokenizer.ggml.add_space_prefix", false);
  w.add_u32("general.quantization_version", 2);
  w.add_u32("general.file_type", q8 ? 7 : 15);

  auto mat = [&](const std::string& name, GgmlType type, std::vector<int64_t> ne) {
    const float sigma = 1.0f / std::sqrt(static_cast<float>(ne[0]));
    specs.push_back({name, q8 ? GgmlType::Q8_0 : fit_row(type, ne[0]), std::move(ne), sigma});
  };
  auto ones = [&](const std::string& name, int64_t n, float fill = 1.0f) {
    specs.push_back({name, GgmlType::F32, {n}, 0.0f, fill});
  };
  // Tied embedding and head: logits with a standard deviation of about 3 (under the softcap of 30).
  specs.push_back({"token_embd.weight", q8 ? GgmlType::Q8_0 : GgmlType::Q6_K, {sh.n_embd, sh.n_vocab},
                   3.0f / std::sqrt(static_cast<float>(sh.n_embd))});
  // Proportional RoPE of the global layers: a quarter of the head's dimensions rotate.
  Spec freqs{"rope_freqs.weight", GgmlType::F32, {sh.head_dim / 2}, 0.0f};
  for (int64_t j = 0; j < sh.head_dim / 2; ++j) freqs.values.push_back(j < sh.head_dim / 8 ? 1.0f : 1e30f);
  specs.push_back(std::move(freqs));
  ones("output_norm.weight", sh.n_embd);
  ones("self_cond_pre_norm.weight", sh.n_embd);
  mat("self_cond_gate.weight", GgmlType::Q4_K, {sh.n_embd, sh.n_ff});
  mat("self_cond_up.weight", GgmlType::Q4_K, {sh.n_embd, sh.n_ff});
  mat("self_cond_down.weight", GgmlType::Q4_K, {sh.n_ff, sh.n_embd});
  for (int64_t i = 0; i < sh.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool more = use_more_bits(i, sh.n_layer), swa = sliding[static_cast<size_t>(i)];
    const int64_t hd = swa ? sh.head_dim_swa : sh.head_dim, kv = kv_heads[static_cast<size_t>(i)];
    // Unscaled attention: q and k norms of sqrt(2.5 / sqrt(hd)) give scores with a standard deviation of 2.5.
    const float qk = std::sqrt(2.5f / std::sqrt(static_cast<float>(hd)));
    ones(p + "attn_norm.weight", sh.n_embd);
    mat(p + "attn_q.weight", GgmlType::Q4_K, {sh.n_embd, sh.n_head * hd});
    mat(p + "attn_k.weight", GgmlType::Q8_0, {sh.n_embd, kv * hd});
    if (swa) mat(p + "attn_v.weight", GgmlType::Q8_0, {sh.n_embd, kv * hd});
    mat(p + "attn_output.weight", GgmlType::Q5_K, {sh.n_head * hd, sh.n_embd});
    ones(p + "attn_q_norm.weight", hd, qk);
    ones(p + "attn_k_norm.weight", hd, qk);
    ones(p + "post_attention_norm.weight", sh.n_embd);
    ones(p + "ffn_norm.weight", sh.n_embd);
    mat(p + "ffn_gate.weight", GgmlType::Q4_K, {sh.n_embd, sh.n_ff});
    mat(p + "ffn_up.weight", GgmlType::Q4_K, {sh.n_embd, sh.n_ff});
    mat(p + "ffn_down.weight", more ? GgmlType::Q6_K : GgmlType::Q4_K, {sh.n_ff, sh.n_embd});
    ones(p + "post_ffw_norm_1.weight", sh.n_embd);
    // The router sees a unit-length input: uniform weights of standard deviation 1.5 spread its logits.
    specs.push_back({p + "ffn_gate_inp.weight", GgmlType::F32, {sh.n_embd, sh.n_expert}, -1.5f * std::sqrt(3.0f)});
    ones(p + "ffn_gate_inp.scale", sh.n_embd);
    ones(p + "pre_ffw_norm_2.weight", sh.n_embd);
    mat(p + "ffn_gate_up_exps.weight", GgmlType::Q4_K, {sh.n_embd, 2 * sh.n_ff_exp, sh.n_expert});
    mat(p + "ffn_down_exps.weight", more ? GgmlType::Q6_K : GgmlType::Q4_K, {sh.n_ff_exp, sh.n_embd, sh.n_expert});
    ones(p + "ffn_down_exps.scale", sh.n_expert);
    ones(p + "post_ffw_norm_2.weight", sh.n_embd);
    ones(p + "post_ffw_norm.weight", sh.n_embd);
    ones(p + "layer_output_scale.weight", 1);
    ones(p + "enc_layer_output_scale.weight", 1);
  }
}

// Declares the tensors and streams their random values into `path`.
uint64_t write_tensors(gguf::Writer& w, const std::vector<Spec>& specs, const std::string& path, uint64_t seed,
                       const Progress& progress) {
  for (const auto& s : specs) w.add_tensor(s.name, s.type, s.ne);
  const uint64_t total = w.file_size();
  uint64_t done = total - [&] {
    uint64_t t = 0;
    for (size_t i = 0; i < w.n_tensors(); ++i) t += w.tensor_bytes(i);
    return t;
  }();
  std::vector<uint8_t> buf;
  w.write(path, [&](size_t i, gguf::DataSink& sink) {
    const Spec& s = specs[i];
    Rng rng(seed * 0x2545F4914F6CDD1Dull ^ name_hash(s.name));
    if (s.type == GgmlType::F32) {
      std::vector<float> v = s.values;
      if (v.empty()) {
        int64_t count = 1;
        for (int64_t n : s.ne) count *= n;
        v.resize(static_cast<size_t>(count));
        for (auto& x : v) x = s.sigma == 0.0f ? s.fill : rng.uniform_f(-std::fabs(s.sigma), std::fabs(s.sigma));
      }
      sink.write(v.data(), v.size() * 4);
      done += v.size() * 4;
      return;
    }
    const auto info = *ggml_type_info(static_cast<uint32_t>(s.type));
    const uint64_t row_blocks = static_cast<uint64_t>(s.ne[0]) / info.block_size;
    const uint64_t row_bytes = row_blocks * info.type_size;
    const int64_t rows_per_chunk = std::max<int64_t>(1, static_cast<int64_t>((4u << 20) / row_bytes));
    const int64_t n_rows = s.ne[1] * (s.ne.size() > 2 ? s.ne[2] : 1);
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
      const int64_t nr = std::min<int64_t>(rows_per_chunk, n_rows - r0);
      buf.resize(static_cast<size_t>(nr * row_bytes));
      for (uint64_t b = 0; b < static_cast<uint64_t>(nr) * row_blocks; ++b) {
        uint8_t* p = buf.data() + b * info.type_size;
        if (s.type == GgmlType::Q4_K) q4_k_block(rng, s.sigma, p);
        else if (s.type == GgmlType::Q6_K) q6_k_block(rng, s.sigma, p);
        else if (s.type == GgmlType::Q5_K) q5_k_block(rng, s.sigma, p);
        else if (s.type == GgmlType::Q5_0) q5_0_block(rng, s.sigma, p);
        else q8_0_block(rng, s.sigma, p);
      }
      sink.write(buf.data(), buf.size());
      done += buf.size();
      if (progress) progress(done, total);
    }
  });
  if (progress) progress(total, total);
  return total;
}

}  // namespace

bool sliding_layer(int64_t i, int64_t n_layer) { return i != n_layer - 1 && i % 6 != 5; }

Shape real_shape(const std::string& arch) {
  Shape s;
  s.arch = arch;
  if (arch == "llada") return s;
  if (arch == "dream") {
    s.n_layer = 28, s.n_embd = 3584, s.n_head = 28, s.n_head_kv = 4, s.n_ff = 18944, s.n_vocab = 152064;
    return s;
  }
  if (arch == "llada-moe") {  // LLaDA-MoE-7B-A1B (inclusionAI's config.json)
    s.n_layer = 16, s.n_embd = 2048, s.n_head = 16, s.n_head_kv = 16, s.n_ff = 8192, s.n_vocab = 157184;
    s.n_expert = 64, s.n_expert_used = 8, s.n_ff_exp = 1024;
    return s;
  }
  if (arch == "rnd1") {  // RND1-30B-A3B (Qwen3-30B-A3B's layout), 24 of its 48 layers
    s.n_layer = 24, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 4, s.n_ff = 6144, s.n_vocab = 151936;
    s.head_dim = 128, s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 768;
    return s;
  }
  if (arch == "diffusion-gemma") {  // DiffusionGemma-26B-A4B (the published GGUF's keys)
    s.n_layer = 30, s.n_embd = 2816, s.n_head = 16, s.n_ff = 2112, s.n_vocab = 262144;
    s.n_head_kv = 2, s.head_dim = 512, s.n_head_kv_swa = 8, s.head_dim_swa = 256, s.n_swa = 1024, s.canvas = 256;
    s.n_expert = 128, s.n_expert_used = 8, s.n_ff_exp = 704;
    return s;
  }
  throw usage_error(kArchFlagError + arch + "'");
}

SpecialIds special_ids(const Shape& shape) {
  const int32_t V = static_cast<int32_t>(shape.n_vocab);
  if (shape.arch == "diffusion-gemma") return {2, 1, 7, 4, 0, V};  // <bos> <eos> <turn|> <mask> <pad>, no padding rows
  if (shape.arch == "llada" || shape.arch == "llada-moe") {
    if (V == 126464) return {126080, 126081, 126348, 126336, 126081, 126349};
    return {V - 12, V - 11, V - 7, V - 10, V - 11, V - 6};
  }
  if (V == 152064 && shape.arch == "dream") return {151643, 151643, 151645, 151666, 151643, 151667};
  return {V - 8, V - 8, V - 6, V - 5, V - 8, V - 4};
}

uint64_t write_model(const std::string& path, const Options& opt, const Progress& progress) {
  if (!known_arch(opt.shape.arch)) throw usage_error(kArchFlagError + opt.shape.arch + "'");
  if (opt.quant != "Q4_K_M" && opt.quant != "Q8_0")
    throw usage_error("flag --quant must be one of Q4_K_M|Q8_0, got '" + opt.quant + "'");
  gguf::Writer w;
  std::vector<Spec> specs;
  if (opt.shape.arch == "diffusion-gemma") describe_diffusion_gemma(opt, w, specs);
  else describe_classic(opt, w, specs);
  return write_tensors(w, specs, path, opt.seed, progress);
}

}  // namespace dllm::synth
