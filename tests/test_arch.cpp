// Model loading: hyperparameters of the tiny llada/dream fixtures, and every load-time check (missing
// key, bad value, missing tensor, wrong shape, unsupported type, unsupported architecture) on model files
// the test writes itself with one thing wrong, through the library and through the dllm binary.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gguf_writer.h"
#include "model/arch.h"
#include "common/error.h"
#include "model/model.h"
#include "model/reference_executor.h"
#include "support.h"

namespace dllm::test {
namespace {

using model::Arch;
using model::HParams;
using model::Model;
using model::RopeStyle;

std::unique_ptr<Model> load(const std::string& path) {
  model::LoadOptions opt;
  opt.threads = 2;
  return Model::load(path, opt);
}

// A scratch directory removed at the end of each test.
class ArchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tpl[] = "/tmp/dllm-test-arch-XXXXXX";
    ASSERT_NE(mkdtemp(tpl), nullptr);
    dir_ = tpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const GgufWriter& w, const std::string& name = "model.gguf") {
    std::string path = dir_ + "/" + name;
    w.write(path);
    return path;
  }
  // The message of the dllm::Error that loading `w` throws ("" when it loads).
  std::string load_error(const GgufWriter& w) {
    const std::string path = write(w);
    try {
      load(path);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 1);
      return e.what();
    }
    return "";
  }

  std::string dir_;
};

TEST(ArchFixtures, TinyLladaHyperparameters) {
  auto m = load(data_path("models/tiny-llada-Q4_K_M.gguf"));
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.arch, Arch::LLaDA);
  EXPECT_EQ(hp.arch_name, "llada");
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_embd, 256);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 4);
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_EQ(hp.n_rot, 64);
  EXPECT_EQ(hp.n_ff, 768);
  EXPECT_EQ(hp.n_ctx, 4096);
  EXPECT_EQ(hp.n_vocab, 1024);
  EXPECT_FLOAT_EQ(hp.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(hp.rope_base, 500000.0f);
  EXPECT_EQ(hp.rope_style, RopeStyle::Norm);
  EXPECT_FALSE(hp.qkv_bias);
  EXPECT_EQ(m->mask_token_id(), 1014);
  EXPECT_FALSE(m->shift_logits());
  EXPECT_EQ(m->n_vocab(), 1024);
  ASSERT_EQ(m->tensors().layers.size(), 2u);
  EXPECT_EQ(m->tensors().layers[1].bq, nullptr);
  EXPECT_EQ(m->tensors().output->type(), GgmlType::Q6_K);
}

TEST(ArchFixtures, TinyDreamHyperparameters) {
  auto m = load(data_path("models/tiny-dream-F16.gguf"));
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.arch, Arch::Dream);
  EXPECT_EQ(hp.n_layer, 2);
  EXPECT_EQ(hp.n_embd, 256);
  EXPECT_EQ(hp.n_head, 4);
  EXPECT_EQ(hp.n_head_kv, 2);
  EXPECT_EQ(hp.head_dim, 64);
  EXPECT_EQ(hp.n_rot, 64);  // no rope.dimension_count key: all dims rotate
  EXPECT_EQ(hp.kv_dim(), 128);
  EXPECT_EQ(hp.n_ctx, 131072);
  EXPECT_EQ(hp.n_vocab, 1024);  // no dream.vocab_size key: from the tokenizer
  EXPECT_FLOAT_EQ(hp.rms_eps, 1e-6f);
  EXPECT_FLOAT_EQ(hp.rope_base, 1000000.0f);
  EXPECT_EQ(hp.rope_style, RopeStyle::Neox);
  EXPECT_TRUE(hp.qkv_bias);
  EXPECT_EQ(m->mask_token_id(), 1019);
  EXPECT_TRUE(m->shift_logits());  // no diffusion.shift_logits key: Dream shifts
  ASSERT_NE(m->tensors().layers[0].bk, nullptr);
  EXPECT_EQ(m->tensors().layers[0].bk->ne[0], 128);
}

