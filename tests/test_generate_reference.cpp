// Greedy generations on the tiny models, token for token and step for step, against every reference of
// tests/data/generations (copies of the shared fixtures marked matches_authors_algorithm: true: the
// authors' LLaDA and Dream samplers at temperature 0 over llama.cpp's forward pass, cross-checked by a
// float64 loop). Runs through the library with the reference executor and --no-early-stop semantics.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

TEST(ReferenceSet, HasEveryAuthorsAlgorithmRun) {
  // 43 of the 78 shared runs follow the authors' algorithms (README section 3.5); all are copied.
  EXPECT_EQ(test::generation_case_files().size(), 43u);
}

}  // namespace
}  // namespace dllm::model
