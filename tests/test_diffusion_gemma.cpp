// The diffusion-gemma architecture against the llama.cpp fork's logits (tests/data/diffusion-gemma: the tiny
// model A as F32, Q8_0 and Q4_K_M; five cases, each through the unified forward and the prompt-KV path; copied
// from ../shared/fixtures/diffusion-gemma, whose README describes them), on the reference executor and the
// JIT CPU executor of this CPU's best family:
// - F32: every case within 1e-3 relative L2 and 5e-3 absolute (the fork's GELU is an F16 table, which dllm
//   emulates; its F32 matmuls round differently), argmax equal on rows whose top-1 margin exceeds 0.05.
// - quantised files on the JIT (llama.cpp's arithmetic: int8 activations): within kQuantTolerance; argmax
//   equal where the margin exceeds 0.5 (docs/correctness.md lists the measured errors per case); the
//   issue's 2e-2, or each case above it explained by near-tie expert choices and int8 rounding flips
//   (DiffusionGemmaRouter).
// - the prompt-KV path (prompt encoded once with CacheMode::Extend, canvas run with Prefix) equals the
//   unified forward bit for bit on every model and executor; so do a batch of both sequences and a prompt
//   encoded in two pieces.
// Plus the command line's checks of `dllm logits` on these files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jit/cpu_executor.h"
#include "model/arch.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/batch.h"
#include "model/generate.h"
#include "model/prefix_cache.h"
#include "model/quant.h"
#include "model/reference_executor.h"
#include "model/sequence.h"
#include "dg_cases.h"
#include "router_probe.h"
#include "support.h"

using namespace dllm;

