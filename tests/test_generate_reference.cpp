// Greedy generations on the tiny models, token for token and step for step, against every reference of
// tests/data/generations (copies of the shared fixtures marked matches_authors_algorithm: true: the
// authors' LLaDA and Dream samplers at temperature 0 over llama.cpp's forward pass, cross-checked by a
// float64 loop). Runs through the library with the reference executor and --no-early-stop semantics.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>

#include "model/generate.h"
#include "model/model.h"
#include "support.h"

namespace dllm::model {
namespace {

using nlohmann::json;

Model& tiny_model(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[file];
  if (!m) m = Model::load(test::data_path("models/" + file));
  return *m;
}

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, SameCanvasAndSameCommitsPerStep) {
  const json ref = json::parse(test::read_file(test::data_path("generations/" + GetParam())));
  const test::GenerationCase c = test::load_generation_case(GetParam());
  Model& m = tiny_model(c.model_file);
  ASSERT_EQ(m.mask_token_id(), c.mask_id);
  const GenerateConfig& cfg = c.config;
  const std::vector<int32_t>& prompt = c.prompt;

  // step -> committed (position, token) pairs, as the reference trace lists them
  std::map<int64_t, std::vector<std::pair<int64_t, int32_t>>> steps;
  GenerateHooks hooks;
  hooks.pool = &m.pool();
  hooks.on_step = [&](const StepEvent& ev) {
    for (int64_t j : ev.committed)
      steps[ev.step].emplace_back(j, ev.canvas[static_cast<size_t>(j)]);
  };
  auto src = make_model_logit_source(m);
  const GenerateResult res = generate(*src, cfg, prompt, hooks);

  const auto got = std::vector<int32_t>(res.generated().begin(), res.generated().end());
  EXPECT_EQ(got, c.expected);
  EXPECT_FALSE(res.stopped_early);
  for (const auto& t : ref.at("trace")) {
    std::vector<std::pair<int64_t, int32_t>> w;
    for (const auto& u : t.at("unmasked")) w.emplace_back(u[0].get<int64_t>(), u[1].get<int32_t>());
    std::sort(w.begin(), w.end());
    EXPECT_EQ(steps[t.at("step").get<int64_t>()], w) << "step " << t.at("step");
  }
  size_t nonempty = 0;
  for (const auto& [s, v] : steps) nonempty += !v.empty();
  EXPECT_EQ(nonempty, ref.at("trace").size());
}

INSTANTIATE_TEST_SUITE_P(Generations, Reference, ::testing::ValuesIn(test::generation_case_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return test::test_label(info.param);
                         });

// Log-probabilities on the tiny models: the generation is the reference's with them on, and each committed
// token's value is ln softmax of its row in an independent full-logits pass over the canvas as it was
// before the step that committed it (LLaDA: row j; Dream: row j - 1), the top alternatives lead with it.
void expect_logprobs_of_full_logits(Model& m, const GenerateConfig& cfg, const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>* expected) {
  std::map<int64_t, std::vector<int32_t>> before;  // step -> the canvas it started from
  std::vector<int32_t> canvas(prompt);
  canvas.resize(prompt.size() + static_cast<size_t>(cfg.max_tokens), cfg.mask_id);
  GenerateHooks hooks;
  hooks.pool = &m.pool();
  hooks.on_step = [&](const StepEvent& ev) {
    before[ev.step] = canvas;
    canvas.assign(ev.canvas.begin(), ev.canvas.end());
  };
  GenerateConfig c = cfg;
  c.top_logprobs = 5;
  auto src = make_model_logit_source(m);
  const GenerateResult res = generate(*src, c, prompt, hooks);
  if (expected) {
    EXPECT_EQ(std::vector<int32_t>(res.generated().begin(), res.generated().end()), *expected);
  }
  ASSERT_EQ(res.logprobs.size(), static_cast<size_t>(cfg.max_tokens));
  const int64_t P = static_cast<int64_t>(prompt.size());
  const bool shifted = arch_spec(cfg.arch).sampler != SamplerKind::Blocks;
  std::vector<float> row(static_cast<size_t>(m.n_vocab()));
  for (int64_t i = 0; i < cfg.max_tokens; ++i) {
    const PositionLogprobs& p = res.logprobs[static_cast<size_t>(i)];
    ASSERT_GE(p.step, 0) << "position " << i;
    EXPECT_EQ(p.chosen.token, res.canvas[static_cast<size_t>(P + i)]);
    ASSERT_EQ(p.top.size(), 5u);
    EXPECT_EQ(p.top[0].token, p.chosen.token);  // greedy: the most probable token
    EXPECT_EQ(p.top[0].logprob, p.chosen.logprob);
    for (const TokenLogprob& t : p.top) EXPECT_LE(t.logprob, 0.0);
    const int64_t r = shifted ? P + i - 1 : P + i;
    m.forward(before.at(p.step), std::span<const int64_t>(&r, 1), row.data());
    long double mx = -INFINITY, sum = 0;
    for (float l : row) mx = std::max<long double>(mx, l);
    for (float l : row) sum += std::exp(l - mx);
    const long double want = row[static_cast<size_t>(p.chosen.token)] - mx - std::log(sum);
    EXPECT_NEAR(p.chosen.logprob, static_cast<double>(want), 1e-9) << "position " << i;
  }
}

TEST(ReferenceLogprobs, GreedyValuesAreTheLogSoftmaxOfTheFullLogits) {
  bool llada = false, dream = false;
  for (const std::string& file : test::generation_case_files()) {
    const test::GenerationCase c = test::load_generation_case(file);
    bool& seen = c.config.arch == Arch::Dream ? dream : llada;
    if (seen) continue;
    seen = true;
    SCOPED_TRACE(file);
    Model& m = tiny_model(c.model_file);
    expect_logprobs_of_full_logits(m, c.config, c.prompt, &c.expected);
    if (c.config.arch == Arch::Dream) continue;
    GenerateConfig odd = c.config;  // blocks of 8, 8 and 4 with 2, 3 and 2 steps
    odd.max_tokens = 20;
    odd.block_length = 8;
    odd.steps = 7;
    expect_logprobs_of_full_logits(m, odd, c.prompt, nullptr);
  }
  EXPECT_TRUE(llada && dream);
}

TEST(ReferenceSet, HasEveryAuthorsAlgorithmRun) {
  // 43 of the 78 shared runs follow the authors' algorithms (README section 3.5); all are copied.
  EXPECT_EQ(test::generation_case_files().size(), 43u);
}

}  // namespace
}  // namespace dllm::model