TEST_F(ArchTest, WriterModelsLoadAndRun) {
  for (std::string arch : {"llada", "dream"}) {
    TinyModelSpec spec;
    spec.arch = arch;
    spec.n_head_kv = arch == "dream" ? 2 : 4;
    auto m = load(write(tiny_model(spec), arch + ".gguf"));
    EXPECT_EQ(m->hparams().n_head_kv, spec.n_head_kv);
    EXPECT_EQ(m->n_vocab(), 48);
    const std::vector<int32_t> tokens{1, 2, 47, 47, 5};
    const std::vector<int64_t> rows{4, 0};
    std::vector<float> logits = m->forward(tokens, rows);
    ASSERT_EQ(logits.size(), 2u * 48u);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    EXPECT_NE(logits[0], logits[48]);
  }
}

// Writer-built llada-moe and rnd1 files (random F32 weights, 4 experts, 2 used) load with the expert keys they
// declare and give finite logits that differ between rows.
TEST_F(ArchTest, WriterMoeModelsLoadAndRun) {
  for (std::string arch : {"llada-moe", "rnd1"}) {
    TinyModelSpec spec;
    spec.arch = arch;
    spec.n_head_kv = 2;
    auto m = load(write(tiny_model(spec), arch + ".gguf"));
    const HParams& hp = m->hparams();
    EXPECT_TRUE(hp.moe()) << arch;
    EXPECT_EQ(hp.n_expert, 4);
    EXPECT_EQ(hp.n_expert_used, 2);
    EXPECT_EQ(hp.n_ff_exp, 64);
    EXPECT_EQ(hp.expert_weights_norm, arch == "rnd1");
    const std::vector<int32_t> tokens{1, 2, 47, 47, 5};
    const std::vector<int64_t> rows{4, 0};
    std::vector<float> logits = m->forward(tokens, rows);
    ASSERT_EQ(logits.size(), 2u * 48u);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x)) << arch;
    EXPECT_NE(logits[0], logits[48]) << arch;
  }
}

