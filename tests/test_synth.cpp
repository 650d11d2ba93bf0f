// dllm synth: the written files are valid GGUF with the real metadata, special ids and Q4_K_M type mix, and
// the forward pass over them stays finite through many layers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <unistd.h>

#include "common/error.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "support.h"

using namespace dllm;

namespace {

synth::Shape tiny(const std::string& arch, int64_t layers) {
  synth::Shape s;
  s.arch = arch;
  s.n_layer = layers;
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = arch == "dream" ? 2 : 4;
  s.n_ff = 768;
  s.n_vocab = 1024;
  return s;
}

std::string temp_path(const std::string& name) {
  return "/tmp/dllm-test-synth-" + std::to_string(getpid()) + "-" + name + ".gguf";
}

}  // namespace

TEST(Synth, RealShapes) {
  auto l = synth::real_shape("llada");
  EXPECT_EQ(l.n_embd, 4096);
  EXPECT_EQ(l.n_layer, 32);
  EXPECT_EQ(l.n_ff, 12288);
  EXPECT_EQ(l.n_vocab, 126464);
  auto d = synth::real_shape("dream");
  EXPECT_EQ(d.n_embd, 3584);
  EXPECT_EQ(d.n_head_kv, 4);
  EXPECT_EQ(d.n_ff, 18944);
  EXPECT_EQ(d.n_vocab, 152064);
  auto ids = synth::special_ids(l);
  EXPECT_EQ(ids.mask, 126336);
  EXPECT_EQ(ids.eot, 126348);
  EXPECT_EQ(synth::special_ids(d).mask, 151666);
  EXPECT_THROW(synth::real_shape("qwen2"), Error);
}

TEST(Synth, Q4KMTypeMixAndMetadata) {
  for (std::string arch : {"llada", "dream"}) {
    synth::Options o;
    o.shape = tiny(arch, 8);
    std::string path = temp_path(arch);
    uint64_t size = synth::write_model(path, o);
    auto f = gguf::File::open(path);
    EXPECT_EQ(f->file_size(), size);
    EXPECT_EQ(f->get_string("general.architecture"), arch);
    EXPECT_EQ(f->get_uint(arch + ".block_count"), 8u);
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 1024u);
    EXPECT_EQ(f->get_uint("tokenizer.ggml.mask_token_id"), static_cast<uint64_t>(synth::special_ids(o.shape).mask));
    EXPECT_EQ(f->find_tensor("output.weight")->type(), GgmlType::Q6_K);
    EXPECT_EQ(f->find_tensor("token_embd.weight")->type(), GgmlType::Q4_K);
    // llama.cpp's Q4_K_M rule: attn_v and ffn_down get Q6_K in layers i < n/8, i >= 7n/8, (i - n/8) % 3 == 2
    for (int i = 0; i < 8; ++i) {
      bool more = i < 1 || i >= 7 || (i - 1) % 3 == 2;
      auto want = more ? GgmlType::Q6_K : GgmlType::Q4_K;
      std::string p = "blk." + std::to_string(i) + ".";
      EXPECT_EQ(f->find_tensor(p + "attn_v.weight")->type(), want) << arch << " layer " << i;
      EXPECT_EQ(f->find_tensor(p + "ffn_down.weight")->type(), want);
      EXPECT_EQ(f->find_tensor(p + "attn_q.weight")->type(), GgmlType::Q4_K);
      EXPECT_EQ(f->find_tensor(p + "attn_k.weight")->ne[1], arch == "dream" ? 128 : 256);
      EXPECT_EQ(f->find_tensor(p + "attn_q.bias") != nullptr, arch == "dream");
    }
    std::remove(path.c_str());
  }
}