namespace {

using namespace test::dg;

constexpr double kQuantTolerance = 4e-2;

std::unique_ptr<model::Model> load(const std::string& model, bool jit) {
  model::LoadOptions o;
  o.threads = 2;
  if (jit) {
    const jit::Isa isa = jit::cpu_features().best();
    o.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
  }
  return model::Model::load(dg_path("gguf/" + model + ".gguf"), o);
}

struct ModelCase {
  std::string model;
  bool jit;
};

class DiffusionGemmaLogits : public ::testing::TestWithParam<ModelCase> {};

TEST_P(DiffusionGemmaLogits, MatchTheForkOnBothPathsAndThePathsAgreeExactly) {
  const ModelCase p = GetParam();
  auto m = load(p.model, p.jit);
  const int64_t V = m->n_vocab();
  const bool f32 = p.model.find("F32") != std::string::npos;
  for (const std::string& name : case_names()) {
    for (const std::string path : {"unified", "pkv"}) {
      const Case c = load_case(p.model, name, path);
      const std::vector<float> u = unified(*m, c), k = prompt_kv(*m, c);
      ASSERT_EQ(u.size(), c.want.size());
      EXPECT_EQ(std::memcmp(u.data(), k.data(), u.size() * sizeof(float)), 0) << c.name << ": prompt-KV != unified";
      const Deviation e = compare(path == std::string("unified") ? u : k, c, V, f32 ? 0.05 : 0.5);
      std::printf("%s %s %s: rel %.2e max %.2e\n", p.model.c_str(), p.jit ? "jit" : "reference", c.name.c_str(), e.rel,
                  e.max_abs);
      if (f32) {
        EXPECT_LE(e.rel, 1e-3) << c.name;
        EXPECT_LE(e.max_abs, 5e-3) << c.name;
      } else {
        EXPECT_LE(e.rel, kQuantTolerance) << c.name;
      }
      EXPECT_EQ(e.argmax_diff, 0) << c.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DiffusionGemmaLogits,
                         ::testing::Values(ModelCase{"tiny-diffusion-gemma-A-F32", false},
                                           ModelCase{"tiny-diffusion-gemma-A-F32", true},
                                           ModelCase{"tiny-diffusion-gemma-A-Q8_0", true},
                                           ModelCase{"tiny-diffusion-gemma-A-Q4_K_M", true}),
                         [](const auto& info) {
                           std::string n = info.param.model.substr(22) + (info.param.jit ? "_jit" : "_reference");
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The opt-in approximate self-conditioning (ForwardRequest::self_cond_top_k) on the fork's self-conditioning case
// (a5: the previous step's logits at T 0.8) of the F32 file: K = the vocabulary gives the exact logits' bits;
// fewer tokens move the logits away from the fork's, printed per K (docs/correctness.md quotes them).
TEST(DiffusionGemma, SelfCondTopKAgainstTheFork) {
  auto m = load("tiny-diffusion-gemma-A-F32", true);
  const int64_t V = m->n_vocab();
  const Case c = load_case("tiny-diffusion-gemma-A-F32", "a5_self_cond_after_a3_t0.8", "unified");
  const std::vector<float> exact = unified(*m, c);
  for (int64_t k : {V, int64_t{256}, int64_t{64}, int64_t{16}, int64_t{4}}) {
    std::vector<float> out(exact.size());
    model::ForwardRequest r = request(c, out.data());
    r.self_cond_top_k = k;
    m->forward(r);
    if (k == V) {
      EXPECT_EQ(out, exact) << "K = the vocabulary";
    }
    const Deviation fork = compare(out, c, V, 0.05);
    Case ex = c;
    ex.want = exact;
    const Deviation self = compare(out, ex, V, 0.05);
    std::printf("  top-%lld of %lld: against the fork rel %.2e (argmax differs on %d rows), against exact rel %.2e\n",
                static_cast<long long>(k), static_cast<long long>(V), fork.rel, fork.argmax_diff, self.rel);
    if (k == V) {
      EXPECT_LE(fork.rel, 1e-3);
    }
  }
}

TEST(DiffusionGemma, PromptEncodedInPiecesAndBatchedSequencesAreExact) {
  auto m = load("tiny-diffusion-gemma-A-Q8_0", true);
  const Case a = load_case("tiny-diffusion-gemma-A-Q8_0", "a2_prompt29_long", "pkv");
  const Case b = load_case("tiny-diffusion-gemma-A-Q8_0", "a5_self_cond_after_a3_t0.8", "pkv");
  const std::vector<float> ua = unified(*m, a), ub = unified(*m, b);
  EXPECT_EQ(prompt_kv(*m, a, 3), ua) << "the prompt encoded in three pieces";
  // Both sequences in one pass: each equals its own.
  std::vector<float> oa(ua.size()), ob(ub.size());
  const model::ForwardRequest reqs[2] = {request(a, oa.data()), request(b, ob.data())};
  m->forward_batch(reqs);
  EXPECT_EQ(oa, ua);
  EXPECT_EQ(ob, ub);
}

TEST(DiffusionGemma, HyperparametersAndGeometry) {
  const model::ModelFile f = model::ModelFile::open(dg_path("gguf/tiny-diffusion-gemma-A-Q4_K_M.gguf"));
  const model::HParams& hp = f.hparams();
  EXPECT_EQ(hp.arch, model::Arch::DiffusionGemma);
  EXPECT_EQ(hp.canvas_length, 16);
  EXPECT_EQ(hp.n_swa, 8);
  EXPECT_FLOAT_EQ(hp.final_softcap, 30.0f);
  ASSERT_EQ(hp.layer_attn.size(), 6u);
  EXPECT_TRUE(hp.attn(0).sliding);
  EXPECT_EQ(hp.attn(0).head_dim, 64);
  EXPECT_EQ(hp.attn(0).n_head_kv, 2);
  EXPECT_FALSE(hp.attn(5).sliding);
  EXPECT_EQ(hp.attn(5).head_dim, 128);
  EXPECT_EQ(hp.attn(5).n_head_kv, 1);
  EXPECT_EQ(hp.eb.max_steps, 48);
  const model::ModelTensors& t = f.tensors();
  EXPECT_EQ(t.layers[0].wv != nullptr, true);
  EXPECT_EQ(t.layers[5].wv, nullptr) << "global layers take V from K";
  EXPECT_NE(t.rope_freqs, nullptr);
  EXPECT_EQ(t.output, t.token_embd) << "tied head";
}

TEST(DiffusionGemma, GeluTableMatchesGgmlsRule) {
  // Outside (-10, 10) the rule takes 0 or x; inside, F16 in and out.
  EXPECT_EQ(model::gelu_tanh_f16_table(-12.0f), 0.0f);
  EXPECT_EQ(model::gelu_tanh_f16_table(11.0f), 11.0f);
  for (float x : {-3.0f, -0.5f, 0.0f, 0.3f, 1.0f, 2.5f}) {
    const double exact = 0.5 * x * (1 + std::tanh(0.7978845608 * x * (1 + 0.044715 * x * x)));
    EXPECT_NEAR(model::gelu_tanh_f16_table(x), exact, 2e-3 * (1 + std::abs(exact))) << x;
  }
}

// The GeGLU row (vectorised with F16C where the CPU has it) gives the scalar rule's bits: every F16 value, the
// floats around the +-10 cut and around F16 rounding ties, random ones, infinities, odd lengths (the tail).
TEST(DiffusionGemma, GegluRowEqualsTheScalarRuleBitForBit) {
  std::vector<float> x;
  for (uint32_t i = 0; i < 65536; ++i) x.push_back(quant::fp16_to_f32(static_cast<uint16_t>(i)));
  for (float c : {-10.0f, 10.0f, 9.9951f, -9.9951f, 0.0f})
    for (int d = -40; d <= 40; ++d) x.push_back(std::nextafter(c, d < 0 ? -INFINITY : INFINITY) + d * 1e-4f * (c != 0));
  for (uint32_t i = 0; i < 65536; i += 7) {  // halfway between neighbouring F16 values: the rounding ties
    const float a = quant::fp16_to_f32(static_cast<uint16_t>(i)), b = quant::fp16_to_f32(static_cast<uint16_t>(i + 1));
    if (std::isfinite(a) && std::isfinite(b)) x.push_back(a + (b - a) / 2);
  }
  std::mt19937 rng(4);
  std::normal_distribution<float> n(0.0f, 4.0f);
  for (int i = 0; i < 100000; ++i) x.push_back(n(rng));
  x.push_back(INFINITY), x.push_back(-INFINITY), x.push_back(3.0f);
  std::vector<float> up(x.size());
  for (float& u : up) u = n(rng);
  std::vector<float> got = x;
  model::geglu_row(got.data(), up.data(), static_cast<int64_t>(got.size()));
  int nan_pairs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = model::gelu_tanh_f16_table(x[i]) * up[i];
    if (want != want) {
      EXPECT_NE(got[i], got[i]) << "x " << x[i];
      ++nan_pairs;
      continue;
    }
    uint32_t a, b;
    std::memcpy(&a, &want, 4), std::memcpy(&b, &got[i], 4);
    ASSERT_EQ(a, b) << "x " << x[i] << " up " << up[i];
  }
  EXPECT_GT(nan_pairs, 0) << "the F16 NaNs stay NaN";
}

// ---------------------------------------------------------------- quantised files: router flips

// A quantised file loaded with a probe executor: the JIT of this CPU's best family, or the reference executor
// with f32 activations (the router's input without activation quantisation) or with int8 ones (llama.cpp's
// arithmetic, as the JIT, with sums in double: another summation order of the same arithmetic).
struct Probed {
  std::unique_ptr<model::Model> model;
  test::RouterProbe<jit::CpuExecutor>* jit = nullptr;
  test::RouterProbe<model::ReferenceExecutor>* ref = nullptr;
};

enum class ProbeKind { Jit, ReferenceF32, ReferenceInt8 };

std::unique_ptr<Probed> load_probed(const std::string& model, ProbeKind kind) {
  auto owned = std::make_unique<Probed>();
  Probed& p = *owned;
  model::LoadOptions o;
  o.threads = 2;
  if (kind == ProbeKind::Jit) {
    const jit::Isa isa = jit::cpu_features().best();
    o.make_executor = [&p, isa](ThreadPool& pool) {
      auto e = std::make_unique<test::RouterProbe<jit::CpuExecutor>>(pool, isa);
      p.jit = e.get();
      return e;
    };
  } else {
    const auto acts = kind == ProbeKind::ReferenceF32 ? model::ReferenceExecutor::Activations::F32
                                                      : model::ReferenceExecutor::Activations::Quantized;
    o.make_executor = [&p, acts](ThreadPool& pool) {
      auto e = std::make_unique<test::RouterProbe<model::ReferenceExecutor>>(pool, acts);
      p.ref = e.get();
      return e;
    };
  }
  p.model = model::Model::load(dg_path("gguf/" + model + ".gguf"), o);
  return owned;
}

// The target for quantised files: within 2e-2 of the fork, and where a case exceeds it, show where the
// difference comes from. Two discontinuities of llama.cpp's arithmetic turn summation-order differences (ulps)
// into visible ones, and this tiny random model amplifies them: an expert choice between two experts whose
// router probabilities differ by less than what activation rounding moves them (the same row with int8
// activations, the JIT, against f32 ones, the reference), and an int8 rounding of an activation that lies
// within an ulp of a half step. For each case above 2e-2:
// - router flips: such near-tie decisions are forced the other way, nearest to a tie first, keeping each flip
//   that brings the case closer, until it is within 2e-2 (every row and layer of the unified pass is a
//   candidate: the canvas attends to every position, so a prompt row's choice reaches the canvas);
// - what is left must be within 2e-2 plus the distance between dllm's two executors of the very same
//   arithmetic (the JIT against the int8 reference, which sums in double: they part only where an int8
//   rounding or an expert choice lands on the other side), that is, the fork is no further from the JIT than a
//   third summation order of the same arithmetic would be.
// The prompt-KV path gives the same logits bit for bit (checked above), so the unified pass serves both
// paths' references. Each case is reported (docs/correctness.md keeps the numbers).
TEST(DiffusionGemmaRouter, QuantisedWithinTwoPercentOrExplainedByRoundingFlips) {
  constexpr double kTarget = 2e-2;
  constexpr size_t kTries = 24;  // near-tie decisions tried per case
  for (const std::string quant : {"Q8_0", "Q4_K_M"}) {
    const std::string file = "tiny-diffusion-gemma-A-" + quant;
    const std::unique_ptr<Probed> jit_owned = load_probed(file, ProbeKind::Jit),
                                  f32_owned = load_probed(file, ProbeKind::ReferenceF32),
                                  int8_owned = load_probed(file, ProbeKind::ReferenceInt8);
    Probed &jit = *jit_owned, &f32 = *f32_owned, &int8 = *int8_owned;
    const model::HParams& hp = jit.model->hparams();
    const int64_t E = hp.n_expert, k = hp.n_expert_used, V = jit.model->n_vocab();
    for (const std::string& name : case_names()) {
      for (const std::string path : {"unified", "pkv"}) {
        const Case c = load_case(file, name, path);
        auto rel_of = [&](const std::vector<float>& got) { return compare(got, c, V, 0.5).rel; };
        jit.jit->flips.clear(), jit.jit->reset();
        const std::vector<float> got = unified(*jit.model, c);
        const double rel = rel_of(got);
        std::printf("%s %s: rel L2 %.3g\n", file.c_str(), c.name.c_str(), rel);
        if (rel <= kTarget) continue;
        const auto probs = jit.jit->probs;
        const auto ids = jit.jit->ids;
        f32.ref->reset();
        unified(*f32.model, c);
        ASSERT_EQ(f32.ref->probs.size(), probs.size());
        // Every (layer, row) decision nearer to a tie than activation rounding moves that row's probabilities.
        // The last layer routes only the requested rows (row i there is position c.rows[i]).
        std::vector<test::Decision> near;
        for (size_t call = 0; call < probs.size(); ++call) {
          const int64_t n = static_cast<int64_t>(probs[call].size()) / E;
          for (int64_t r = 0; r < n; ++r) {
            const test::Decision d = test::decision_at(probs, ids, static_cast<int>(call), r, E, k);
            double moved = 0;
            for (int64_t e = 0; e < E; ++e)
              moved = std::max<double>(moved, std::fabs(probs[call][r * E + e] - f32.ref->probs[call][r * E + e]));
            if (d.margin < moved) near.push_back(d);
          }
        }
        std::sort(near.begin(), near.end(),
                  [](const test::Decision& a, const test::Decision& b) { return a.margin < b.margin; });
        double best = rel;
        std::vector<test::Flip> kept;
        for (size_t j = 0; j < std::min(kTries, near.size()) && best > kTarget; ++j) {
          const test::Decision& d = near[j];
          jit.jit->flips = kept;
          jit.jit->flips.push_back({d.call, d.row, d.selected, d.unselected});
          jit.jit->reset();
          const double after = rel_of(unified(*jit.model, c));
          if (after < best) {
            const int64_t pos = static_cast<int64_t>(probs[static_cast<size_t>(d.call)].size()) / E ==
                                        static_cast<int64_t>(c.ids.size())
                                    ? d.row
                                    : c.rows[static_cast<size_t>(d.row)];
            std::printf("  router flip: layer %d position %lld, experts %d / %d differ by %.3g in probability: "
                        "rel L2 %.3g\n",
                        d.call, static_cast<long long>(pos), d.selected, d.unselected, d.margin, after);
            best = after, kept = jit.jit->flips;
          }
        }
        jit.jit->flips.clear();
        if (best <= kTarget) continue;
        // What is left: int8 rounding flips. The same arithmetic summed in another order, for scale.
        Case same = c;
        same.want = unified(*int8.model, c);
        const double floor = compare(got, same, V, 0.5).rel;
        std::printf("  left %.3g; the JIT against the int8 reference (same arithmetic, sums in double): %.3g\n", best,
                    floor);
        EXPECT_LE(best, kTarget + floor) << file << " " << c.name << ": " << near.size()
                                         << " near-tie router decisions, the first " << kTries
                                         << " tried, and the difference is larger than rounding flips explain";
      }
    }
  }
}

TEST(DiffusionGemmaCli, LogitsAndRunFlagsAreChecked) {
  const std::string mf = dg_path("gguf/tiny-diffusion-gemma-A-Q8_0.gguf");
  const std::string out = ::testing::TempDir() + "dg_logits.f32";
  std::string ids;  // prompt of 4 ids, then a 16-id canvas
  for (int i = 0; i < 20; ++i) {
    if (i) ids += ',';
    ids += std::to_string(i == 0 ? 2 : 100 + i);
  }
  auto r = test::run_dllm({"logits", "--model", mf, "--tokens", ids, "--rows", "4,19", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<float> cached = read_f32(out);
  ASSERT_EQ(cached.size(), 2u * 1536u);
  r = test::run_dllm({"logits", "--model", mf, "--tokens", ids, "--rows", "4,19", "--out", out, "--no-prompt-cache"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_f32(out), cached) << "both paths give the same logits";
  r = test::run_dllm({"logits", "--model", mf, "--tokens", ids, "--rows", "3", "--out", out});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--rows: position 3 is in the prompt"), std::string::npos) << r.err;
  r = test::run_dllm({"logits", "--model", mf, "--tokens", "2,5,6", "--rows", "1", "--out", out});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
  r = test::run_dllm({"logits", "--model", mf, "--tokens", ids, "--rows", "4", "--out", out, "--self-cond", mf});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--self-cond"), std::string::npos) << r.err;
  r = test::run_dllm({"logits", "--model", test::data_path("models/tiny-llada-Q8_0.gguf"), "--tokens", "1,2", "--rows",
                      "0", "--out", out, "--no-prompt-cache"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--no-prompt-cache is for DiffusionGemma"), std::string::npos) << r.err;
  r = test::run_dllm({"run", "--model", mf, "--prompt", "hi", "--max-tokens", "20", "--seed", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("output_ids").size(), 20u) << r.out;  // two blocks of 16, the second cut
  EXPECT_LE(j.at("steps_run").get<int>(), 2 * 48) << r.out;
  EXPECT_EQ(j.at("forward_passes"), j.at("steps_run")) << "encoding the prefix is not a step";
  // Steps per block and per-step statistics: the blocks' step counts add up to the steps run, each step has its
  // scheduled temperature (the first of a block t_max = 0.8), and a block's last step closes it.
  ASSERT_EQ(j.at("blocks").size(), 2u) << r.out;
  ASSERT_EQ(j.at("step_stats").size(), j.at("steps_run").get<size_t>()) << r.out;
  EXPECT_EQ(j["blocks"][0]["steps"].get<int>() + j["blocks"][1]["steps"].get<int>(), j["steps_run"].get<int>());
  for (const auto& b : j["blocks"]) EXPECT_TRUE(b["done"].get<bool>()) << r.out;
  EXPECT_FLOAT_EQ(j["step_stats"][0]["temperature"].get<float>(), 0.8f);
  const int first_of_second = j["blocks"][0]["steps"].get<int>();
  EXPECT_TRUE(j["step_stats"][first_of_second - 1]["block_done"].get<bool>());
  EXPECT_EQ(j["step_stats"][first_of_second]["block"], 1);
  EXPECT_FLOAT_EQ(j["step_stats"][first_of_second]["temperature"].get<float>(), 0.8f);
  for (const auto& st : j["step_stats"]) {
    EXPECT_GE(st["accepted"].get<int>(), 1);
    EXPECT_EQ(st["accepted"].get<int>() + st["renoised"].get<int>(), 16) << st;
    EXPECT_GE(st["mean_entropy"].get<double>(), 0.0);
  }
  // The sampler's own flags; the other samplers' flags are refused on this model, and its flags on others.
  r = test::run_dllm({"run", "--model", mf, "--prompt", "hi", "--max-tokens", "8", "--eb-max-steps", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LE(nlohmann::json::parse(r.out).at("steps_run").get<int>(), 3) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("settings").at("eb").at("max_steps"), 3) << r.out;
  EXPECT_FALSE(nlohmann::json::parse(r.out).at("settings").contains("remasking")) << "not this sampler's setting";
  // Per-step statistics: the schedule's temperatures (0.8, then 0.8 - 0.4/3, ...), the mean entropy, block ends.
  r = test::run_dllm({"run", "--model", mf, "--prompt", "hi", "--max-tokens", "8", "--eb-max-steps", "3",
                      "--eb-confidence", "0", "--dump-step-stats"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("step=0 steps=3 block=0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("temperature=0.8000 mean_entropy="), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("temperature=0.6667 mean_entropy="), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("temperature=0.5333 mean_entropy="), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" block_done"), std::string::npos) << r.err;
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--steps", "4"}, {"--temperature", "0.5"}, {"--block-length", "8"}, {"--remasking", "entropy"}}) {
    r = test::run_dllm({"run", "--model", mf, "--prompt", "hi", flag, value});
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_NE(r.err.find(flag + " does not apply to DiffusionGemma models"), std::string::npos) << r.err;
  }
  r = test::run_dllm({"run", "--model", test::data_path("models/tiny-llada-Q8_0.gguf"), "--prompt", "hi",
                      "--eb-max-steps", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--eb-max-steps is for DiffusionGemma models only (this model is LLaDA)"), std::string::npos) << r.err;
  r = test::run_dllm({"run", "--model", mf, "--prompt", "hi", "--eb-t-min", "0.9"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("flags --eb-t-min and --eb-t-max must satisfy 0 < t_min <= t_max, got 0.9 and 0.8"),
            std::string::npos) << r.err;
  r = test::run_dllm({"run", "--model", mf, "--prompts-file", "-", "--json"},
                     "{\"prompt\":\"hi\",\"max_tokens\":8,\"eb_max_steps\":2}\n{\"prompt\":\"yo\",\"steps\":3}\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("line 2: \"steps\" does not apply to DiffusionGemma models"), std::string::npos) << r.err;
}

// --self-cond-top-k (self_cond_top_k), the opt-in approximate self-conditioning: off by default; a K at least
// the vocabulary is the exact path's bytes (logits) and tokens (run); a small K changes the logits a little;
// refused on other models, below 0, and without --self-cond in `logits`.
TEST(DiffusionGemmaCli, SelfCondTopKIsOptInAndExactAtTheVocabulary) {
  const std::string mf = dg_path("gguf/tiny-diffusion-gemma-A-Q8_0.gguf");
  const std::string out = ::testing::TempDir() + "dg_topk.f32", sc = ::testing::TempDir() + "dg_topk_sc.f32";
  std::string ids;  // prompt of 4 ids, then a 16-id canvas
  for (int i = 0; i < 20; ++i) {
    if (i) ids += ',';
    ids += std::to_string(i == 0 ? 2 : 100 + i);
  }
  {
    std::mt19937 rng(9);
    std::normal_distribution<float> n(0.0f, 3.0f);
    std::vector<float> l(16u * 1536u);
    for (float& x : l) x = n(rng);
    std::ofstream f(sc, std::ios::binary);
    f.write(reinterpret_cast<const char*>(l.data()), static_cast<std::streamsize>(l.size() * sizeof(float)));
  }
  const std::vector<std::string> base = {"logits", "--model", mf, "--tokens", ids, "--rows", "4,11,19", "--out", out,
                                         "--self-cond", sc};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto r = test::run_dllm(base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<float> exact = read_f32(out);
  r = test::run_dllm(with({"--self-cond-top-k", "1536"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_f32(out), exact) << "K = the vocabulary takes every token";
  // Fewer tokens, further from the exact logits (the random fixture's broad distributions leave much mass out).
  double last = 0;
  for (const char* k : {"512", "64", "8"}) {
    r = test::run_dllm(with({"--self-cond-top-k", k}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> approx = read_f32(out);
    ASSERT_EQ(approx.size(), exact.size());
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < exact.size(); ++i)
      d2 += double(approx[i] - exact[i]) * (approx[i] - exact[i]), n2 += double(exact[i]) * exact[i];
    const double rel = std::sqrt(d2 / n2);
    std::printf("  top-%s of 1536 against every token: relative L2 %.3g\n", k, rel);
    EXPECT_GT(rel, last) << "K " << k;
    last = rel;
  }
  r = test::run_dllm({"logits", "--model", mf, "--tokens", ids, "--rows", "4", "--out", out, "--self-cond-top-k", "8"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--self-cond-top-k needs --self-cond FILE"), std::string::npos) << r.err;
  r = test::run_dllm(with({"--self-cond-top-k", "-1"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--self-cond-top-k"), std::string::npos) << r.err;

  // run: the tokens of the exact path at K >= vocabulary, the setting in --json, refused on other models.
  const std::vector<std::string> run = {"run", "--model", mf, "--prompt", "hi", "--max-tokens", "20", "--seed", "3",
                                        "--eb-max-steps", "4", "--json"};
  r = test::run_dllm(run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json cold = nlohmann::json::parse(r.out);
  std::vector<std::string> a = run;
  a.insert(a.end(), {"--self-cond-top-k", "100000"});
  r = test::run_dllm(a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json all = nlohmann::json::parse(r.out);
  EXPECT_EQ(all.at("output_ids"), cold.at("output_ids"));
  EXPECT_EQ(all.at("settings").at("eb").at("self_cond_top_k"), 100000);
  EXPECT_EQ(cold.at("settings").at("eb").at("self_cond_top_k"), 0);
  a = run;
  a.insert(a.end(), {"--self-cond-top-k", "2"});
  r = test::run_dllm(a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("output_ids").size(), 20u);
  r = test::run_dllm({"run", "--model", test::data_path("models/tiny-llada-Q8_0.gguf"), "--prompt", "hi",
                      "--self-cond-top-k", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--self-cond-top-k is for DiffusionGemma models only (this model is LLaDA)"), std::string::npos)
      << r.err;
  r = test::run_dllm({"run", "--model", mf, "--prompts-file", "-", "--json"},
                     "{\"prompt\":\"hi\",\"max_tokens\":8,\"eb_max_steps\":2,\"self_cond_top_k\":-4}\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("\"self_cond_top_k\" must be at least 0"), std::string::npos) << r.err;
}

// --- generation: the entropy-bound sampler in the per-sequence state machine ---

model::GenerateConfig generation_config(const model::Model& m, int64_t max_tokens, uint64_t seed) {
  model::GenerateConfig c = {};
  c.arch = m.hparams().arch;
  c.max_tokens = max_tokens;
  c.seed = seed;
  c.eb = m.hparams().eb;
  c.eb.max_steps = 6;  // short blocks: the adaptive stop rarely fires on the tiny random model
  c.canvas_length = m.hparams().canvas_length;
  c.context_length = m.hparams().n_ctx;
  return c;
}

// Counts the passes a generation asks for; `unified` computes each canvas step as one unified forward over
// [prefix | canvas] (no cache: the encode passes do nothing) instead of against the cached prefix.
class CountingSource : public model::LogitSource {
 public:
  CountingSource(model::Model& m, bool unified) : m_(m), unified_(unified), cached_(model::make_model_logit_source(m)) {}
  int64_t n_vocab() const override { return m_.n_vocab(); }
  void forward(std::span<const int32_t>, std::span<const int64_t>, float*) override {
    throw std::runtime_error("a DiffusionGemma generation asked for an exact pass");
  }
  void forward_prefixed(std::span<const int32_t> tokens, const model::StepNeed& need, float* out) override {
    need.pass == model::Pass::Encode ? ++encodes : ++canvases;
    if (!unified_) return cached_->forward_prefixed(tokens, need, out);
    if (need.pass == model::Pass::Encode) return;
    model::ForwardRequest r{tokens.first(static_cast<size_t>(need.end)), need.rows, out};
    r.n_prompt = need.begin;
    r.self_cond_logits = need.self_cond;
    r.self_cond_temperature = need.self_cond_temperature;
    r.self_cond_top_k = need.self_cond_top_k;
    m_.forward(r);
  }
  int encodes = 0, canvases = 0;

 private:
  model::Model& m_;
  bool unified_;
  std::unique_ptr<model::LogitSource> cached_;
};

// Two blocks: the prompt encoded once, the first block's tokens appended to the cached prefix, each step one
// canvas pass; the same tokens as unified forwards over [prefix | canvas]; a stop token in the first block ends
// the answer there (no second block).
TEST(DiffusionGemmaGenerate, BlocksChainThroughTheCachedPrefixAndEqualUnifiedForwards) {
  auto m = load("tiny-diffusion-gemma-A-Q8_0", true);
  const Case a = load_case("tiny-diffusion-gemma-A-Q8_0", "a1_prompt5_short", "pkv");
  const std::vector<int32_t> prompt(a.ids.begin(), a.ids.begin() + a.n_prompt);
  const int64_t C = m->hparams().canvas_length;
  const model::GenerateConfig cfg = generation_config(*m, 2 * C, 7);
  int steps_seen = 0, blocks_closed = 0;
  model::GenerateHooks hooks;
  hooks.on_step = [&](const model::StepEvent& ev) {
    ++steps_seen;
    EXPECT_GE(ev.scheduled, 1) << "the lowest-entropy position is always accepted";
    EXPECT_EQ(static_cast<int64_t>(ev.canvas.size()), a.n_prompt + (ev.block + 1) * C);
    // The open block is noise until its last step, which reports the block's tokens as answer.
    if (ev.open_begin >= 0) {
      EXPECT_EQ(ev.open_begin, a.n_prompt + ev.block * C);
    }
    blocks_closed += ev.open_begin < 0;
  };
  CountingSource cached(*m, false), other_seed(*m, false), plain(*m, true);
  const model::GenerateResult r = model::generate(cached, cfg, prompt, hooks);
  ASSERT_EQ(static_cast<int64_t>(r.generated().size()), 2 * C);
  EXPECT_EQ(std::vector<int32_t>(r.canvas.begin(), r.canvas.begin() + a.n_prompt), prompt);
  EXPECT_EQ(cached.encodes, 2) << "the prompt, then the first block's tokens";
  EXPECT_EQ(cached.canvases, r.steps_run);
  EXPECT_EQ(steps_seen, r.steps_run);
  EXPECT_EQ(blocks_closed, 2);
  EXPECT_LE(r.steps_run, 2 * cfg.eb.max_steps);
  const model::GenerateResult u = model::generate(plain, cfg, prompt);
  EXPECT_EQ(u.canvas, r.canvas) << "unified forwards give the same tokens";
  EXPECT_EQ(plain.encodes, 2);
  EXPECT_NE(model::generate(other_seed, generation_config(*m, 2 * C, 8), prompt).canvas, r.canvas) << "another seed";

  // A stop token: the first block's token at generated position 5 ends the answer at its first occurrence.
  model::GenerateConfig stop = cfg;
  const int32_t t = r.generated()[5];
  stop.stop_ids = {t};
  const auto first = std::find(r.generated().begin(), r.generated().end(), t) - r.generated().begin();
  CountingSource once(*m, false);
  const model::GenerateResult s = model::generate(once, stop, prompt);
  EXPECT_EQ(std::vector<int32_t>(s.generated().begin(), s.generated().end()),
            std::vector<int32_t>(r.generated().begin(), r.generated().begin() + first + 1));
  EXPECT_EQ(once.encodes, 1) << "no second block";
  EXPECT_EQ(model::answer_tokens(s.canvas, s.prompt_length, stop.stop_ids).size(), static_cast<size_t>(first));
}

// Self-conditioning keeps each step's logits for the next: generate() (and the batch) hand over their buffer,
// which the sequence swaps with its own instead of copying it; a caller that does not is copied from. Driving a
// sequence by hand, its buffer poisoned with NaN after every commit, gives generate()'s tokens: the swapped-in
// buffer is the one the sequence reads, and neither path keeps reading a buffer the caller refills.
TEST(DiffusionGemmaGenerate, SelfConditioningLogitsSwappedOrCopiedGiveTheSameTokens) {
  auto m = load("tiny-diffusion-gemma-A-Q8_0", true);
  const Case a = load_case("tiny-diffusion-gemma-A-Q8_0", "a1_prompt5_short", "pkv");
  const std::vector<int32_t> prompt(a.ids.begin(), a.ids.begin() + a.n_prompt);
  const model::GenerateConfig cfg = generation_config(*m, 2 * m->hparams().canvas_length, 11);
  CountingSource swapped(*m, false), copied(*m, false);
  const model::GenerateResult r = model::generate(swapped, cfg, prompt);
  model::Sequence seq(cfg, prompt, copied.n_vocab());
  std::vector<float> logits;
  int steps = 0;
  while (const model::StepNeed* need = seq.next()) {
    logits.assign(need->rows.size() * static_cast<size_t>(copied.n_vocab()), 0.0f);
    copied.forward_prefixed(seq.canvas(), *need, logits.data());
    seq.commit(logits.data());
    std::fill(logits.begin(), logits.end(), std::numeric_limits<float>::quiet_NaN());
    ++steps;
  }
  const model::GenerateResult c = seq.take_result();
  ASSERT_TRUE(c.error.empty()) << c.error;
  EXPECT_GT(steps, 2);
  EXPECT_EQ(c.canvas, r.canvas);
  EXPECT_EQ(c.steps_run, r.steps_run);
}

// The prefix cache on its own: the longest shared run of leading ids wins, an entry that extends another
// replaces it, one already held is not kept twice, the least recently used goes first, one larger than the
// whole bound is not kept.
TEST(DiffusionGemmaPrefixCache, LongestPrefixLeastRecentlyUsedOutAndBounded) {
  auto entry = [](std::vector<int32_t> ids) {
    model::PrefixCache::Entry e;
    e.kv.assign(ids.size() * 4, 1.0f);
    e.ids = std::move(ids);
    return e;
  };
  const uint64_t one = entry({1, 2, 3, 4}).bytes();  // 4 positions
  model::PrefixCache c(3 * one);
  c.insert(entry({1, 2, 3, 4}));
  c.insert(entry({1, 2, 9, 9}));
  EXPECT_EQ(c.entries(), 2u);
  const std::vector<int32_t> q{1, 2, 3, 7, 7};
  auto hit = c.find(q, 5);
  ASSERT_NE(hit.entry, nullptr);
  EXPECT_EQ(hit.length, 3);
  EXPECT_EQ(hit.entry->ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(c.find(q, 2).length, 2) << "at most max_length";
  EXPECT_EQ(c.find(std::vector<int32_t>{5, 1}, 2).entry, nullptr);
  EXPECT_EQ(c.misses(), 1);
  c.insert(entry({1, 2, 3}));  // held already by {1, 2, 3, 4}
  EXPECT_EQ(c.entries(), 2u);
  c.insert(entry({1, 2, 9, 9, 5, 6}));  // the next turn of {1, 2, 9, 9}: replaces it
  EXPECT_EQ(c.entries(), 2u);
  EXPECT_EQ(c.find(std::vector<int32_t>{1, 2, 9, 9, 5, 6, 7}, 7).length, 6);
  EXPECT_LE(c.bytes(), c.capacity_bytes());
  // {1, 2, 3, 4} is now the least recently used: a new entry that needs the room evicts it.
  c.insert(entry({8, 8, 8, 8}));
  EXPECT_EQ(c.find(std::vector<int32_t>{1, 2, 3, 4}, 4).length, 2) << "only {1, 2, 9, 9, 5, 6} shares a prefix now";
  c.insert(entry(std::vector<int32_t>(13, 3)));  // larger than the bound
  EXPECT_EQ(c.find(std::vector<int32_t>(13, 3), 13).length, 0);
  EXPECT_LE(c.bytes(), c.capacity_bytes());
}

// Through the batch: a finished sequence leaves its encoded prefix (prompt and first block); a later prompt that
// begins with it (the next turn: prompt, answer's first block, more) encodes only the rest, reports the cached
// positions, and generates exactly the tokens of a cold run; a prompt that shares only part of it takes that part.
TEST(DiffusionGemmaPrefixCache, NextTurnReusesTheEncodedPrefixExactly) {
  for (const char* name : {"tiny-diffusion-gemma-A-Q8_0", "tiny-diffusion-gemma-A-F32"}) {
    auto m = load(name, true);
    const int64_t C = m->hparams().canvas_length;
    const Case a = load_case(name, "a2_prompt29_long", "pkv");
    const std::vector<int32_t> p1(a.ids.begin(), a.ids.begin() + a.n_prompt);
    model::PrefixCache cache(64 << 20);
    model::Batch warm(*m);
    warm.set_prefix_cache(&cache);
    warm.add(generation_config(*m, 2 * C, 4), p1);
    warm.run();
    auto first = warm.take_finished();
    ASSERT_EQ(first.size(), 1u);
    const model::GenerateResult& r1 = first[0].second;
    ASSERT_TRUE(r1.error.empty()) << r1.error;
    EXPECT_EQ(r1.cached_prompt_tokens, 0);
    ASSERT_EQ(cache.entries(), 1u) << name;
    // The next turn: the first turn's prompt and first block, then new tokens.
    std::vector<int32_t> p2(r1.canvas.begin(), r1.canvas.begin() + a.n_prompt + C);
    for (int32_t t : {7, 40, 41, 42, 6}) p2.push_back(t);
    // A prompt sharing only the first 10 ids.
    std::vector<int32_t> p3(p1.begin(), p1.begin() + 10);
    for (int32_t t : {300, 301, 302}) p3.push_back(t);
    const model::GenerateConfig c2 = generation_config(*m, C + 3, 11), c3 = generation_config(*m, C, 12);
    warm.add(c2, p2);
    warm.add(c3, p3);
    warm.run();
    auto second = warm.take_finished();
    ASSERT_EQ(second.size(), 2u);
    model::Batch cold(*m);
    cold.add(c2, p2);
    cold.add(c3, p3);
    cold.run();
    auto want = cold.take_finished();
    ASSERT_EQ(want.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const auto& [id, res] = second[i];
      const auto& [wid, wres] = want[i];
      ASSERT_EQ(id - 1, wid);
      EXPECT_TRUE(res.error.empty()) << res.error;
      EXPECT_EQ(res.canvas, wres.canvas) << name << ": the reuse is exact, request " << wid;
      EXPECT_EQ(wres.cached_prompt_tokens, 0);
      EXPECT_EQ(res.cached_prompt_tokens, wid == 0 ? a.n_prompt + C : 10) << name << " request " << wid;
    }
  }
}

// Sequences at different blocks in one batch, one with the approximate self-conditioning (self_cond_top_k), give
// each exactly its tokens alone; max_tokens not a multiple of the canvas cuts the last block's tokens.
TEST(DiffusionGemmaGenerate, BatchedSequencesEqualEachAlone) {
  auto m = load("tiny-diffusion-gemma-A-Q4_K_M", true);
  const int64_t C = m->hparams().canvas_length;
  std::vector<std::vector<int32_t>> prompts;
  for (const char* name : {"a1_prompt5_short", "a2_prompt29_long", "a3_chat_prompt_uniform_canvas"}) {
    const Case c = load_case("tiny-diffusion-gemma-A-Q4_K_M", name, "pkv");
    prompts.emplace_back(c.ids.begin(), c.ids.begin() + c.n_prompt);
  }
  std::vector<model::GenerateConfig> cfgs{generation_config(*m, C + 5, 1), generation_config(*m, 2 * C, 2),
                                          generation_config(*m, C, 3)};
  cfgs[1].eb.self_cond_top_k = 5;  // each sequence its own self-conditioning
  std::vector<model::GenerateResult> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    CountingSource src(*m, false);
    alone.push_back(model::generate(src, cfgs[i], prompts[i]));
  }
  EXPECT_EQ(static_cast<int64_t>(alone[0].generated().size()), C + 5);
  model::Batch batch(*m);
  for (size_t i = 0; i < prompts.size(); ++i) batch.add(cfgs[i], prompts[i]);
  batch.run();
  auto done = batch.take_finished();
  ASSERT_EQ(done.size(), prompts.size());
  for (auto& [id, res] : done) {
    EXPECT_TRUE(res.error.empty()) << res.error;
    EXPECT_EQ(res.canvas, alone[static_cast<size_t>(id)].canvas) << "sequence " << id;
  }
}

TEST(DiffusionGemmaGenerate, SettingsAreChecked) {
  auto m = load("tiny-diffusion-gemma-A-Q8_0", false);
  model::GenerateConfig c = generation_config(*m, 16, 1);
  const std::vector<int32_t> prompt{2, 5};
  EXPECT_FALSE(model::check_settings(c, 2));
  c.eb.t_min = 0;
  EXPECT_EQ(model::check_settings(c, 2)->key, "eb_t_min");
  c = generation_config(*m, 16, 1), c.eb.t_max = 0.3;
  EXPECT_EQ(model::check_settings(c, 2)->key, "eb_t_min");
  c = generation_config(*m, 16, 1), c.eb.max_steps = 0;
  EXPECT_EQ(model::check_settings(c, 2)->key, "eb_max_steps");
  c.eb.max_steps = int64_t{1} << 62;  // steps * blocks must not overflow
  EXPECT_EQ(model::check_settings(c, 2)->key, "eb_max_steps");
  c = generation_config(*m, 16, 1), c.eb.stability = 1.5;
  EXPECT_EQ(model::check_settings(c, 2)->key, "eb_stability");
  c = generation_config(*m, 16, 1), c.eb.entropy_bound = -1;
  EXPECT_EQ(model::check_settings(c, 2)->key, "eb_entropy_bound");
  c = generation_config(*m, 16, 1), c.eb.self_cond_top_k = -1;
  EXPECT_EQ(model::check_settings(c, 2)->key, "self_cond_top_k");
  c = generation_config(*m, 16, 1);
  EXPECT_EQ(model::check_settings(c, 0)->key, "prompt");
  c.max_tokens = m->hparams().n_ctx;
  EXPECT_EQ(model::check_settings(c, 2)->key, "max_tokens");
  CountingSource src(*m, false);
  c = generation_config(*m, 16, 1), c.eb.max_steps = 0;
  EXPECT_THROW(model::generate(src, c, prompt), Error);
}

}  // namespace
