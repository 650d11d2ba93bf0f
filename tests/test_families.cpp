// The same answer on every kernel family: each family performs, per output, the same f32 operations in
// the same order (src/jit/kernel_order.h for the GEMMs; one 16-lane reduction order in attention), so
//  - whole-model logits of every quantized tiny model and every logits case are bit-identical across all
//    the families (portable, avx2, avx-vnni, avx512-vnni, amx; those this CPU lacks with their kernels in the
//    x86 interpreter of x86_emu.h, where libzydis-dev is installed), and
//  - every greedy generation of tests/data/generations gives the same tokens on every family.
// The portable family is the baseline each other family is compared with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jit/cpu_executor.h"
#include "model/generate.h"
#include "model/model.h"
#include "support.h"
#ifdef DLLM_HAVE_X86_EMU
#include "x86_emu.h"
#endif

using namespace dllm;
namespace fs = std::filesystem;

namespace {

// The model at tests/data/`rel` on one family, loaded once.
model::Model& family_model_at(const std::string& rel, jit::Isa isa) {
  static std::map<std::pair<std::string, jit::Isa>, std::unique_ptr<model::Model>> cache;
  auto& m = cache[{rel, isa}];
  if (!m) {
    model::LoadOptions o;
    o.threads = 2;
    o.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
    m = model::Model::load(test::data_path(rel), o);
  }
  return *m;
}

model::Model& family_model(const std::string& file, jit::Isa isa) { return family_model_at("models/" + file, isa); }

// The JIT families this CPU allows besides the portable baseline.
std::vector<jit::Isa> other_families() {
  std::vector<jit::Isa> out;
  for (jit::Isa isa : jit::cpu_features().supported())
    if (isa != jit::Isa::Portable) out.push_back(isa);
  return out;
}

// The families whose logits are compared with portable's: those this CPU has, and with the x86 interpreter
// (libzydis-dev) every other one, so that any machine checks every family's whole-model logits.
std::vector<jit::Isa> logits_families() {
#ifdef DLLM_HAVE_X86_EMU
  return {jit::Isa::Avx2, jit::Isa::AvxVnni, jit::Isa::Avx512Vnni, jit::Isa::Amx};
#else
  return other_families();
#endif
}

// Index of the first float whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

class FamilyLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyLogits, BitIdenticalOnEveryFamily) {
  const std::string model = GetParam();
  const fs::path dir = test::data_path("logits");
  int cases = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json" || name.rfind(model + "__", 0) != 0) continue;
    const auto j = nlohmann::json::parse(test::read_file(e.path().string()));
    const auto ids = j.at("ids").get<std::vector<int32_t>>();
    const auto rows = j.at("rows").get<std::vector<int64_t>>();
    const std::vector<float> base = family_model(model + ".gguf", jit::Isa::Portable).forward(ids, rows);
    ASSERT_FALSE(base.empty());
    for (jit::Isa isa : logits_families()) {
#ifdef DLLM_HAVE_X86_EMU
      // A family the CPU lacks loads and runs with its kernels in the x86 interpreter (tests/x86_emu.h).
      const test::ScopedKernelInterpreter interpreted(!jit::cpu_features().supports(isa));
#endif
      const std::vector<float> got = family_model(model + ".gguf", isa).forward(ids, rows);
      const int64_t at = first_bit_difference(got, base);
      EXPECT_EQ(at, -1) << name << ": " << jit::isa_name(isa) << " differs from portable at row "
                        << (at < 0 ? 0 : at / 1024) << " logit " << (at < 0 ? 0 : at % 1024) << ": "
                        << (at < 0 ? 0.f : got[at]) << " vs " << (at < 0 ? 0.f : base[at]);
    }
    ++cases;
  }
  EXPECT_GE(cases, 4) << model;
}

INSTANTIATE_TEST_SUITE_P(QuantizedModels, FamilyLogits,
                         ::testing::Values("tiny-llada-Q8_0", "tiny-llada-Q4_K_M", "tiny-dream-Q8_0",
                                           "tiny-dream-Q4_K_M"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return test::test_label(info.param);
                         });

// diffusion-gemma (tests/data/diffusion-gemma): the unified pass and the prompt-KV path (prompt encoded once,
// the canvas against it, with self-conditioning in a5) bit-identical on every family to portable's.
std::vector<float> diffusion_gemma_logits(const std::string& model, const std::string& name, jit::Isa isa, bool pkv) {
  model::Model* m = &family_model_at("diffusion-gemma/gguf/" + model + ".gguf", isa);
  const auto j = nlohmann::json::parse(test::read_file(test::data_path("diffusion-gemma/logits/" + model + "__" + name + "__pkv.json")));
  std::vector<int32_t> ids = j.at("prompt_ids").get<std::vector<int32_t>>();
  const int64_t P = static_cast<int64_t>(ids.size());
  for (int32_t t : j.at("canvas_ids").get<std::vector<int32_t>>()) ids.push_back(t);
  const auto rows = j.at("rows").get<std::vector<int64_t>>();
  std::vector<float> sc;
  if (j.contains("self_conditioning") && !j["self_conditioning"].is_null()) {
    const std::string b = test::read_file(test::data_path("diffusion-gemma/logits/" +
                                                          j["self_conditioning"]["input_logits_file"].get<std::string>()));
    sc.resize(b.size() / sizeof(float));
    std::memcpy(sc.data(), b.data(), sc.size() * sizeof(float));
  }
  std::vector<float> out(rows.size() * static_cast<size_t>(m->n_vocab()));
  model::ForwardRequest r{ids, rows, out.data()};
  r.n_prompt = P;
  if (!sc.empty()) r.self_cond_logits = sc.data(), r.self_cond_temperature = j["self_conditioning"]["temperature"].get<float>();
  model::KVCache kv;
  if (pkv) {
    model::ForwardRequest enc{std::span<const int32_t>(ids.data(), static_cast<size_t>(P)), {}, nullptr, &kv,
                              model::CacheMode::Extend};
    enc.n_prompt = P;
    m->forward(enc);
    r.cache = &kv, r.cache_mode = model::CacheMode::Prefix;
  }
  m->forward(r);
  return out;
}