TEST(Synth, DeterministicForASeed) {
  synth::Options o;
  o.shape = tiny("llada", 2);
  o.quant = "Q8_0";
  std::string a = temp_path("a"), b = temp_path("b");
  synth::write_model(a, o);
  synth::write_model(b, o);
  EXPECT_EQ(test::read_file(a), test::read_file(b));
  o.seed = 7;
  synth::write_model(b, o);
  EXPECT_NE(test::read_file(a), test::read_file(b));
  auto f = gguf::File::open(a);
  EXPECT_EQ(f->find_tensor("output.weight")->type(), GgmlType::Q8_0);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(Synth, ActivationsStayFiniteThroughManyLayers) {
  for (std::string arch : {"llada", "dream"}) {
    synth::Options o;
    o.shape = tiny(arch, 32);
    std::string path = temp_path("deep-" + arch);
    synth::write_model(path, o);
    model::LoadOptions lo;
    lo.threads = 2;
    auto m = model::Model::load(path, lo);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 24; ++i) tokens.push_back(i < 12 ? 300 + 7 * i : m->mask_token_id());
    std::vector<int64_t> rows = {0, 11, 12, 23};
    auto logits = m->forward(tokens, rows);
    ASSERT_EQ(logits.size(), rows.size() * 1024);
    double sum2 = 0;
    for (float x : logits) {
      ASSERT_TRUE(std::isfinite(x)) << arch;
      sum2 += double(x) * x;
    }
    double rms = std::sqrt(sum2 / logits.size());
    EXPECT_GT(rms, 0.05) << arch;  // not collapsed to zero
    EXPECT_LT(rms, 100.0) << arch;  // not exploding
    std::remove(path.c_str());
  }
}

// Mixture-of-experts shapes: the real LLaDA-MoE-7B-A1B and RND1 (24 of 48 layers) shapes; at tiny widths the
// Q4_K_M mix of a mixture of experts (Q8_0 attention K/V, Q5_K attention output, F32 router and q/k norms,
// 3-D expert tensors with Q6_K down projections in the "more bits" layers), a model that loads and gives
// finite logits, and the dense twin: a llada with FFN width = experts used x expert width.
TEST(Synth, MixtureOfExpertsShapesTypesAndDenseTwin) {
  const auto lm = synth::real_shape("llada-moe");
  EXPECT_EQ(lm.n_layer, 16);
  EXPECT_EQ(lm.n_embd, 2048);
  EXPECT_EQ(lm.n_expert, 64);
  EXPECT_EQ(lm.n_expert_used, 8);
  EXPECT_EQ(lm.n_ff_exp, 1024);
  EXPECT_EQ(lm.n_vocab, 157184);
  const auto r = synth::real_shape("rnd1");
  EXPECT_EQ(r.head_dim * r.n_head, 4096);  // Qwen3: the heads span twice the width
  EXPECT_EQ(r.n_expert, 128);
  for (std::string arch : {"llada-moe", "rnd1"}) {
    synth::Options o;
    o.shape = tiny(arch, 4);
    o.shape.n_expert = 4, o.shape.n_expert_used = 2, o.shape.n_ff_exp = 256;
    if (arch == "rnd1") o.shape.n_head_kv = 2, o.shape.head_dim = 128;
    const std::string path = temp_path(arch);
    synth::write_model(path, o);
    {
      auto f = gguf::File::open(path);
      for (int i = 0; i < 4; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        const bool more = i < 0 || i >= 3 || (i - 0) % 3 == 2;
        EXPECT_EQ(f->find_tensor(p + "attn_k.weight")->type(), GgmlType::Q8_0) << arch;
        EXPECT_EQ(f->find_tensor(p + "attn_v.weight")->type(), GgmlType::Q8_0) << arch;
        EXPECT_EQ(f->find_tensor(p + "attn_output.weight")->type(), GgmlType::Q5_K) << arch;
        EXPECT_EQ(f->find_tensor(p + "ffn_gate_inp.weight")->type(), GgmlType::F32) << arch;
        EXPECT_EQ(f->find_tensor(p + "attn_q_norm.weight")->ne[0], arch == "rnd1" ? 128 : 64) << arch;
        const gguf::TensorInfo* down = f->find_tensor(p + "ffn_down_exps.weight");
        ASSERT_NE(down, nullptr);
        EXPECT_EQ(down->n_dims, 3u);
        EXPECT_EQ(down->ne[2], 4);
        EXPECT_EQ(down->type(), more ? GgmlType::Q6_K : GgmlType::Q4_K) << arch << " layer " << i;
        EXPECT_EQ(f->find_tensor(p + "ffn_gate.weight"), nullptr);
      }
    }
    model::LoadOptions lo;
    lo.threads = 2;
    auto m = model::Model::load(path, lo);
    EXPECT_EQ(m->hparams().n_expert, 4);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 16; ++i) tokens.push_back(i < 8 ? 300 + 7 * i : m->mask_token_id());
    const std::vector<int64_t> rows = {0, 15};
    for (float x : m->forward(tokens, rows)) ASSERT_TRUE(std::isfinite(x)) << arch;
    std::remove(path.c_str());
  }
  synth::Options d;
  d.shape = tiny("llada-moe", 2);
  d.shape.n_expert = 4, d.shape.n_expert_used = 2, d.shape.n_ff_exp = 256;
  d.dense = true;
  const std::string path = temp_path("dense-twin");
  synth::write_model(path, d);
  auto f = gguf::File::open(path);
  EXPECT_EQ(f->get_string("general.architecture"), "llada");
  EXPECT_EQ(f->get_uint("llada.feed_forward_length"), 512u);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up.weight")->ne[1], 512);
  EXPECT_EQ(f->find_tensor("blk.0.attn_output.weight")->type(), GgmlType::Q5_K);
  std::remove(path.c_str());
  synth::Options bad;
  bad.shape = tiny("llada", 2);
  bad.dense = true;
  EXPECT_THROW(synth::write_model(temp_path("bad"), bad), Error);
}

