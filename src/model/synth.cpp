// Synthetic model writer: metadata and vocabulary as the llama.cpp converters write them for LLaDA / Dream /
// LLaDA-MoE / RND1, and random quantized blocks (Q4_K, Q5_K, Q6_K, Q8_0) streamed tensor by tensor through
// gguf::Writer.
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

}  // namespace

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
  throw usage_error("flag --arch must be one of llada|dream|llada-moe|rnd1, got '" + arch + "'");
}

SpecialIds special_ids(const Shape& shape) {
  const int32_t V = static_cast<int32_t>(shape.n_vocab);
  if (shape.arch == "llada" || shape.arch == "llada-moe") {
    if (V == 126464) return {126080, 126081, 126348, 126336, 126081, 126349};
    return {V - 12, V - 11, V - 7, V - 10, V - 11, V - 6};
  }
  if (V == 152064 && shape.arch == "dream") return {151643, 151643, 151645, 151666, 151643, 151667};
  return {V - 8, V - 8, V - 6, V - 5, V - 8, V - 4};
}

uint64_t write_model(const std::string& path, const Options& opt, const Progress& progress) {
  if (opt.shape.arch != "llada" && opt.shape.arch != "dream" && opt.shape.arch != "llada-moe" && opt.shape.arch != "rnd1")
    throw usage_error("flag --arch must be one of llada|dream|llada-moe|rnd1, got '" + opt.shape.arch + "'");
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
  if (o.quant != "Q4_K_M" && o.quant != "Q8_0")
    throw usage_error("flag --quant must be one of Q4_K_M|Q8_0, got '" + o.quant + "'");
  if (sh.n_layer < 1 || sh.n_head < 1 || sh.n_head_kv < 1 || sh.n_head % sh.n_head_kv || sh.n_embd % sh.n_head ||
      sh.n_embd % 256 || sh.n_ff % 256 || sh.n_vocab < 512)
    throw Error("synthetic model shape is not valid (widths must be multiples of 256, heads must divide evenly)");
  const bool q8 = o.quant == "Q8_0";
  const std::string a = sh.arch;
  const int64_t head_dim = sh.head_dim > 0 ? sh.head_dim : sh.n_embd / sh.n_head, kv_dim = head_dim * sh.n_head_kv;
  const int64_t q_dim = head_dim * sh.n_head;
  const SpecialIds sp = special_ids(sh);

  gguf::Writer w;
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
  Vocab vocab = make_vocab(sh, o.seed);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", llada_like ? "bailingmoe" : "qwen2");
  w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.add_i32_array("tokenizer.ggml.token_type", vocab.types);
  w.add_string_array("tokenizer.ggml.merges", vocab.merges);
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(sp.bos));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(sp.eos));
  w.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(sp.pad));
  w.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(sp.eot));
  w.add_u32("tokenizer.ggml.mask_token_id", static_cast<uint32_t>(sp.mask));
  w.add_bool("tokenizer.ggml.add_bos_token", llada_like);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  w.add_string("tokenizer.chat_template", llada_like ? kLladaTemplate : kDreamTemplate);
  vocab = Vocab{};  // written into the header; free it before the weights

  // Tensors, with the standard deviation each one's values get.
  struct Spec {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    float sigma;  // 0 = a 1-D F32 tensor of ones (norm weights); < 0: F32 uniform(-|sigma|, |sigma|)
  };
  std::vector<Spec> specs;
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
    Rng rng(o.seed * 0x2545F4914F6CDD1Dull ^ name_hash(s.name));
    if (s.type == GgmlType::F32) {
      int64_t count = 1;
      for (int64_t n : s.ne) count *= n;
      std::vector<float> v(static_cast<size_t>(count));
      for (auto& x : v) x = s.sigma == 0.0f ? 1.0f : rng.uniform_f(-std::fabs(s.sigma), std::fabs(s.sigma));
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

}  // namespace dllm::synth