TEST(FamilyLogitsDiffusionGemma, BitIdenticalOnEveryFamily) {
  for (const char* model : {"tiny-diffusion-gemma-A-Q8_0", "tiny-diffusion-gemma-A-Q4_K_M"}) {
    for (const char* name : {"a2_prompt29_long", "a5_self_cond_after_a3_t0.8"}) {
      for (bool pkv : {false, true}) {
        const std::vector<float> base = diffusion_gemma_logits(model, name, jit::Isa::Portable, pkv);
        for (jit::Isa isa : logits_families()) {
#ifdef DLLM_HAVE_X86_EMU
          const test::ScopedKernelInterpreter interpreted(!jit::cpu_features().supports(isa));
#endif
          const std::vector<float> got = diffusion_gemma_logits(model, name, isa, pkv);
          EXPECT_EQ(first_bit_difference(got, base), -1)
              << model << " " << name << (pkv ? " prompt-KV" : " unified") << ": " << jit::isa_name(isa);
        }
      }
    }
  }
}

// DiffusionGemma generation (the entropy-bound sampler, blocks chained through the cached prefix): every family
// this CPU has gives portable's tokens (the whole-model logits above cover the families it lacks).
TEST(FamilyGenerationsDiffusionGemma, TokensEqualPortablesOnEveryFamily) {
  const std::string rel = "diffusion-gemma/gguf/tiny-diffusion-gemma-A-Q4_K_M.gguf";
  const std::vector<int32_t> prompt{2, 6, 916, 600, 32, 319, 317, 7};
  auto tokens = [&](jit::Isa isa) {
    model::Model& m = family_model_at(rel, isa);
    model::GenerateConfig c;
    c.arch = m.hparams().arch;
    c.canvas_length = m.hparams().canvas_length;
    c.max_tokens = 2 * c.canvas_length;
    c.seed = 5;
    c.eb = m.hparams().eb;
    c.eb.max_steps = 6;
    c.context_length = m.hparams().n_ctx;
    auto src = model::make_model_logit_source(m);
    return model::generate(*src, c, prompt).canvas;
  };
  const std::vector<int32_t> base = tokens(jit::Isa::Portable);
  ASSERT_EQ(base.size(), prompt.size() + 32);
  for (jit::Isa isa : other_families()) EXPECT_EQ(tokens(isa), base) << jit::isa_name(isa);
}

class FamilyGenerations : public ::testing::TestWithParam<std::string> {};

std::vector<int32_t> greedy(const test::GenerationCase& c, jit::Isa isa) {
  model::Model& m = family_model(c.model_file, isa);
  if (m.mask_token_id() != c.mask_id) throw std::runtime_error("mask token differs from the reference's");
  model::GenerateHooks hooks;
  hooks.pool = &m.pool();
  auto src = model::make_model_logit_source(m);
  const model::GenerateResult res = model::generate(*src, c.config, c.prompt, hooks);
  return {res.generated().begin(), res.generated().end()};
}

// One test per model file (its cases in turn), so that each family's model is loaded once.
TEST_P(FamilyGenerations, SameTokensOnEveryFamily) {
  int cases = 0;
  for (const std::string& file : test::generation_case_files()) {
    const test::GenerationCase c = test::load_generation_case(file);
    if (c.model_file != GetParam()) continue;
    SCOPED_TRACE(file);
    const std::vector<int32_t> base = greedy(c, jit::Isa::Portable);
    ASSERT_EQ(base.size(), c.expected.size());
    for (jit::Isa isa : other_families()) {
      EXPECT_EQ(greedy(c, isa), base) << jit::isa_name(isa);
    }
    // Against the fixture: the F32 models (whose matrices take the reference path) must match it; the
    // quantized ones quantize activations as llama.cpp does and match it in most cases (recorded).
    if (c.model_file.find("F32") != std::string::npos) {
      EXPECT_EQ(base, c.expected) << "portable vs the fixture";
    }
    RecordProperty(test::test_label(file), base == c.expected ? "matches the fixture" : "differs");
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

std::vector<std::string> generation_models() {
  std::vector<std::string> out;
  for (const std::string& file : test::generation_case_files()) {
    const std::string m = test::load_generation_case(file).model_file;
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, FamilyGenerations, ::testing::ValuesIn(generation_models()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return test::test_label(info.param);
                         });

}  // namespace