// DiffusionGemma: the real DiffusionGemma-26B-A4B shape; at tiny widths the published file's keys and tensors
// (per-layer KV heads, sliding pattern with every 6th and the last layer global, no attn_v on global layers,
// rope_freqs, self-conditioning, fused gate_up experts, region scalars, no eb_* keys) in the Q4_K_M mix
// llama-quantize makes (Q6_K tied embedding, Q5_0 / Q8_0 fallbacks for down-projection rows that are not whole
// super-blocks); a gemma4 vocabulary the tokenizer round-trips, the Gemma-4 template, and a generation through
// the `run` command.
TEST(Synth, DiffusionGemmaShapesTypesTokenizerAndRun) {
  const auto real = synth::real_shape("diffusion-gemma");
  EXPECT_EQ(real.n_layer, 30);
  EXPECT_EQ(real.n_embd, 2816);
  EXPECT_EQ(real.n_vocab, 262144);
  EXPECT_EQ(real.n_expert, 128);
  EXPECT_EQ(real.n_ff_exp, 704);
  EXPECT_EQ(real.canvas, 256);
  std::vector<int64_t> global;
  for (int64_t i = 0; i < 30; ++i)
    if (!synth::sliding_layer(i, 30)) global.push_back(i);
  EXPECT_EQ(global, (std::vector<int64_t>{5, 11, 17, 23, 29}));
  EXPECT_TRUE(synth::sliding_layer(0, 2));
  EXPECT_FALSE(synth::sliding_layer(1, 2)) << "the last layer is global";

  synth::Options o;
  o.shape = real;
  o.shape.n_layer = 7, o.shape.n_embd = 256, o.shape.n_head = 4, o.shape.n_head_kv = 1, o.shape.head_dim = 128;
  o.shape.n_head_kv_swa = 2, o.shape.head_dim_swa = 64, o.shape.n_swa = 8, o.shape.n_ff = 192, o.shape.n_vocab = 2048;
  o.shape.n_expert = 8, o.shape.n_expert_used = 2, o.shape.n_ff_exp = 64, o.shape.canvas = 16;
  const std::string path = temp_path("diffusion-gemma");
  synth::write_model(path, o);
  {
    auto f = gguf::File::open(path);
    EXPECT_EQ(f->get_string("general.architecture"), "diffusion-gemma");
    EXPECT_EQ(f->get_uint("diffusion.canvas_length"), 16u);
    EXPECT_EQ(f->find("diffusion.eb_max_steps"), nullptr) << "the published file has no eb_* keys";
    EXPECT_EQ(f->get_int_array("diffusion-gemma.attention.head_count_kv"), (std::vector<int64_t>{2, 2, 2, 2, 2, 1, 1}));
    EXPECT_EQ(f->find_tensor("token_embd.weight")->type(), GgmlType::Q6_K);
    EXPECT_EQ(f->find_tensor("output.weight"), nullptr) << "tied head";
    EXPECT_EQ(f->find_tensor("self_cond_down.weight")->type(), GgmlType::Q5_0);
    const gguf::TensorInfo* freqs = f->find_tensor("rope_freqs.weight");
    ASSERT_NE(freqs, nullptr);
    ASSERT_EQ(freqs->ne[0], 64);
    const float* fv = reinterpret_cast<const float*>(freqs->data);
    EXPECT_EQ(fv[15], 1.0f);
    EXPECT_EQ(fv[16], 1e30f) << "a quarter of the global head rotates";
    for (int i = 0; i < 7; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      const bool swa = i < 5, more = i < 0 || i >= 6 || i % 3 == 2;
      EXPECT_EQ(f->find_tensor(p + "attn_v.weight") != nullptr, swa) << i;
      EXPECT_EQ(f->find_tensor(p + "attn_q.weight")->ne[1], swa ? 256 : 512) << i;
      EXPECT_EQ(f->find_tensor(p + "attn_k.weight")->type(), GgmlType::Q8_0);
      EXPECT_EQ(f->find_tensor(p + "attn_output.weight")->type(), GgmlType::Q5_K);
      EXPECT_EQ(f->find_tensor(p + "ffn_gate.weight")->type(), GgmlType::Q4_K);
      EXPECT_EQ(f->find_tensor(p + "ffn_down.weight")->type(), more ? GgmlType::Q8_0 : GgmlType::Q5_0) << i;
      EXPECT_EQ(f->find_tensor(p + "ffn_down_exps.weight")->type(), more ? GgmlType::Q8_0 : GgmlType::Q5_0) << i;
      const gguf::TensorInfo* gu = f->find_tensor(p + "ffn_gate_up_exps.weight");
      ASSERT_NE(gu, nullptr);
      EXPECT_EQ(gu->type(), GgmlType::Q4_K);
      EXPECT_EQ(std::vector<int64_t>(gu->ne, gu->ne + 3), (std::vector<int64_t>{256, 128, 8}));
      EXPECT_EQ(f->find_tensor(p + "ffn_gate_inp.weight")->type(), GgmlType::F32);
      for (const char* n : {"ffn_gate_inp.scale", "ffn_down_exps.scale", "layer_output_scale.weight",
                            "enc_layer_output_scale.weight", "post_ffw_norm_2.weight", "pre_ffw_norm_2.weight"})
        EXPECT_NE(f->find_tensor(p + n), nullptr) << p << n;
    }
    // The vocabulary: spaces as U+2581 pieces, newline runs whole, characters outside it as <0xXX> bytes.
    const model::Tokenizer tok(*f);
    for (const std::string text : {"Hello  world, this is\n\n\tsynthetic text", "caf\xC3\xA9 \xE2\x9C\x93 \xF0\x9F\x98\x80 end"}) {
      const std::vector<int32_t> ids = tok.encode(text, false, false);
      EXPECT_EQ(tok.decode(ids), text);
      EXPECT_LT(ids.size(), text.size()) << "merges apply";
    }
    EXPECT_EQ(tok.encode("\xE2\x9C\x93", false, false).size(), 3u) << "a character outside the vocabulary: three byte tokens";
    EXPECT_EQ(tok.encode("<|turn>user", true, true).front(), 2) << "BOS";
  }
  // The file runs: a chat prompt through the Gemma-4 template, two blocks of the canvas.
  const auto r = test::run_dllm({"run", "--model", path, "--prompt", "Say something.", "--max-tokens", "20", "--seed",
                                 "5", "--eb-max-steps", "3", "--json", "--verbose"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"][0], 2) << "BOS";
  EXPECT_EQ(j["prompt_ids"][1], 6) << "the Gemma-4 template's <|turn>";
  EXPECT_EQ(j["output_ids"].size(), 20u);
  ASSERT_EQ(j["blocks"].size(), 2u) << r.out;
  EXPECT_EQ(j["step_stats"].size(), j["steps_run"].get<size_t>()) << r.out;

  synth::Options q8 = o;
  q8.quant = "Q8_0";
  q8.shape.n_layer = 2;
  synth::write_model(path, q8);
  {
    auto f = gguf::File::open(path);
    for (const char* n : {"token_embd.weight", "self_cond_down.weight", "blk.0.ffn_down.weight", "blk.1.attn_output.weight",
                          "blk.1.ffn_gate_up_exps.weight"})
      EXPECT_EQ(f->find_tensor(n)->type(), GgmlType::Q8_0) << n;
    EXPECT_EQ(f->find_tensor("blk.1.attn_v.weight"), nullptr);
  }
  std::remove(path.c_str());
  synth::Options dense = q8;
  dense.dense = true;
  EXPECT_THROW(synth::write_model(temp_path("bad"), dense), Error);
}