// Each mixture-of-experts key missing or out of range in turn (a file could say anything): loading stops
// before anything is sized by it, with an error that names the key and its value.
TEST_F(ArchTest, BadMixtureOfExpertsKeysAreNamed) {
  TinyModelSpec spec;
  spec.arch = "rnd1";
  struct Case {
    std::string key;
    int64_t value;  // -1: the key is removed
    std::string error;
  };
  const std::vector<Case> cases{
      {"rnd1.expert_count", -1, "required metadata key missing: rnd1.expert_count"},
      {"rnd1.expert_used_count", -1, "required metadata key missing: rnd1.expert_used_count"},
      {"rnd1.expert_count", 0, "invalid metadata: rnd1.expert_count = 0"},
      {"rnd1.expert_count", 5000, "invalid metadata: rnd1.expert_count = 5000 is more than 4096"},
      {"rnd1.expert_count", 4294967295, "invalid metadata: rnd1.expert_count = 4294967295 is more than 4096"},
      {"rnd1.expert_used_count", 0, "invalid metadata: rnd1.expert_used_count = 0"},
      {"rnd1.expert_used_count", 5,
       "invalid metadata: rnd1.expert_used_count = 5 is more than rnd1.expert_count = 4"},
      {"rnd1.expert_feed_forward_length", 0, "invalid metadata: rnd1.expert_feed_forward_length = 0"},
      // The tensors say 4 experts of width 64: a key that disagrees is caught by the tensor table check.
      {"rnd1.expert_count", 8,
       "tensor shape mismatch for blk.0.ffn_gate_inp.weight: [256, 4], expected [256, 8]"},
      {"rnd1.expert_feed_forward_length", 32,
       "tensor shape mismatch for blk.0.ffn_gate_exps.weight: [256, 64, 4], expected [256, 32, 4]"},
  };
  for (const Case& c : cases) {
    GgufWriter w = tiny_model(spec);
    if (c.value < 0) {
      w.remove_key(c.key);
    } else {
      w.add_u32(c.key, static_cast<uint32_t>(c.value));
    }
    EXPECT_EQ(load_error(w), c.error) << c.key << " = " << c.value;
  }
  // Without expert_feed_forward_length the experts' width is feed_forward_length / expert_used_count (as
  // llama.cpp): here 64 / 2 = 32, which the tensors contradict; and 1 / 2 leaves no width at all.
  {
    GgufWriter w = tiny_model(spec);
    w.remove_key("rnd1.expert_feed_forward_length");
    EXPECT_EQ(load_error(w),
              "tensor shape mismatch for blk.0.ffn_gate_exps.weight: [256, 64, 4], expected [256, 32, 4]");
    w.add_u32("rnd1.feed_forward_length", 128);
    auto m = load(write(w, "ff128.gguf"));
    EXPECT_EQ(m->hparams().n_ff_exp, 64);
    w.add_u32("rnd1.feed_forward_length", 1);
    EXPECT_EQ(load_error(w), "invalid metadata: rnd1.feed_forward_length = 1 (no expert width)");
  }
  // An expert tensor of the wrong rank, or a dense FFN tensor in place of the experts, is named.
  {
    GgufWriter w = tiny_model(spec);
    w.add_f32_tensor("blk.0.ffn_up_exps.weight", {256, 64}, std::vector<float>(256 * 64, 0.01f));
    EXPECT_EQ(load_error(w), "tensor shape mismatch for blk.0.ffn_up_exps.weight: [256, 64], expected [256, 64, 4]");
  }
  {
    GgufWriter w = tiny_model(spec);
    w.remove_tensor("blk.0.ffn_down_exps.weight");
    w.add_f32_tensor("blk.0.ffn_down.weight", {64, 256}, std::vector<float>(64 * 256, 0.01f));
    EXPECT_EQ(load_error(w), "required tensor missing: blk.0.ffn_down_exps.weight");
  }
  // Through the binary: exit code 1 and the message, no output file.
  GgufWriter w = tiny_model(spec);
  w.add_u32("rnd1.expert_used_count", 9);
  RunResult r = run_dllm({"logits", "--model", write(w, "bad.gguf"), "--tokens", "1,2", "--rows", "0", "--out",
                          dir_ + "/o.f32"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "ERROR: invalid metadata: rnd1.expert_used_count = 9 is more than rnd1.expert_count = 4\n");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/o.f32"));
}

TEST_F(ArchTest, UnsupportedArchitecture) {
  GgufWriter w = tiny_model({});
  w.add_string("general.architecture", "qwen2");
  EXPECT_EQ(load_error(w), "unsupported model architecture: qwen2 (supported: llada, dream, llada-moe, rnd1, diffusion-gemma)");
}

TEST_F(ArchTest, MissingArchitectureKey) {
  GgufWriter w = tiny_model({});
  w.remove_key("general.architecture");
  EXPECT_EQ(load_error(w), "required metadata key missing: general.architecture");
}

TEST_F(ArchTest, MissingHyperparameterKeys) {
  for (std::string key : {"llada.block_count", "llada.context_length", "llada.embedding_length",
                          "llada.feed_forward_length", "llada.attention.head_count",
                          "llada.attention.layer_norm_rms_epsilon", "tokenizer.ggml.mask_token_id"}) {
    GgufWriter w = tiny_model({});
    w.remove_key(key);
    EXPECT_EQ(load_error(w), "required metadata key missing: " + key);
  }
  TinyModelSpec dream;
  dream.arch = "dream";
  GgufWriter w = tiny_model(dream);
  w.remove_key("dream.attention.head_count");
  EXPECT_EQ(load_error(w), "required metadata key missing: dream.attention.head_count");
}

TEST_F(ArchTest, OptionalKeysTakeTheirDefaults) {
  GgufWriter w = tiny_model({});
  w.remove_key("llada.attention.head_count_kv");
  w.remove_key("llada.rope.freq_base");
  auto m = load(write(w));
  EXPECT_EQ(m->hparams().n_head_kv, 4);
  EXPECT_FLOAT_EQ(m->hparams().rope_base, 10000.0f);
}

TEST_F(ArchTest, BadHyperparameterValues) {
  {
    GgufWriter w = tiny_model({});
    w.add_u32("llada.attention.head_count_kv", 3);
    EXPECT_EQ(load_error(w),
              "invalid metadata: llada.attention.head_count_kv = 3 does not divide llada.attention.head_count = 4");
  }
  {
    GgufWriter w = tiny_model({});
    w.add_u32("llada.block_count", 0);
    EXPECT_EQ(load_error(w), "invalid metadata: llada.block_count = 0");
  }
  {
    GgufWriter w = tiny_model({});
    w.add_u32("tokenizer.ggml.mask_token_id", 48);
    EXPECT_EQ(load_error(w),
              "invalid metadata: tokenizer.ggml.mask_token_id = 48 is not below the vocabulary size 48");
  }
  {
    GgufWriter w = tiny_model({});
    w.add_f32("llada.block_count", 1.0f);  // wrong value type: the GGUF reader's message names the key
    EXPECT_NE(load_error(w).find("llada.block_count"), std::string::npos);
  }
}

TEST_F(ArchTest, BlockCountIsCheckedAgainstTheTensorsBeforeAnythingIsSizedByIt) {
  {
    GgufWriter w = tiny_model({});
    w.add_u32("llada.block_count", 1u << 24);  // 1.58 GB of empty layers before "required tensor missing"
    EXPECT_EQ(load_error(w), "invalid metadata: llada.block_count = 16777216 is more than 4096 layers");
  }
  {
    GgufWriter w = tiny_model({});
    w.add_u32("llada.block_count", 4096);
    const std::string e = load_error(w);  // the one-layer model holds 3 + 9 tensors
    EXPECT_EQ(e, "invalid metadata: llada.block_count = 4096, but the file holds only 12 tensors (4096 layers need 9 "
                 "each)");
  }
  TinyModelSpec dream;
  dream.arch = "dream";
  GgufWriter d = tiny_model(dream);
  d.add_u32("dream.block_count", 2);
  EXPECT_EQ(load_error(d), "invalid metadata: dream.block_count = 2, but the file holds only 15 tensors (2 layers "
                           "need 12 each)");
}

TEST_F(ArchTest, AHostileArchitectureNameIsEscapedAndCut) {
  GgufWriter w = tiny_model({});
  w.add_string("general.architecture", "\x1b]0;pwned\x07\xc2\x9b" + std::string(100000, 'A'));
  const std::string e = load_error(w);
  EXPECT_EQ(e.find('\x1b'), std::string::npos);
  EXPECT_EQ(e.find("\xc2\x9b"), std::string::npos);
  EXPECT_EQ(e.rfind("unsupported model architecture: \\x1b]0;pwned\\x07\\u009bAAA", 0), 0u) << e.substr(0, 300);
  EXPECT_NE(e.find("... (100012 bytes) (supported: "), std::string::npos) << e.substr(0, 300);
  EXPECT_LT(e.size(), 600u);
}

TEST_F(ArchTest, MissingTensor) {
  GgufWriter w = tiny_model({});
  w.remove_tensor("blk.0.ffn_up.weight");
  EXPECT_EQ(load_error(w), "required tensor missing: blk.0.ffn_up.weight");

  TinyModelSpec dream;
  dream.arch = "dream";
  GgufWriter d = tiny_model(dream);
  d.remove_tensor("blk.0.attn_k.bias");
  EXPECT_EQ(load_error(d), "required tensor missing: blk.0.attn_k.bias");
}

TEST_F(ArchTest, WrongShape) {
  GgufWriter w = tiny_model({});
  w.add_f32_tensor("blk.0.attn_q.weight", {256, 128}, std::vector<float>(256 * 128, 0.01f));
  EXPECT_EQ(load_error(w), "tensor shape mismatch for blk.0.attn_q.weight: [256, 128], expected [256, 256]");

  GgufWriter v = tiny_model({});  // output with one row too many for the vocabulary
  v.add_f32_tensor("output.weight", {256, 49}, std::vector<float>(256 * 49, 0.01f));
  EXPECT_EQ(load_error(v), "tensor shape mismatch for output.weight: [256, 49], expected [256, 48]");

  GgufWriter n = tiny_model({});  // a norm stored as a matrix
  n.add_f32_tensor("output_norm.weight", {256, 1}, std::vector<float>(256, 1.0f));
  EXPECT_EQ(load_error(n), "tensor shape mismatch for output_norm.weight: [256, 1], expected [256]");
}

TEST_F(ArchTest, UnsupportedTensorType) {
  GgufWriter w = tiny_model({});
  // IQ2_XXS: 256 values in 66 bytes per block; a type the decoders cannot read.
  w.add_tensor("blk.0.attn_q.weight", GgmlType::IQ2_XXS, {256, 256}, std::vector<uint8_t>(256 * 66, 0));
  EXPECT_EQ(load_error(w), "unsupported GGUF tensor type: IQ2_XXS (tensor blk.0.attn_q.weight)");
}

TEST_F(ArchTest, QuantizedWriterTensorLoads) {
  // A Q8_0 matrix (34 bytes per 32 values: f16 scale + 32 int8) in an otherwise F32 model.
  GgufWriter w = tiny_model({});
  std::vector<uint8_t> q(256 * 256 / 32 * 34, 1);
  for (size_t b = 0; b < q.size(); b += 34) q[b] = 0, q[b + 1] = 0x20;  // scale = fp16 0x2000
  w.add_tensor("blk.0.attn_v.weight", GgmlType::Q8_0, {256, 256}, q);
  auto m = load(write(w));
  EXPECT_EQ(m->tensors().layers[0].wv->type(), GgmlType::Q8_0);
  std::vector<float> logits = m->forward(std::vector<int32_t>{3, 4}, std::vector<int64_t>{1});
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(ArchTest, InputChecksRunBeforeTheExecutorIsBuilt) {
  bool built = false;
  model::LoadOptions opt;
  opt.threads = 1;
  opt.make_executor = [&](ThreadPool& pool) -> std::unique_ptr<model::Executor> {
    built = true;
    return std::make_unique<model::ReferenceExecutor>(pool);
  };
  opt.on_checked = [](const HParams& hp) {
    EXPECT_EQ(hp.n_vocab, 48);
    throw Error("rejected by the caller");
  };
  const std::string path = write(tiny_model({}));
  EXPECT_THROW(Model::load(path, opt), Error);
  EXPECT_FALSE(built);
  opt.on_checked = nullptr;
  EXPECT_EQ(Model::load(path, opt)->executor().name(), "reference");
  EXPECT_TRUE(built);
}

TEST_F(ArchTest, CliReportsLoadErrors) {
  GgufWriter w = tiny_model({});
  w.add_string("general.architecture", "qwen2");
  const std::string path = write(w);
  RunResult r = run_dllm({"logits", "--model", path, "--tokens", "1,2", "--rows", "0", "--out", dir_ + "/o.f32"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "ERROR: unsupported model architecture: qwen2 (supported: llada, dream, llada-moe, rnd1, diffusion-gemma)\n");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/o.f32"));

  GgufWriter s = tiny_model({});
  s.add_f32_tensor("blk.0.attn_q.weight", {256, 128}, std::vector<float>(256 * 128, 0.01f));
  r = run_dllm({"logits", "--model", write(s, "s.gguf"), "--tokens", "1", "--rows", "0", "--out", dir_ + "/o.f32"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "ERROR: tensor shape mismatch for blk.0.attn_q.weight: [256, 128], expected [256, 256]\n");
}

}  // namespace
}  // namespace dllm::test
